"""Sliding-window converters: `conv` (on the CPU the TE computes of `te_conv.py`, the weight packed at compile
time for its schedule, `cpu_schedule_conv.py`; on a GPU Relax's ``conv1d/2d/3d``, NCW / NCHW / NCDHW with OIW /
OIHW / OIDHW weights, padding given as all the before-sides, then all the after-sides), `max_pool` and
`avg_pool` (the TE computes of `te_window.py`, whose reasons are there). float16 convolves and sums in float32.

A padded input smaller than the dilated kernel is an error in numpy (`runtime/kernels_nn.py`); where a
symbolic spatial dim makes that possible at run time, a run-time check (`common.checked`) stands in front of
the kernel (on a 1-element tensor the kernel reads; Relax's conv on a GPU: on the weight), so the compiled
region fails and the executor reports numpy's error."""
from __future__ import annotations

from functools import partial

import numpy as np
from tvm import relax, tirx
from tvm.relax import op as R

from ...ir.ops_nn import window_out_size
from ..dims import I64, is_one
from ..te_conv import (OUT_EWISE_FUSABLE, flat_positions, gemv_channel_block, is_pointwise, out_channel_block,
                       pack_axes, position_lanes, strided_position_lanes, te_conv)
from ..te_kernels import nonempty_primfunc
from ..te_window import te_avg_pool, te_max_pool
from .common import assert_dims, cast, checked, constant_of, dtype_of, emit, shape_of
from .registry import converter
from .window_dims import plain_window_sizes


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


#: Convolutions on the CPU through `te_conv` (False: Relax's conv1d/2d/3d, as before; for A/B measurements).
TE_CONV = True

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
    groups = int(a.groups)
    if TE_CONV and not ctx.device_checks and sw[0] > 0 and sw[1] > 0:     # the CPU: our computes (`te_conv`)
        out = _out_sizes(ctx, x, sw[2:], a)
        vb = out_channel_block(sw[0] // groups, sw[1], groups)
        if vb > 1 and groups == 1 and all(is_one(o) for o in out):
            vb = gemv_channel_block(sw[0])
        w = _packed_weight(bb, w, sw, vb, work)
        # the size check on a 1-element tensor the kernel reads (through the weight, it copied every weight
        # at every call: 47 MB for resnet18)
        guard = None
        if not all(ctx.positive(o) for o in out):
            guard = _check_sizes(bb, ctx, emit(bb, R.zeros([tirx.IntImm(I64, 1)], I64)), out)
        sizes = plain_window_sizes(bb, ctx, node, out)
        data = emit(bb, cast(x, work))
        call = bb.call_te(te_conv, data, w, list(a.strides), list(a.dilations), list(a.pads),
                          sizes, groups, vb, guard, primfunc_name_hint="dt_conv")
        # over flattened positions: fusable with its epilogue as the per-row form is (`te_conv.OUT_EWISE_FUSABLE`)
        if flat_positions(sizes, vb, work, int(np.prod(sw[1:])), is_pointwise(sw[2:], a.strides, a.pads), sw[0]) \
                or position_lanes(list(data.ty.shape.values)[2:], sizes, sw[2:], a.strides, a.pads, groups,
                                  vb, max(sw[0], sw[1]), sw[0], work) \
                or strided_position_lanes(sizes, sw[2:], a.strides, a.pads, groups, vb, max(sw[0], sw[1])):
            bb.update_func(call.args[0], bb.get()[call.args[0]].with_attr("op_pattern", OUT_EWISE_FUSABLE))
        return [cast(emit(bb, call), dt)]
    w = _check_sizes(bb, ctx, w, _out_sizes(ctx, x, sw[2:], a))
    fn, data_layout, kernel_layout = _CONV[nsp]
    r = fn(emit(bb, cast(x, work)), emit(bb, cast(w, work)), strides=list(a.strides),
           padding=[lo for lo, _ in a.pads] + [hi for _, hi in a.pads], dilation=list(a.dilations),
           groups=int(a.groups), data_layout=data_layout, kernel_layout=kernel_layout, out_dtype=work)
    return [cast(emit(bb, r), dt)]


def _packed_weight(bb, w, sw: list, vb: int, work: str):
    """The weight in `work` dtype, packed for ``te_conv`` when vb > 1: once, here, when it is a constant (the
    usual case: a model's weights), else by a transpose kernel at run time."""
    value = constant_of(bb, w)
    if value is not None:
        value = value.astype(work)
        if vb > 1:
            value = value.reshape([sw[0] // vb, vb] + sw[1:]).transpose(pack_axes(len(sw) - 2))
        return emit(bb, relax.const(np.ascontiguousarray(value), work))
    w = emit(bb, cast(w, work))
    if vb == 1:
        return w
    split = emit(bb, R.reshape(w, [sw[0] // vb, vb] + sw[1:]))
    return emit(bb, R.permute_dims(split, pack_axes(len(sw) - 2)))


def _pool(kind):
    def conv(bb, node, args, ctx):
        a = node.attrs
        x = args[0]
        out = _out_sizes(ctx, x, a.kernel, a, a.ceil_mode)
        guard = None
        if not all(ctx.positive(o) for o in out):
            guard = _check_sizes(bb, ctx, emit(bb, R.zeros([tirx.IntImm(I64, 1)], I64)), out)
        geometry = (list(a.kernel), list(a.strides), list(a.dilations), list(a.pads),
                    plain_window_sizes(bb, ctx, node, out))
        if kind == "max":
            r = bb.emit_te(te_max_pool, x, *geometry, guard, primfunc_name_hint="dt_max_pool")
        else:
            r = bb.emit_te(te_avg_pool, x, *geometry, bool(a.count_include_pad), guard,
                           primfunc_name_hint="dt_avg_pool")
        return [r]
    return conv


converter("max_pool")(_pool("max"))
converter("avg_pool")(_pool("avg"))
