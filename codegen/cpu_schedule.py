"""Default CPU schedules for Relax modules, so compiled code is fast without tuning.

Relax's CPU pipeline leaves every PrimFunc as a naive loop nest (fp32 matmul at 1-2 GFLOP/s).
This module legalizes and fuses a module, then gives every PrimFunc a hand-written schedule:

* matmul-like contractions (incl. batched and fused epilogues): register tiles (rows x vector
  columns), reduction split by 4, epilogue computed per tile, parallel over the outer tiles;
* reductions (sum/max/softmax/layer_norm rows): every block computed per row, rows parallel;
* injective kernels: outer loops fused and parallel, inner loop vectorized.

Symbolic dims (one kernel for every batch size) are handled with runtime dispatch: a rule emits
several versions of a kernel and the PrimFunc picks one with an ``if`` on the actual sizes. This
keeps tiny kernels serial (a parallel launch costs ~2 us on the TVM thread pool) and switches the
matmul from a 1-row GEMV-like tile to a 4-row tile when the batch grows.

Every rule runs on a fresh ``tvm.s_tir.Schedule``; if any primitive raises, the PrimFunc is left as
it was, so a schedule problem can cost speed but never break a build.

Thread pool: TVM's runtime takes half of ``hardware_concurrency`` on x86 (it assumes SMT), i.e. ONE
thread on a 2-core machine without SMT. Importing this module sets ``TVM_NUM_THREADS`` to the
number of physical cores unless it is already set; the variable is read when a thread first
launches a TVM parallel loop, so import this module before running any kernel.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable

import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.backend.cpu_generic import pipeline as _cpu_pipeline
from tvm.s_tir import SBlock, SBlockRealize

_LOG = logging.getLogger(__name__)

# Work (MACs, or output elements weighted by op cost) below which a kernel stays serial. Measured on
# the 2-core Zen box: an elementwise multiply only gains from 2 threads past ~150k elements, tanh
# past ~8k, a GEMV 1x256x256 (65k MACs) runs 2.6 us serial vs 2.9 us parallel.
PARALLEL_MIN_WORK = 1 << 17
# libm calls (not vectorized by LLVM) cost ~16x a multiply per element.
_EXPENSIVE_CALL = re.compile(
    r"T\.(exp|exp2|exp10|log|log2|log10|log1p|tanh|sigmoid|erf|pow|sin|cos|tan|asin|acos|atan|"
    r"atan2|sinh|cosh|asinh|acosh|atanh)\("
)
_EXPENSIVE_WEIGHT = 16
# Register tile of the matmul accumulator (rows x fp32 columns): 4x64 = 16 zmm registers measured
# best for M >= 4 (~400 GFLOP/s on 2 cores); 1x128 for the GEMV case (M < 4).
_MATMUL_MR = 4
_TILE_COLS = {1: 128, 2: 128, 3: 64, 4: 64}
_REDUCE_SPLIT = 4
# Pad a ragged/symbolic M up to the row tile (pad_einsum) instead of predicating the k loop.
_PAD_ROWS = True


def _physical_cores() -> int:
    """Number of physical cores available to this process (SMT siblings counted once)."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set(range(os.cpu_count() or 1))
    cores, cpu = set(), None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info: dict[str, str] = {}
            for line in f.read().splitlines() + [""]:
                if line.strip():
                    key, _, val = line.partition(":")
                    info[key.strip()] = val.strip()
                    continue
                if "processor" in info:
                    cpu = int(info["processor"])
                    if cpu in allowed:
                        cores.add((info.get("physical id", "0"), info.get("core id", str(cpu))))
                info = {}
    except (OSError, ValueError):
        pass
    return max(1, len(cores) or len(allowed))


os.environ.setdefault("TVM_NUM_THREADS", str(_physical_cores()))


def cpu_target(num_cores: int | None = None) -> tvm.target.Target:
    """Returns an LLVM target for the host CPU.

    Args:
        num_cores: Number of cores the schedules may use (``num-cores``); defaults to the
            physical cores of this process. 1 disables every parallel loop.

    Returns:
        The host target (``mcpu`` detected by ``Target.from_device``) plus ``num-cores`` and
        ``fast-math-reassoc``, which lets LLVM vectorize fp sum reductions (rounding-level
        differences only; no nnan/ninf, so NaN and inf semantics are kept).
    """
    cfg = dict(tvm.target.Target.from_device(tvm.cpu()).export())
    cfg["num-cores"] = int(num_cores) if num_cores else _physical_cores()
    cfg["fast-math-reassoc"] = True
    return tvm.target.Target(cfg)


