"""vjp rules of the layout, gather and data-dependent-shape ops (`grad_engine.vjp`).

Ops that copy entries of their data input (slices, `take`, `boolean_mask`, `tile`, their data-dependent forms)
share one rule: the op is applied again to an int64 tensor of the data's flat positions ("iota"), which says
where each output entry came from, and the cotangent is scatter-added there (`scatter_flat`, duplicates add).
So a gather whose size depends on the data (a mask, `nonzero`'s indices, `topk`'s `k`) scatters back with the
sizes it had when it ran. `topk` computes its positions from its indices.
"""
from __future__ import annotations

import numpy as np

from ..ir.ops_index import ScatterAttrs
from ..ir.shapes import norm_axis
from . import F
from .ops import apply
from .grad_engine import vjp
from .tracer import Tensor, trace_error


def _flat_size(x):
    return F.prod(F.shape_of(x))


def _iota(x):
    """int64 tensor shaped like x holding each entry's flat (row-major) position."""
    return F.reshape(F.arange(_flat_size(x)), F.shape_of(x))


def _scatter_add(x, pos, g):
    """zeros shaped like x with `g` added at flat positions `pos` (shaped like g)."""
    flat = F.reshape(F.zeros_like(x, g.dtype.name), (-1,))
    pos = F.reshape(pos, F.shape_of(g))         # g's dims (a gather made again has dims of its own)
    out = apply("grad", "scatter_flat", [flat, F.reshape(pos, (-1,)), F.reshape(g, (-1,))], ScatterAttrs("add"))[0]
    return F.reshape(out, F.shape_of(x))


@vjp("slice", "slice_dyn", "slice_axes_dyn", "take", "boolean_mask", "tile", "tile_dyn", "broadcast_to_dyn")
def _gather(c):
    """Input 0 is the data; the others (bounds, indices, a mask, shapes) are integers or bools."""
    def d():
        b = c.builder
        x = c.ins[0]
        (pos,) = b.emit(c.node.op, [_iota(x).value] + [t.value for t in c.ins[1:]], c.attrs, source=c.node.source)
        return _scatter_add(x, Tensor(pos, b), c.g)
    return [d] + [None] * (len(c.ins) - 1)


@vjp("topk", "topk_dyn")
def _topk(c):
    def d():
        x, idx = c.ins[0], c.outs[1]
        ax = norm_axis(c.attrs.axis, x.ndim)
        iota = _iota(x)
        first = F.take(iota, np.zeros(1, np.int64), axis=ax)          # position of entry 0 along the axis
        stride = F.prod(F.slice(F.shape_of(x), [ax + 1], [None]))
        return _scatter_add(x, first + idx * stride, c.g)
    return [d] + [None] * (len(c.ins) - 1)


@vjp("scatter_flat")
def _scatter_flat(c):
    data, idx, _ = c.ins
    red = c.attrs.reduction
    if red not in ("add", "none"):
        raise trace_error(f"grad: scatter_flat with reduction {red!r} has no vjp rule (only 'add' and 'none')",
                          c.node.source)
    if red == "add":
        return [lambda: c.g, None, lambda: F.take(c.g, idx)]
    m = F.arange(F.shape_of(idx)[0])

    def winners():      # the last write to a position wins: only that update gets the gradient
        last = apply("grad", "scatter_flat", [F.full_like(data, -1, "int64"), idx, m], ScatterAttrs("none"))[0]
        return F.cast(F.equal(F.take(last, idx), m), c.g.dtype.name)
    return [lambda: c.g * (1.0 - _written(c.g, idx)), None, lambda: F.take(c.g, idx) * winners()]


def _written(g, idx):
    """1 where some update replaced the entry, else 0 (g's dtype)."""
    ones = F.ones_like(F.cast(idx, g.dtype.name))
    return apply("grad", "scatter_flat", [F.zeros_like(g), idx, ones], ScatterAttrs("none"))[0]


# --------------------------------------------------------------------------------------- layout
@vjp("reshape", "reshape_dyn", "squeeze")
def _reshape(c):
    return [lambda: F.reshape(c.g, F.shape_of(c.ins[0]))] + [None] * (len(c.ins) - 1)


@vjp("assert_dims_equal")
def _assert_dims_equal(c):
    return [None, lambda: c.g]      # returns its second input, retyped


@vjp("broadcast_to")
def _broadcast_to(c):
    return [lambda: c.g]        # the engine sums the broadcast axes


@vjp("expand_dims")
def _expand_dims(c):
    return [lambda: F.squeeze(c.g, (norm_axis(c.attrs.axis, c.g.ndim),))]


@vjp("transpose")
def _transpose(c):
    def d():
        nd = c.g.ndim
        axes = tuple(reversed(range(nd))) if c.attrs.axes is None else tuple(norm_axis(a, nd) for a in c.attrs.axes)
        return F.transpose(c.g, tuple(int(i) for i in np.argsort(axes)))
    return [d]


@vjp("concat")
def _concat(c):
    ax = norm_axis(c.attrs.axis, c.g.ndim)
    parts = []
    start = np.zeros(1, np.int64)
    for x in c.ins:
        stop = start + F.slice(F.shape_of(x), [ax], [ax + 1])
        parts.append(lambda s0=start, s1=stop: F.slice(c.g, s0, s1, [1], [ax]))
        start = stop
    return parts


@vjp("stack")
def _stack(c):
    ax = norm_axis(c.attrs.axis, c.g.ndim)
    return [lambda i=i: F.take(c.g, np.int64(i), axis=ax) for i in range(len(c.ins))]


@vjp("split")
def _split(c):
    return [lambda: F.concat([c.cot(i) for i in range(len(c.outs))], axis=c.attrs.axis)]


@vjp("pad")
def _pad(c):
    def d():
        pw = c.attrs.pad_width
        if any(lo < 0 or hi < 0 for lo, hi in pw):
            raise trace_error("grad: pad with negative widths (a crop) has no vjp rule", c.node.source)
        axes = [i for i, (lo, hi) in enumerate(pw) if lo or hi]
        return F.slice(c.g, [pw[i][0] for i in axes], [-pw[i][1] or None for i in axes], [1] * len(axes), axes) \
            if axes else c.g
    return [d]
