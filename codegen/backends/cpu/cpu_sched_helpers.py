"""TIR analysis and loop helpers shared by the CPU schedule rules (`cpu_schedule`): block and loop
kinds, a per-kernel work estimate, vector widths and vectorized tiles."""

from __future__ import annotations

import functools
import re

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlockRealize

# Work estimate (`op_count`): arithmetic ops per iteration, counted on the printed block body,
# capped at _MAX_OPS; a libm call counts _LIBM_OPS.
_MAX_OPS = 64
_LIBM_CALL = re.compile(r"T\.(exp\w*|log\w*|tanh|sigmoid|erf|pow|a?sinh?|a?cosh?|a?tanh?)\(")
_LIBM_OPS = 16  # a scalar libm call costs ~16 vectorized multiply-adds
_ARITH_OP = re.compile(r" [-+*/%] | // |T\.(?:max|min|Select|if_then_else|sqrt|rsqrt|floor)\(")


#: The storage scope of a kernel's register tile (an accumulator tile, an epilogue's cache tile): "global", not
#: "local". TVM's LowerTVMBuiltin makes a stack array only of a constant-size "global" buffer on the CPU; a
#: "local" one, even of constant size once compacted under the tile loop (128 bytes), became a
#: TVMBackendAllocWorkspace / FreeWorkspace pair per tile (a depthwise layer's rows: ~20% of its time). Either
#: way LLVM keeps an unrolled tile in registers.
TILE_SCOPE = "global"


def tile_scope(sch: s_tir.Schedule, block) -> None:
    """`block`'s output buffer in `TILE_SCOPE` (an intermediate is "global" already)."""
    if TILE_SCOPE != "global":
        sch.set_scope(block, 0, TILE_SCOPE)

def child_blocks(sch: s_tir.Schedule) -> list:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def loop_extent(sch: s_tir.Schedule, loop) -> int | tirx.PrimExpr:
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else ext


def iter_kinds(sch: s_tir.Schedule, block) -> str:
    kinds = {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}
    return "".join(kinds.get(iv.iter_type, "O") for iv in sch.get(block).iter_vars)


def loop_kinds(sch: s_tir.Schedule, block) -> str:
    """"R" for each loop that drives a reduction iter, else "S" (iter order can differ from
    loop order, e.g. after rfactor). Requires a perfect loop nest."""
    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body if loops else None
    if not isinstance(realize, SBlockRealize):
        raise ValueError("block is not perfectly nested")
    red = [v for iv, val in zip(realize.block.iter_vars, realize.iter_values)
           if iv.iter_type == tirx.IterVar.CommReduce for v in tirx.analysis.undefined_vars(val)]
    return "".join("R" if any(sch.get(lp).loop_var.same_as(v) for v in red) else "S"
                   for lp in loops)


def writes_param(func: tirx.PrimFunc, sch: s_tir.Schedule, block) -> bool:
    return any(w.source.same_as(p) for w in sch.get(block).writes for p in func.params)


def op_count(sch: s_tir.Schedule, block) -> int:
    """Arithmetic ops per iteration of a block (declaration lines of the printout skipped)."""
    text = "\n".join(ln for ln in str(sch.get(block).body).splitlines()
                     if "T.Buffer(" not in ln and "= T.int" not in ln)
    ops = len(_ARITH_OP.findall(text)) + _LIBM_OPS * len(_LIBM_CALL.findall(text))
    return min(_MAX_OPS, max(1, ops))


def total_work(sch: s_tir.Schedule, blocks) -> tirx.PrimExpr:
    """Sum over blocks of loop iterations x ops per iteration (a runtime expression)."""
    total = tirx.IntImm("int64", 0)
    for block in blocks:
        work = tirx.IntImm("int64", op_count(sch, block))
        for loop in sch.get_loops(block):
            work = work * tirx.Cast("int64", sch.get(loop).extent)
        total = total + work
    return total


def is_contraction(sch: s_tir.Schedule, block) -> bool:
    """``C[s.., i, j] += A[.., k] * B[.., k, ..]`` with loops in iter order S..SSR."""
    stmt, kinds = sch.get(block), iter_kinds(sch, block)
    if not kinds.endswith("SSR") or kinds.count("R") != 1 or "O" in kinds:
        return False
    store = stmt.body
    return (len(sch.get_loops(block)) == len(kinds) and len(stmt.reads) >= 2
            and isinstance(store, tirx.BufferStore) and isinstance(store.value, tirx.Add)
            and "*" in str(store.value)
            and [str(i) for i in store.indices] == [str(iv.var) for iv in stmt.iter_vars[:-1]])


def is_column_reduction(sch: s_tir.Schedule, block) -> bool:
    """A reduction whose input's innermost index is the last spatial iter (sum over axis 0):
    reducing inside each output element would stride through memory."""
    stmt, kinds = sch.get(block), iter_kinds(sch, block)
    n_s = len(kinds) - len(kinds.lstrip("S"))
    if n_s == 0 or kinds[n_s:] != "R" * (len(kinds) - n_s):
        return False
    last_s = stmt.iter_vars[n_s - 1].var
    return any(r.region and r.region[-1].min.same_as(last_s) for r in stmt.reads)


