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

Convolutions (`te_conv`'s kernels) have schedules of their own (`cpu_schedule_conv`).

Files: this module (target, pipeline, runtime dispatch and the schedule rules), `cpu_inline` (which
spatial blocks are inlined: within a budget that keeps compile time linear in chain length),
`cpu_sched_helpers` (TIR analysis and loop helpers the rules share), `cpu_fast_math` (the fp32 math
legalizations).
"""

from __future__ import annotations

import logging
import os

import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.backend.cpu_generic import pipeline as _cpu_pipeline

from ....ir.vm_program import ELEMENT_ALIGNED_FUNCTION
from ...branch_storage import after_planning
from ...compiled_loops import loop_pass
from ...fusion_guard import opaque_shape_scalar_kernels
from .cpu_fast_math import FAST_MATH, LANES_SUFFIX
from .cpu_inline import inline_spatial
from .cpu_schedule_conv import conv_block_name, conv_select
from .cpu_schedule_pool import pool_block_name, pool_select
from .cpu_schedule_dispatch import _parallel_cands, _select
from .cpu_prepack import prepack_weights
from .cpu_schedule_fuse import CONTRACTION_GROUP, merge_contractions
from .cpu_schedule_matmul import _MATMUL_MR, PACK_MIN_ROWS, _group_select, _sched_matmul, exact_tile, matmul_rows
from .cpu_schedule_reduce import (LANES_PREFIX, _lanes_select, _reduced_axis, _sched_axis_reduction,
                                  _sched_interleaved_rows, interleaved_rows_fit)
from ...dims import is_one
from .cpu_sched_helpers import (child_blocks, is_column_reduction, is_contraction, iter_kinds, loop_extent,
                                loop_kinds, total_work, vector_lanes, vectorize_inner)
from ...te_kernels import SERIAL_CHECK

_LOG = logging.getLogger(__name__)

#: Injective kernels with a symbolic dim fuse their loops for the parallel loop up to the last dim when it has at
#: most this many elements (`_sched_injective`).
INJECTIVE_ROW_MAX = 1024
#: Merge matmul kernels with their epilogue matmuls and consumers (`cpu_schedule_fuse`); a switch for A/B.
FUSE_CONTRACTIONS = True
#: Reductions over a symbolic trailing axis: several rows side by side (`_sched_interleaved_rows`); a switch for A/B.
INTERLEAVE_ROWS = True


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


def schedule_module(mod: tvm.IRModule, target, tuned=None) -> tvm.IRModule:
    """Applies the CPU schedule rules to every PrimFunc of a legalized, fused module.

    Args:
        mod: Module after legalization and fusion (``legalize_and_fuse`` or the "zero"
            pipeline). Not modified.
        target: LLVM target (``cpu_target()``): its ``num-cores`` and vector width are used.
        tuned: ``tuned(func) -> PrimFunc | None``: a tuned schedule (from a tuning log) used instead of
            the rules where it returns one.

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
            new = tuned(func) if tuned is not None else None
            new = _schedule_func(func, target, gvar.name_hint) if new is None else new
            if new is not func:
                out[gvar] = new.with_attr("tirx.is_scheduled", True)
    return out


def cpu_schedule_pass(target, tuned=None) -> tvm.transform.Pass:
    """Returns ``schedule_module`` as a module pass, for custom pipelines."""
    return tvm.transform.module_pass(
        lambda mod, _ctx: schedule_module(mod, target, tuned), opt_level=0, name="DyntvmCPUSchedule")


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
        relax.transform.AnnotateTIROpPattern(), opaque_shape_scalar_kernels, relax.transform.FoldConstant(),
        relax.transform.FuseOps()]
        + ([merge_contractions(target)] if FUSE_CONTRACTIONS else [])
        + [relax.transform.FuseTIR(), prepack_weights(target)])


def fuse_passes(target) -> list:
    """The passes before scheduling: library dispatch, legalization and fusion (what tuning tasks come from)."""
    return _cpu_pipeline.library_dispatch_passes(target) + [legalize_and_fuse(target)]


