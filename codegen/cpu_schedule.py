"""Default CPU schedules, so Relax code compiled for the CPU is fast without tuning.

Relax's CPU pipeline leaves every PrimFunc a naive loop nest (fp32 matmul at 1-2 GFLOP/s). After
legalization and fusion, ``schedule_module`` schedules every PrimFunc by hand: contractions
(matmul, batched, fused epilogues) get register tiles with the epilogue per tile; row reductions
(sum/max/softmax/layer_norm) are computed per row with the reduction vectorized through rfactor;
injective kernels are fused, parallel outside and vectorized inside.

Symbolic dims get runtime dispatch: a rule builds several variants of a kernel and the PrimFunc
picks one with an ``if`` on the actual sizes, so small kernels stay serial (a parallel launch
costs ~1-2 us) and a matmul goes from a 1-row (GEMV) tile to a 4-row tile as the batch grows. A
rule that raises leaves its PrimFunc as it was (reductions still get their init hoisted: TVM's
unscheduled lowering returned garbage for a reduction over an empty domain). ``build_cpu`` also
legalizes fp32 exp/tanh/sigmoid/softmax/log_softmax to math LLVM vectorizes (TVM's lowering
calls scalar ``expf``, ~2 ns each), and marks VMShapeLower's ``shape_func`` noalias (see there).

Thread pool: on x86 TVM uses half of ``hardware_concurrency`` (it assumes SMT): ONE thread on a
2-core machine without SMT. Importing this module sets ``TVM_NUM_THREADS`` to the physical core
count unless already set; TVM reads it when a thread first runs a parallel kernel.

Files: this module (target, pipeline, runtime dispatch and the schedule rules), `cpu_inline` (which
spatial blocks are inlined: within a budget that keeps compile time linear in chain length),
`cpu_sched_helpers` (TIR analysis and loop helpers the rules share), `cpu_fast_math` (the fp32 math
legalizations).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.relax.backend.cpu_generic import pipeline as _cpu_pipeline
from tvm.s_tir import SBlock, SBlockRealize

from .cpu_fast_math import FAST_MATH
from .dims import is_one
from .cpu_inline import inline_spatial
from .cpu_schedule_fuse import CONTRACTION_GROUP, merge_contractions
from .cpu_sched_helpers import (child_blocks, is_column_reduction, is_contraction, iter_kinds, loop_extent,
                                loop_kinds, pick_tile, total_work, vector_lanes, vectorize_inner, vectorize_tile,
                                writes_param)
from .te_kernels import LANE_BLOCK, LANE_ROW, SERIAL_CHECK

LANES_PREFIX = "dt_lanes_"  # blocks of `te_kernels.te_lane_reduce`
# Full reductions of a 1-d input run in parallel from this many elements. Measured (2 threads vs 1, warm
# thread pool): sum / max / argmax 0.3-0.6x at 8k-16k, 0.9x at 32k, 1.0-1.1x at 64k, 1.2x at 128k,
# 1.3-1.5x at 256k-1M.
LANES_PARALLEL_MIN = 1 << 17

_LOG = logging.getLogger(__name__)

# Work below which a kernel stays serial: loop iterations x arithmetic ops per iteration
# (`cpu_sched_helpers.total_work`). Measured on the 2-core Zen box, 2 threads vs 1
# (a launch costs ~1 us): x*(x+b) (2 ops) gains from 2 threads from ~128k elements, the
# vectorized tanh (~60 ops) and softmax rows from ~8k, matmul (2 ops per MAC) from ~128k MACs;
# below that the serial kernel is up to 1.4x faster.
PARALLEL_MIN_WORK = 1 << 18
# Matmul register tile, rows x fp32 columns: 4x64 (16 zmm accumulators) measured best for M >= 4
# (~400 GFLOP/s on 2 cores, numpy ~200); 1x128 for M < 4, the batch-1 GEMV.
_MATMUL_MR = 4
_TILE_COLS = {1: 128, 2: 128, 3: 64, 4: 64, 6: 32}
_K_SPLIT = 4
#: Merge matmul kernels with their epilogue matmuls and consumers (`cpu_schedule_fuse`); a switch for A/B.
FUSE_CONTRACTIONS = True
TILE_OVERRIDE = None


def _physical_cores() -> int:
    """Cores available to this process, SMT siblings counted once."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(
        os.cpu_count() or 1)
    cores = set()
    try:
        for cpu in allowed:
            topo = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
            with open(topo + "physical_package_id") as pkg, open(topo + "core_id") as core:
                cores.add((pkg.read().strip(), core.read().strip()))
    except OSError:
        return max(1, len(allowed))
    return max(1, len(cores))


os.environ.setdefault("TVM_NUM_THREADS", str(_physical_cores()))