def schedule_module(mod: tvm.IRModule, target) -> tvm.IRModule:
    """Applies the CPU schedule rules to every PrimFunc of a legalized and fused module.

    Args:
        mod: Module after legalization and fusion (e.g. ``relax.get_pipeline("zero")``).
            Not modified.
        target: The LLVM target (``cpu_target()``); its ``num-cores`` and vector width drive
            the schedules.

    Returns:
        A new module. PrimFuncs that a rule scheduled carry ``tirx.is_scheduled``; the others
        (already scheduled, or no rule applied) are unchanged.
    """
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs.get("tirx.is_scheduled", False):
            continue
        new = _schedule_func(func, target)
        if new is not func:
            out[gvar] = new.with_attr("tirx.is_scheduled", True)
    return out


def cpu_schedule_pass(target) -> tvm.transform.Pass:
    """Returns ``schedule_module`` as a module pass, to insert into a custom pipeline."""
    return tvm.transform.module_pass(
        lambda mod, _ctx: schedule_module(mod, target), opt_level=0, name="DyntvmCPUSchedule"
    )


def build_cpu(mod: tvm.IRModule, target=None) -> relax.VMExecutable:
    """Compiles a Relax module for the CPU with fusion and the default schedules.

    Pipeline: DispatchSampling/DispatchSortScan -> LegalizeOps, AnnotateTIROpPattern,
    FoldConstant, FuseOps, FuseTIR (= the "zero" pipeline) -> ``schedule_module`` -> the CPU
    backend's dataflow-lowering and finalization passes -> ``tvm.compile``.

    Args:
        mod: Relax module; may hold several public functions and symbolic dims.
        target: LLVM target; ``cpu_target()`` when None.

    Returns:
        The executable, for ``relax.VirtualMachine(ex, tvm.cpu())``.
    """
    if target is None:
        target = cpu_target()
    elif not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    passes = (
        _cpu_pipeline.library_dispatch_passes(target)
        + _cpu_pipeline.legalize_passes(target)
        + [cpu_schedule_pass(target)]
        + _cpu_pipeline.dataflow_lower_passes(target)
        + _cpu_pipeline.finalize_passes(target)
    )
    with target:
        mod = tvm.transform.Sequential(passes)(mod)
    return tvm.compile(mod, target=target, relax_pipeline=None)


# ----------------------------------------------------------------------------------------------
# Analysis helpers


def _root_blocks(sch: s_tir.Schedule) -> list:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def _extent(sch: s_tir.Schedule, loop) -> int | tirx.PrimExpr:
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else ext


def _iter_kinds(sch: s_tir.Schedule, block) -> str:
    kinds = {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}
    return "".join(kinds.get(iv.iter_type, "O") for iv in sch.get(block).iter_vars)


def _loop_kinds(sch: s_tir.Schedule, block) -> str:
    """Per loop of a perfectly nested block: "R" if it drives a reduction iter, else "S".
    (Iter order can differ from loop order, e.g. after rfactor.)"""
    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body if loops else None
    if not isinstance(realize, SBlockRealize):
        raise ValueError("block is not perfectly nested")
    red_vars = set()
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        if iv.iter_type == tirx.IterVar.CommReduce:
            red_vars.update(tirx.analysis.undefined_vars(value, []))
    return "".join("R" if any(sch.get(lp).loop_var.same_as(v) for v in red_vars) else "S"
                   for lp in loops)


def _writes_param(func: tirx.PrimFunc, sch: s_tir.Schedule, block) -> bool:
    return any(w.source.same_as(p) for w in sch.get(block).writes for p in func.params)


def _is_cheap(sch: s_tir.Schedule, block) -> bool:
    return _EXPENSIVE_CALL.search(str(sch.get(block).body)) is None