def build_cpu(mod: tvm.IRModule, target=None, loops=(), tuned=None, program=None) -> relax.VMExecutable:
    """Compiles a Relax module for the CPU with fusion and the default schedules.

    Pipeline: DispatchSampling, DispatchSortScan -> ``legalize_and_fuse`` ->
    ``schedule_module`` -> the dataflow-lowering and finalization passes of
    ``relax.backend.cpu_generic`` (as in its default pipeline; `branch_storage.scope_branch_storage` after its
    StaticPlanBlockMemory) -> ``tvm.compile``.

    Args:
        mod: Relax module; may hold several public functions and symbolic dims.
        target: LLVM target; ``cpu_target()`` when None.
        loops: foreach loops to compile end to end, added after scheduling (`compiled_loops.loop_pass`).
        tuned: tuned schedules to use where they exist (see ``schedule_module``).
        program: a module pass adding the VM program after the compiled loops (`vm_program.program_pass`).

    Returns:
        The executable, for ``relax.VirtualMachine(ex, tvm.cpu())``.
    """
    target = cpu_target() if target is None else target
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    passes = (fuse_passes(target) + [cpu_schedule_pass(target, tuned)]
              + ([loop_pass(list(loops))] if loops else [])
              + ([program] if program is not None else [])
              + _cpu_pipeline.dataflow_lower_passes(target)
              + after_planning(_cpu_pipeline.finalize_passes(target)))
    with target:
        mod = tvm.transform.Sequential(passes)(mod)
    # VMShapeLower's `shape_func` (present whenever a dim is symbolic) lacks "tirx.noalias", and
    # one such function in the LLVM module made LLVM keep every matmul accumulator in memory (a
    # store per FMA, 2.5x slower). It has a single buffer param, so noalias holds trivially.
    for gvar, func in list(mod.functions_items()):
        if (isinstance(func, tirx.PrimFunc) and len(func.params) <= 1
                and not func.attrs.get("tirx.noalias", False)):
            mod[gvar] = func.with_attr("tirx.noalias", True)
    # a program that passes numpy inputs unaligned (`vm_program.ELEMENT_ALIGNED_INPUTS`): kernels without 64-byte hints
    element_aligned = any(g.name_hint == ELEMENT_ALIGNED_FUNCTION for g in mod.get_global_vars())
    with _lowering_context():
        return tvm.compile(mod, target=target, relax_pipeline=None, tir_pipeline=tir_pipeline(element_aligned))


def tir_pipeline(element_aligned: bool = False) -> str:
    """The name of a CPU build's TIR pipeline (registered once a combination): TVM's, then (`te_conv.STRIDED_LANES`)
    lane-strided loads written as contiguous loads and a shuffle (`cpu_strided_loads`), then, for a library whose
    program passes numpy inputs unaligned (`element_aligned`: `vm_program.ELEMENT_ALIGNED_INPUTS`), the arguments'
    alignment hints of one element (`cpu_alignment`)."""
    from tvm.tirx import compilation_pipeline

    from ...te_conv import STRIDED_LANES
    from .cpu_alignment import element_aligned_pass
    from .cpu_strided_loads import strided_loads_pass
    extra = [p for p, on in ((strided_loads_pass, STRIDED_LANES), (element_aligned_pass, element_aligned)) if on]
    if not extra:
        return "default"
    name = "dyntvm_cpu:" + "+".join(p.info.name for p in extra)

    def make(**kwargs):
        base, host, device = compilation_pipeline.get_tir_pipeline("s_tir", **kwargs)
        return tvm.transform.Sequential([base, *extra]), host, device
    compilation_pipeline.PIPELINE_MAP.setdefault(name, make)
    return name


#: TIR's LoopPartition config for CPU builds: a partition of one iteration stays a loop. Unrolled, TVM 0.27
#: substituted an int32 0 for the int64 loop variable after NarrowDataType, and the build failed (mismatched types)
#: for the column loops of the padded copies `te_conv._padded(split_columns=True)` marks ``likely``.
_LOOP_PARTITION = {"no_unroll_loop_with_extent_one": True}


