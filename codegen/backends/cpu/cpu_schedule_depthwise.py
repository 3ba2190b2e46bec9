"""The register tile of ``dt_conv_spv`` (depthwise and small-group convolutions, `cpu_schedule_conv`).

A tile of one channel's row is a few vectors of output positions, and each kernel tap is one FMA into each:
with one vector (a symbolic width's ragged tile of 8 positions, or a short row) the taps form one dependency
chain, latency-bound at a quarter of the FMA unit's rate. So the tile spans several output channels: their
accumulators are independent chains, and the taps' loop overhead is shared.
"""
from __future__ import annotations

#: Accumulator vectors of one spv tile (channels x vectors per row tile); AVX2 has 16 registers, and each
#: FMA needs an input vector and a broadcast weight besides.
SPV_ACCUMULATORS = 8
#: A strided spv conv's phases copy left unsplit (`te_conv.SPLIT_PHASES_MAX_CHANNELS`: static channels, at least
#: that many) computed per block of output channels, inside the conv's (parallel) channel block loop, just before the
#: block's rows read it (`copy_per_channel_block`; with at least `COPY_BLOCKS_MIN` blocks, which are then the only
#: parallel tasks, not blocks x rows), not the whole image's copy (all channels) written first and read back. Off: the
#: 288-channel 5x5 / 2 layer at 14 (unsplit) took 0.99-1.14x its time per image (4 runs, bench_dw_layers one thread).
#: Split copies per block (all strided ones, before this rule): 0.91-0.94x (72 channels, 3x3 / 2 at 56), 0.88-0.96x
#: (288 split), but 1.03-1.13x (96, 5x5 / 2 at 28) and 1.13x (16 at 112: 4 blocks); unstrided copies per block
#: 1.07-1.13x (the 5x5 layers at 14 and 7). A switch for A/B.
COPY_PER_CHANNEL_BLOCK = False
COPY_BLOCKS_MIN = 16


def spv_channel_block(channels, row_tile: int, lanes: int) -> int:
    """Output channels per spv register tile: the largest of 4, 3, 2 dividing `channels` (static) whose
    accumulators (channels x vectors of `row_tile` positions) fit `SPV_ACCUMULATORS`; else 1."""
    if not isinstance(channels, int):
        return 1
    vectors = max(1, -(-row_tile // max(1, lanes)))
    return next((cb for cb in (4, 3, 2) if channels % cb == 0 and cb * vectors <= SPV_ACCUMULATORS), 1)


def phases_sources(sch, pads: list) -> tuple[list, list]:
    """(the padded-input blocks `pads` less the phases blocks copied from a padded source and their sources,
    [(source, phases)]): a strided spv conv's phases copied from the zero-padded input
    (`te_conv.PHASES_FROM_PADDED`), scheduled by `attach_phases_sources`."""
    from ...te_conv import PHASES_BLOCK
    sources = []
    for pad in pads:
        consumers = sch.get_consumers(pad)
        if len(consumers) == 1 and sch.get(consumers[0]).name_hint.startswith(PHASES_BLOCK):
            sources.append((pad, consumers[0]))
    taken = [sch.get(b) for pair in sources for b in pair]
    return [p for p in pads if not any(sch.get(p).same_as(t) for t in taken)], sources


def attach_phases_sources(sch, sources: list, n_loop, parallel: bool) -> None:
    """Each phases block computed under the batch loop `n_loop`, parallel over its channels when `parallel`, and
    its padded source per channel, just before (its plane in L1 / L2: one workspace per channel). Channels, not
    channels x rows, are the tasks: the fused loop's index (three 64-bit divisions per row of ~60 floats) took
    ~20% of the layer's time. (Per row of the phases, the padded row - of a symbolic width - was a workspace
    allocated and freed per row: ~10%.)"""
    for source, phases in sources:
        sch.compute_at(phases, n_loop, preserve_unit_loops=True)
        loops = sch.get_loops(phases)      # ..., c, rows..., phase, columns: one loop per axis but the batch's
        channel = loops[len(loops) - len(sch.get(phases).iter_vars) + 1]
        if parallel:
            sch.parallel(channel)
        sch.compute_at(source, channel, preserve_unit_loops=True)
        # (phase, column) iterated (column, phase), the phase unrolled: each step reads `stride` contiguous padded
        # values, which LLVM loads as vectors and deinterleaves with shuffles (phase outermost: a gather of lanes)
        phase, column = sch.get_loops(phases)[-2:]
        sch.reorder(column, phase)
        sch.unroll(phase)


def schedule_phases(sch, block, n_loop, parallel: bool) -> bool:
    """A strided spv conv's phases copy (`te_conv._padded_phases`, with `te_conv.SPLIT_PHASES`) or an unstrided one's
    padded copy with its columns split (`te_conv.SPLIT_SPV_PADDING`) computed under the
    batch loop `n_loop`: parallel over its channels when `parallel` (channels, not channels x rows: the fused
    loop's index took three 64-bit divisions per row of ~60 floats), iterated (column, phase) with the phase
    unrolled, so that each step of the column loop's interior (split off by LoopPartition) reads `stride`
    contiguous inputs, which LLVM loads as vectors and deinterleaves (phase outermost: a gather of lanes).
    Returns False (nothing done) for any other block."""
    from ...te_conv import PAD_BLOCK, PHASES_BLOCK, SPLIT_PHASES, SPLIT_SUFFIX
    name = sch.get(block).name_hint
    phases = SPLIT_PHASES and name.startswith(PHASES_BLOCK)
    if not phases and not name.startswith(PAD_BLOCK + SPLIT_SUFFIX):
        return False
    sch.compute_at(block, n_loop, preserve_unit_loops=True)
    loops = sch.get_loops(block)      # ..., c, rows..., [phase,] columns: one loop per axis but the batch's
    if parallel:
        sch.parallel(loops[len(loops) - len(sch.get(block).iter_vars) + 1])
    if phases:
        sch.reorder(loops[-1], loops[-2])
        sch.unroll(loops[-2])
    return True


def copy_per_channel_block(sch, block_loop, channels) -> bool:
    """A strided spv conv's unsplit phases copy (`channels`: the conv's output channels, an int at least
    `te_conv.SPLIT_PHASES_MAX_CHANNELS`) computed under the conv's channel block loop `block_loop`
    (`COPY_PER_CHANNEL_BLOCK`, with at least `COPY_BLOCKS_MIN` blocks), iterated (column, phase) with the phase
    unrolled (as `schedule_phases`). Returns False (nothing done) otherwise: no phases copy, an unpadded copy
    too, the switch off, fewer channels or blocks, or a symbolic channel count."""
    from ...te_conv import PAD_BLOCK, PHASES_BLOCK, SPLIT_PHASES_MAX_CHANNELS
    from .cpu_sched_helpers import child_blocks, loop_extent
    blocks = loop_extent(sch, block_loop)
    if (not COPY_PER_CHANNEL_BLOCK or not isinstance(blocks, int) or blocks < COPY_BLOCKS_MIN
            or not isinstance(channels, int) or channels < SPLIT_PHASES_MAX_CHANNELS):
        return False
    pads = [b for b in child_blocks(sch) if sch.get(b).name_hint.startswith(PAD_BLOCK)]
    if not pads or not all(sch.get(b).name_hint.startswith(PHASES_BLOCK) for b in pads):
        return False
    for pad in pads:
        sch.compute_at(pad, block_loop, preserve_unit_loops=True)
        phase, column = sch.get_loops(pad)[-2:]
        sch.reorder(column, phase)
        sch.unroll(phase)
    return True
