"""CPU schedules of the convolutions `te_conv` writes (`cpu_schedule` dispatches here by block name), with
the epilogue that fusion gives them (bias, batch norm, activation, residual add) computed per register tile.

* ``dt_conv_ocv`` (output channels in blocks of vb, the weight packed): the register tile is vb output
  channels (vector lanes) x `tw` output positions of a row (`te_conv.row_tile`: up to 14 accumulators); the
  reduction over input channels x kernel taps loads one weight vector per tap and FMAs it with `tw`
  broadcast input values (TVM's x86 ``conv2d_NCHWc`` / NeoCPU micro-kernel, without the NCHWc data
  layout: the tile is written back to NCHW, once per output). Parallel over output-channel blocks x rows.
* ``dt_conv_spv`` (depthwise, small groups): the register tile is a vector run of output positions along
  the row, the reduction over kernel taps (and the group's input channels) outside it; parallel over
  channels x rows.

The padded input (``dt_conv_pad``) is computed inside the kernel once per batch element (one pass over the
input), so the reduction reads it without a bounds test. A row the tile does not divide (symbolic, prime) was
computed by `te_conv` over whole tiles: only the epilogue, once per output, tests ``w < W``.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from .cpu_schedule_depthwise import spv_channel_block
from .cpu_schedule_dispatch import _parallel_cands, _select
from .cpu_inline import inline_spatial
from .cpu_sched_helpers import child_blocks, loop_extent, total_work, vector_lanes, vectorize_tile, writes_param
from ...te_conv import CROP_BLOCK, OCV_BLOCK, PAD_BLOCK, ROW_TILE_ATTR, SPV_BLOCK


#: The taps of the kernel's last axis are unrolled up to this many (1.2x for resnet18's 7x7 stem, ~1.02x 3x3).
_UNROLL_TAPS = 7


def conv_block_name(sch: s_tir.Schedule) -> str | None:
    """The name of the `te_conv` reduction block of a (fused) PrimFunc, or None."""
    names = [sch.get(b).name_hint for b in child_blocks(sch)]
    found = [n for n in names if n.startswith((OCV_BLOCK, SPV_BLOCK))]
    return found[0] if len(found) == 1 else None


def _attach_epilogue(sch: s_tir.Schedule, func, conv, loop) -> list:
    """The accumulator tile in registers ("local"), the epilogue chain computed per tile under `loop`;
    returns the epilogue blocks attached there."""
    epilogues = list(sch.get_consumers(conv))
    if not writes_param(func, sch, conv):
        sch.set_scope(conv, 0, "local")
    elif not epilogues:
        epilogues = [sch.cache_write(conv, 0, "local")]
    attached = []
    while epilogues:
        epi = epilogues.pop(0)
        try:
            sch.reverse_compute_at(epi, loop, preserve_unit_loops=True)
        except Exception:  # pylint: disable=broad-except
            continue   # stays a loop nest after the convolution
        attached.append(epi)
        epilogues += [c for c in sch.get_consumers(epi)
                      if not any(sch.get(c).same_as(sch.get(e)) for e in attached + epilogues)]
    return attached


def _pad_per_batch(sch: s_tir.Schedule, n_loop, parallel: bool) -> None:
    """The padded input computed under the batch loop (one pass over each batch element's input)."""
    pads = [b for b in child_blocks(sch) if sch.get(b).name_hint.startswith(PAD_BLOCK)]
    for pad in pads:
        sch.compute_at(pad, n_loop, preserve_unit_loops=True)
        loops = sch.get_loops(pad)[1:]     # c, rows..., columns
        if parallel and len(loops) > 1:
            sch.parallel(sch.fuse(*loops[:-1]))


def _sched_conv(func, target, name: str, exact: bool, parallel: bool) -> tirx.PrimFunc:
    """`exact`: the row tile divides the output rows (else `te_conv` computed whole tiles and the epilogue
    keeps the first W positions, under a predicate)."""
    sch = s_tir.Schedule(func)
    conv = sch.get_sblock(name)
    ocv = name.startswith(OCV_BLOCK)
    if ROW_TILE_ATTR not in sch.get(conv).annotations:
        raise ValueError("conv block without its row tile")
    tw = int(sch.get(conv).annotations[ROW_TILE_ATTR])
    n_red = sum(1 for iv in sch.get(conv).iter_vars if iv.iter_type == tirx.IterVar.CommReduce)
    loops = sch.get_loops(conv)
    n_sp = len(loops) - 2 - n_red
    n, o, spatial, red = loops[0], loops[1], loops[2:2 + n_sp], loops[2 + n_sp:]
    lanes = vector_lanes(target, sch.get(conv).writes[0].source.dtype)
    wo, wi = sch.split(spatial[-1], [None, tw])
    if ocv:
        # the packed weight [O / vb, Cg, *K, vb]: the only operand with one axis more than the data
        vb = next(int(r.source.shape[-1]) for r in sch.get(conv).reads if len(r.source.shape) == 3 + n_sp)
        oo, oi = sch.split(o, [None, vb])
        tasks = [oo, *spatial[:-1]]
        sch.reorder(n, *tasks, wo, *red, wi, oi)
    else:
        oo, oi = sch.split(o, [None, spv_channel_block(loop_extent(sch, o), tw, lanes)])
        tasks = [oo, *spatial[:-1]]
        sch.reorder(n, *tasks, wo, *red, oi, wi)
    attached = _attach_epilogue(sch, func, conv, wo)
    if ocv:  # the accumulator tile [tw, vb]: each register one output position's vb channels
        sch.transform_layout(conv, ("write", 0), tirx.IndexMap.from_func(
            lambda *i: (i[0], *i[2:], i[1]), ndim=2 + n_sp))
    _pad_per_batch(sch, n, parallel)
    if parallel:
        sch.parallel(sch.fuse(*tasks) if len(tasks) > 1 else tasks[0])
    if loop_extent(sch, red[-1]) <= _UNROLL_TAPS:   # the kernel's last axis: 1.2x for the 7x7 stem
        sch.unroll(red[-1])
    if ocv:
        sch.unroll(wi)
        vectorize_tile(sch, oi, vb, lanes, unroll=True)
    else:
        sch.unroll(oi)
        vectorize_tile(sch, wi, tw, lanes, unroll=True)
    for epi in attached:     # innermost loop: output positions of the tile (contiguous in NCHW)
        inner = sch.get_loops(epi)[-1]
        if exact and loop_extent(sch, inner) == tw and tw % lanes == 0:
            vectorize_tile(sch, inner, tw, lanes, unroll=False)
    sch.decompose_reduction(conv, red[0])
    return sch.mod["main"]


def conv_select(func, target, name: str) -> tirx.PrimFunc:
    """The conv schedule of `func` (a fused kernel with a `te_conv` block `name`): spatial producers and the
    epilogue chain inlined (the padded input kept), serial below PARALLEL_MIN_WORK."""
    sch = s_tir.Schedule(func)
    exact = not any(sch.get(b).name_hint.startswith(CROP_BLOCK) for b in child_blocks(sch))
    inline_spatial(func, sch, keep=(PAD_BLOCK,))
    inlined = sch.mod["main"]
    work = total_work(sch, child_blocks(sch))
    return _select(inlined, _parallel_cands(work, target, lambda par: _sched_conv(inlined, target, name, exact, par)))
