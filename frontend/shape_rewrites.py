"""Ops that take a shape, a size or an index from a tensor, rewritten while tracing where its entries are known.

`Builder.emit` calls `rewrite` before it records a node. For the ops below, an operand with a known value
(`frontend/shape_values.py`) decides what is recorded:

* every entry known (ints, or symbolic dims that cannot be negative): the static op (`reshape`, `broadcast_to`,
  `full`, `tile`, `slice`, `arange`, `topk`), which compiles into a region, with the symbols of the entries as
  its dims: ``F.zeros(F.shape_of(x))`` has x's type, ``F.arange(F.shape_of(x)[0])`` is ``[N]``;
* some entries known: the dynamic op with those dims in its attrs (`dims`), fresh unknown dims for the rest;
* none: the dynamic op as asked.

A slice bound known as a symbolic dim (ONNX ``Slice(mask, 0, Shape(ids)[1])``) becomes a `take` of a static
`arange` along that axis, so its length is a dim expression rather than a fresh one.

A rewrite returns the output values it recorded (through `Builder.emit` again, which checks the new node's type
rule and records its known value), or None to record the node as it is. ShapeError from here becomes the
TraceError of the API called.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir.attrs import ArangeAttrs, AxesAttrs, AxisAttrs, FullAttrs, ShapeAttrs, SliceAttrs, TileAttrs
from ..ir.ops_shape_tensors import ReshapeDynAttrs
from ..ir.shapes import ShapeError, broadcast_dims_ahead
from ..ir.types import dim_min, dim_mul
from .shape_values import as_dim, describe, ints_of

HUGE = 2 ** 62          # a slice bound this far out means "to the end" (F.slice's and ONNX's sentinels)

REWRITES: dict = {}


def rewrite(b, op: str, ins: list, attrs, api, source):
    fn = REWRITES.get(op)
    if fn is None:
        return None
    known = [b.known.get(v) for v in ins]
    if all(k is None for k in known):
        return None

    def emit(op2, ins2, attrs2):
        return b.emit(op2, ins2, attrs2, api=api, source=source)
    return fn(b, emit, ins, known, attrs)


def rewrites(op):
    def deco(fn):
        REWRITES[op] = fn
        return fn
    return deco


def _no_negatives(entries, what: str, allow=()):
    for e in entries:
        if isinstance(e, int) and e < 0 and e not in allow:
            raise ShapeError(f"the {what} {describe(entries)} has a negative entry ({e}); entries must be >= 0"
                             + (" (or -1 for one inferred dim)" if -1 in allow else ""))


def _operand(known, attrs, what: str, allow=()):
    """The known entries of the shape operand (input 1) of a dynamic op not yet given its dims, checked; else
    None."""
    if attrs.dims is not None or known[1] is None:
        return None
    _no_negatives(known[1], what, allow)
    return known[1]


def _partial(emit, op, ins, attrs, dims):
    """The dynamic op with the dims it knows, or None (recorded as asked) where it knows none."""
    if all(d is None for d in dims):
        return None
    return emit(op, ins, replace(attrs, dims=tuple(dims)))


@rewrites("reshape_dyn")
def _reshape(b, emit, ins, known, attrs):
    x, entries = ins[0], _operand(known, attrs, "shape", allow=(-1,))
    if entries is None:
        return None
    out = []
    for i, e in enumerate(entries):
        if attrs.copy_zeros and e == 0:         # a 0 there copies x's dim
            if i >= x.type.ndim:
                raise ShapeError(f"the shape {describe(entries)} has a 0 (copy the input's dim) past the "
                                 f"input's {x.type.ndim} dims")
            e = x.type.shape[i]
        # (a symbolic entry stays the dim: where it is 0 when the model runs, the static reshape to it raises
        # rather than copying x's dim, the exporters' shape chains never rely on that)
        out.append(-1 if e == -1 else as_dim(e))
    if None not in out:
        return emit("reshape", [x], ShapeAttrs(tuple(out)))
    return _partial(emit, "reshape_dyn", ins, attrs, [None if d == -1 else d for d in out])


def _static_broadcast(emit, x, shape):
    """broadcast_to of x to the static-rank `shape`: a `full` where x is a constant scalar (F.zeros of a shape
    tensor), else `broadcast_to`."""
    p = x.producer
    if p is not None and p.op == "constant" and x.type.ndim == 0:
        return emit("full", [], FullAttrs(tuple(shape), p.attrs.value.item(), x.type.dtype))
    return emit("broadcast_to", [x], ShapeAttrs(tuple(shape)))


@rewrites("broadcast_to_dyn")
def _broadcast(b, emit, ins, known, attrs):
    x, entries = ins[0], _operand(known, attrs, "shape")
    if entries is None:
        return None
    target = [as_dim(e) for e in entries]
    if not attrs.bidirectional:
        out = target
    else:                   # ONNX Expand: the broadcast of x's shape and the operand's
        r = max(len(target), x.type.ndim)
        xs = (1,) * (r - x.type.ndim) + x.type.shape
        ts = [1] * (r - len(target)) + target
        out = [broadcast_dims_ahead(d, t) if t is not None else d if isinstance(d, int) and d != 1 else None
               for d, t in zip(xs, ts)]
    if None not in target:          # (an entry known only when it runs is checked then, even where x fixes the dim)
        return _static_broadcast(emit, x, out)
    return _partial(emit, "broadcast_to_dyn", ins, attrs, out)


@rewrites("tile_dyn")
def _tile(b, emit, ins, known, attrs):
    x, entries = ins[0], _operand(known, attrs, "repeats")
    if entries is None:
        return None
    reps = ints_of(entries)
    if reps is not None:
        return emit("tile", [x], TileAttrs(tuple(reps)))
    nd = max(x.type.ndim, len(entries))
    xs = (1,) * (nd - x.type.ndim) + x.type.shape
    rs = [1] * (nd - len(entries)) + [as_dim(e) for e in entries]
    out = [None if r is None else dim_mul(d, r) for d, r in zip(xs, rs)]
    if None in out:
        return _partial(emit, "tile_dyn", ins, attrs, out)
    # symbolic repeats: np.tile is x with a new axis of size r before each axis d, broadcast, then merged
    spread = emit("reshape", [x], ShapeAttrs(tuple(v for d in xs for v in (1, d))))[0]
    spread = emit("broadcast_to", [spread], ShapeAttrs(tuple(v for d, r in zip(xs, rs) for v in (r, d))))[0]
    return emit("reshape", [spread], ShapeAttrs(tuple(out)))


def _one(known, k):
    """The single known entry of a 0-d operand k, or None."""
    return None if known[k] is None else known[k][0]


@rewrites("arange_dyn")
def _arange(b, emit, ins, known, attrs):
    start, stop, step = (_one(known, k) for k in range(3))
    if any(isinstance(v, bool) for v in (start, stop, step)) or not isinstance(step, int):
        return None
    if isinstance(start, int) and isinstance(stop, int):
        return emit("arange", [], ArangeAttrs(start, stop, step, attrs.dtype))
    if np.dtype(attrs.dtype).kind in "iu" and step and all(isinstance(v, (int, str)) for v in (start, stop)):
        return emit("arange", [], ArangeAttrs(start, stop, step, attrs.dtype))     # symbolic bounds
    return None


@rewrites("topk_dyn")
def _topk(b, emit, ins, known, attrs):
    k = _one(known, 1)
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        return None
    return emit("topk", [ins[0]], replace(attrs, k=k))


# ------------------------------------------------------------------------------------------ slice
def _static_bounds(s, e, st):
    """Python ints as static slice bounds; the "to the end" sentinels as None."""
    if st == 0:
        raise ShapeError("slice step cannot be zero")
    if (s <= -HUGE and st > 0) or (s >= HUGE and st < 0):
        s = None
    if (e >= HUGE and st > 0) or (e <= -HUGE and st < 0):
        e = None
    return s, e, st


def _index_range(d, s, e, st):
    """(lo, hi) of the positions ``range(d)[s:e:st]`` visits, for bounds that cannot be negative and a step > 0:
    ``arange(lo, hi, st)``; None for other bounds."""
    if not (isinstance(st, int) and st > 0) or isinstance(st, bool):
        return None
    if isinstance(e, int) and e >= HUGE:
        e = d
    s, e = as_dim(s), as_dim(e)
    if s is None or e is None:
        return None
    return dim_min(s, d), dim_min(e, d)


@rewrites("slice_dyn")
def _slice(b, emit, ins, known, attrs):
    x, axes = ins[0], attrs.axis
    entries = [known[k] or [None] * len(axes) for k in (1, 2, 3)]
    static, takes, rest = [], [], []
    for k, ax in enumerate(axes):
        s, e, st = (entries[j][k] for j in range(3))
        if st == 0 and not isinstance(st, bool):
            raise ShapeError(f"slice step cannot be zero (steps {describe(entries[2])})")
        d = x.type.shape[ax]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (s, e, st)):
            static.append((ax, *_static_bounds(s, e, st)))
            continue
        lohi = _index_range(d, s, e, st)
        if lohi is None:
            rest.append(k)
        elif lohi != (0, d) or st != 1:
            takes.append((ax, *lohi, st))
    if len(rest) == len(axes):
        return None
    y = x
    if static:
        y = emit("slice", [y], SliceAttrs(*map(tuple, zip(*static))))[0]
    for ax, lo, hi, st in takes:
        idx = emit("arange", [], ArangeAttrs(lo, hi, st, "int64"))[0]
        y = emit("take", [y, idx], AxisAttrs(ax))[0]
    if rest:                # the axes known only when it runs: their bounds picked out of the operands
        pick = b.constant(np.asarray(rest, np.int64))
        bounds = [emit("take", [v, pick], AxisAttrs(0))[0] for v in ins[1:]]
        y = emit("slice_dyn", [y, *bounds], AxesAttrs(tuple(axes[k] for k in rest)))[0]
    return [y]


@rewrites("slice_axes_dyn")
def _slice_axes(b, emit, ins, known, attrs):
    axes = ints_of(known[4])
    r = ins[0].type.ndim
    if axes is None:
        return None
    if any(not -r <= ax < r for ax in axes) or len({ax % r for ax in axes}) != len(axes):
        raise ShapeError(f"the slice axes {axes} must be distinct axes of a rank-{r} tensor")
    return emit("slice_dyn", ins[:4], AxesAttrs(tuple(ax % r for ax in axes)))
