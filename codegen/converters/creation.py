"""Converters of ops that create tensors: constant, full, full_like, arange, shape_of."""
from __future__ import annotations

import numpy as np
from tvm import relax, tirx
from tvm.relax import op as R

from ..dims import I64
from ..te_kernels import te_arange, te_shape_vector
from .registry import converter
from .common import full_expr, is_int, out_type, shape_of


@converter("constant")
def _constant(bb, node, args, ctx):
    v = np.asarray(node.attrs.value)
    return [relax.const(v, v.dtype.name)]


@converter("full")
def _full(bb, node, args, ctx):
    a = node.attrs
    return [full_expr(ctx.shape(a.shape), a.fill_value, np.dtype(a.dtype).name)]


@converter("full_like")
def _full_like(bb, node, args, ctx):
    return [full_expr(shape_of(args[0]), node.attrs.fill_value, out_type(node).dtype)]


@converter("arange")
def _arange(bb, node, args, ctx):
    a = node.attrs
    dt = np.dtype(a.dtype).name
    if isinstance(a.start, str) or isinstance(a.stop, str):
        # symbolic integer bounds (F.arange(x.shape[0])): start + i * step, computed in int64
        start, stop = ctx.dim(a.start), ctx.dim(a.stop)
        step = int(a.step)
        span = stop - start if step > 0 else start - stop
        n = ctx.analyzer.simplify(tirx.max(tirx.floordiv(span + (abs(step) - 1), abs(step)), 0))
        return [bb.emit_te(te_arange, start, tirx.IntImm(I64, step), n, dt, primfunc_name_hint="dt_arange")]
    ref = np.arange(a.start, a.stop, a.step, dtype=dt)
    if is_int(dt) and ref.size > 64:
        return [R.arange(int(a.start), int(a.stop), int(a.step), dt)]
    # float arange: numpy's fill (start + i * delta in the output dtype) is reproduced exactly by
    # embedding the values; small int ranges too.
    return [relax.const(ref, dt)]


@converter("shape_of")
def _shape_of(bb, node, args, ctx):
    dims = shape_of(args[0])
    if all(isinstance(d, tirx.IntImm) for d in dims):
        return [relax.const(np.array([int(d) for d in dims], np.int64), "int64")]
    return [bb.emit_te(te_shape_vector, *dims, primfunc_name_hint="dt_shape_of")]
