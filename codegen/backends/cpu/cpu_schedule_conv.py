"""CPU schedules of the convolutions `te_conv` writes (`cpu_schedule` dispatches here by block name), with
the epilogue that fusion gives them (bias, batch norm, activation, residual add) computed per register tile.

* ``dt_conv_ocv`` (output channels in blocks of vb, the weight packed): the register tile is vb output
  channels (vector lanes) x `tw` output positions of a row (`te_conv.row_tile`: up to 14 accumulators); the
  reduction over input channels x kernel taps loads one weight vector per tap and FMAs it with `tw`
  broadcast input values (TVM's x86 ``conv2d_NCHWc`` / NeoCPU micro-kernel, without the NCHWc data
  layout: the tile is written back to NCHW, once per output). Parallel over output-channel blocks x rows (with
  `BATCH_IN_PARALLEL`: batch x blocks x rows); over flattened positions (`te_conv.FLAT_POSITIONS`: the tile `tw`
  positions of h * W + w) over blocks x tiles.
* ``dt_conv_pwp`` (a pointwise conv over the flattened positions of the image, `te_conv.POSITION_LANES`): the
  register tile is rows output channels x 2 vectors of positions, the reduction over the input channels outside
  it: per input channel one broadcast weight value per row and one input vector per 8 (16) positions; the result
  and the epilogue written as vectors of NCHW. Parallel over channel-row blocks (a parallel loop fused with the
  tiles kept LoopPartition from splitting off the last tile). Where the tile does not divide H * W (a run-time
  test), the block is scheduled as ``dt_conv_ocv`` over flattened positions (`_pointwise_select`). A strided 1x1
  conv's block reads a copy of its strided positions in whole tiles (`_strided_copy`): no test, no other variant.
* ``dt_conv_spv`` (depthwise, small groups): the register tile is a vector run of output positions along
  the row, the reduction over kernel taps (and the group's input channels) outside it; parallel over
  channels x rows (batch x channels x rows).

The padded input (``dt_conv_pad``) is computed inside the kernel (one pass over the input), so the reduction reads
it without a bounds test: under the batch loop, once per image (with `BATCH_IN_PARALLEL`, in the parallel variant:
a loop nest of its own before the convolution, parallel over batch x channels x rows, one fork per call).
A row the tile does not divide (symbolic, prime) was computed by `te_conv` over whole tiles: only the epilogue,
once per output, tests ``w < W``.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from .cpu_schedule_depthwise import copy_per_channel_block, schedule_phases, spv_channel_block
from .cpu_schedule_dispatch import _parallel_cands, _select
from .cpu_inline import inline_spatial
from . import cpu_sched_helpers
from .cpu_sched_helpers import (child_blocks, loop_extent, tile_scope, total_work, vector_lanes, vectorize_tile,
                                writes_param)
from ...dims import is_one
from ...te_conv import (CROP_BLOCK, FLAT_ATTR, OCV_BLOCK, PAD_BLOCK, PHASES_BLOCK, PWP_BLOCK, PWP_ROWS_ATTR,
                        ROW_TILE_ATTR, SPV_BLOCK, STRIDED_BLOCK)


#: Input channels unrolled inside the kernel taps per step of the dense conv's reduction (`_channels_inside_taps`);
#: 1: none, the reduction runs (input channel, taps) - the order of the packed weight [O / vb, Cg, *K, vb], which it
#: then reads as one contiguous stream. 8 (channel blocks outside the taps, 8 channels unrolled inside them) read
#: the weight 8 taps apart: resnet18's conv layers summed 1.37x onnxruntime's time with 8, 1.19x with 2, 1.15x with
#: 1 (`benchmarks/bench_conv_variants.py`, one thread; the 512-channel 3x3 layer at 7 x 7 1.71x -> 1.22x).
CHANNEL_BLOCK = 1
#: An epilogue of a one-position conv (1x1 on [N, C, 1, 1]) over more positions - the squeeze-excitation's broadcast
#: multiply - iterates positions innermost (contiguous in NCHW, vectorized by LLVM), not channels-last: each of its
#: stores was then a scalar one H x W floats from the last (~1 ns per element, the SE kernels at 1-3 GFLOP/s).
#: False: channels-last as every other epilogue (a switch for A/B).
BROADCAST_POSITIONS_INNER = True
#: The batch is part of the parallel loop (the parallel variant): the convolution's tasks are batch x output-channel
#: blocks x rows (or tiles), one fork per call, and the padded input a loop nest of its own before it, parallel over
#: batch x channels x rows (computed under the batch loop, it would be computed again by every task of an image).
#: False: the batch loop serial outside, the padded copy and the convolution each forking once per image (at batch 8,
#: 8-16 fork / joins per kernel over one image's few tasks). Off by default: measured under a load of 3-7 on the
#: 2-core machine (2 threads, interleaved with onnxruntime in one process, `bench_conv_models.py --ab`) resnet18 B8
#: took 0.70-0.95x the per-image form's time in 3 of 4 runs (1.03x in one), mobilenet_v3_small B8
#: 1.08-1.31x in 4 of 6 (0.92x and 0.78x in two): the whole batch's padded copy is read back from memory, not from the
#: core's cache.
BATCH_IN_PARALLEL = False
#: With BATCH_IN_PARALLEL, where the batch is a multiple of the cores and at least this many images a core, a third
#: variant (chosen at run time; not for flattened positions) is parallel over the images alone, each image's padded
#: copy and convolution computed by one thread in turn (the copy read back from that core's cache). 2 threads, load
#: 4-6: mobilenet_v3_small B8 0.84x and 0.65x the per-image form's time (two runs), resnet18 B8 1.24x (one); with it
#: for the depthwise / small-group kernels only, mobilenet_v3_small B8 1.20x (one). 0: none (a switch for A/B).
IMAGES_PER_CORE = 2
#: The epilogue of a ``dt_conv_spv`` conv computed in whole ragged tiles (a symbolic width: every depthwise layer of a
#: model with symbolic sizes) is vectorized over the tile's positions, its predicate (``w < W``) marked ``likely``
#: (`_likely_predicates`): TIR's LoopPartition splits the row's tile loop into the whole tiles - vector loads, bias /
#: activation and stores of NCHW without a test - and the last, cut tile (a scalar loop of one test an output, as
#: every tile was before). False: every tile's epilogue a scalar loop (a switch for A/B).
SPV_EPILOGUE_VECTORS = True
#: The epilogue of a per-row ``dt_conv_ocv`` conv (vb channels x `tw` positions a tile) writes its tile to a small
#: buffer laid out [positions, channels] (vector stores of the channels it computes in vector registers), and a copy
#: writes that buffer to the NCHW result positions-innermost, `tw` contiguous outputs a channel (vectors where the
#: tile is whole: its ``w < W`` test ``likely``). Before, the epilogue stored each output alone (the tile's channels
#: are H * W apart in NCHW), and LLVM, seeing every lane of the epilogue's vectors extracted for those stores,
#: computed the epilogue one scalar at a time: mobilenet_v3_small's stem (3 -> 16, bias + hardswish) spent about half
#: its time there. False: as before (a switch for A/B).
OCV_EPILOGUE_TILE = True
#: The taps of the kernel's last axis are unrolled up to this many (1.2x for resnet18's 7x7 stem, ~1.02x 3x3).
_UNROLL_TAPS = 7


def conv_block_name(sch: s_tir.Schedule) -> str | None:
    """The name of the `te_conv` reduction block of a (fused) PrimFunc, or None."""
    names = [sch.get(b).name_hint for b in child_blocks(sch)]
    found = [n for n in names if n.startswith((OCV_BLOCK, SPV_BLOCK, PWP_BLOCK))]
    return found[0] if len(found) == 1 else None


def _attach_epilogue(sch: s_tir.Schedule, func, conv, loop, relayout=None) -> list:
    """The accumulator tile in registers (`cpu_sched_helpers.TILE_SCOPE`), the epilogue chain computed per tile
    under `loop`; returns the epilogue blocks attached there. `relayout(block)`: called on each before it is
    attached."""
    epilogues = list(sch.get_consumers(conv))
    if not writes_param(func, sch, conv):
        tile_scope(sch, conv)
    elif not epilogues:
        epilogues = [sch.cache_write(conv, 0, cpu_sched_helpers.TILE_SCOPE)]
    attached = []
    while epilogues:
        epi = epilogues.pop(0)
        if relayout is not None:
            relayout(epi)
        try:
            sch.reverse_compute_at(epi, loop, preserve_unit_loops=True)
        except Exception:  # pylint: disable=broad-except
            continue   # stays a loop nest after the convolution
        attached.append(epi)
        epilogues += [c for c in sch.get_consumers(epi)
                      if not any(sch.get(c).same_as(sch.get(e)) for e in attached + epilogues)]
    return attached


def _pad_per_batch(sch: s_tir.Schedule, n_loop, parallel: bool, at_root: bool = False) -> None:
    """The padded input computed under the batch loop (one pass over each batch element's input); `at_root`: as
    a loop nest of its own before the convolution (the parallel variant with `BATCH_IN_PARALLEL`; over flattened
    positions, `te_conv.FLAT_POSITIONS`: the region
    of one batch element that compute_at inferred from h = p // W, w = p % W spanned 2 W + 1 columns, a predicate
    skipping W - 1 of them: the 64-channel 3x3 layer at 56 x 56 took 1.85x its time)."""
    pads = [b for b in child_blocks(sch) if sch.get(b).name_hint.startswith(PAD_BLOCK)]
    for pad in pads:
        if at_root:     # n, c, rows... (phases: the phase and the columns stay inside, as below)
            loops = sch.get_loops(pad)[:-2 if sch.get(pad).name_hint.startswith(PHASES_BLOCK) else -1]
            if parallel:
                sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])
            continue
        if schedule_phases(sch, pad, n_loop, parallel):
            continue
        sch.compute_at(pad, n_loop, preserve_unit_loops=True)
        loops = sch.get_loops(pad)[1:]     # c, rows..., columns (phases: c, rows..., phase, columns)
        # (the phase stays out of the fused loop: fused with symbolic rows, TVM's iter-map rewrite failed)
        tasks = loops[:-2] if sch.get(pad).name_hint.startswith(PHASES_BLOCK) else loops[:-1]
        if parallel and tasks:
            sch.parallel(sch.fuse(*tasks) if len(tasks) > 1 else tasks[0])


def _channels_inside_taps(sch: s_tir.Schedule, red: list, n_sp: int) -> tuple[list, object]:
    """The reduction of ``dt_conv_ocv`` as (input channels, kernel taps) with CHANNEL_BLOCK 1 (the default), else
    (input-channel blocks, kernel taps, CHANNEL_BLOCK input channels),
    the channels unrolled: consecutive multiply-adds read different input channels, so no broadcast value is shared
    between them. With the taps innermost, unrolled, LLVM kept the broadcasts that neighbouring taps share (x[w + 1]
    is tap 1 of position w and tap 0 of position w + 1) live across them, and the 14 (AVX2: 12) accumulators, 2
    weight vectors and those broadcasts spilled to the stack. Returns (the reduction loops in order, the loop to
    unroll or None)."""
    if len(red) == n_sp or CHANNEL_BLOCK <= 1:   # the taps alone, or (channels, taps): the packed weight's order
        return red, None
    channels = loop_extent(sch, red[0])
    block = next(b for b in (CHANNEL_BLOCK, 4, 2, 1) if channels % b == 0) if channels > CHANNEL_BLOCK else channels
    outer, inner = sch.split(red[0], [None, block])
    return [outer, *red[1:], inner], inner


def _channels_last(sch: s_tir.Schedule, epi, n_sp: int) -> bool:
    """An epilogue block [n, o, *spatial] iterated [n, *spatial, o] (before it is attached under the tile), so that
    its innermost loop is the tile's vb channels: it then reads the accumulator tile [tw, vb] a register at a time
    and the bias as a vector, and the ragged row's test (w < W) is the same for every lane - a branch around vector
    code. Positions innermost (contiguous in NCHW) made it a scalar loop with a branch per output and one more for
    the relu's select (~20% of the 3x3 128-channel layer's time). Returns whether it was done."""
    if len(sch.get(epi).iter_vars) != 2 + n_sp:
        return False
    try:
        sch.transform_block_layout(epi, tirx.IndexMap.from_func(lambda n, o, *sp: (n, *sp, o), ndim=2 + n_sp))
    except Exception:  # pylint: disable=broad-except  # not a plain loop nest: stays positions-innermost
        return False
    return True


def _flat_channels_last(sch: s_tir.Schedule, epi, n_sp: int) -> bool:
    """`_channels_last` for the epilogue of a conv computed over flattened positions (`te_conv.FLAT_POSITIONS`):
    [n, o, *rows, h, w] iterated [n, *rows, h * W + w, o], so that it attaches under the conv's tile of flattened
    positions (its read of the conv, ``conv[n, o, *rows, h * W + w]``, becomes ``conv[n, o, *rows, p]``)."""
    ivs = sch.get(epi).iter_vars
    if len(ivs) != 2 + n_sp:
        return False
    width = ivs[-1].dom.extent
    try:
        sch.transform_block_layout(epi, tirx.IndexMap.from_func(
            lambda n, o, *sp: (n, *sp[:-2], sp[-2] * width + sp[-1], o), ndim=2 + n_sp))
    except Exception:  # pylint: disable=broad-except
        return False
    return True


def _over_positions(sch: s_tir.Schedule, epi, n_sp: int) -> bool:
    """Whether the epilogue block `epi` of a conv with one output position (a 1x1 conv on [N, C, 1, 1]) iterates
    over more positions than that: the squeeze-excitation's broadcast multiply ``x * hardsigmoid(conv(s))`` over
    x's [N, C, H, W]."""
    ivs = sch.get(epi).iter_vars
    return len(ivs) == 2 + n_sp and not all(is_one(iv.dom.extent) for iv in ivs[2:])