def _inline_spatial(func: tirx.PrimFunc, sch: s_tir.Schedule) -> None:
    """Inlines intermediate spatial blocks into their consumers (elementwise chains, bias adds,
    reshapes). A block with an expensive call and several consumers (softmax's exp) is kept, to
    not compute it twice."""
    changed = True
    while changed:
        changed = False
        for block in _root_blocks(sch):
            if "R" in _iter_kinds(sch, block) or _writes_param(func, sch, block):
                continue
            if len(sch.get_consumers(block)) > 1 and not _is_cheap(sch, block):
                continue
            try:
                sch.compute_inline(block)
                changed = True
                break
            except Exception:  # pylint: disable=broad-except
                continue


def _block_work(sch: s_tir.Schedule, block) -> tirx.PrimExpr:
    """Iterations of a block's loop nest, weighted by the cost of its body."""
    work = tirx.IntImm("int64", _EXPENSIVE_WEIGHT if not _is_cheap(sch, block) else 1)
    for loop in sch.get_loops(block):
        work = work * tirx.Cast("int64", sch.get(loop).extent)
    return work


def _is_contraction(sch: s_tir.Schedule, block) -> bool:
    """True for ``C[s..., i, j] += A[.., k] * B[.., k, ..]`` with loops in iter order S..SR."""
    stmt = sch.get(block)
    kinds = _iter_kinds(sch, block)
    if not (kinds.endswith("SSR") and kinds.count("R") == 1 and "O" not in kinds):
        return False
    if len(sch.get_loops(block)) != len(kinds) or len(stmt.reads) < 2:
        return False
    store = stmt.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return False
    out_idx = [str(i) for i in store.indices]
    return out_idx == [str(iv.var) for iv in stmt.iter_vars[:-1]] and "*" in str(store.value)


def _is_column_reduction(sch: s_tir.Schedule, block) -> bool:
    """True when the innermost index of a read is the last spatial iter (``sum(x, axis=0)``):
    iterating the reduction inside each output element would stride through memory."""
    stmt = sch.get(block)
    kinds = _iter_kinds(sch, block)
    n_s = len(kinds) - len(kinds.lstrip("S"))
    if n_s == 0 or kinds[n_s:] != "R" * (len(kinds) - n_s):
        return False
    last_s = stmt.iter_vars[n_s - 1].var
    return any(r.region and r.region[-1].min.same_as(last_s) for r in stmt.reads)


# ----------------------------------------------------------------------------------------------
# Runtime dispatch between schedule variants


def _combine(then_func: tirx.PrimFunc, else_func: tirx.PrimFunc, cond) -> tirx.PrimFunc:
    """One PrimFunc running ``then_func``'s body if ``cond`` holds at run time, else
    ``else_func``'s. Both are schedules of the same PrimFunc, so they share params and
    buffers; their root allocations are merged."""
    blk_a, blk_b = then_func.body.block, else_func.body.block
    allocs = list(blk_a.alloc_buffers)
    allocs += [b for b in blk_b.alloc_buffers if not any(b.same_as(a) for a in allocs)]
    root = SBlock([], [], [], "root", tirx.IfThenElse(cond, blk_a.body, blk_b.body),
                  alloc_buffers=allocs, match_buffers=list(blk_a.match_buffers),
                  annotations=dict(blk_a.annotations))
    func = then_func.with_body(SBlockRealize([], True, root))
    # Loop/iter vars untouched by the schedules occur in both branches; the lowering's analyzer
    # rejects a var bound twice with different ranges, so give each definition its own var.
    return s_tir.transform.ConvertSSA()(tvm.IRModule({"main": func}))["main"]


def _select(func: tirx.PrimFunc, cands: list[tuple[tirx.PrimExpr, Callable]]) -> tirx.PrimFunc:
    """Builds the first candidate whose condition holds, as a runtime if-chain. Conditions that
    are provably false (assuming every symbolic dim >= 1) are dropped; the last one left is the
    default branch."""
    ana = tvm.sym.Analyzer()
    for param in func.params:
        for dim in getattr(param, "shape", []):
            if isinstance(dim, tirx.Var):
                ana.update(dim, tvm.sym.ConstIntBound(1, 1 << 40), override=True)
    live = []
    for cond, make in cands:
        cond = ana.simplify(cond)
        if isinstance(cond, tirx.IntImm) and not cond.value:
            continue
        live.append((cond, make))
        if isinstance(cond, tirx.IntImm):
            break
    result = live[-1][1]()
    for cond, make in reversed(live[:-1]):
        result = _combine(make(), result, cond)
    return result