@functools.lru_cache(maxsize=None)
def _isa_vectors(target_text: str) -> tuple[int, int]:
    """(bits, count) of the vector registers of a target, from its CPU features (never its -mcpu name): AVX-512
    512 x 32, AVX / AVX2 256 x 16, SSE 128 x 16, NEON 128 x 32. TVM's ``llvm_get_vector_width`` says 512 for
    every x86 -mcpu, AVX2-only ones included: tiles sized by it spilled their accumulators on AVX2."""
    try:
        features = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(target_text))}
    except Exception:  # pylint: disable=broad-except  # an LLVM without the query: the narrow registers
        features = set()
    if "avx512f" in features:
        return 512, 32
    if "avx" in features:
        return 256, 16
    if "neon" in features or "sve" in features:
        return 128, 32
    return 128, 16


def vector_registers(target) -> int:
    """How many vector registers the target's ISA has (16 on AVX2, 32 on AVX-512 / NEON)."""
    return _isa_vectors(str(target))[1]


def vector_lanes(target, dtype) -> int:
    """Lanes of `dtype` in one native vector register of the target's ISA."""
    return max(1, _isa_vectors(str(target))[0] // tvm.DataType(str(dtype)).bits)


def pick_tile(extent, target: int, lanes: int, at_most: bool = False) -> int | None:
    """Column tile for a static extent: the whole extent when small, else the divisor closest
    to `target` among multiples of `lanes` (of 4 if none) up to 2*target (up to `target` if
    `at_most`: a register tile that must not outgrow the registers); None (the loop is
    left to LLVM) when symbolic or without such a divisor. A ragged tile would need a
    predicate inside the vectorized loop, which scalarizes it (17 vs 400 GFLOP/s)."""
    if not isinstance(extent, int):
        return None
    if extent <= target:
        return extent
    for step in (lanes, 4):
        cands = [d for d in range(step, (1 if at_most else 2) * target + 1, step) if extent % d == 0]
        if cands:
            return min(cands, key=lambda d: (abs(d - target), -d))
    return None


def vectorize_tile(sch: s_tir.Schedule, loop, extent: int, lanes: int, unroll: bool) -> None:
    """Vectorizes a static loop as native-width vectors (the rest unrolled or a loop): LLVM
    handles e.g. a <80 x float> badly (5 x 16 lanes: 8x faster at 16x256x1040)."""
    vec = next(v for v in (lanes, 8, 4, 2, 1) if v <= lanes and extent % v == 0)
    if 1 < vec < extent:
        outer, loop = sch.split(loop, [None, vec])
        if unroll:
            sch.unroll(outer)
    sch.vectorize(loop)


def binds_an_integer(stmt) -> bool:
    """Whether `stmt` has a ``Let`` of an integer value. TVM's VectorizeLoop binds such a variable in its
    arithmetic analyzer to the *vectorized* value and fails ("mismatched types. int64x8 vs. int64": an int64
    floor_divide by a tensor on static shapes did not compile); LLVM's loop vectorizer takes those loops."""
    found = []
    tvm_ffi.structural_walk(stmt, (tirx.Let, lambda let: found.append(str(let.var.ty)) if "int" in str(let.var.ty)
                                   else None))
    return bool(found)


def vectorize_inner(sch: s_tir.Schedule, block, target) -> None:
    """Vectorizes a static innermost loop that the vector width divides. Symbolic or ragged
    loops are left to LLVM's loop vectorizer: a predicated TVM split would scalarize; so are blocks
    binding an integer (`binds_an_integer`)."""
    inner = sch.get_loops(block)[-1]
    ext = loop_extent(sch, inner)
    lanes = vector_lanes(target, sch.get(block).writes[0].source.dtype)
    if lanes > 1 and isinstance(ext, int) and ext >= lanes and ext % lanes == 0 and \
            not binds_an_integer(sch.get(block).body):
        sch.vectorize(sch.split(inner, [None, lanes])[1])


#: PrimFunc attribute of a kernel whose constant right operands were packed at compile time (`cpu_prepack`):
#: {parameter index: panel columns nr}, the parameter in the layout [N / nr, K, nr], read by one block of its own
#: (``W[k, j] = P[j // nr, k, j % nr]``) that the schedules inline into the matmul (`inline_spatial` keeps it).
PREPACKED = "dyntvm.prepacked_panels"


def prepacked_columns(func: tirx.PrimFunc, block) -> int | None:
    """The panel width nr of the prepacked parameter (`PREPACKED`) that `block` (a `tirx.SBlock`) of `func`
    reads, else None."""
    packed = func.attrs.get(PREPACKED) if func.attrs else None
    if not packed:
        return None
    for n, nr in packed.items():
        if any(r.source.same_as(func.params[int(n)]) for r in block.reads):
            return int(nr)
    return None