def cpu_target(num_cores: int | None = None) -> tvm.target.Target:
    """Returns the LLVM target of the host CPU.

    Args:
        num_cores: Cores the schedules may use; defaults to the physical cores of this
            process. 1 disables every parallel loop.

    Returns:
        ``Target.from_device(tvm.cpu())`` (detected ``mcpu``) plus ``num-cores``. No fast-math
        flags: reductions are vectorized by the schedules, and ``fast-math-reassoc`` could undo
        the exact range reduction of ``exp_f32``.
    """
    cfg = dict(tvm.target.Target.from_device(tvm.cpu()).export())
    cfg["num-cores"] = int(num_cores) if num_cores else _physical_cores()
    return tvm.target.Target(cfg)


def schedule_module(mod: tvm.IRModule, target) -> tvm.IRModule:
    """Applies the CPU schedule rules to every PrimFunc of a legalized, fused module.

    Args:
        mod: Module after legalization and fusion (``legalize_and_fuse`` or the "zero"
            pipeline). Not modified.
        target: LLVM target (``cpu_target()``): its ``num-cores`` and vector width are used.

    Returns:
        A new module; scheduled PrimFuncs carry ``tirx.is_scheduled``. PrimFuncs already marked
        scheduled, or that no rule handles, are kept as they were.
    """
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs,
                       global_infos=mod.global_infos)
    for gvar, func in mod.functions_items():
        if (isinstance(func, tirx.PrimFunc) and not func.attrs.get("tirx.is_scheduled", False)
                and not func.attrs.get(SERIAL_CHECK, False)
                # a pure reshape stays as written: RewriteDataflowReshape makes it a view (no kernel,
                # no copy); scheduled, it was a copy kernel (e.g. around every run-time check)
                and not relax.analysis.has_reshape_pattern(func)):
            new = _schedule_func(func, target, gvar.name_hint)
            if new is not func:
                out[gvar] = new.with_attr("tirx.is_scheduled", True)
    return out


def cpu_schedule_pass(target) -> tvm.transform.Pass:
    """Returns ``schedule_module`` as a module pass, for custom pipelines."""
    return tvm.transform.module_pass(
        lambda mod, _ctx: schedule_module(mod, target), opt_level=0, name="DyntvmCPUSchedule")


def legalize_and_fuse(target=None) -> tvm.transform.Pass:
    """Returns the "zero" pipeline (LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps,
    FuseTIR) with fp32 exp/tanh/sigmoid/softmax/log_softmax legalized to vectorizable math and, after
    FuseOps, matmul groups merged with the matmuls and the elementwise / slicing kernels around them
    (`cpu_schedule_fuse`; off with ``FUSE_CONTRACTIONS = False``).

    Args:
        target: The LLVM target the merged kernels are checked against; ``cpu_target()`` when None.
    """
    target = cpu_target() if target is None else target
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(customize_legalize_map=FAST_MATH),
        relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
        relax.transform.FuseOps()]
        + ([merge_contractions(target)] if FUSE_CONTRACTIONS else [])
        + [relax.transform.FuseTIR()])


def build_cpu(mod: tvm.IRModule, target=None) -> relax.VMExecutable:
    """Compiles a Relax module for the CPU with fusion and the default schedules.

    Pipeline: DispatchSampling, DispatchSortScan -> ``legalize_and_fuse`` ->
    ``schedule_module`` -> the dataflow-lowering and finalization passes of
    ``relax.backend.cpu_generic`` (as in its default pipeline) -> ``tvm.compile``.

    Args:
        mod: Relax module; may hold several public functions and symbolic dims.
        target: LLVM target; ``cpu_target()`` when None.

    Returns:
        The executable, for ``relax.VirtualMachine(ex, tvm.cpu())``.
    """
    target = cpu_target() if target is None else target
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    passes = (_cpu_pipeline.library_dispatch_passes(target)
              + [legalize_and_fuse(target), cpu_schedule_pass(target)]
              + _cpu_pipeline.dataflow_lower_passes(target)
              + _cpu_pipeline.finalize_passes(target))
    with target:
        mod = tvm.transform.Sequential(passes)(mod)
    # VMShapeLower's `shape_func` (present whenever a dim is symbolic) lacks "tirx.noalias", and
    # one such function in the LLVM module made LLVM keep every matmul accumulator in memory (a
    # store per FMA, 2.5x slower). It has a single buffer param, so noalias holds trivially.
    for gvar, func in list(mod.functions_items()):
        if (isinstance(func, tirx.PrimFunc) and len(func.params) <= 1
                and not func.attrs.get("tirx.noalias", False)):
            mod[gvar] = func.with_attr("tirx.noalias", True)
    return tvm.compile(mod, target=target, relax_pipeline=None)


# ---------------------------------------------------------------- runtime dispatch


