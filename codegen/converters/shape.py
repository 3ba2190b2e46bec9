"""Shape converters: reshape, transpose, expand_dims, squeeze, concat, stack, slice, split, take,
broadcast_to, tile, pad.

Reshape sizes Relax cannot prove equal get a run-time checked ``match_cast``; slices, splits, take
and symbolic broadcasts are our own TE computes (`te_kernels`): Relax's ``strided_slice`` infers
negative lengths for empty symbolic slices, ``broadcast_to`` reads out of bounds when a symbolic dim
is 1 at run time, and ``take`` defaults to an unchecked mode."""
from __future__ import annotations

import numpy as np
from tvm import relax, te, tirx
from tvm.relax import op as R

from dyntvm.errors import CompileError
from ...ir.shapes import norm_axes, norm_axis
from ..dims import I64, is_one
from ..te_kernels import same_size_primfunc, take_index_primfunc, te_broadcast, te_slice, te_take
from .registry import converter
from .common import (assert_dims, cast, checked, constant_of, dtype_of, emit, ndim_of, out_type, primfunc_once, prod,
                     shape_of)


def _is_zero(d) -> bool:
    return isinstance(d, tirx.IntImm) and d.value == 0


def _relax_reshape(bb, x, target: list):
    """R.reshape, but for an empty target: a literal 0 in a Relax reshape target copies the input's dim
    there (`x[:, :0]` of [N, 3] reshaped to (0,) gave N elements), so an empty result is a new tensor
    (computed from x: an empty constant would not survive the kernel library's export)."""
    if any(_is_zero(d) for d in target):
        return bb.emit_te(lambda t: te.compute(target, lambda *i: tirx.const(0, t.dtype), name="empty"), x,
                          primfunc_name_hint="dt_empty")
    return R.reshape(x, target)


def _checked_reshape(bb, ctx, x, target: list):
    """R.reshape to `target`; when Relax cannot prove the sizes equal, flatten and copy into the target
    size through `same_size_primfunc`, which checks the sizes at run time (R.reshape itself does not)."""
    src = shape_of(x)
    if ctx.equal(prod(src), prod(target)):
        return _relax_reshape(bb, x, target)
    dt = dtype_of(x)
    flat = emit(bb, _relax_reshape(bb, x, [ctx.analyzer.simplify(prod(src))]))
    gv = primfunc_once(bb, f"dt_same_size_{dt}", lambda: same_size_primfunc(dt))
    flat = emit(bb, R.call_tir(gv, [flat], relax.TensorType([ctx.analyzer.simplify(prod(target))], dt)))
    return _relax_reshape(bb, flat, target)


@converter("reshape")
def _reshape(bb, node, args, ctx):
    x = args[0]
    want = list(node.attrs.shape)
    out_t = out_type(node).shape
    src = shape_of(x)
    if -1 in want:
        j = want.index(-1)
        target = [ctx.dim(d) if k != j else None for k, d in enumerate(want)]
        try:
            cand = ctx.dim(out_t[j])           # the type rule's resolved -1 (keeps static dims)
        except CompileError:
            cand = None
        if cand is not None and ctx.equal(prod(src), prod([cand if d is None else d for d in target])):
            target[j] = cand
        else:                                  # size / product of the others (guarded against 0)
            known = prod([d for d in target if d is not None])
            target[j] = ctx.analyzer.simplify(tirx.floordiv(prod(src), tirx.max(known, 1)))
    else:
        target = ctx.shape(want)
    return [_checked_reshape(bb, ctx, x, target)]


@converter("transpose")
def _transpose(bb, node, args, ctx):
    axes = node.attrs.axes
    nd = ndim_of(args[0])
    axes = list(reversed(range(nd))) if axes is None else [norm_axis(int(a), nd) for a in axes]
    return [R.permute_dims(args[0], axes)]


@converter("expand_dims")
def _expand_dims(bb, node, args, ctx):
    nd = ndim_of(args[0])
    return [R.expand_dims(args[0], norm_axis(int(node.attrs.axis), nd + 1))]


@converter("squeeze")
def _squeeze(bb, node, args, ctx):
    x = args[0]
    t = node.inputs[0].type
    if node.attrs.axis is None:
        axes = [i for i, d in enumerate(t.shape) if d == 1]
    else:
        axes = list(norm_axes(node.attrs.axis, t.ndim))
    if not axes:
        return [x]
    s = shape_of(x)
    if all(is_one(s[a]) for a in axes):
        return [R.squeeze(x, axes)]
    # Relax cannot prove the dim is 1: a checked reshape (raises at run time if it is not).
    return [_checked_reshape(bb, ctx, x, [d for i, d in enumerate(s) if i not in axes])]


