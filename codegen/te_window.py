"""TE computes of the pooling ops (`converters/window.py`), written out rather than Relax's
``max_pool*d`` / ``avg_pool*d``: the output sizes are ours (`ir.ops_nn.window_out_size`, ceil_mode's
"a window starts inside the input or its before-padding" rule), NaN propagates through a max (TOPI's max
keeps whichever operand the comparison picks), padding never enters a max, and an average divides by exactly
the taps `runtime/kernels_nn.avg_pool` counts (dilated windows included)."""
from __future__ import annotations

import tvm
from tvm import te, tirx

from .dims import i64 as _i64
from .te_kernels import isnan_bits


#: block names of `te_max_pool` (`cpu_schedule_pool` schedules them)
MAX_POOL_BLOCK = "max_pool"
POOL_PAD_BLOCK = "dt_pool_pad"


def _taps(x, kernel, strides, dilations, pads, rk, o):
    """Input coordinates of the taps of output position `o` (reduce vars `rk`), and whether all are inside."""
    pos = [o[i] * _i64(s) - _i64(lo) + rk[i] * _i64(d)
           for i, (s, d, (lo, _)) in enumerate(zip(strides, dilations, pads))]
    inside = tirx.all(*[tirx.all(p >= _i64(0), p < x.shape[2 + i]) for i, p in enumerate(pos)])
    return pos, inside


def _lowest(dtype: str):
    return -tirx.infinity(dtype) if dtype.startswith("float") else tirx.min_value(dtype)


def _nan_max(acc, b, dtype):
    """`b` if NaN, else the larger; a NaN `acc` stays (the ordered compare is false). Selects only, no
    ``tirx.isnan`` (`te_kernels.isnan_bits`): with it the max over a window became a branch per tap, and the
    row's loop stayed scalar."""
    return tirx.Select(isnan_bits(b, dtype), b, tirx.Select(b > acc, b, acc))


def te_max_pool(x, kernel, strides, dilations, pads, out, guard=None):
    """max_pool of `x` [N, C, *S] to [N, C, *out]. `guard`: a 1-element int64 tensor that a run-time check
    produced (always 0): read for the padding value, so that the check runs first."""
    dt = str(x.dtype)
    rk = [te.reduce_axis((_i64(0), _i64(k)), name=f"k{i}") for i, k in enumerate(kernel)]
    is_f = dt.startswith("float")
    red = te.comm_reducer((lambda a, b: _nan_max(a, b, dt)) if is_f else (lambda a, b: tirx.max(a, b)), _lowest,
                          name="nan_max")
    pad_value = _lowest(dt)
    if guard is not None:
        pad_value = pad_value + tirx.Cast(dt, guard[0])

    # the input padded with `pad_value` over the span the windows read ((out - 1) * stride + the window's
    # extent: ceil_mode's last window may pass the after-padding), so that the max reads it without a bounds
    # test per tap: a vector loop along the row (`cpu_schedule_pool`). Not where no window can leave the input.
    span = [tirx.max((_i64(o) - _i64(1)) * _i64(s) + _i64((k - 1) * d + 1), _i64(0))
            for o, k, s, d in zip(out, kernel, strides, dilations)]
    ana = tvm.sym.Analyzer()
    if (any(lo or hi for lo, hi in pads) or guard is not None
            or not all(ana.can_prove(sp <= x.shape[2 + i]) for i, sp in enumerate(span))):

        def padded(n, c, *p):
            src = [p[i] - _i64(lo) for i, (lo, _) in enumerate(pads)]
            inside = tirx.all(*[tirx.all(q >= _i64(0), q < x.shape[2 + i]) for i, q in enumerate(src)])
            return tirx.if_then_else(inside, x(n, c, *src), pad_value)
        xp = te.compute(list(x.shape[:2]) + span, padded, name=POOL_PAD_BLOCK)

        def f(n, c, *o):
            return red(xp(n, c, *[o[i] * _i64(s) + rk[i] * _i64(d)
                                  for i, (s, d) in enumerate(zip(strides, dilations))]), axis=rk)
    else:
        def f(n, c, *o):
            pos, _ = _taps(x, kernel, strides, dilations, pads, rk, o)
            return red(x(n, c, *pos), axis=rk)
    return te.compute(list(x.shape[:2]) + list(out), f, name=MAX_POOL_BLOCK)


def _count(n, k, s, d, lo, hi, o, include_pad):
    """How many taps of window `o` (k taps, stride s, dilation d) lie in [-lo, n + hi) (`include_pad`) or
    [0, n), in input coordinates."""
    start = o * _i64(s) - _i64(lo)
    lo_b, hi_b = (_i64(-lo), n + _i64(hi)) if include_pad else (_i64(0), n)
    first = tirx.max(tirx.floordiv(lo_b - start + _i64(d - 1), _i64(d)), _i64(0))   # ceil((lo_b - start) / d)
    last = tirx.min(tirx.floordiv(hi_b - _i64(1) - start, _i64(d)), _i64(k - 1))
    return tirx.max(last - first + _i64(1), _i64(0))


def te_avg_pool(x, kernel, strides, dilations, pads, out, count_include_pad, guard=None):
    """avg_pool of `x` [N, C, *S] to [N, C, *out] (float16 sums in float32); `guard` as in `te_max_pool`."""
    dt = str(x.dtype)
    work = "float32" if dt == "float16" else dt
    rk = [te.reduce_axis((_i64(0), _i64(k)), name=f"k{i}") for i, k in enumerate(kernel)]
    shape = list(x.shape[:2]) + list(out)

    def total(n, c, *o):
        pos, inside = _taps(x, kernel, strides, dilations, pads, rk, o)
        return te.sum(tirx.if_then_else(inside, tirx.Cast(work, x(n, c, *pos)), tirx.const(0, work)), axis=rk)
    sums = te.compute(shape, total, name="pool_sum")

    def mean(n, c, *o):
        cnt = _i64(1)
        for i, (k, s, d, (lo, hi)) in enumerate(zip(kernel, strides, dilations, pads)):
            cnt = cnt * _count(x.shape[2 + i], k, s, d, lo, hi, o[i], count_include_pad)
        if guard is not None:
            cnt = cnt + guard[0]
        return tirx.Cast(dt, sums(n, c, *o) / tirx.Cast(work, cnt))
    return te.compute(shape, mean, name="avg_pool")
