"""A GPU schedule for the reductions dlight's default rules leave to `Fallback`.

dlight's `Reduction` rule takes only sums (``X = X + Y``) and `GeneralReduction` only reductions followed by an
elementwise block, so a lone max / min / argmax-style reduction (`te_kernels.te_first_index`, the ordered-key max
of `te_kernels.te_nan_reduce_keyed`) was scheduled by `Fallback`: one thread per output element looping over the
whole reduced extent. On an H200 that made the greedy decode's max and argmax over 1000 logits 98 and 88 us each,
against ~2 us for the step's matmuls (benchmarks/README.md, GPU section).

`InnerReduction` gives such a kernel dlight's own cross-thread form (`Reduction._sch_inner_reduction`): one
thread block per output element, the reduced extent split over its threads (`rfactor`: each thread reduces a
strided slice, then the partial results are combined across the block), an injective epilogue computed in the
same block. `rfactor` accepts the reducers TVM recognises (sum, product, min, max, bitwise ones); a reducer it does
not recognise makes the rule decline, as does a reduction over a short or non-innermost extent (threads over the
outputs, `Fallback`'s form, read memory contiguously there).

A reduction to one value (no spatial extent: ``max(abs(h))`` over all of ``h``) is never left to `Fallback`: with no
spatial loop to bind, its reduction loops stayed on the host and every element was a kernel launch of its own
(branchy's ``max`` over [B, 32] launched 32 B kernels per call: ~2 ms at B = 16 on an H200). It gets one block
whose threads each reduce a strided slice and combine across the block (TVM's cross-thread reduction, no
`rfactor`: TVM 0.27's rfactor fails on a block whose only spatial loop is a unit loop), whatever its extent; the
decoding epilogue of a keyed max / min runs as a one-thread kernel after it.
"""
from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

#: a reduced extent shorter than this stays one thread per output (the threads would mostly idle)
MIN_REDUCED = 64
#: threads per block: a power of two up to this, no more than the reduced extent needs
MAX_THREADS = 256


def _threads(extent) -> int:
    if not isinstance(extent, (int, tirx.IntImm)):
        return MAX_THREADS
    n = 32
    while n < MAX_THREADS and n < int(extent):
        n *= 2
    return n


def lone_reduction(func):
    """(schedule, reduction block info, epilogue info or None) of a PrimFunc that is one reduction block and at
    most one injective epilogue (after inlining contiguous spatial blocks), else None."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    infos = try_inline_contiguous_spatial(sch, infos)
    if not infos or len(infos) > 2:
        return None
    red, epilogue = infos[0], (infos[1] if len(infos) == 2 else None)
    if not red.is_reduction() or (epilogue is not None and not epilogue.is_injective()):
        return None
    return sch, red, epilogue


def _spatial_then_reduced(sch, red) -> tuple:
    """The reduction block's spatial and reduced loops, reordered spatial first."""
    s_loops = [it.loop_rv for it in red.iters if it.kind == "S"]
    r_loops = [it.loop_rv for it in red.iters if it.kind == "R"]
    sch.reorder(*s_loops, *r_loops)
    return s_loops, r_loops


def _is_one(extent) -> bool:
    return isinstance(extent, (int, tirx.IntImm)) and int(extent) == 1


def _reduced_extent(info):
    extent = 1
    for it in info.iters:
        if it.kind == "R":
            extent = extent * it.dom
    return extent


def _innermost_read_is_reduced(block, info) -> bool:
    """Whether the last index of the block's widest read (the tensor reduced) uses a reduced iter: consecutive
    threads then read consecutive addresses. (dlight's iter-sum analysis gives up on the int32 reduce var of a
    TE reduction next to int64 spatial ones, so the index's vars are read directly.)"""
    import tvm_ffi
    reads = [r for r in block.reads if len(r.region) > 0]
    if not reads:
        return False
    widest = max(reads, key=lambda r: len(r.region))
    reduced = {it.var for it in info.iters if it.kind == "R"}
    found = []
    tvm_ffi.structural_walk(widest.region[-1].min, (tirx.Var, lambda v: found.append(v)), order="post")
    return any(v in reduced for v in found)