def _sched_conv(func, target, name: str, exact: bool, parallel: bool, images: bool = False,
                flat_tile: int | None = None) -> tirx.PrimFunc:
    """`exact`: the row tile divides the output rows (else `te_conv` computed whole tiles and the epilogue
    keeps the first W positions, under a predicate). `images`: parallel over the batch alone, each image's padded
    copy and convolution serial inside (`IMAGES_PER_CORE`). `flat_tile`: a ``dt_conv_pwp`` block scheduled as a
    ``dt_conv_ocv`` one over flattened positions, tiles of that many positions (`_pointwise_select`)."""
    sch = s_tir.Schedule(func)
    conv = sch.get_sblock(name)
    ocv = name.startswith(OCV_BLOCK) or flat_tile is not None
    if ROW_TILE_ATTR not in sch.get(conv).annotations:
        raise ValueError("conv block without its row tile")
    tw = int(sch.get(conv).annotations[ROW_TILE_ATTR]) if flat_tile is None else flat_tile
    # over flattened positions (`te_conv.FLAT_POSITIONS`): the block's last axis is h * W + w of the output
    flat = ocv and (FLAT_ATTR in sch.get(conv).annotations or flat_tile is not None)
    n_red = sum(1 for iv in sch.get(conv).iter_vars if iv.iter_type == tirx.IterVar.CommReduce)
    loops = sch.get_loops(conv)
    n_loop_sp = len(loops) - 2 - n_red          # the block's spatial axes
    n_sp = n_loop_sp + (1 if flat else 0)       # the convolution's
    n, o, spatial, red = loops[0], loops[1], loops[2:2 + n_loop_sp], loops[2 + n_loop_sp:]
    lanes = vector_lanes(target, sch.get(conv).writes[0].source.dtype)
    wo, wi = sch.split(spatial[-1], [None, tw])
    if ocv:
        # the packed weight [O / vb, Cg, *K, vb]: the only operand with one axis more than the data
        vb = next(int(r.source.shape[-1]) for r in sch.get(conv).reads if len(r.source.shape) == 3 + n_sp)
        oo, oi = sch.split(o, [None, vb])
        # flat: the tiles are the tasks too (a 7 x 7 plane is 13 tiles; its rows were 7 tasks of 2 tiles)
        tasks = [oo, *spatial[:-1]] + ([wo] if flat and flat_tile is None else [])
        red, unrolled = _channels_inside_taps(sch, red, n_sp)
        sch.reorder(n, oo, *spatial[:-1], wo, *red, wi, oi)
    else:
        channels = loop_extent(sch, o)
        oo, oi = sch.split(o, [None, spv_channel_block(channels, tw, lanes)])
        tasks = [oo, *spatial[:-1]]
        sch.reorder(n, *tasks, wo, *red, oi, wi)
    epi_channels_last = {}
    one_position = all(is_one(iv.dom.extent) for iv in sch.get(conv).iter_vars[2:2 + n_loop_sp])

    def relayout(epi):
        if flat:
            epi_channels_last[sch.get(epi).name_hint] = _flat_channels_last(sch, epi, n_sp)
        elif ocv and not (BROADCAST_POSITIONS_INNER and one_position and _over_positions(sch, epi, n_sp)):
            epi_channels_last[sch.get(epi).name_hint] = _channels_last(sch, epi, n_sp)
    store = None    # (`OCV_EPILOGUE_TILE`) the epilogue's last block, writing the tile buffer, and its copy to NCHW
    if OCV_EPILOGUE_TILE and ocv and not flat and not one_position and tw % 4 == 0:
        store = _tile_store(sch, func, conv)
    skip = {sch.get(b).name_hint for b in store[1:]} if store else set()
    attached = _attach_epilogue(sch, func, conv, wo,
                                lambda epi: None if sch.get(epi).name_hint in skip else relayout(epi))
    if store:
        # the tile buffer [n, *rows, w // tw, w % tw, o]: the epilogue's vectors of channels stored whole, and its
        # region under the tile loop one tile of constant size ([n, h, w, o] was compacted to min(W, tw) positions,
        # a run-time size: a workspace allocation a tile)
        sch.transform_layout(store[0], ("write", 0), tirx.IndexMap.from_func(
            lambda n, o, *sp: (n, *sp[:-1], tirx.floordiv(sp[-1], tw), tirx.floormod(sp[-1], tw), o),
            ndim=2 + n_loop_sp), assume_injective_transform=True)
    if ocv:  # the accumulator tile [tw, vb]: each register one output position's vb channels
        sch.transform_layout(conv, ("write", 0), tirx.IndexMap.from_func(
            lambda *i: (i[0], *i[2:], i[1]), ndim=2 + n_loop_sp))
    if images:
        _pad_per_batch(sch, n, False, at_root=flat)
        sch.parallel(n)
        parallel = False
    batch_tasks = parallel and BATCH_IN_PARALLEL
    if not images and not ocv and not batch_tasks and copy_per_channel_block(sch, oo, channels):
        tasks = [oo]    # the rows serial under the block's copy
    elif not images:
        _pad_per_batch(sch, n, parallel, at_root=flat or batch_tasks)
    if batch_tasks:     # one parallel loop over the batch too (`BATCH_IN_PARALLEL`)
        tasks = [n, *tasks]
    if parallel:
        sch.parallel(sch.fuse(*tasks) if len(tasks) > 1 else tasks[0])
    if ocv:
        if unrolled is not None:
            sch.unroll(unrolled)
    elif loop_extent(sch, red[-1]) <= _UNROLL_TAPS:   # the kernel's last axis: 1.2x for the 7x7 stem
        sch.unroll(red[-1])
    if ocv:
        sch.unroll(wi)
        vectorize_tile(sch, oi, vb, lanes, unroll=True)
    else:
        sch.unroll(oi)
        vectorize_tile(sch, wi, tw, lanes, unroll=True)
    likely = []     # epilogue blocks whose predicate is made ``likely`` (`SPV_EPILOGUE_VECTORS`, `OCV_EPILOGUE_TILE`)
    for epi in attached:
        if store and sch.get(epi).same_as(sch.get(store[1])):
            # the copy to NCHW: [o, *rows, w] under the tile, channels unrolled, the tile's positions a vector
            loops = sch.get_loops(epi)
            sch.unroll(loops[-2 - (n_loop_sp - 1)])
            vectorize_tile(sch, loops[-1], tw, lanes, unroll=True)
            if not exact:
                likely.append(sch.get(epi).name_hint)
            continue
        if ocv and epi_channels_last.get(sch.get(epi).name_hint):
            inner, positions = sch.get_loops(epi)[-1], sch.get_loops(epi)[-2]
            # (an epilogue whose sizes are other dims than the conv's - the SE block's broadcast multiply after
            # a 1x1 conv on [B, C, 1, 1] - is not tiled under the conv: its positions loop is not a constant)
            if loop_extent(sch, inner) == vb and vb % lanes == 0 and isinstance(loop_extent(sch, positions), int):
                sch.unroll(positions)
                vectorize_tile(sch, inner, vb, lanes, unroll=True)
            continue
        inner = sch.get_loops(epi)[-1]     # output positions of the tile (contiguous in NCHW)
        if exact and loop_extent(sch, inner) == tw and tw % lanes == 0:
            vectorize_tile(sch, inner, tw, lanes, unroll=False)
        elif not exact and not ocv and SPV_EPILOGUE_VECTORS and loop_extent(sch, inner) == tw and tw % 8 == 0:
            # whole ragged tiles (`SPV_EPILOGUE_VECTORS`; AVX-512: vectors of 8 of the 8-position tile): vectors
            # where the tile is whole, its test ``likely``
            vectorize_tile(sch, inner, tw, lanes, unroll=True)
            likely.append(sch.get(epi).name_hint)
    sch.decompose_reduction(conv, red[0])
    return _likely_predicates(sch.mod["main"], likely) if likely else sch.mod["main"]