@converter("concat")
def _concat(bb, node, args, ctx):
    dt = out_type(node).dtype
    xs = [emit(bb, cast(x, dt)) for x in args]
    nd = ndim_of(xs[0])
    ax = norm_axis(int(node.attrs.axis), nd)
    ref = shape_of(xs[0])
    xs = [xs[0]] + [assert_dims(bb, ctx, x, {j: ref[j] for j in range(nd) if j != ax}) for x in xs[1:]]
    return [_concat_tree(bb, xs, ax)]


#: inputs per concat kernel: TVM's concatenate of n inputs is one nested select over all of them, whose lowering
#: time grows as n^2 (90 inputs, as SSDlite concatenates its classes' boxes: 100 s); more are joined in a tree
CONCAT_FANIN = 8


def _concat_tree(bb, xs: list, axis: int):
    while len(xs) > CONCAT_FANIN:
        xs = [xs[k] if len(xs[k:k + CONCAT_FANIN]) == 1 else emit(bb, R.concat(xs[k:k + CONCAT_FANIN], axis=axis))
              for k in range(0, len(xs), CONCAT_FANIN)]
    return R.concat(xs, axis=axis)


@converter("stack")
def _stack(bb, node, args, ctx):
    dt = out_type(node).dtype
    xs = [emit(bb, cast(x, dt)) for x in args]
    nd = ndim_of(xs[0])
    ax = norm_axis(int(node.attrs.axis), nd + 1)
    ref = shape_of(xs[0])
    xs = [xs[0]] + [assert_dims(bb, ctx, x, dict(enumerate(ref))) for x in xs[1:]]
    if len(xs) > CONCAT_FANIN:          # as concat (see `_concat_tree`)
        return [_concat_tree(bb, [emit(bb, R.expand_dims(x, ax)) for x in xs], ax)]
    return [R.stack(xs, axis=ax)]


def _canonical_slice(ctx, L, start, stop, step):
    """numpy's slice canonicalisation (PySlice_AdjustIndices) on a possibly symbolic length L:
    returns (begin, length) as int64 PrimExprs."""
    if isinstance(L, tirx.IntImm):
        b, e, s = slice(start, stop, step).indices(int(L.value))
        return tirx.IntImm(I64, b), tirx.IntImm(I64, len(range(b, e, s)))
    zero, one = tirx.IntImm(I64, 0), tirx.IntImm(I64, 1)

    def adj(v, default):
        if v is None:
            return default
        v = int(v)
        if v >= 0:
            return tirx.min(tirx.IntImm(I64, v), L if step > 0 else L - 1)
        return tirx.max(L + v, zero if step > 0 else -one)

    if step > 0:
        b, e = adj(start, zero), adj(stop, L)
        n = tirx.max(tirx.floordiv(e - b + (step - 1), step), zero)
    else:
        b, e = adj(start, L - 1), adj(stop, -one)
        n = tirx.max(tirx.floordiv(b - e + (-step - 1), -step), zero)
    return ctx.analyzer.simplify(b), ctx.analyzer.simplify(n)


def _slice_expr(bb, ctx, x, axes, starts, stops, steps):
    s = shape_of(x)
    nd = len(s)
    A, B, N, S = [], [], [], []
    for ax, s0, s1, st in zip(axes, starts, stops, steps):
        ax = norm_axis(int(ax), nd)
        st = int(st)
        if st == 0:
            raise CompileError("slice step cannot be zero")
        b, n = _canonical_slice(ctx, s[ax], s0, s1, st)
        A.append(ax), B.append(b), N.append(n), S.append(st)
    if not A:
        return x
    if all(ctx.equal(b, 0) and ctx.equal(n, s[a]) and st == 1 for a, b, n, st in zip(A, B, N, S)):
        return x                           # full slice
    return bb.emit_te(te_slice, x, A, B, N, S, primfunc_name_hint="dt_strided_slice")


@converter("slice")
def _slice(bb, node, args, ctx):
    a = node.attrs
    return [_slice_expr(bb, ctx, args[0], a.axes, a.starts, a.stops, a.steps)]