def _combine(then_func: tirx.PrimFunc, else_func: tirx.PrimFunc, cond) -> tirx.PrimFunc:
    """One PrimFunc running then_func's body if ``cond`` holds at run time, else else_func's.
    Both schedule the same PrimFunc: same params. Each branch keeps its own intermediate buffers
    (in an opaque block of its own): a buffer shared by both would be allocated at the root at its
    full size, where one branch alone computes it per row / tile (a few registers)."""
    blk_a, blk_b = then_func.body.block, else_func.body.block

    def allocs(blk) -> dict:     # buffers allocated in `blk` or any block inside it (nested variants)
        found = {b.__chandle__(): b for b in blk.alloc_buffers}
        tvm_ffi.structural_walk(blk.body, (SBlock, lambda x: found.update(
            {b.__chandle__(): b for b in x.alloc_buffers})))
        return found
    in_a = allocs(blk_a)
    shared = {h: tirx.decl_buffer(b.shape, b.dtype, name=b.name, scope=b.scope())
              for h, b in allocs(blk_b).items() if h in in_a}
    if shared:     # the else branch gets copies
        blk_b = tvm_ffi.structural_mutate(blk_b, (tvm.ir.expr.Var, lambda v, m: shared.get(v.__chandle__(), v)))

    def branch(blk, name):
        return SBlockRealize([], True, SBlock([], [], [], name, blk.body, alloc_buffers=list(blk.alloc_buffers)))
    root = SBlock([], [], [], "root", tirx.IfThenElse(cond, branch(blk_a, "then"), branch(blk_b, "else")),
                  match_buffers=list(blk_a.match_buffers), annotations=dict(blk_a.annotations))
    func = then_func.with_body(SBlockRealize([], True, root))
    # Vars (loop vars, buffers) that appear in both branches: lowering rejects a var bound twice
    # with different ranges, so every definition gets its own var.
    return s_tir.transform.ConvertSSA()(tvm.IRModule({"main": func}))["main"]


def _select(func: tirx.PrimFunc, cands) -> tirx.PrimFunc:
    """Builds [(condition, make_variant)] as a runtime if-chain: the first true condition wins.
    Conditions provably false (every symbolic dim >= 1) are dropped, and a provably true one
    ends the chain; the last remaining variant is the default."""
    ana = tvm.sym.Analyzer()
    for param in func.params:
        for dim in getattr(param, "shape", []):
            if isinstance(dim, tirx.Var):
                ana.update(dim, tvm.sym.ConstIntBound(1, 1 << 40), override=True)
    live = []
    for cond, make in cands:
        cond = ana.simplify(cond)
        if not (isinstance(cond, tirx.IntImm) and not cond.value):
            live.append((cond, make))
            if isinstance(cond, tirx.IntImm):
                break
    result = live[-1][1]()
    for cond, make in reversed(live[:-1]):
        result = _combine(make(), result, cond)
    return result


def _parallel_cands(work: tirx.PrimExpr, target, make: Callable[[bool], tirx.PrimFunc]):
    """Serial variant below PARALLEL_MIN_WORK, parallel one above (none on one core)."""
    true = tirx.const(True, "bool")
    if int(target.attrs.get("num-cores", 1)) <= 1:
        return [(true, lambda: make(False))]
    return [(work < tirx.IntImm("int64", PARALLEL_MIN_WORK), lambda: make(False)),
            (true, lambda: make(True))]


# ---------------------------------------------------------------- rules (one variant each)