def _parallel_cands(work: tirx.PrimExpr, target, make: Callable[[bool], tirx.PrimFunc]):
    """(condition, builder) pairs: serial below PARALLEL_MIN_WORK, parallel above."""
    serial = (work < tirx.IntImm("int64", PARALLEL_MIN_WORK), lambda: make(False))
    if int(target.attrs.get("num-cores", 1)) <= 1:
        return [(tirx.const(True, "bool"), lambda: make(False))]
    return [serial, (tirx.const(True, "bool"), lambda: make(True))]


def _and(a: tirx.PrimExpr, b: tirx.PrimExpr) -> tirx.PrimExpr:
    return tirx.And(a, b)


# ----------------------------------------------------------------------------------------------
# Rules. Each `_sched_*` builds one variant on a fresh schedule and returns the PrimFunc.


def _vector_lanes(target, dtype: str) -> int:
    bits = tvm.target.codegen.llvm_get_vector_width(target)
    return max(1, (bits if bits > 0 else 256) // tvm.DataType(dtype).bits)


def _pick_tile(extent, target: int, lanes: int) -> int | None:
    """Largest power-of-two multiple of `lanes` <= target dividing a static extent; the whole
    extent when it is small; None (leave the loop to LLVM) when symbolic or awkward."""
    if not isinstance(extent, int):
        return None
    if extent <= target:
        return extent
    tile = target
    while tile >= lanes:
        if extent % tile == 0:
            return tile
        tile //= 2
    divs = [d for d in range(lanes // 2, target + 1) if extent % d == 0 and d % 4 == 0]
    return max(divs) if divs else None


def _sched_matmul(func, target, name: str, mr: int, parallel: bool) -> tirx.PrimFunc:
    sch = s_tir.Schedule(func)
    _inline_spatial(func, sch)
    mm = sch.get_sblock(name)
    dtype = sch.get(mm).body.buffer.dtype
    lanes = _vector_lanes(target, dtype)
    n_batch = len(sch.get_loops(mm)) - 3
    m_ext = _extent(sch, sch.get_loops(mm)[-3])
    pads = []
    if _PAD_ROWS and mr > 1 and not (isinstance(m_ext, int) and m_ext % mr == 0):
        # A ragged row tile would put an `i < M` predicate inside the k loop (measured 2-3x
        # slower): pad M up to the tile instead. The input rows are copied per tile (K floats
        # per mr*nr*K MACs) and the padded result is written back under the same predicate.
        sch.pad_einsum(mm, [1] * n_batch + [mr, 1, 1])
        pads = list(sch.get_producers(mm))
        pads = [b for b in pads if sch.get(b).name_hint.endswith("_pad")]
        for copy in sch.get_consumers(mm):
            if not _writes_param(func, sch, copy):
                sch.compute_inline(copy)  # the epilogue reads the padded tile directly
    *batch, i, j, k = sch.get_loops(mm)
    n_ext, k_ext = _extent(sch, j), _extent(sch, k)
    nr = _pick_tile(n_ext, max(lanes, _TILE_COLS[mr]), lanes)
    io, ii = (i, None) if mr == 1 else sch.split(i, [None, mr])
    jo, ji = (None, j) if nr is None else sch.split(j, [None, nr])
    split_k = isinstance(k_ext, int) and k_ext % _REDUCE_SPLIT == 0 and k_ext > _REDUCE_SPLIT
    ko, ki = sch.split(k, [None, _REDUCE_SPLIT]) if split_k else (k, None)
    outer = [*batch, io] + ([jo] if jo is not None else [])
    sch.reorder(*outer, ko, *[lp for lp in (ki, ii) if lp is not None], ji)
    # Epilogue per tile: the accumulator tile stays in L1/registers and the buffer shrinks to
    # the tile (CompactBufferAllocation). A matmul writing the output gets a cache tile.
    epilogues = list(sch.get_consumers(mm))
    if _writes_param(func, sch, mm) and not epilogues:
        epilogues = [sch.cache_write(mm, 0, "global")]
    for pad in pads:
        sch.compute_at(pad, outer[-1], preserve_unit_loops=True)
        _vectorize_inner(sch, pad, target)
    attached = []
    for epi in epilogues:
        try:
            sch.reverse_compute_at(epi, outer[-1], preserve_unit_loops=True)
            attached.append(epi)
        except Exception:  # pylint: disable=broad-except
            pass
    if parallel:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    if ii is not None:
        sch.unroll(ii)
    if nr is not None:
        sch.vectorize(ji)
        for epi in attached:
            inner = sch.get_loops(epi)[-1]
            if _extent(sch, inner) == nr:
                sch.vectorize(inner)
    sch.decompose_reduction(mm, ko)
    return sch.mod["main"]


def _sched_reduction(func, target, parallel: bool) -> tirx.PrimFunc:
    """Row reductions (softmax, layer_norm, sum/max over trailing axes): every block computed
    per row, rows parallel, row-local elementwise work vectorized. A trailing reduction loop
    that the vector width divides is rfactor-ed into `lanes` partial results, so the sum/max
    itself is vectorized (LLVM cannot vectorize an fp max chain by itself)."""
    sch = s_tir.Schedule(func)
    _inline_spatial(func, sch)
    rf_names = set()
    for b in _root_blocks(sch):
        kinds, loops, stmt = _iter_kinds(sch, b), sch.get_loops(b), sch.get(b)
        if not kinds.endswith("R") or len(stmt.writes) != 1:
            continue
        lanes = _vector_lanes(target, stmt.writes[0].source.dtype)
        ext = _extent(sch, loops[-1])
        if lanes > 1 and isinstance(ext, int) and ext % lanes == 0 and ext >= 2 * lanes:
            try:
                _, r_in = sch.split(loops[-1], [None, lanes])
                rf = sch.rfactor(r_in, factor_axis=len(stmt.writes[0].region))
                rf_names.add(sch.get(rf).name_hint)
            except Exception:  # pylint: disable=broad-except
                pass  # e.g. argmax's two-buffer reduction: stays a scalar loop
    blocks = _root_blocks(sch)
    ana = tvm.sym.Analyzer()
    last_loops = sch.get_loops(blocks[-1])
    n_lead = min(len(k) - len(k.lstrip("S")) for k in (_loop_kinds(sch, b) for b in blocks))
    if n_lead == 0:
        raise ValueError("no leading spatial loop")
    for b in blocks:
        for lp, ref in zip(sch.get_loops(b)[:n_lead], last_loops[:n_lead]):
            if not ana.can_prove_equal(sch.get(lp).extent, sch.get(ref).extent):
                raise ValueError("blocks do not share their leading spatial loops")
    lead = last_loops[:n_lead]
    row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    for b in reversed(blocks[:-1]):
        sch.compute_at(b, row, preserve_unit_loops=True)
    if parallel:
        sch.parallel(row)
    for b in blocks:
        inner = sch.get_loops(b)[1:]
        if sch.get(b).name_hint in rf_names:
            kinds = _loop_kinds(sch, b)[1:]  # compute_at re-creates loops in iter order
            lane = [lp for lp, k in zip(inner, kinds) if k == "S"][-1]
            sch.reorder(*[lp for lp in inner if not lp.same_as(lane)], lane)
            sch.vectorize(lane)
            inner = sch.get_loops(b)[1:]
        if "R" in _iter_kinds(sch, b):
            if inner:  # after parallel/vectorize: both refuse a decomposed block
                sch.decompose_reduction(b, inner[0])
        elif inner:
            _vectorize_inner(sch, b, target)
    return sch.mod["main"]


def _sched_column_reduction(func, target, parallel: bool) -> tirx.PrimFunc:
    """A single reduction over a non-trailing axis (sum over axis 0): reduction loops moved
    outside the innermost spatial loop, which is vectorized; outer spatial loops parallel."""
    sch = s_tir.Schedule(func)
    _inline_spatial(func, sch)
    (block,) = [b for b in _root_blocks(sch) if "R" in _iter_kinds(sch, b)]
    kinds = _iter_kinds(sch, block)
    loops = sch.get_loops(block)
    n_s = kinds.index("R")
    if kinds[n_s:] != "R" * (len(kinds) - n_s) or n_s == 0:
        raise ValueError("not S..SR..R")
    spatial, red = loops[:n_s], loops[n_s:]
    sch.reorder(*red, spatial[-1])
    if parallel and len(spatial) > 1:
        sch.parallel(sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0])
    sch.decompose_reduction(block, red[0])
    return sch.mod["main"]


def _vectorize_inner(sch: s_tir.Schedule, block, target) -> None:
    """Explicitly vectorizes a static innermost loop that the vector width divides; symbolic or
    ragged loops are left to LLVM's loop vectorizer (a predicated TVM split would scalarize)."""
    inner = sch.get_loops(block)[-1]
    ext = _extent(sch, inner)
    lanes = _vector_lanes(target, sch.get(block).writes[0].source.dtype)
    if isinstance(ext, int) and ext >= lanes and ext % lanes == 0 and lanes > 1:
        sch.vectorize(sch.split(inner, [None, lanes])[1])


def _sched_injective(func, target, parallel: bool) -> tirx.PrimFunc:
    sch = s_tir.Schedule(func)
    _inline_spatial(func, sch)
    for block in _root_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            continue
        _vectorize_inner(sch, block, target)
        loops = sch.get_loops(block)
        vectorized = len(loops) > 1 and sch.get(loops[-1]).kind == tirx.ForKind.VECTORIZED
        outer = loops[:-1] if vectorized or len(loops) > 1 else loops
        if parallel and outer:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return sch.mod["main"]


# ----------------------------------------------------------------------------------------------
# Dispatch


def _schedule_func(func: tirx.PrimFunc, target) -> tirx.PrimFunc:
    """Schedules one PrimFunc, or returns it unchanged if no rule applies or a rule fails."""
    try:
        sch = s_tir.Schedule(func)
        _inline_spatial(func, sch)
        blocks = _root_blocks(sch)
        if not blocks:
            return func
        for b in blocks:  # rules assume perfect loop nests, one loop per block iter
            if len(sch.get_loops(b)) != len(sch.get(b).iter_vars) or "O" in _iter_kinds(sch, b):
                return func
        reductions = [b for b in blocks if "R" in _iter_kinds(sch, b)]
        work = _block_work(sch, blocks[0])
        for b in blocks[1:]:
            work = work + _block_work(sch, b)
    except Exception as err:  # pylint: disable=broad-except
        _LOG.debug("cpu_schedule: cannot analyze %s: %s", func, err)
        return func

    def par_rule(sched):
        return lambda: _select(func, _parallel_cands(
            work, target, lambda par: sched(func, target, par)))

    rules: list[tuple[str, Callable[[], tirx.PrimFunc]]] = []
    if len(reductions) == 1 and _is_contraction(sch, reductions[0]):
        name = sch.get(reductions[0]).name_hint
        i_ext = sch.get(sch.get_loops(reductions[0])[-3]).extent
        rules.append(("matmul", lambda: _matmul_select(func, target, name, i_ext, work)))
    if len(reductions) == 1 and len(blocks) == 1 and _is_column_reduction(sch, reductions[0]):
        rules.append(("column_reduction", par_rule(_sched_column_reduction)))
    if reductions:
        rules.append(("row_reduction", par_rule(_sched_reduction)))
    else:
        rules.append(("injective", par_rule(_sched_injective)))
    for label, rule in rules:
        try:
            new = rule()
            _LOG.debug("cpu_schedule: %s rule applied to\n%s", label, func)
            return new
        except Exception as err:  # pylint: disable=broad-except
            _LOG.debug("cpu_schedule: %s rule failed: %s\n%s", label, err, func)
    return func


def _matmul_select(func, target, name: str, m_ext, work) -> tirx.PrimFunc:
    """Matmul variants: a 1-row tile (GEMV-like, wide vector columns) while M < 4, a 4-row tile
    otherwise; each serial below PARALLEL_MIN_WORK MACs. Static M picks one at compile time."""
    if isinstance(m_ext, tirx.IntImm):
        m = int(m_ext.value)
        mrs = [(tirx.const(True, "bool"), max(1, min(m, _MATMUL_MR)))]
    else:
        mrs = [(m_ext < tirx.IntImm(str(m_ext.ty), _MATMUL_MR), 1), (tirx.const(True, "bool"), _MATMUL_MR)]
    cands = []
    for m_cond, mr in mrs:
        for p_cond, make in _parallel_cands(
                work, target, lambda par, mr=mr: _sched_matmul(func, target, name, mr, par)):
            cands.append((_and(m_cond, p_cond), make))
    return _select(func, cands)
