"""Reduction converters (sum, mean, max, min, prod; argmax, argmin) in numpy's accumulation dtypes.

Sum/prod/mean over a symbolic axis get the empty-axis guard (`common.guard_empty`); max/min and
argmax/argmin of an empty axis raise at run time like numpy (`_nonempty`); float max/min and
argmax/argmin use the NaN-propagating TE computes of `te_kernels`. On the CPU, a 1-d input reduced to a
scalar (argmax/argmin with ``axis=None`` after flattening) uses `te_kernels.te_lane_reduce`, which the CPU
schedules vectorize and parallelize (the generic computes are scalar loops there)."""
from __future__ import annotations

from functools import partial

from tvm import tirx
from tvm.relax import op as R

from ...ir.dtypes import is_float
from ...ir.ops import Group, get_op, ops_in
from ...ir.shapes import norm_axes, norm_axis
from ..dims import I64
from ..te_kernels import (nonempty_primfunc, te_first_index, te_lane_reduce, te_mean_div, te_nan_reduce,
                          te_nan_reduce_keyed)
from .registry import converter
from .common import cast, checked, const, dtype_of, emit, full_expr, guard_empty, ndim_of, prod, shape_of


#: Use `te_lane_reduce` for full reductions of 1-d inputs on the CPU (a switch for before/after benchmarks).
LANE_REDUCE = True


def _nan_reduce(ctx):
    """The NaN-propagating float max/min: on a GPU (`ctx.device_checks`) the integer-key form its threads can
    reduce together (`backends/cuda/gpu_reduction.py`), on the CPU the custom reducer (a serial loop either way)."""
    return te_nan_reduce_keyed if ctx.device_checks else te_nan_reduce


def _lanes(ctx, x, axes) -> bool:
    """True where `te_lane_reduce` computes the reduction: the CPU, a 1-d input reduced over its axis."""
    return LANE_REDUCE and not ctx.device_checks and ndim_of(x) == 1 and list(axes) == [0]


def _lane_reduce(bb, x, kind, keep):
    r = bb.emit_te(te_lane_reduce, emit(bb, x), kind, primfunc_name_hint=f"dt_lanes_{kind}")
    return emit(bb, R.reshape(r, [tirx.IntImm(I64, 1)])) if keep else r


def _reduce(name):
    dtype_rule = get_op(name).result_dtype
    extreme = getattr(R, name) if name in ("max", "min") else None

    def conv(bb, node, args, ctx):
        dt = dtype_rule([dtype_of(args[0])], node.attrs)       # numpy's accumulator dtype
        if dt == "float16" and name in ("sum", "mean"):     # numpy sums float16 in float32, then rounds
            return [R.astype(reduce(bb, node, emit(bb, R.astype(args[0], "float32")), ctx, "float32"), dt)]
        return [reduce(bb, node, args[0], ctx, dt)]

    def reduce(bb, node, x, ctx, dt):
        nd = ndim_of(x)
        axes = list(norm_axes(node.attrs.axis, nd))
        keep = bool(node.attrs.keepdims)
        shape = shape_of(x)
        extents = [shape[a] for a in axes]
        if _lanes(ctx, x, axes):
            if name in ("sum", "prod") or name == "mean":   # the identity for an empty input: no guard
                s = _lane_reduce(bb, emit(bb, cast(x, dt)), "prod" if name == "prod" else "sum", keep)
                if name != "mean":
                    return s
                count = extents[0]
                if isinstance(count, tirx.IntImm) and int(count.value) > 0:
                    return R.divide(s, const(int(count.value), dt))
                if isinstance(count, tirx.IntImm):
                    return full_expr(shape_of(s), float("nan"), dt)
                return bb.emit_te(te_mean_div, s, x, count, primfunc_name_hint="dt_mean_div")
            xe = emit(bb, R.astype(x, "int8")) if dt == "bool" else x
            r = _nonempty(bb, ctx, _lane_reduce(bb, xe, name, keep), extents, "int8" if dt == "bool" else dt)
            return R.astype(r, "bool") if dt == "bool" else r
        if name in ("sum", "prod"):
            x = emit(bb, cast(x, dt))
            fn = R.sum if name == "sum" else R.prod
            r = fn(x, axis=axes, keepdims=keep) if axes else x
            return guard_empty(bb, ctx, r, x, extents, 0 if name == "sum" else 1) if axes else r
        if name == "mean":
            x = emit(bb, cast(x, dt))
            if not axes:
                return x
            s = emit(bb, R.sum(x, axis=axes, keepdims=keep))
            count = ctx.analyzer.simplify(prod(extents))
            if isinstance(count, tirx.IntImm) and int(count.value) > 0:
                return R.divide(s, const(int(count.value), dt))
            if isinstance(count, tirx.IntImm):      # a static 0-length axis: nan (numpy), no divide by 0
                return full_expr(shape_of(s), float("nan"), dt)
            return bb.emit_te(te_mean_div, s, x, count, primfunc_name_hint="dt_mean_div")
        # max / min: numpy raises when the reduced extent is 0 (no identity): a run-time check
        if not axes:
            return x
        if is_float(dt):
            r = bb.emit_te(_nan_reduce(ctx), emit(bb, x), axes, keep, name == "max", primfunc_name_hint="dt_" + name)
            return _nonempty(bb, ctx, r, extents, dt)
        if dt == "bool":
            r = _nonempty(bb, ctx, emit(bb, extreme(R.astype(x, "int8"), axis=axes, keepdims=keep)), extents, "int8")
            return R.astype(r, "bool")
        return _nonempty(bb, ctx, emit(bb, extreme(x, axis=axes, keepdims=keep)), extents, dt)
    return conv