def _sched_matmul(func, target, name: str, mr: int, parallel: bool, attach: bool = True) -> tirx.PrimFunc:
    """`attach=False`: the result stays a buffer of its own (no epilogue per tile), for kernels with
    several matmuls whose epilogues read all of them (`_sched_contraction_group`)."""
    sch = s_tir.Schedule(func)
    mm = sch.get_sblock(name)
    lanes = vector_lanes(target, sch.get(mm).body.buffer.dtype)
    loops = sch.get_loops(mm)
    m_ext, pads = loop_extent(sch, loops[-3]), []
    if mr > 1 and not (isinstance(m_ext, int) and m_ext % mr == 0):
        # A ragged row tile puts an `i < M` test inside the k loop (1.8x slower at M = 16 than
        # padding): pad M to the tile instead.
        # Input rows are copied per tile (K floats per mr*nr*K MACs) and the padded result is
        # written back under the `i < M` predicate, outside the k loop.
        sch.pad_einsum(mm, [1] * (len(loops) - 3) + [mr, 1, 1])
        pads = [b for b in sch.get_producers(mm) if sch.get(b).name_hint.endswith("_pad")]
        for copy in sch.get_consumers(mm):
            if not writes_param(func, sch, copy):
                sch.compute_inline(copy)  # the epilogue reads the padded tile directly
    *batch, i, j, k = sch.get_loops(mm)
    nr = pick_tile(loop_extent(sch, j), max(lanes, _TILE_COLS[mr]), lanes)
    io, ii = (i, None) if mr == 1 else sch.split(i, [None, mr])
    jo, ji = (None, j) if nr is None else sch.split(j, [None, nr])
    k_ext = loop_extent(sch, k)
    ko, ki = (sch.split(k, [None, _K_SPLIT]) if isinstance(k_ext, int)
              and k_ext % _K_SPLIT == 0 and k_ext > _K_SPLIT else (k, None))
    # Column tiles outside row tiles: a weight panel (K x nr) is reused by every row tile while
    # it sits in L1/L2 (1.15-1.2x faster at 64x256x1024 and 256x512x512 than rows outside).
    outer = [*batch] + ([jo] if jo is not None else []) + [io]
    sch.reorder(*outer, ko, *[lp for lp in (ki, ii) if lp is not None], ji)
    # Epilogue per tile: the accumulator tile (thread-local scratch) stays in registers and the
    # intermediate buffer shrinks to the tile (CompactBufferAllocation); a matmul writing the
    # output directly gets a cache tile.
    epilogues = list(sch.get_consumers(mm)) if attach else []
    if not writes_param(func, sch, mm):
        if attach:
            sch.set_scope(mm, 0, "local")
    elif not epilogues:
        epilogues = [sch.cache_write(mm, 0, "local")]
    for pad in pads:
        sch.compute_at(pad, outer[-1], preserve_unit_loops=True)
        vectorize_inner(sch, pad, target)
    attached = []
    while epilogues:  # and their consumers: an epilogue chain the inlining budget split
        epi = epilogues.pop(0)
        try:
            sch.reverse_compute_at(epi, outer[-1], preserve_unit_loops=True)
        except Exception:  # pylint: disable=broad-except
            continue  # stays a separate loop nest after the matmul
        attached.append(epi)
        epilogues += [c for c in sch.get_consumers(epi)
                      if not any(sch.get(c).same_as(sch.get(e)) for e in attached + epilogues)]
    if parallel:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    for lp in (ki, ii):  # explicit, rather than left to LLVM's unrolling heuristics
        if lp is not None:
            sch.unroll(lp)
    if nr is not None:
        vectorize_tile(sch, ji, nr, lanes, unroll=True)
        for epi in attached:  # the epilogue stays a loop: unrolling it only costs compile time
            inner = sch.get_loops(epi)[-1]
            if loop_extent(sch, inner) == nr:
                vectorize_tile(sch, inner, nr, lanes, unroll=False)
    sch.decompose_reduction(mm, ko)  # only now: parallel/vectorize refuse a decomposed block
    return sch.mod["main"]


def _group_parts(sch: s_tir.Schedule):
    """(contractions, epilogues, S) of a merged contraction group (`cpu_schedule_fuse`): every reduction a
    2-d matmul ``C[i, j] += A[i, k] * W[k, j]`` with the same (M, N), every other block spatial over
    (M, S), S dividing N: the epilogue reads columns ``g * S + s`` of the matmuls (a split into N / S
    gates, or S == N)."""
    blocks = child_blocks(sch)
    cons = [b for b in blocks if "R" in iter_kinds(sch, b)]
    epis = [b for b in blocks if "R" not in iter_kinds(sch, b)]
    if not cons or not epis or not all(is_contraction(sch, c) and len(sch.get_loops(c)) == 3 for c in cons):
        raise ValueError("not a 2-d contraction group")
    ana = tvm.sym.Analyzer()
    m_ext, n = (sch.get(lp).extent for lp in sch.get_loops(cons[0])[:2])
    if not isinstance(n, tirx.IntImm) or any(
            not ana.can_prove_equal(sch.get(sch.get_loops(c)[0]).extent, m_ext)
            or not ana.can_prove_equal(sch.get(sch.get_loops(c)[1]).extent, n) for c in cons):
        raise ValueError("matmuls of different shapes")
    ext = {loop_extent(sch, sch.get_loops(e)[-1]) for e in epis}
    if len(ext) != 1 or any(len(sch.get_loops(e)) != 2 or not ana.can_prove_equal(
            sch.get(sch.get_loops(e)[0]).extent, m_ext) for e in epis):
        raise ValueError("epilogues of different shapes")
    (s_ext,) = ext
    if not isinstance(s_ext, int) or int(n.value) % s_ext:
        raise ValueError("epilogue columns do not divide the matmul's")
    return cons, epis, s_ext


