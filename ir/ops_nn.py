"""Registry entries of the sliding-window ops: `conv`, `max_pool`, `avg_pool` (NC<spatial> layout, 1 to 3
spatial axes), and the one formula of their output sizes (`window_out_size`), which the type rules, the numpy
kernels and the Relax converters all use.

* ``conv(x [N, C, *S], w [O, C / groups, *K]) -> [N, O, *S_out]``: cross-correlation (no kernel flip), zero
  padding, float dtypes (float16 accumulates in float32).
* ``max_pool(x [N, C, *S]) -> [N, C, *S_out]``: the maximum of each window's taps inside x (padding never
  counts; a window with no tap inside x gives -inf, the dtype's minimum for integers); NaN propagates.
* ``avg_pool``: the mean of each window's taps inside x, or inside x and its padding (`count_include_pad`;
  the padding counts as zeros); taps that `ceil_mode` adds past the padding never count. No tap to count:
  NaN. Float dtypes (float16 sums in float32).

Output size per spatial axis: ``floor((S + lo + hi - (dilation * (K - 1) + 1)) / stride) + 1``; with
`ceil_mode` rounded up, less one where the last window would start past ``S + lo`` (ONNX's and PyTorch's
rule). A padded input smaller than the dilated kernel (an output size below 1) is an error.
"""
from __future__ import annotations

import numpy as np

from .attrs import ConvAttrs, PoolAttrs
from .ops import register
from .shapes import ShapeError, unify_dims
from .types import TensorType, dim_add, dim_floordiv, dim_max, dim_min, dim_mul, dim_sub

_DIM_OPS = (dim_add, dim_sub, dim_mul, dim_floordiv, dim_min, dim_max)
_INT_OPS = (lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a // b, min, max)


def window_span(k: int, dilation: int) -> int:
    """How many input positions a dilated window covers."""
    return dilation * (k - 1) + 1


def window_out_size(n, k: int, stride: int, dilation: int, lo: int, hi: int, ceil_mode: bool = False, ops=None):
    """The output size of a sliding window along one axis of size `n` (see the module docstring). `ops` is
    (add, sub, mul, floordiv, min, max) for `n`'s kind: Python ints by default, `_DIM_OPS` for our dims, or
    PrimExpr operations for a converter; the size can be below 1 (an error the callers report)."""
    add, sub, mul, floordiv, mn, mx = ops or _INT_OPS
    base = lo + hi - window_span(k, dilation)                        # n + base: the positions past the first window
    if not ceil_mode:
        return add(floordiv(add(n, base), stride), 1)
    c = floordiv(add(n, base + stride - 1), stride)                  # ceil((n + base) / stride)
    # the last window starts at c * stride (padded coordinates): drop it if that is at or past n + lo
    past = mn(mx(sub(mul(c, stride), add(n, lo - 1)), 0), 1)
    return sub(add(c, 1), past)


def window_out_dim(n, k, stride, dilation, lo, hi, ceil_mode=False):
    """`window_out_size` of a dim of our IR (an int, or a symbolic expression)."""
    if isinstance(n, int):
        return window_out_size(n, k, stride, dilation, lo, hi, ceil_mode)
    return window_out_size(n, k, stride, dilation, lo, hi, ceil_mode, _DIM_OPS)


def _spatial(x: TensorType, nsp: int, kernel, a) -> list:
    if x.ndim != nsp + 2:
        raise ShapeError(f"{nsp} spatial axes need data of rank {nsp + 2} (N, C, spatial...), got {x}")
    out = []
    ceil = getattr(a, "ceil_mode", False)
    for i, (n, k, s, d, (lo, hi)) in enumerate(zip(x.shape[2:], kernel, a.strides, a.dilations, a.pads)):
        o = window_out_dim(n, k, s, d, lo, hi, ceil)
        if isinstance(o, int) and o < 1:
            raise ShapeError(f"spatial axis {i} of {x} padded by {(lo, hi)} is smaller than the dilated "
                             f"kernel ({window_span(k, d)} positions): no output position")
        out.append(o)
    return out


def _float_only(*ts):
    for t in ts:
        if np.dtype(t.dtype).kind != "f":
            raise ShapeError(f"float tensors only, got {t.dtype}")


def _conv(ts, a: ConvAttrs):
    x, w = ts
    _float_only(x, w)
    if x.dtype != w.dtype:
        raise ShapeError(f"data and weight dtypes differ ({x.dtype}, {w.dtype})")
    nsp = len(a.strides)
    if w.ndim != nsp + 2:
        raise ShapeError(f"{nsp} spatial axes need a weight of rank {nsp + 2} (O, C / groups, "
                         f"kernel...), got {w}")
    if not w.is_static:
        raise ShapeError(f"the weight's shape must be static, got {w}")
    o, cg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    if cg < 1 or min(kernel) < 1:
        raise ShapeError(f"the weight {w} has an empty axis")
    if o % a.groups:
        raise ShapeError(f"{o} output channels (weight axis 0) do not split into {a.groups} groups")
    try:
        unify_dims(x.shape[1], cg * a.groups, "conv")
    except ShapeError:
        raise ShapeError(f"data {x} has {x.shape[1]} channels, but the weight {w} with {a.groups} group(s) "
                         f"takes {cg * a.groups}") from None
    return [TensorType((x.shape[0], o, *_spatial(x, nsp, kernel, a)), x.dtype)]


def _pool(op: str, floats: bool):
    def rule(ts, a: PoolAttrs):
        x = ts[0]
        if floats:
            _float_only(x)
        elif x.dtype == "bool":
            raise ShapeError("numeric tensors only, got bool")
        if op == "max_pool" and a.count_include_pad:
            raise ShapeError("count_include_pad applies to avg_pool only")
        return [TensorType(x.shape[:2] + tuple(_spatial(x, len(a.kernel), a.kernel, a)), x.dtype)]
    return rule


register("conv", ConvAttrs, _conv, num_inputs=2,
         doc="N-d convolution (cross-correlation) of NC<spatial> data with an O,C/groups,<kernel> weight.")
register("max_pool", PoolAttrs, _pool("max_pool", False), num_inputs=1,
         doc="N-d max pooling over the spatial axes of NC<spatial> data.")
register("avg_pool", PoolAttrs, _pool("avg_pool", True), num_inputs=1,
         doc="N-d average pooling over the spatial axes of NC<spatial> data.")

__all__ = ["window_out_dim", "window_out_size", "window_span"]