def _tile_store(sch: s_tir.Schedule, func, conv):
    """(`OCV_EPILOGUE_TILE`) The last block of `conv`'s epilogue chain made to write a buffer of the result's shape
    (`cache_write`), and the block copying it to the result: (that block, the copy), or None (no epilogue, or not a
    chain ending in the result). (Either not attached under the tile stays a loop nest after the conv: correct,
    slower.)"""
    block = conv
    while True:
        consumers = sch.get_consumers(block)
        if not consumers:
            break
        if len(consumers) != 1:
            return None
        block = consumers[0]
    if sch.get(block).same_as(sch.get(conv)) or not writes_param(func, sch, block):
        return None
    if len(sch.get(block).writes) != 1:
        return None
    copy = sch.cache_write(block, 0, cpu_sched_helpers.TILE_SCOPE)
    # (cache_write: `block` now writes the buffer, `copy` the result)
    return block, copy


def _likely_predicates(func: tirx.PrimFunc, only: list | None = None) -> tirx.PrimFunc:
    """The ``dt_conv_pwp`` variant's predicates where its tile divides the plane (`_pointwise_select` checks that at
    run time): the conv's (init, update) made true - the split's, they would size the accumulator tile at run time
    (a workspace allocation a tile) - and the epilogue's rewritten as the bounds of its block vars, ``likely``
    (TIR's LoopPartition then splits off the tiles past the plane, none: the tiles are vector loads, FMAs and
    stores without a test). As reverse_compute_at wrote them (``(p_0 < tiles or p == 0) and p < H * W``),
    LoopPartition left every tile's epilogue a scalar loop of one branch an element. `only`: the names of the blocks
    to rewrite (a ``dt_conv_spv`` kernel's epilogue, `SPV_EPILOGUE_VECTORS`); None: every block."""
    import tvm_ffi
    from tvm.s_tir import SBlockRealize

    def mark(realize, mutator):
        realize = mutator.default_mutate(realize)
        if isinstance(realize.predicate, tirx.IntImm) or (only is not None and realize.block.name_hint not in only):
            return realize
        if realize.block.name_hint.startswith(PWP_BLOCK):
            return SBlockRealize(realize.iter_values, tirx.const(True, "bool"), realize.block)
        bounds = [value < iv.dom.min + iv.dom.extent
                  for value, iv in zip(realize.iter_values, realize.block.iter_vars)]
        return SBlockRealize(realize.iter_values, tirx.likely(tirx.all(*bounds)), realize.block)
    return func.with_body(tvm_ffi.structural_mutate(func.body, (SBlockRealize, mark)))