class InnerReduction(GPUScheduleRule):
    """One thread block per output element, the reduced extent split over its threads (see the module doc)."""

    to_one_only = False

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        prepared = self._prepare(func)
        if prepared is None:
            return None
        sch, red, epilogue = prepared
        extent = _reduced_extent(red)
        to_one = all(it.kind != "S" or _is_one(it.dom) for it in red.iters)      # a reduction to one value
        if self.to_one_only and not to_one:
            return None
        short = isinstance(extent, (int, tirx.IntImm)) and int(extent) < MIN_REDUCED
        if not short:
            try:
                if _innermost_read_is_reduced(sch.get(red.block_rv), red):
                    self._schedule(sch, red, epilogue, _threads(extent))
                    return sch
            except (s_tir.ScheduleError, ValueError, AssertionError, RuntimeError):  # a reducer rfactor does not take
                pass
            if not to_one:
                return None
            sch, red, epilogue = self._prepare(func)         # the failed attempt left `sch` half scheduled
        if not to_one:
            return None
        try:
            self._schedule_to_one(sch, red, epilogue, _threads(extent))
            s_tir.transform.LowerCrossThreadReduction()(sch.mod)    # a reducer TVM cannot combine across threads
        except (s_tir.ScheduleError, ValueError, AssertionError, RuntimeError):
            return None
        return sch

    @staticmethod
    def _prepare(func):
        """`lone_reduction`, of one output written by a reduction over a reduced iter."""
        found = lone_reduction(func)
        if found is None:
            return None
        sch, red, _ = found
        if "R" not in red.dom_kind() or len(sch.get(red.block_rv).writes) != 1:
            return None
        return found

    @staticmethod
    def _schedule_to_one(sch, red, epilogue, len_tx: int) -> None:
        """One block: thread t reduces elements t, t + len_tx, ..., then the block combines (see the module doc)."""
        block_rv = red.block_rv
        s_loops, r_loops = _spatial_then_reduced(sch, red)
        r = sch.fuse(*r_loops)
        r_outer, tx = sch.split(r, factors=[None, len_tx])
        sch.reorder(tx, r_outer)
        sch.bind(tx, "threadIdx.x")
        if s_loops:
            sch.bind(sch.fuse(*s_loops), "blockIdx.x")
        if epilogue is not None:
            loops = sch.get_loops(epilogue.block_rv)
            sch.bind(sch.fuse(*loops) if loops else sch.add_unit_loop(epilogue.block_rv), "threadIdx.x")

    @staticmethod
    def _schedule(sch, red, epilogue, len_tx: int) -> None:
        block_rv = red.block_rv
        s_loops, r_loops = _spatial_then_reduced(sch, red)
        if s_loops:
            sch.fuse(*s_loops)
        else:
            sch.add_unit_loop(block_rv)
        r = sch.fuse(*r_loops)
        _, tx = sch.split(r, factors=[None, len_tx])
        rf = sch.rfactor(tx, 0)                     # partial results per thread, in registers
        bx, r_outer, tx, *_ = sch.get_loops(rf)
        sch.reorder(bx, tx, r_outer)
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.annotate(tx, ann_key="pragma_auto_unroll_max_step", ann_val=256)
        sch.annotate(tx, ann_key="pragma_unroll_explicit", ann_val=1)
        sch.set_scope(rf, 0, "local")
        sch.decompose_reduction(rf, r_outer)
        sch.reverse_compute_at(block_rv, bx, preserve_unit_loops=True)     # the combine across the block
        _, tx2, *rest = sch.get_loops(block_rv)
        if rest:
            sch.reorder(sch.fuse(*rest), tx2)
        sch.bind(tx2, "threadIdx.x")
        if epilogue is not None:
            sch.reverse_compute_at(epilogue.block_rv, bx, preserve_unit_loops=True)
            sch.set_scope(block_rv, 0, "local")


class ReductionToOne(InnerReduction):
    """`InnerReduction` for reductions to one value only, placed before dlight's `GeneralReduction`, which takes
    a lone max / min to one value and leaves its loops on the host (a kernel launch per element)."""

    to_one_only = True
