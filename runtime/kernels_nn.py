"""Numpy kernels of the sliding-window ops (`conv`, `max_pool`, `avg_pool`; semantics in `ir/ops_nn.py`),
registered by `kernels.py`. Vectorized: the windows of the padded input are one strided view
(`sliding_window_view`, stepped by the strides and the dilations); conv contracts it with the weight
(`np.einsum`, im2col), the pools reduce its window axes."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..ir.ops_nn import window_out_size, window_span


def _work_dtype(dtype) -> np.dtype:
    """float16 accumulates in float32."""
    return np.dtype("float32") if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def _geometry(op: str, spatial: tuple, kernel, strides, dilations, pads, ceil_mode=False):
    """Output sizes, and the padding past `pads`' after side that `ceil_mode`'s last windows reach."""
    out, extra = [], []
    for i, (n, k, s, d, (lo, hi)) in enumerate(zip(spatial, kernel, strides, dilations, pads)):
        o = window_out_size(n, k, s, d, lo, hi, ceil_mode)
        if o < 1:
            raise ValueError(f"{op}: spatial axis {i} of size {n} padded by {(lo, hi)} is smaller than the dilated "
                             f"kernel ({window_span(k, d)} positions): no output position")
        out.append(o)
        extra.append(max((o - 1) * s + window_span(k, d) - (n + lo + hi), 0))
    return out, extra


def _windows(xp, kernel, strides, dilations, out):
    """The windows of padded `xp` [..., *spatial] as a view [..., *out, *kernel]."""
    nsp = len(kernel)
    lead = xp.ndim - nsp
    spans = [window_span(k, d) for k, d in zip(kernel, dilations)]
    v = sliding_window_view(xp, spans, axis=tuple(range(lead, xp.ndim)))
    idx = (slice(None),) * lead + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, strides)) + \
        tuple(slice(None, None, d) for d in dilations)
    return v[idx]


def conv(attrs, x, w):
    nsp = w.ndim - 2
    n, c = x.shape[:2]
    o, cg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    g = attrs.groups
    if c != cg * g:
        raise ValueError(f"conv: the data has {c} channels, the weight {tuple(w.shape)} with {g} group(s) takes "
                         f"{cg * g}")
    out, _ = _geometry("conv", x.shape[2:], kernel, attrs.strides, attrs.dilations, attrs.pads)
    work = _work_dtype(x.dtype)
    xp = np.pad(x.astype(work, copy=False), ((0, 0), (0, 0)) + attrs.pads)
    win = _windows(xp, kernel, attrs.strides, attrs.dilations, out).reshape(n, g, cg, *out, *kernel)
    wg = w.astype(work, copy=False).reshape(g, o // g, cg, *kernel)
    so, sk = "xyz"[:nsp], "uvw"[:nsp]
    r = np.einsum(f"ngc{so}{sk},gpc{sk}->ngp{so}", win, wg, optimize=True)
    return (np.ascontiguousarray(r.reshape(n, o, *out)).astype(x.dtype, copy=False),)


def _lowest(dtype):
    dt = np.dtype(dtype)
    return dt.type(-np.inf) if dt.kind == "f" else np.iinfo(dt).min


def max_pool(attrs, x):
    a = attrs
    out, extra = _geometry("max_pool", x.shape[2:], a.kernel, a.strides, a.dilations, a.pads, a.ceil_mode)
    pads = ((0, 0), (0, 0)) + tuple((lo, hi + e) for (lo, hi), e in zip(a.pads, extra))
    xp = np.pad(x, pads, constant_values=_lowest(x.dtype))
    win = _windows(xp, a.kernel, a.strides, a.dilations, out)
    if not win.size:
        return (np.empty(x.shape[:2] + tuple(out), x.dtype),)
    return (np.ascontiguousarray(win.max(axis=tuple(range(-len(a.kernel), 0)))),)


def avg_pool(attrs, x):
    a = attrs
    spatial = x.shape[2:]
    out, extra = _geometry("avg_pool", spatial, a.kernel, a.strides, a.dilations, a.pads, a.ceil_mode)
    work = _work_dtype(x.dtype)
    pads = tuple((lo, hi + e) for (lo, hi), e in zip(a.pads, extra))
    xp = np.pad(x.astype(work, copy=False), ((0, 0), (0, 0)) + pads)
    # which padded positions a window's mean counts: the input's, and the padding's with count_include_pad
    # (never the positions ceil_mode adds past it)
    counted = np.zeros(tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads)), work)
    counted[tuple(slice(0 if a.count_include_pad else lo, lo + n + (hi - e if a.count_include_pad else 0))
                  for n, (lo, hi), e in zip(spatial, pads, extra))] = 1
    axes = tuple(range(-len(a.kernel), 0))
    sums = _windows(xp, a.kernel, a.strides, a.dilations, out).sum(axis=axes)
    counts = _windows(counted, a.kernel, a.strides, a.dilations, out).sum(axis=axes)
    with np.errstate(all="ignore"):
        return (np.ascontiguousarray(sums / counts).astype(x.dtype, copy=False),)