def _sched_pointwise(func, target, name: str, parallel: bool) -> tirx.PrimFunc:
    """``dt_conv_pwp`` [N, O, P] (P = H * W, reduced over C): the tile `rows` output channels x `tw` positions
    (2 vectors), the reduction over C outside it; the epilogue [n, o, h, w] iterated [n, o, h * W + w] and computed
    per tile, positions innermost (vectors of NCHW). Only where the tile divides H * W (`_pointwise_select`): the
    conv's predicates are then stripped, the epilogue's ``likely`` (`_likely_predicates`)."""
    sch = s_tir.Schedule(func)
    conv = sch.get_sblock(name)
    tw = int(sch.get(conv).annotations[ROW_TILE_ATTR])
    rows = int(sch.get(conv).annotations[PWP_ROWS_ATTR])
    lanes = vector_lanes(target, sch.get(conv).writes[0].source.dtype)
    n, o, p, c = sch.get_loops(conv)
    po, pi = sch.split(p, [None, tw])
    oo, oi = sch.split(o, [None, rows])
    sch.reorder(n, oo, po, c, oi, pi)

    def relayout(epi):
        ivs = sch.get(epi).iter_vars
        if len(ivs) == 4:
            width = ivs[-1].dom.extent
            try:
                sch.transform_block_layout(epi, tirx.IndexMap.from_func(
                    lambda b, ch, h, col: (b, ch, h * width + col), ndim=4))
            except Exception:  # pylint: disable=broad-except  # not a plain loop nest: not attached
                pass
    attached = _attach_epilogue(sch, func, conv, po, relayout)
    _strided_copy(sch, parallel)
    if parallel:    # (with BATCH_IN_PARALLEL the batch too: the strided copy, if any, then a loop nest of its own)
        sch.parallel(sch.fuse(n, oo) if BATCH_IN_PARALLEL else oo)
    sch.unroll(oi)
    vectorize_tile(sch, pi, tw, lanes, unroll=True)
    for epi in attached:
        loops = sch.get_loops(epi)
        if loop_extent(sch, loops[-1]) == tw and loop_extent(sch, loops[-2]) == rows:
            sch.unroll(loops[-2])
            vectorize_tile(sch, loops[-1], tw, lanes, unroll=True)
    sch.decompose_reduction(conv, c)
    return _likely_predicates(sch.mod["main"])


