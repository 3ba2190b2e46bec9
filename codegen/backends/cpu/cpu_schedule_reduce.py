"""CPU schedules of reductions the row rule (`cpu_schedule._sched_reduction`) does not fit: full reductions
of a 1-d input (`te_kernels.te_lane_reduce`: `_lanes_select`) and row-like kernels over a non-trailing axis
(softmax over axis 0: `_sched_axis_reduction`) and reductions of static rows over a symbolic trailing axis (a global
average pool's sum over [H, W]: `_sched_interleaved_rows`)."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from . import cpu_sched_helpers
from .cpu_schedule_dispatch import _select
from .cpu_sched_helpers import (child_blocks, iter_kinds, loop_extent, loop_kinds, vector_lanes, vectorize_inner,
                                vectorize_tile)
from ...te_kernels import LANE_BLOCK, LANE_ROW

LANES_PREFIX = "dt_lanes_"  # blocks of `te_kernels.te_lane_reduce`
# Full reductions of a 1-d input run in parallel from this many elements. Measured (2 threads vs 1, warm
# thread pool): sum / max / argmax 0.3-0.6x at 8k-16k, 0.9x at 32k, 1.0-1.1x at 64k, 1.2x at 128k,
# 1.3-1.5x at 256k-1M.
LANES_PARALLEL_MIN = 1 << 17


def _reduced_axis(sch: s_tir.Schedule) -> int | None:
    """The axis A of `_sched_axis_reduction`'s pattern (spatial blocks over one (outer.., A, inner..) domain,
    the last block spatial, every reduction over A alone, A not the last axis), else None."""
    blocks = child_blocks(sch)
    reds = [b for b in blocks if "R" in iter_kinds(sch, b)]
    spatial = [b for b in blocks if "R" not in iter_kinds(sch, b)]
    if not reds or not spatial or not sch.get(blocks[-1]).same_as(sch.get(spatial[-1])):
        return None
    dims = sch.get_loops(spatial[-1])
    ana = tvm.sym.Analyzer()
    axes = set()
    for r in reds:
        kinds = iter_kinds(sch, r)
        if kinds.count("R") != 1 or not kinds.endswith("R") or len(kinds) != len(dims):
            return None
        rvar = sch.get(r).iter_vars[-1].var
        axes |= {i for rd in sch.get(r).reads for i, rg in enumerate(rd.region)
                 if len(rd.region) == len(dims) and rg.min.same_as(rvar)}
    if len(axes) != 1 or next(iter(axes)) == len(dims) - 1:
        return None
    for b in spatial:
        if len(sch.get_loops(b)) != len(dims) or not all(
                ana.can_prove_equal(sch.get(lp).extent, sch.get(d).extent) for lp, d in zip(sch.get_loops(b), dims)):
            return None
    return next(iter(axes))


def _sched_axis_reduction(func, target, parallel: bool) -> tirx.PrimFunc:
    """Row-like kernels over a non-trailing axis (softmax / log_softmax over axis 1 of (B, N, D)): every
    spatial block over the full (outer.., A, inner..) domain, every reduction over A. Per tile of the
    contiguous inner dims (all outer dims, tiles parallel) each block runs over A with the inner tile as
    vectors: the reductions accumulate a vector per step of A, nothing strides through memory."""
    sch = s_tir.Schedule(func)
    axis = _reduced_axis(sch)
    if axis is None:
        raise ValueError("not a reduction over a non-trailing axis")
    blocks = child_blocks(sch)
    anchor = blocks[-1]
    dims = sch.get_loops(anchor)
    outer, a_loop, inner = dims[:axis], dims[axis], dims[axis + 1:]
    inn = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    ext = loop_extent(sch, inn)
    lanes = vector_lanes(target, sch.get(anchor).writes[0].source.dtype)
    tile = next((c for c in (64, 32, 16) if isinstance(ext, int) and ext % c == 0 and c % lanes == 0), None)
    if tile is None:
        raise ValueError("inner dims not a multiple of the vector width")
    inn_o, inn_i = sch.split(inn, [None, tile])
    sch.reorder(*outer, inn_o, a_loop, inn_i)
    unit = sch.fuse(*outer, inn_o) if outer else inn_o
    for b in reversed(blocks[:-1]):
        sch.compute_at(b, unit, preserve_unit_loops=True)
    if parallel:
        sch.parallel(unit)
    for b in blocks:
        loops = sch.get_loops(b)[1:]
        if "R" in iter_kinds(sch, b):
            r_loop = [lp for lp, k in zip(loops, loop_kinds(sch, b)[1:]) if k == "R"][0]
            others = [lp for lp in loops if not sch.get(lp).same_as(sch.get(r_loop))]
            sch.reorder(r_loop, *others)
            vectorize_tile(sch, sch.get_loops(b)[-1], tile, lanes, unroll=True)
            sch.decompose_reduction(b, r_loop)
        else:
            vectorize_tile(sch, loops[-1], tile, lanes, unroll=False)
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
            copy = sch.cache_write(block, 0, cpu_sched_helpers.TILE_SCOPE)
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
    need = LANES_PARALLEL_MIN // (LANE_ROW * LANE_BLOCK)
    # one core: no parallel variant, but still the two branches (TVM 0.27's TIR CSE hoisted a bound of the lane
    # argmax / argmin out of the loop that defines it in the lone variant: "Instruction does not dominate all uses")
    parallel = int(target.attrs.get("num-cores", 1)) > 1
    return _select(func, [(nblk < tirx.IntImm(str(nblk.ty), need), lambda: _sched_lanes(func, target, False)),
                          (true, lambda: _sched_lanes(func, target, parallel))])


#: Rows reduced side by side by `_sched_interleaved_rows` (each its own accumulator): the largest of these that
#: divides the row loop's extent.
INTERLEAVED_ROWS = (8, 4, 2)


def interleaved_rows_fit(sch: s_tir.Schedule) -> bool:
    """Whether `_sched_interleaved_rows` applies: one block, spatial loops then reduction loops, the innermost
    reduction loop symbolic, the last non-unit spatial loop static and a multiple of an INTERLEAVED_ROWS factor."""
    return _interleave_plan(sch) is not None


def _interleave_plan(sch: s_tir.Schedule):
    """(block, spatial loops, reduction loops, index of the row loop, factor) for `_sched_interleaved_rows`, or
    None."""
    blocks = child_blocks(sch)
    if len(blocks) != 1:
        return None
    block = blocks[0]
    kinds = iter_kinds(sch, block)
    n_s = len(kinds) - len(kinds.lstrip("S"))
    loops = sch.get_loops(block)
    if ("R" not in kinds or kinds != "S" * n_s + "R" * (len(kinds) - n_s) or len(loops) != len(kinds)
            or len(sch.get(block).writes) != 1):
        return None
    spatial, red = loops[:n_s], loops[n_s:]
    if isinstance(loop_extent(sch, red[-1]), int):
        return None     # a static innermost reduction: the row rule vectorizes it
    rows = [i for i, lp in enumerate(spatial) if loop_extent(sch, lp) != 1]
    if not rows or not isinstance(loop_extent(sch, spatial[rows[-1]]), int):
        return None
    ext = loop_extent(sch, spatial[rows[-1]])
    factor = next((f for f in INTERLEAVED_ROWS if ext % f == 0), None)
    return None if factor is None else (block, spatial, red, rows[-1], factor)


def _sched_interleaved_rows(func, target, parallel: bool) -> tirx.PrimFunc:
    """One reduction over trailing axes whose innermost is symbolic (a global average pool's sum over [H, W]):
    `_sched_reduction` cannot rfactor it into vector lanes, and it was one dependent add per element (~1 ns, the
    add's latency; mobilenet_v3_small's SE means at ~1 GFLOP/s). Here INTERLEAVED_ROWS rows (channels) are
    reduced side by side, unrolled innermost, each into its own accumulator (a small stack tile LLVM keeps in
    registers): independent adds, bound by the loads. Rows outside parallel."""
    del target
    sch = s_tir.Schedule(func)
    plan = _interleave_plan(sch)
    if plan is None:
        raise ValueError("not a reduction of static rows over a symbolic trailing axis")
    block, spatial, red, row, factor = plan
    outer, inner = sch.split(spatial[row], [None, factor])
    head = [*spatial[:row], outer]
    units = spatial[row + 1:]
    sch.reorder(*head, *units, *red, inner)
    acc = sch.cache_write(block, 0, "global")
    sch.reverse_compute_at(acc, units[-1] if units else head[-1], preserve_unit_loops=True)
    if parallel:
        sch.parallel(sch.fuse(*head) if len(head) > 1 else head[0])
    sch.unroll(inner)
    sch.unroll(next(lp for lp in sch.get_loops(acc) if loop_extent(sch, lp) == factor))
    sch.decompose_reduction(block, red[0])
    return sch.mod["main"]
