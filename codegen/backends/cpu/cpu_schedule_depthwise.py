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


def spv_channel_block(channels, row_tile: int, lanes: int) -> int:
    """Output channels per spv register tile: the largest of 4, 3, 2 dividing `channels` (static) whose
    accumulators (channels x vectors of `row_tile` positions) fit `SPV_ACCUMULATORS`; else 1."""
    if not isinstance(channels, int):
        return 1
    vectors = max(1, -(-row_tile // max(1, lanes)))
    return next((cb for cb in (4, 3, 2) if channels % cb == 0 and cb * vectors <= SPV_ACCUMULATORS), 1)