def _strided_copy(sch: s_tir.Schedule, parallel: bool) -> None:
    """The strided positions of a strided pointwise conv (``STRIDED_BLOCK`` [N, C, rows, W], `te_conv`'s
    `STRIDED_POSITION_LANES`) stored flattened [N, C, rows * W] - the GEMM's read [n, c, p // W, p % W] simplifies
    to [n, c, p] - a loop nest of its own before the conv, parallel over batch x channels. (Computed under the conv's
    batch loop, the region compute_at inferred from the flattened read was (rows, (tiles * t - 1) % W + 1) columns:
    not the whole row.) No such block: nothing done."""
    copies = [b for b in child_blocks(sch) if sch.get(b).name_hint.startswith(STRIDED_BLOCK)]
    for copy in copies:
        cols = sch.get(copy).writes[0].source.shape[3]
        sch.transform_layout(copy, ("write", 0), tirx.IndexMap.from_func(
            lambda n, c, h, col: (n, c, h * cols + col), ndim=4))
        if parallel:
            sch.parallel(sch.fuse(*sch.get_loops(copy)[:2]))


def _pointwise_select(func, target, name: str, work) -> tirx.PrimFunc:
    """A ``dt_conv_pwp`` kernel: where the tile (2 vectors) divides the plane H * W (checked at run time), its
    positions-vectorized schedule (`_sched_pointwise`); else the block as a ``dt_conv_ocv`` one over flattened
    positions (channels vectorized, `_sched_conv`): the partial last tile of the positions form is a scalar loop of
    a test an element over the tile's rows x input channels - 96 -> 576 channels at 7 x 7 (49 positions: 3 tiles
    and 1 position) took 9.5x the channels form's time."""
    sch = s_tir.Schedule(func)
    if any(sch.get(b).name_hint.startswith(STRIDED_BLOCK) for b in child_blocks(sch)):
        # a strided conv's copy (`te_conv_pwp.te_conv_strided_pointwise`): whole tiles of positions, no test
        return _select(func, _parallel_cands(work, target, lambda par: _sched_pointwise(func, target, name, par)))
    block = sch.get(sch.get_sblock(name))
    tw = int(block.annotations[ROW_TILE_ATTR])
    data = next(r.source for r in block.reads if len(r.source.shape) == 4)
    plane = data.shape[2] * data.shape[3]
    vb = next(int(r.source.shape[-1]) for r in block.reads if len(r.source.shape) == 5)
    lanes = vector_lanes(target, block.writes[0].source.dtype)
    # the channels form's tile: the ocv tile of vb channels (`te_conv._ocv_tiles`' ragged one), dividing the block's
    # whole vectors of positions
    ocv_tile = next(t for t in (8, 4, 2, 1) if lanes % t == 0 and t * max(1, vb // lanes) <= 8)
    whole = tirx.floormod(plane, tirx.IntImm("int64", tw)) == tirx.IntImm("int64", 0)
    variants = []
    par_conds = _parallel_cands(work, target, lambda par: None)
    for i, (cond, _) in enumerate(par_conds):
        par = len(par_conds) > 1 and i == len(par_conds) - 1
        variants.append((tirx.all(cond, whole),
                         lambda par=par: _sched_pointwise(func, target, name, par)))
        variants.append((cond, lambda par=par: _sched_conv(func, target, name, False, par, flat_tile=ocv_tile)))
    return _select(func, variants)


def conv_select(func, target, name: str) -> tirx.PrimFunc:
    """The conv schedule of `func` (a fused kernel with a `te_conv` block `name`): spatial producers and the
    epilogue chain inlined (the padded input kept), serial below PARALLEL_MIN_WORK."""
    sch = s_tir.Schedule(func)
    exact = not any(sch.get(b).name_hint.startswith(CROP_BLOCK) for b in child_blocks(sch))
    inline_spatial(func, sch, keep=(PAD_BLOCK,))
    inlined = sch.mod["main"]
    work = total_work(sch, child_blocks(sch))
    if name.startswith(PWP_BLOCK):
        return _pointwise_select(inlined, target, name, work)
    cands = _parallel_cands(work, target, lambda par: _sched_conv(inlined, target, name, exact, par))
    cores = int(target.attrs.get("num-cores", 1))
    conv = sch.get(sch.get_sblock(name))
    if BATCH_IN_PARALLEL and IMAGES_PER_CORE and len(cands) > 1 and FLAT_ATTR not in conv.annotations:
        batch = tirx.Cast("int64", conv.iter_vars[0].dom.extent)
        images = tirx.all(batch >= tirx.IntImm("int64", cores * IMAGES_PER_CORE),
                          tirx.floormod(batch, tirx.IntImm("int64", cores)) == tirx.IntImm("int64", 0))
        cands.insert(len(cands) - 1, (images, lambda: _sched_conv(inlined, target, name, exact, True, images=True)))
    return _select(inlined, cands)