def _lowering_context():
    """The current PassContext with `_LOOP_PARTITION` added (unless it sets its own)."""
    cur = tvm.transform.PassContext.current()
    if "s_tir.LoopPartition" in cur.config:
        return cur
    config = dict(cur.config.items())
    config["s_tir.LoopPartition"] = _LOOP_PARTITION
    return tvm.transform.PassContext(opt_level=cur.opt_level, required_pass=list(cur.required_pass),
                                     disabled_pass=list(cur.disabled_pass), instruments=list(cur.instruments),
                                     config=config)


# ---------------------------------------------------------------- rules (one variant each)


def _sched_reduction(func, target, parallel: bool) -> tirx.PrimFunc:
    """Rows (softmax, layer_norm, sum/max over trailing axes): all blocks computed per row, rows
    parallel, row-local elementwise work vectorized. A trailing reduction loop the vector width
    divides is rfactor-ed into `lanes` partial results, vectorizing the sum/max itself. An intermediate of
    symbolic row length that the last block reads element by element (softmax's exp) is kept in the output's
    row (`_row_in_output`)."""
    sch = s_tir.Schedule(func)
    in_output = _row_in_output(sch, func)
    rf_names = set()
    for b in child_blocks(sch):
        loops, stmt = sch.get_loops(b), sch.get(b)
        if not iter_kinds(sch, b).endswith("R") or len(stmt.writes) != 1:
            continue
        if stmt.name_hint.endswith(LANES_SUFFIX) and iter_kinds(sch, b).endswith("SR"):
            rf_names.add(stmt.name_hint)  # partial results per lane already (`cpu_fast_math._row_reduce`)
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
    if in_output is not None and n_lead:
        return _alias_buffer(sch.mod["main"], *in_output)
    return sch.mod["main"]


def _row_in_output(sch: s_tir.Schedule, func: tirx.PrimFunc):
    """(intermediate, output) where the last block of a row kernel reads an intermediate of the output's shape
    and dtype at the very index it writes (softmax: ``out[i] = exp[i] / sum[row]``), written by one spatial block,
    over a symbolic row length; else None. Such a row, computed per row (`_sched_reduction`), is a workspace
    of symbolic size allocated and freed on every row (TVMBackendAllocWorkspace inside the row loop); the
    output's own row holds it instead, the last block updating it in place."""
    blocks = child_blocks(sch)
    last = sch.get(blocks[-1])
    if len(blocks) < 2 or len(last.writes) != 1 or "R" in iter_kinds(sch, blocks[-1]):
        return None
    out = last.writes[0].source
    if not any(out.same_as(p) for p in func.params) or isinstance(out.shape[-1], tirx.IntImm):
        return None
    ana, at = tvm.sym.Analyzer(), [str(r.min) for r in last.writes[0].region]
    for rd in last.reads:
        buf = rd.source
        if (any(buf.same_as(p) for p in func.params) or buf.dtype != out.dtype or len(buf.shape) != len(out.shape)
                or not all(ana.can_prove_equal(a, b) for a, b in zip(buf.shape, out.shape))
                or [str(r.min) for r in rd.region] != at or not all(is_one(r.extent) for r in rd.region)):
            continue
        writers = [b for b in blocks if any(w.source.same_as(buf) for w in sch.get(b).writes)]
        if len(writers) == 1 and "R" not in iter_kinds(sch, writers[0]):
            return buf, out
    return None