def _nonempty(bb, ctx, r, extents, dtype):
    """`r` (a reduction over `extents`), or a run-time error where their product is 0 (numpy raises for
    max/min/argmax/argmin: no identity), unless it is provably positive."""
    n = ctx.analyzer.simplify(prod(extents))
    if ctx.positive(n):
        return r
    return checked(bb, ctx, f"dt_check_nonempty_{dtype}", partial(nonempty_primfunc, dtype), r, n, dtype,
                   "nonempty")


for _name in ops_in(Group.REDUCE):
    converter(_name)(_reduce(_name))


def _argreduce_expr(bb, ctx, x, axis, keepdims, is_max):
    """numpy argmax/argmin along `axis`: the extreme (NaN-propagating for floats), then the first
    index holding it; an empty axis raises at run time like numpy (unless provably non-empty)."""
    if _lanes(ctx, x, [axis]):
        r = _lane_reduce(bb, x, "argmax" if is_max else "argmin", keepdims)
        return _nonempty(bb, ctx, r, [shape_of(x)[axis]], I64)
    if is_float(dtype_of(x)):
        m = bb.emit_te(_nan_reduce(ctx), x, [axis], True, is_max, primfunc_name_hint="dt_" + ("max" if is_max else "min"))
    else:
        m = emit(bb, (R.max if is_max else R.min)(x, axis=[axis], keepdims=True))
    r = bb.emit_te(te_first_index, x, m, axis, keepdims,
                   primfunc_name_hint="dt_" + ("argmax" if is_max else "argmin"))
    return _nonempty(bb, ctx, r, [shape_of(x)[axis]], I64)


@converter(*ops_in(Group.ARG_REDUCE))
def _argreduce(bb, node, args, ctx):
    x = args[0]
    nd = ndim_of(x)
    keep = bool(node.attrs.keepdims)
    is_max = node.op == "argmax"
    if dtype_of(x) == "bool":
        x = R.astype(x, "int8")
    x = emit(bb, x)
    if node.attrs.axis is None:            # flattened, like numpy
        flat = x if nd == 1 else emit(bb, R.reshape(x, [prod(shape_of(x)) if nd else tirx.IntImm(I64, 1)]))
        r = _argreduce_expr(bb, ctx, flat, 0, False, is_max)
        if keep:
            r = R.reshape(r, [tirx.IntImm(I64, 1)] * nd)
        return [r]
    if nd == 0:
        return [const(0, I64)]
    return [_argreduce_expr(bb, ctx, x, norm_axis(int(node.attrs.axis), nd), keep, is_max)]
