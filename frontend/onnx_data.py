"""The ONNX converters of the indexing ops with data-dependent or mode-dependent forms (`Pad` in its four modes,
`Slice` with computed bounds, `Split`, `Unique`), registered into `onnx_ops.CONVERTERS` like the others."""
from __future__ import annotations

import numpy as np

from ..ir.types import dim_add
from . import F
from .onnx_ops import OnnxImportError, _const, _ints, _is_const, _rank, _shape, converter

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