def _sched_group_tiles(func, target, parallel: bool) -> tirx.PrimFunc:
    """A contraction group with few rows (M < 4; GEMV-like): per tile of t epilogue columns (the same t
    columns of each of the G = N / S gates), every matmul's G x t accumulators in registers over k, then
    the epilogues on that tile. Tiles run in parallel; each core reads the same weight columns every call
    (its share of the weights stays in its L2)."""
    sch = s_tir.Schedule(func)
    cons, epis, s_ext = _group_parts(sch)
    n = loop_extent(sch, sch.get_loops(cons[0])[1])
    gates = n // s_ext
    lanes = vector_lanes(target, sch.get(cons[0]).writes[0].source.dtype)
    # 16 accumulator vectors per matmul (G x t floats): t = 64 for the 4 gates of an LSTM (1.1x faster than
    # 32: longer contiguous weight rows); 128 columns for one gate, as the GEMV tile
    want = TILE_OVERRIDE or (_TILE_COLS[1] if gates == 1 else 256 // gates)
    t = next((c for c in (want, 64, 32, 16) if c >= lanes and s_ext % c == 0 and c % lanes == 0), None)
    if t is None:
        raise ValueError("no column tile")
    outer = []
    for c in cons:
        # [M, N] -> [M, G, S]: each gate's tile is a box (the epilogue's gate index a constant)
        sch.transform_block_layout(c, lambda i, j, k: (i, j // s_ext, j % s_ext, k))
        sch.transform_layout(c, ("write", 0), lambda i, j: (i, j // s_ext, j % s_ext))
        sch.set_scope(c, 0, "local")
        i, g, col, k = sch.get_loops(c)
        so, si = sch.split(col, [None, t])
        ko, ki = sch.split(k, [None, _K_SPLIT]) if isinstance(loop_extent(sch, k), int) and \
            loop_extent(sch, k) % _K_SPLIT == 0 else (k, None)
        sch.reorder(so, i, ko, *([ki] if ki is not None else []), g, si)
        outer.append((so, i))
    so, row = (sch.merge(*lps) if len(lps) > 1 else lps[0] for lps in zip(*outer))
    if parallel:
        sch.parallel(so)
    for c in cons:
        loops = sch.get_loops(c)     # so, row, ko, [ki], g, si
        for lp in loops[3:-1]:
            sch.unroll(lp)
        vectorize_tile(sch, loops[-1], t, lanes, unroll=True)
        sch.decompose_reduction(c, loops[2])
    # The epilogues go under the row loop by hand: reverse_compute_at cannot solve a constant (gate) index
    # of the region they read.
    return _move_epilogues(sch.mod["main"], [sch.get(e).name_hint for e in epis], sch.get(so).loop_var,
                           sch.get(row).loop_var, t, lanes)


def _move_epilogues(func, names, so_var, row_var, t: int, lanes: int) -> tirx.PrimFunc:
    """Moves each root-level loop nest of a spatial block in `names` (loops (row, col)) under the loop of
    `row_var` (below what is there), for columns ``so * t + [0, t)``, in order, vectorized."""
    root = func.body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    realizes, keep = {}, []
    for st in stmts:
        found = []
        tvm_ffi.structural_walk(st, (SBlockRealize, lambda r: found.append(r) if r.block.name_hint in names else None))
        if found:
            if len(found) != 1 or not isinstance(st, tirx.For):
                raise ValueError("epilogue is not a loop nest of its own")
            realizes[found[0].block.name_hint] = found[0]
        else:
            keep.append(st)
    if set(realizes) != set(names):
        raise ValueError("epilogue not found")
    i64 = lambda v: tirx.IntImm("int64", v)  # noqa: E731
    moved = []
    for name in names:
        outer, vec = tirx.Var("e_o", "int64"), tirx.Var("e_v", "int64")
        realize = SBlockRealize([row_var, so_var * t + outer * lanes + vec], tirx.const(True, "bool"),
                                realizes[name].block)
        moved.append(tirx.For(outer, i64(0), i64(t // lanes), tirx.ForKind.SERIAL,
                              tirx.For(vec, i64(0), i64(lanes), tirx.ForKind.VECTORIZED, realize)))
    done = []

    def under_row(loop, mutator):
        if not loop.loop_var.same_as(row_var):
            return mutator.default_mutate(loop)
        done.append(loop)
        seq = list(loop.body.seq) if isinstance(loop.body, tirx.SeqStmt) else [loop.body]
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.SeqStmt(seq + moved),
                        loop.thread_binding, loop.annotations)
    keep = [tvm_ffi.structural_mutate(st, (tirx.For, under_row)) for st in keep]
    if len(done) != 1:
        raise ValueError("row loop not found")
    new_root = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                      tirx.SeqStmt(keep) if len(keep) > 1 else keep[0], root.init, root.alloc_buffers,
                      root.match_buffers, root.annotations)
    return func.with_body(SBlockRealize([], tirx.const(True, "bool"), new_root))


def _sched_group_separate(func, target, parallel: bool) -> tirx.PrimFunc:
    """A contraction group with many rows: each matmul with the 4-row matmul schedule into a buffer of
    its own, then the epilogues, rows parallel (what the separate kernels did, in one launch)."""
    sch = s_tir.Schedule(func)
    cons, epis, _ = _group_parts(sch)
    names = [sch.get(c).name_hint for c in cons]
    epi_names = [sch.get(e).name_hint for e in epis]
    for name in names:
        func = _sched_matmul(func, target, name, _MATMUL_MR, parallel, attach=False)
    sch = s_tir.Schedule(func)
    for name in epi_names:
        block = sch.get_sblock(name)
        vectorize_inner(sch, block, target)
        if parallel:
            sch.parallel(sch.get_loops(block)[0])
    return sch.mod["main"]


def _group_select(func, target, work) -> tirx.PrimFunc:
    """Row tiles (`_sched_group_tiles`) while M < 4, else `_sched_group_separate`; each serial below
    PARALLEL_MIN_WORK."""
    sch = s_tir.Schedule(func)
    cons, _, _ = _group_parts(sch)
    m_ext = sch.get(sch.get_loops(cons[0])[0]).extent
    true = tirx.const(True, "bool")
    if isinstance(m_ext, tirx.IntImm):
        kinds = [(true, _sched_group_tiles if int(m_ext.value) < _MATMUL_MR else _sched_group_separate)]
    else:
        kinds = [(m_ext < tirx.IntImm(str(m_ext.ty), _MATMUL_MR), _sched_group_tiles), (true, _sched_group_separate)]
    cands = []
    for m_cond, sched in kinds:
        for p_cond, make in _parallel_cands(work, target, lambda par, sched=sched: sched(func, target, par)):
            cands.append((tirx.And(m_cond, p_cond), make))
    return _select(func, cands)


def contraction_group_schedulable(func: tirx.PrimFunc, target) -> bool:
    """True if the contraction-group rule schedules `func` (a kernel `cpu_schedule_fuse` merged)."""
    try:
        sch = s_tir.Schedule(func)
        inline_spatial(func, sch)
        inlined = sch.mod["main"]
        _group_select(inlined, target, total_work(sch, child_blocks(sch)))
        return True
    except Exception as err:  # pylint: disable=broad-except
        _LOG.debug("cpu_schedule: no contraction-group schedule: %s", err)
        return False


def _sched_reduction(func, target, parallel: bool) -> tirx.PrimFunc:
    """Rows (softmax, layer_norm, sum/max over trailing axes): all blocks computed per row, rows
    parallel, row-local elementwise work vectorized. A trailing reduction loop the vector width
    divides is rfactor-ed into `lanes` partial results, vectorizing the sum/max itself."""
    sch = s_tir.Schedule(func)
    rf_names = set()
    for b in child_blocks(sch):
        loops, stmt = sch.get_loops(b), sch.get(b)
        if not iter_kinds(sch, b).endswith("R") or len(stmt.writes) != 1:
            continue
        lanes, ext = vector_lanes(target, stmt.writes[0].source.dtype), loop_extent(sch, loops[-1])
        if lanes > 1 and isinstance(ext, int) and ext % lanes == 0 and ext >= 2 * lanes:
            try:
                r_in = sch.split(loops[-1], [None, lanes])[1]
                rf = sch.rfactor(r_in, factor_axis=len(stmt.writes[0].region))
                rf_names.add(sch.get(rf).name_hint)
            except Exception:  # pylint: disable=broad-except
                pass  # e.g. argmax's two-buffer reduction stays a scalar loop
    blocks = child_blocks(sch)
    last_loops = sch.get_loops(blocks[-1])
    n_lead = min(len(k) - len(k.lstrip("S")) for k in (loop_kinds(sch, b) for b in blocks))
    ana = tvm.sym.Analyzer()
    if n_lead == 0 and not rf_names:
        raise ValueError("no leading spatial loop and nothing to vectorize")
    if not all(ana.can_prove_equal(sch.get(lp).extent, sch.get(ref).extent) for b in blocks
               for lp, ref in zip(sch.get_loops(b)[:n_lead], last_loops)):
        raise ValueError("blocks do not share their leading spatial loops")
    if n_lead:
        row = sch.fuse(*last_loops[:n_lead]) if n_lead > 1 else last_loops[0]
        for b in reversed(blocks[:-1]):
            sch.compute_at(b, row)
        if parallel:
            sch.parallel(row)
    # else: a full reduction to a scalar, only vectorized (serial)
    first = 1 if n_lead else 0
    for b in blocks:
        inner = sch.get_loops(b)[first:]
        if sch.get(b).name_hint in rf_names:  # the lane loop is not innermost (yet)
            kinds = loop_kinds(sch, b)[first:]
            lane = [lp for lp, k in zip(inner, kinds) if k == "S" and loop_extent(sch, lp) > 1][-1]
            sch.reorder(*[lp for lp in inner if not lp.same_as(lane)], lane)
            sch.vectorize(lane)
            inner = sch.get_loops(b)[first:]
        if "R" in iter_kinds(sch, b):
            if inner:
                sch.decompose_reduction(b, inner[0])
        elif inner:
            vectorize_inner(sch, b, target)
    return sch.mod["main"]


def _sched_column_reduction(func, target, parallel: bool) -> tirx.PrimFunc:
    """One reduction over a non-trailing axis: reduction loops moved outside the innermost
    spatial loop (contiguous, vectorized by LLVM), outer spatial loops parallel. Spatial producers
    the inlining budget kept apart are computed per input row, inside the reduction loop."""
    sch = s_tir.Schedule(func)
    blocks = child_blocks(sch)
    (block,) = [b for b in blocks if "R" in iter_kinds(sch, b)]
    loops = sch.get_loops(block)
    n_s = iter_kinds(sch, block).index("R")
    spatial, red = loops[:n_s], loops[n_s:]
    sch.reorder(*red, spatial[-1])
    if parallel and len(spatial) > 1:
        sch.parallel(sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0])
    if len(blocks) > 1 and len(_compute_producers_at(sch, block, red[-1], target)) != len(blocks) - 1:
        raise ValueError("blocks other than the reduction's producers")
    sch.decompose_reduction(block, red[0])
    return sch.mod["main"]


def _sched_lanes(func, target, parallel: bool) -> tirx.PrimFunc:
    """`te_kernels.te_lane_reduce` (blocks ``dt_lanes_*``: full reductions of a 1-d input): in each block
    the static lane loop goes innermost and becomes vectors, reductions run outside it; the blocks of
    ``dt_lanes_block`` (its leading loop) run in parallel. Other blocks (a producer the inlining budget
    kept, an epilogue of the result) stay loop nests of their own, vectorized."""
    sch = s_tir.Schedule(func)
    for block in child_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            continue
        stmt = sch.get(block)
        if not stmt.name_hint.startswith(LANES_PREFIX):
            if "R" in iter_kinds(sch, block):
                sch.decompose_reduction(block, loops[0])
            else:
                vectorize_inner(sch, block, target)
            continue
        kinds = loop_kinds(sch, block)
        spatial = [lp for lp, k in zip(loops, kinds) if k == "S"]
        red = [lp for lp, k in zip(loops, kinds) if k == "R"]
        if spatial and red:
            sch.reorder(*spatial[:-1], *red, spatial[-1])
        if len(spatial) == 2:
            # per block, the lane accumulators stay in registers (a global buffer: a store per row)
            copy = sch.cache_write(block, 0, "local")
            sch.reverse_compute_at(copy, spatial[0], preserve_unit_loops=True)
            vectorize_inner(sch, copy, target)
            if parallel:
                sch.parallel(spatial[0])
        if spatial:
            ext = loop_extent(sch, spatial[-1])
            lanes = vector_lanes(target, stmt.writes[0].source.dtype)
            if isinstance(ext, int) and lanes > 1 and ext % lanes == 0:
                vectorize_tile(sch, spatial[-1], ext, lanes, unroll=True)
        if red:
            sch.decompose_reduction(block, red[0])
    return sch.mod["main"]


def _lanes_select(func, target) -> tirx.PrimFunc:
    """`_sched_lanes`, its blocks parallel from LANES_PARALLEL_MIN elements (``dt_lanes_block`` has one
    iteration per LANE_BLOCK rows of LANE_ROW elements)."""
    sch = s_tir.Schedule(func)
    (part,) = [b for b in child_blocks(sch) if sch.get(b).name_hint == LANES_PREFIX + "block"]
    nblk = sch.get(sch.get_loops(part)[0]).extent
    true = tirx.const(True, "bool")
    if int(target.attrs.get("num-cores", 1)) <= 1:
        return _sched_lanes(func, target, False)
    need = LANES_PARALLEL_MIN // (LANE_ROW * LANE_BLOCK)
    return _select(func, [(nblk < tirx.IntImm(str(nblk.ty), need), lambda: _sched_lanes(func, target, False)),
                          (true, lambda: _sched_lanes(func, target, True))])


def _sched_decompose(func) -> tirx.PrimFunc:
    """Last resort for reductions: only hoist each init out of its loop nest. Unscheduled, the
    init runs at the first reduction step, so a reduction over an empty domain (sum of a
    (0, 4) tensor over axis 0) returned uninitialized memory."""
    sch = s_tir.Schedule(func)
    for block in child_blocks(sch):
        if "R" in iter_kinds(sch, block) and sch.get_loops(block):
            sch.decompose_reduction(block, sch.get_loops(block)[0])
    return sch.mod["main"]


def _sched_injective(func, target, parallel: bool) -> tirx.PrimFunc:
    """Each output block: inner loop vectorized, outer loops fused and parallel. Blocks the inlining
    budget kept apart (`cpu_inline`) are computed per row of the block they feed, so their
    intermediate values stay in registers / L1 and the kernel keeps one parallel loop."""
    sch = s_tir.Schedule(func)
    done: set = set()
    for name in reversed([sch.get(b).name_hint for b in child_blocks(sch)]):
        block = sch.get_sblock(name)
        if name in done or not sch.get_loops(block):
            continue
        n_loops = len(sch.get_loops(block))
        vectorize_inner(sch, block, target)
        loops = sch.get_loops(block)
        # producers are computed per row (the vector loop split from it stays inside): several
        # independent vectors per block, not one long dependent chain per vector (2.5x faster for
        # 8 chained tanh on rows of 64)
        rows = loops[:n_loops - 1] or loops[:1]
        if not sch.get_producers(block):
            rows = loops[:-1] if len(loops) > 1 else loops
        if parallel:
            fused = sch.fuse(*rows) if len(rows) > 1 else rows[0]
            sch.parallel(fused)
            rows = [fused]
        done |= _compute_producers_at(sch, block, rows[-1], target)
    return sch.mod["main"]


def _compute_producers_at(sch: s_tir.Schedule, block, loop, target) -> set:
    """compute_at every spatial producer chain of `block` (whose consumers are all under `loop`)
    at `loop`, vectorized inside; returns the names of the blocks moved."""
    moved, under = set(), {sch.get(block).name_hint}
    queue = list(sch.get_producers(block))
    while queue:
        prod = queue.pop(0)
        name = sch.get(prod).name_hint
        if (name in under or "R" in iter_kinds(sch, prod)
                or not all(sch.get(c).name_hint in under for c in sch.get_consumers(prod))):
            continue
        try:
            sch.compute_at(prod, loop, preserve_unit_loops=True)
        except Exception:  # pylint: disable=broad-except
            continue    # stays a loop nest of its own
        if not sch.get(sch.get_loops(prod)[-1]).same_as(sch.get(loop)):
            vectorize_inner(sch, prod, target)
        moved.add(name)
        under.add(name)
        queue += list(sch.get_producers(prod))
    return moved


# ---------------------------------------------------------------- per-PrimFunc dispatch


def _schedule_func(func: tirx.PrimFunc, target, name: str = "") -> tirx.PrimFunc:
    """Schedules one PrimFunc; returns it unchanged if no rule applies or every rule fails."""
    try:
        sch = s_tir.Schedule(func)
        inline_spatial(func, sch)
        inlined = sch.mod["main"]  # what every rule below schedules
        blocks = child_blocks(sch)
        lanes = any(sch.get(b).name_hint.startswith(LANES_PREFIX) for b in blocks)

        def scalar(b):  # a 0-d result (`te_lane_reduce`'s last step): no loop, unit iters
            return not sch.get_loops(b) and all(is_one(iv.dom.extent) for iv in sch.get(b).iter_vars)
        if not blocks or any((len(sch.get_loops(b)) != len(sch.get(b).iter_vars) and not (lanes and scalar(b)))
                             or "O" in iter_kinds(sch, b) for b in blocks):
            return func  # rules assume perfect loop nests, one loop per block iter
        reductions = [b for b in blocks if "R" in iter_kinds(sch, b)]
        work = total_work(sch, blocks)
    except Exception as err:  # pylint: disable=broad-except
        _LOG.debug("cpu_schedule: cannot analyze: %s\n%s", err, func)
        return func

    def by_size(sched):
        return lambda: _select(inlined, _parallel_cands(work, target,
                                                        lambda par: sched(inlined, target, par)))

    rules = []
    if name.startswith(CONTRACTION_GROUP):
        rules.append(("contraction_group", lambda: _group_select(inlined, target, work)))
    if lanes:
        rules.append(("lanes", lambda: _lanes_select(inlined, target)))
    elif len(reductions) == 1 and is_contraction(sch, reductions[0]):
        name = sch.get(reductions[0]).name_hint
        m_ext = sch.get(sch.get_loops(reductions[0])[-3]).extent
        rules.append(("matmul", lambda: _matmul_select(inlined, target, name, m_ext, work)))
    if len(reductions) == 1 and is_column_reduction(sch, reductions[0]):
        rules.append(("column_reduction", by_size(_sched_column_reduction)))
    rules.append(("row_reduction", by_size(_sched_reduction)) if reductions
                 else ("injective", by_size(_sched_injective)))
    if reductions:
        rules.append(("decompose_only", lambda: _sched_decompose(func)))
    for label, rule in rules:
        try:
            new = rule()
            _LOG.debug("cpu_schedule: %s rule applied to\n%s", label, func)
            return new
        except Exception as err:  # pylint: disable=broad-except
            _LOG.debug("cpu_schedule: %s rule failed: %s\n%s", label, err, func)
    return func


def _matmul_select(func, target, name: str, m_ext, work) -> tirx.PrimFunc:
    """A 1-row tile (GEMV-like, wide vector columns) while M < 4, else a 4-row tile; each serial
    below PARALLEL_MIN_WORK MACs. A static M picks its variant at compile time."""
    true = tirx.const(True, "bool")
    if isinstance(m_ext, tirx.IntImm):  # a row tile dividing M avoids the `i < M` predicate
        m = int(m_ext.value)
        mrs = [(true, next((t for t in (_MATMUL_MR, 6, 3, 2) if m % t == 0), _MATMUL_MR)
                if m >= _MATMUL_MR else max(1, m))]
    else:
        mrs = [(m_ext < tirx.IntImm(str(m_ext.ty), _MATMUL_MR), 1), (true, _MATMUL_MR)]
    cands = []
    for m_cond, mr in mrs:
        for p_cond, make in _parallel_cands(
                work, target, lambda par, mr=mr: _sched_matmul(func, target, name, mr, par)):
            cands.append((tirx.And(m_cond, p_cond), make))
    return _select(func, cands)