def _alias_buffer(func: tirx.PrimFunc, buf, out) -> tirx.PrimFunc:
    """`func` with the intermediate `buf` stored in `out` (same shape and dtype; `_row_in_output`)."""
    import tvm_ffi
    from tvm.s_tir import SBlock

    def block(b, mutator):
        b = mutator.default_mutate(b)
        keep = [a for a in b.alloc_buffers if not a.same_as(out)]
        if len(keep) == len(b.alloc_buffers):
            return b
        return SBlock(b.iter_vars, b.reads, b.writes, b.name_hint, b.body, b.init, keep, b.match_buffers,
                      b.annotations)
    return func.with_body(tvm_ffi.structural_mutate(func.body, [
        (SBlock, block), (tirx.Buffer, lambda b, _m: out if b.same_as(buf) else b),
        (tvm.ir.expr.Var, lambda v, _m: out.data if v.same_as(buf.data) else v)]))


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
            inner = loop_extent(sch, loops[n_loops - 1])
            if (len(loops) > n_loops > 1 and isinstance(inner, int) and inner <= INJECTIVE_ROW_MAX
                    and any(not isinstance(loop_extent(sch, lp), int) for lp in loops[:n_loops - 1])):
                # a symbolic dim among the fused loops: the vector loop's outer part stays out of the fusion,
                # whose index is split by divisions by a symbolic extent, once per row instead of once per
                # vector (the transformer's head split / transposes, [B, S, 128] -> [B, 4, S, 32]: 64-bit
                # divisions per 8 floats)
                rows = loops[:n_loops - 1]
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
    conv = conv_block_name(sch)
    if conv is not None:    # the original func: its padded input stays a block (`cpu_schedule_conv`)
        rules.append(("conv", lambda: conv_select(func, target, conv)))
    pool = pool_block_name(sch) if conv is None else None
    if pool is not None:    # the original func: its padded input stays a block (`cpu_schedule_pool`)
        rules.append(("max_pool", lambda: pool_select(func, target, pool)))
    if name.startswith(CONTRACTION_GROUP):
        rules.append(("contraction_group", lambda: _group_select(inlined, target, work)))
    if lanes:
        rules.append(("lanes", lambda: _lanes_select(inlined, target)))
    elif len(reductions) == 1 and is_contraction(sch, reductions[0]):
        name = sch.get(reductions[0]).name_hint
        m_ext = sch.get(sch.get_loops(reductions[0])[-3]).extent
        rules.append(("matmul", lambda: _matmul_select(inlined, target, name, m_ext, work)))
    if INTERLEAVE_ROWS and not lanes and interleaved_rows_fit(sch):
        rules.append(("interleaved_rows", by_size(_sched_interleaved_rows)))
    if len(reductions) == 1 and is_column_reduction(sch, reductions[0]):
        rules.append(("column_reduction", by_size(_sched_column_reduction)))
    if reductions and not lanes and _reduced_axis(sch) is not None:
        rules.append(("axis_reduction", by_size(_sched_axis_reduction)))
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
    """A 1-row tile (GEMV-like, wide vector columns) while M < 4, else the ISA's row tile
    (`matmul_rows`), from PACK_MIN_ROWS rows with packed weight panels; each serial below
    PARALLEL_MIN_WORK MACs. A static M picks its variant at compile time, a symbolic one at run time."""
    true = tirx.const(True, "bool")
    mr = matmul_rows(target)
    if isinstance(m_ext, tirx.IntImm):  # a row tile dividing M avoids the `i < M` predicate
        m = int(m_ext.value)
        mrs = [(true, next((t for t in (mr, 4, 6, 3, 2) if m % t == 0), mr)
                if m >= _MATMUL_MR else max(1, m), m >= PACK_MIN_ROWS)]
    else:
        rows = lambda n: tirx.IntImm(str(m_ext.ty), n)  # noqa: E731
        # below PACK_MIN_ROWS a 4-row tile whatever the ISA's: small batches are mostly multiples of 4, which a
        # 6-row tile pads (8 rows computed as 12: branchy's B=8 heads)
        mrs = [(m_ext < rows(_MATMUL_MR), 1, False), (m_ext < rows(PACK_MIN_ROWS), _MATMUL_MR, False),
               (true, mr, True)]
    # Symbolic M / N that are multiples of a tile (attention's S, a batch x sequence row count) first get a
    # variant without padding or predicates (`_sched_matmul`'s `exact`): the ISA's row tile, else 4 rows
    variants = []
    for m_cond, mr_, pack in mrs:
        for t in dict.fromkeys((mr_, _MATMUL_MR)) if mr_ > 1 else ():
            tile = exact_tile(func, name, t, target)
            if tile is not None:
                variants.append((tirx.And(m_cond, tile[0]), t, pack, True))
        variants.append((m_cond, mr_, pack, False))
    cands = []
    for m_cond, mr, pack, exact in variants:
        for p_cond, make in _parallel_cands(
                work, target, lambda par, mr=mr, pack=pack, exact=exact: _sched_matmul(
                    func, target, name, mr, par, pack=pack, exact=exact)):
            cands.append((tirx.And(m_cond, p_cond), make))
    return _select(func, cands)