@converter("split")
def _split(bb, node, args, ctx):
    x = args[0]
    nd = ndim_of(x)
    ax = norm_axis(int(node.attrs.axis), nd)
    L = shape_of(x)[ax]
    sec = node.attrs.sections
    outs = []
    if isinstance(sec, int):
        size = ctx.analyzer.simplify(tirx.floordiv(L, sec))
        if sec > 1 and not (isinstance(L, tirx.IntImm)):
            # numpy raises unless L % sections == 0: check it at run time.
            x = assert_dims(bb, ctx, x, {ax: ctx.analyzer.simplify(size * sec)})
        for i in range(sec):
            outs.append(bb.emit_te(te_slice, x, [ax], [ctx.analyzer.simplify(size * i)], [size], [1],
                                   primfunc_name_hint="dt_split") if sec > 1 else x)
        return outs
    bounds = [0, *[int(i) for i in sec], None]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        outs.append(_slice_expr(bb, ctx, x, [ax], [lo], [hi], [1]))
    return outs


@converter("take")
def _take(bb, node, args, ctx):
    # Indices out of range raise at run time like numpy (`take_index_primfunc`: one pass over the
    # indices, which also wraps negative ones); constant indices within a static axis need no check.
    x, idx = args
    nd = ndim_of(x)
    ax = norm_axis(int(node.attrs.axis), nd)
    n = shape_of(x)[ax]
    known = constant_of(bb, idx)
    if known is not None and isinstance(n, tirx.IntImm) and (
            known.size == 0 or (known.min() >= -int(n.value) and known.max() < int(n.value))):
        return [bb.emit_te(te_take, x, idx, ax, n, primfunc_name_hint="dt_take")]
    dt = dtype_of(idx)
    idx = emit(bb, checked(bb, ctx, f"dt_take_index_{dt}", lambda: take_index_primfunc(dt), idx, n, I64,
                                 "take_index"))
    return [bb.emit_te(te_take, x, idx, ax, n, True, primfunc_name_hint="dt_take")]


@converter("broadcast_to")
def _broadcast_to(bb, node, args, ctx):
    x = args[0]
    target = ctx.shape(node.attrs.shape)
    s = shape_of(x)
    off = len(target) - len(s)
    if all(is_one(d) or ctx.relax_equal(d, target[k + off]) for k, d in enumerate(s)):
        if len(s) == len(target) and all(ctx.relax_equal(d, t) for d, t in zip(s, target)):
            return [x]
        return [R.broadcast_to(x, target)]
    return [bb.emit_te(te_broadcast, x, target, primfunc_name_hint="dt_broadcast_to")]


@converter("tile")
def _tile(bb, node, args, ctx):
    """As ``reshape(broadcast_to(reshape(x, [1, d0, 1, d1, ...]), [r0, d0, r1, d1, ...]), [r0*d0, ...])``: the
    kernel Relax legalizes `R.tile` to (an output loop reading ``x[i % d]``) is miscompiled by LLVM for AVX-512
    targets in TVM 0.27 (wrong values from (2,3,4,5) tiled (1,6,4,2) on znver4 and skylake-avx512; the ONNX
    conformance test `test_tile` found it); broadcasting reads no modulo index."""
    x = args[0]
    reps = [int(r) for r in node.attrs.reps]
    dims = shape_of(x)
    if dims is None:
        return [R.tile(x, reps)]
    n = max(len(reps), len(dims))
    reps = [1] * (n - len(reps)) + reps
    one = tirx.IntImm(I64, 1)
    dims = [one] * (n - len(dims)) + list(dims)
    if all(r == 1 for r in reps):
        return [x] if n == len(shape_of(x)) else [_relax_reshape(bb, x, dims)]
    lifted = emit(bb, _relax_reshape(bb, x, [v for d in dims for v in (one, d)]))
    wide = emit(bb, R.broadcast_to(lifted, [v for r, d in zip(reps, dims) for v in (tirx.IntImm(I64, r), d)]))
    return [_relax_reshape(bb, wide, [ctx.analyzer.simplify(d * r) for r, d in zip(reps, dims)])]


@converter("pad")
def _pad(bb, node, args, ctx):
    x = args[0]
    dt = dtype_of(x)
    flat = [int(v) for pair in node.attrs.pad_width for v in pair]
    if not any(flat):
        return [x]
    value = np.asarray(node.attrs.value).astype(dt).item()     # np.pad's cast of the value
    return [R.nn.pad(x, flat, pad_mode="constant", pad_value=float(value))]
