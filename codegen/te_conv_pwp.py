"""The ``dt_conv_pwp`` forms of `te_conv`: a pointwise 2-D conv as the positions GEMM [O, H * W] = W[O, C] x
X[C, H * W] per image, the positions the vector lanes (`te_conv.POSITION_LANES`), and a strided 1x1 conv as that
GEMM on a copy of its strided positions (`te_conv.STRIDED_POSITION_LANES`; `te_conv.PADDED_POSITIONS`: stride 1,
a copy extended to whole tiles). `te_conv` picks the form and the register tile (its switches,
`te_conv._pwp_tile`).
"""
from __future__ import annotations

from tvm import te, tirx

from .dims import i64 as _i64
from .te_conv_names import CROP_BLOCK, PWP_BLOCK, PWP_ROWS_ATTR, ROW_TILE_ATTR, STRIDED_BLOCK


def te_conv_pointwise(x, w, out, vb: int, lanes: int, tile: int, tile_channels: int, guard=None):
    """``dt_conv_pwp`` (`te_conv.POSITION_LANES`): [N, O, ceil(H * W / v) * v] = W[O, C] x X[N, C, H * W] in whole
    vectors of v = `lanes` positions, the input read as 0 past H * W under a ``likely`` test (TIR's LoopPartition
    splits the last tile off); the packed weight [O / vb, C, 1, 1, vb] read at [o // vb, c, 0, 0, o % vb] (the
    size check's `guard`, 0, added to its first index: a scalar the tile's loop hoists). The crop stage reads the
    result back as [N, O, H, W]. The block's annotations: the positions (ROW_TILE_ATTR: `tile`) and output
    channels (PWP_ROWS_ATTR: `tile_channels`) of its register tile, which the schedule uses where it divides
    H * W (else it schedules the block as ``dt_conv_ocv``: `cpu_schedule_conv._pointwise_select`). (Computed over
    H * W positions exactly, the tile's split predicate sized the accumulator tile at run time: a workspace
    allocation a tile.)"""
    height, width = out
    plane = height * width

    def read(n, c, p):
        return tirx.if_then_else(tirx.likely(p < plane), x(n, c, tirx.floordiv(p, width), tirx.floormod(p, width)),
                                 tirx.const(0, x.dtype))
    # (at least one tile: a block of fewer positions sized the accumulator tile at run time, min(blocks, tile))
    flat = tirx.max(tirx.floordiv(plane + _i64(lanes - 1), _i64(lanes)) * _i64(lanes), _i64(tile))
    return pwp_gemm(x.shape[0], w, vb, read, flat, (tile, tile_channels), out,
                    guard[0] if guard is not None else _i64(0))


def pwp_gemm(batch, w, vb: int, read, flat, tile: tuple, out, w_offset=None):
    """The ``dt_conv_pwp`` block [batch, O, flat] = sum over c of ``read(n, c, p)`` x the packed weight
    [O / vb, C, 1, 1, vb] at [o // vb (+ `w_offset`), c, 0, 0, o % vb], annotated with its register tile (`tile`:
    positions, output channels), and the crop stage reading it back as [batch, O, *out]."""
    o_total, cg = int(w.shape[0]) * vb, int(w.shape[1])
    height, width = out
    rc = te.reduce_axis((_i64(0), _i64(cg)), name="rc")

    def value(n, o, p):
        block = tirx.floordiv(o, _i64(vb))
        wv = w[block if w_offset is None else block + w_offset, rc, _i64(0), _i64(0), tirx.floormod(o, _i64(vb))]
        return te.sum(read(n, rc, p) * wv, axis=[rc])
    res = te.compute([batch, _i64(o_total), flat], value, name=PWP_BLOCK,
                     attrs={ROW_TILE_ATTR: tile[0], PWP_ROWS_ATTR: tile[1]})
    return te.compute([batch, _i64(o_total), height, width],
                      lambda n, o, h, col: res(n, o, h * width + col), name=CROP_BLOCK)


def te_conv_strided_pointwise(x, w, strides, out, vb: int, tile: int, tile_channels: int, guard=None):
    """``dt_conv_pwp`` of a strided 1x1 conv (`te_conv.STRIDED_POSITION_LANES`): the strided positions copied to
    ``STRIDED_BLOCK`` [N, C, rows, W] (x[n, c, h * sh, w * sw], zeros in the rows past H, enough rows for whole
    tiles of positions; the size check's `guard` read in its condition), which the schedule stores flattened
    [N, C, rows * W] (`cpu_schedule_conv._strided_copy`): the GEMM's read [n, c, p // W, p % W] is then
    [n, c, p], whole vectors without a test. The block [N, O, ceil(H * W / t) * t] (t: the tile's positions)
    and the crop stage as `te_conv_pointwise`'s."""
    height, width = out
    plane = height * width
    flat = tirx.max(tirx.floordiv(plane + _i64(tile - 1), _i64(tile)) * _i64(tile), _i64(tile))
    # (the output sizes are >= 1 when the kernel runs: checked before it, `converters/window._check_sizes`)
    cols = tirx.max(width, _i64(1))
    rows = tirx.floordiv(flat + cols - _i64(1), cols)
    sh, sw = (_i64(int(s)) for s in strides)
    zero = tirx.const(0, x.dtype)
    checked = [] if guard is None else [guard[0] == tirx.IntImm(guard.dtype, 0)]

    def copy(n, c, h, col):
        inside = tirx.all(tirx.likely(h < height), *checked)
        return tirx.if_then_else(inside, x(n, c, h * sh, col * sw), zero)
    xs = te.compute([x.shape[0], x.shape[1], rows, cols], copy, name=STRIDED_BLOCK)
    return pwp_gemm(x.shape[0], w, vb, lambda n, c, p: xs(n, c, tirx.floordiv(p, cols), tirx.floormod(p, cols)),
                    flat, (tile, tile_channels), out)
