"""Sliding-window converters: `conv` (Relax ``conv1d/2d/3d``, NCW / NCHW / NCDHW with OIW / OIHW / OIDHW
weights; padding given as all the before-sides, then all the after-sides), `max_pool` and `avg_pool` (the TE
computes of `te_window.py`, whose reasons are there). float16 convolves and sums in float32.

A padded input smaller than the dilated kernel is an error in numpy (`runtime/kernels_nn.py`); where a
symbolic spatial dim makes that possible at run time, a run-time check (`common.checked`) stands in front of
the kernel (on the weight for conv, on a 1-element tensor the pool reads for pools), so the compiled region
fails and the executor reports numpy's error."""
from __future__ import annotations

from functools import partial

from tvm import tirx
from tvm.relax import op as R

from ...ir.ops_nn import window_out_size
from ..dims import I64
from ..te_kernels import nonempty_primfunc
from ..te_window import te_avg_pool, te_max_pool
from .common import assert_dims, cast, checked, dtype_of, emit, shape_of
from .registry import converter


def _prim(v):
    return tirx.IntImm(I64, v) if isinstance(v, int) else v


_PRIM_OPS = (lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: tirx.floordiv(a, _prim(b)),
             lambda a, b: tirx.min(_prim(a), _prim(b)), lambda a, b: tirx.max(_prim(a), _prim(b)))


def _out_sizes(ctx, x, kernel, a, ceil_mode=False) -> list:
    return [ctx.analyzer.simplify(window_out_size(_prim(n), k, s, d, lo, hi, ceil_mode, _PRIM_OPS))
            for n, k, s, d, (lo, hi) in zip(shape_of(x)[2:], kernel, a.strides, a.dilations, a.pads)]


def _check_sizes(bb, ctx, t, out):
    """`t` through a run-time check that every output size in `out` is >= 1 (None: provably so)."""
    unsure = [o for o in out if not ctx.positive(o)]
    if not unsure:
        return t
    n = unsure[0]
    for o in unsure[1:]:
        n = tirx.min(n, o)
    dt = dtype_of(t)
    return emit(bb, checked(bb, ctx, f"dt_check_nonempty_{dt}", partial(nonempty_primfunc, dt), t, n, dt,
                            "nonempty"))


_CONV = {1: (R.nn.conv1d, "NCW", "OIW"), 2: (R.nn.conv2d, "NCHW", "OIHW"), 3: (R.nn.conv3d, "NCDHW", "OIDHW")}


@converter("conv")
def _conv(bb, node, args, ctx):
    a = node.attrs
    x, w = args
    nsp = len(a.strides)
    dt = dtype_of(x)
    work = "float32" if dt == "float16" else dt
    sw = [int(d) for d in node.inputs[1].type.shape]
    x = assert_dims(bb, ctx, x, {1: tirx.IntImm(I64, sw[1] * a.groups)})     # C: checked at run time
    w = _check_sizes(bb, ctx, w, _out_sizes(ctx, x, sw[2:], a))
    fn, data_layout, kernel_layout = _CONV[nsp]
    r = fn(emit(bb, cast(x, work)), emit(bb, cast(w, work)), strides=list(a.strides),
           padding=[lo for lo, _ in a.pads] + [hi for _, hi in a.pads], dilation=list(a.dilations),
           groups=int(a.groups), data_layout=data_layout, kernel_layout=kernel_layout, out_dtype=work)
    return [cast(emit(bb, r), dt)]


def _pool(kind):
    def conv(bb, node, args, ctx):
        a = node.attrs
        x = args[0]
        out = _out_sizes(ctx, x, a.kernel, a, a.ceil_mode)
        guard = None
        if not all(ctx.positive(o) for o in out):
            guard = _check_sizes(bb, ctx, emit(bb, R.zeros([tirx.IntImm(I64, 1)], I64)), out)
        geometry = (list(a.kernel), list(a.strides), list(a.dilations), list(a.pads), out)
        if kind == "max":
            return [bb.emit_te(te_max_pool, x, *geometry, guard, primfunc_name_hint="dt_max_pool")]
        return [bb.emit_te(te_avg_pool, x, *geometry, bool(a.count_include_pad), guard,
                           primfunc_name_hint="dt_avg_pool")]
    return conv


converter("max_pool")(_pool("max"))
converter("avg_pool")(_pool("avg"))
