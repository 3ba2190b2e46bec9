"""The ONNX converters of the indexing ops with data-dependent or mode-dependent forms (`Pad` in its four modes,
`Slice` with computed bounds, `Split`, `Unique`), registered into `onnx_ops.CONVERTERS` like the others."""
from __future__ import annotations

import numpy as np

from ..ir.types import dim_add, dim_floordiv, dim_min, dim_mul
from . import F
from .onnx_ops import INT_MAX, OnnxImportError, _const, _ints, _is_const, _rank, _shape, converter

PAD_MODES = ("constant", "edge", "reflect", "wrap")


def _pymod(a, m):
    """Python's ``a % m`` of int64 tensors for m > 0 (a nonnegative result)."""
    r = F.fmod(a, m)
    return F.where(F.less(r, np.int64(0)), r + m, r)


def _pad_index(x, axis: int, lo: int, hi: int, mode: str):
    """The int64 positions of axis `axis` of x that ``np.pad(x, (lo, hi), mode)`` reads, one per position of
    the padded axis: from numpy itself for a static dim, else computed from the run-time size n (edge: clamped
    to [0, n - 1]; wrap: modulo n; reflect: a triangle wave of period 2 (n - 1), so pads longer than the axis
    reflect again, as numpy's do)."""
    n = _shape(x)[axis]
    if isinstance(n, (int, np.integer)):
        if n == 0:
            raise OnnxImportError(f"Pad mode {mode!r} cannot pad axis {axis}: it is empty")
        return np.pad(np.arange(n, dtype=np.int64), (lo, hi), mode=mode)
    i = F.arange(0, dim_add(n, lo + hi)) - np.int64(lo)
    size = F.take(F.shape_of(x), np.int64(axis))
    if mode == "edge":
        return F.minimum(F.maximum(i, np.int64(0)), size - np.int64(1))
    if mode == "wrap":
        return _pymod(i, size)
    period = F.maximum((size - np.int64(1)) * np.int64(2), np.int64(1))     # one row reflects onto itself
    m = _pymod(i, period)
    return F.where(F.less(m, size), m, period - m)


@converter("Pad")
def _pad(ins, a, ctx, env, node):
    x = ins[0]
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in PAD_MODES:
        raise OnnxImportError(f"Pad mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    if ctx.opset < 11:
        pads, value = a.get("pads", a.get("paddings")), a.get("value", 0.0)
    else:
        pads = _ints(ins[1], "Pad's pads", node)
        value = 0 if len(ins) < 3 or ins[2] is None else np.asarray(_const(ins[2], "Pad's constant value",
                                                                          node)).item()
    axes = list(range(_rank(x)))
    if len(ins) > 3 and ins[3] is not None:
        axes = [ax % _rank(x) for ax in _ints(ins[3], "Pad's axes", node)]
    n = len(axes)
    if len(pads) != 2 * n:
        raise OnnxImportError(f"Pad: {len(pads)} pads for {n} axes (it needs two per axis: all the befores, then "
                              "all the afters)")
    width = [(0, 0)] * _rank(x)
    for k, ax in enumerate(axes):
        width[ax] = (int(pads[k]), int(pads[k + n]))
    if any(p < 0 for w in width for p in w):
        raise OnnxImportError("Pad with negative pads (cropping) is not supported")
    if mode == "constant":
        return F.pad(x, tuple(width), value)
    for ax, (lo, hi) in enumerate(width):
        if lo or hi:
            x = F.take(x, _pad_index(x, ax, lo, hi, mode), axis=ax)
    return x


@converter("Slice")
def _slice(ins, a, ctx, env, node):
    x = ins[0]
    if ctx.opset < 10:
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends = ins[1], ins[2]
        axes = _ints(ins[3], "Slice's axes", node) if len(ins) > 3 and ins[3] is not None else None
        steps = ins[4] if len(ins) > 4 and ins[4] is not None else None
        if not all(_is_const(v) for v in (starts, ends, steps)):      # computed bounds: a data-dependent slice
            n = len(axes) if axes is not None else _shape(starts)[0]
            if not isinstance(n, int):
                raise OnnxImportError("Slice with computed starts of unknown length and no axes: the sliced axes "
                                      "must be known when the model is imported")
            axes = list(range(n)) if axes is None else [ax % _rank(x) for ax in axes]
            return F.slice(x, _vec(starts), _vec(ends), [1] * n if steps is None else _vec(steps), axes)
        starts, ends = _ints(starts, "Slice's starts", node), _ints(ends, "Slice's ends", node)
        steps = None if steps is None else _ints(steps, "Slice's steps", node)
    clamp = lambda v: None if abs(v) >= INT_MAX else v     # noqa: E731
    steps = steps or [1] * len(starts)
    ends = [None if (e <= -INT_MAX and s < 0) else clamp(e) for e, s in zip(ends, steps)]
    return F.slice(x, [clamp(s) for s in starts], ends, steps,
                   None if axes is None else [ax % _rank(x) for ax in axes])


def _vec(v):
    """A Slice bound as a 1-d int64 tensor or array (ONNX takes int32 or int64)."""
    return F.astype(v, "int64") if not _is_const(v) else np.asarray(v, dtype=np.int64).reshape(-1)


@converter("Split")
def _split(ins, a, ctx, env, node):
    x, axis = ins[0], a.get("axis", 0) % _rank(ins[0])
    sizes = a.get("split")
    if len(ins) > 1 and ins[1] is not None:
        sizes = _ints(ins[1], "Split's sizes", node)
    n = len(node.output)
    dim = _shape(x)[axis]
    if sizes is not None:
        return F.split(x, list(np.cumsum(sizes)[:-1]), axis=axis)
    if isinstance(dim, (int, np.integer)):      # chunks of ceil(dim / n); the last smaller, or empty (as ONNX's)
        if int(dim) % n and ctx.opset < 18:
            raise OnnxImportError(f"Split: a dim of {dim} does not split into {n} equal parts (before opset 18)")
        chunk = -(-int(dim) // n)
        return F.split(x, [chunk * k for k in range(1, n)], axis=axis)
    # a symbolic dim: chunk k is positions [min(k c, dim), min((k + 1) c, dim)) with c = ceil(dim / n)
    chunk = dim_floordiv(dim_add(dim, n - 1), n)
    bounds = [0] + [dim_min(dim_mul(chunk, k), dim) for k in range(1, n)] + [dim]
    return [F.take(x, F.arange(lo, hi), axis=axis) for lo, hi in zip(bounds[:-1], bounds[1:])]


@converter("Unique")
def _unique(ins, a, ctx, env, node):
    x = ins[0]
    axis = a.get("axis")
    if axis is None:
        x = F.flatten(x)
    outs = list(node.output) + [""] * (4 - len(node.output))
    res = F.unique(x, return_index=bool(outs[1]), return_inverse=bool(outs[2]), return_counts=bool(outs[3]),
                   axis=axis, sorted=bool(a.get("sorted", 1)))
    res = list(res) if isinstance(res, (list, tuple)) else [res]
    return [res.pop(0) if k == 0 or outs[k] else None for k in range(4)]
