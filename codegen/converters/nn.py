"""Neural-network converters: matmul, softmax / log_softmax, layer_norm, topk."""
from __future__ import annotations

import numpy as np
from tvm import relax, tirx
from tvm.relax import op as R

from ...ir.dtypes import is_float
from ...ir.shapes import norm_axis
from ..dims import I64
from ..te_kernels import te_sort_key
from .registry import converter
from .common import (assert_dims, cast, const, dtype_of, emit, full_expr, guard_empty, in_result_dtype, ndim_of,
                     out_type, shape_of, unflatten, unify_broadcast)


#: Elementwise ops after a flattened [..., M, K] @ [K, N] run on its 2-D result, in the matmul's kernel
#: (`sink_flat`); False: the reshape back right after the GEMM (for an interleaved comparison: bench_gemm --models).
FLAT_EPILOGUES = True


@converter("matmul")
def _matmul(bb, node, args, ctx):
    dt = out_type(node).dtype
    work = "int32" if dt == "bool" else dt      # numpy bool matmul: any(a & b)
    a, b = (emit(bb, cast(x, work)) for x in args)
    if dt == "float16":     # numpy accumulates a float16 dot product in float32: so do we (inputs stay float16)
        work = "float32"
    ta, tb = (v.type for v in node.inputs)
    if ndim_of(a) >= 2 and ndim_of(b) >= 2:
        a, b = unify_broadcast(bb, ctx, [a, b], [ta, tb], skip_trailing=2)
    ka = shape_of(a)[-1]
    b = assert_dims(bb, ctx, b, {(ndim_of(b) - 2 if ndim_of(b) >= 2 else 0): ka})
    lead = shape_of(a)[:-1] if ndim_of(a) >= 3 and ndim_of(b) == 2 else None
    if lead is not None and shape_of(b) is not None and all(d is not None for d in lead):
        # [..., M, K] @ [K, N] as one [prod(...) * M, K] GEMM: Relax keeps the leading axes as a batch of
        # small products (the LSTM's hoisted [T, 1, 128] @ [128, 1024] ran as 64 GEMVs, 2.7x numpy's time)
        rows = lead[0]
        for d in lead[1:]:
            rows = rows * d
        flat = next((f for v, f, _ in ctx.flat_views if isinstance(a, relax.Var) and v.same_as(a)), None)
        if flat is None:
            flat = emit(bb, R.reshape(a, [rows, ka]))
            if FLAT_EPILOGUES and not isinstance(rows, (int, tirx.IntImm, tirx.Var)):
                # rows an expression (B * S): a dim var of its own, else the kernels get B and S as scalar
                # parameters, which `fusion_guard` keeps out of fused groups (no bias / GELU in the matmul)
                flat = bb.match_cast(flat, relax.TensorType([ctx.new_dim("rows"), ka], dtype_of(flat)))
        mm = emit(bb, R.matmul(flat, b, out_dtype=work))
        r = unflatten(bb, mm, lead + [shape_of(b)[-1]], ctx.flat_casts)
    else:
        mm, r = None, emit(bb, R.matmul(a, b, out_dtype=work))
    view = r
    r = guard_empty(bb, ctx, r, a, [ka], 0)          # K == 0: numpy gives zeros
    if FLAT_EPILOGUES and mm is not None and r.same_as(view) and work == dt:
        # the elementwise epilogue (bias, activation) runs on the 2-D result, so FuseOps fuses it into the
        # matmul's kernel: the reshape back is injective and FuseOps stops at it (`converters.sink_flat`)
        ctx.flat_views.append((r, mm, tuple(shape_of(r))))
    if dt == "bool":
        r = R.not_equal(r, const(0, work))
    elif work != dt:
        r = R.astype(r, dt)
    return [r]


@converter("softmax", "log_softmax")
def _softmax(bb, node, args, ctx):
    x = in_result_dtype(node.op, args[0])
    nd = ndim_of(x)
    ax = norm_axis(int(node.attrs.axis), nd)
    if nd == 0:      # softmax of a scalar: exp(0)/exp(0) = 1; log_softmax: 0 (nan/inf stay nan)
        z = R.subtract(x, x)
        return [R.exp(z) if node.op == "softmax" else z]
    if dtype_of(x) == "float16":    # as numpy: exp rounded to float16, summed in float32 (Relax's sums in float16)
        s = emit(bb, R.subtract(x, R.max(x, axis=[ax], keepdims=True)))
        e = emit(bb, R.exp(s))
        total = emit(bb, R.astype(R.sum(R.astype(e, "float32"), axis=[ax], keepdims=True), "float16"))
        return [R.divide(e, total) if node.op == "softmax" else R.subtract(s, R.log(total))]
    return [(R.nn.softmax if node.op == "softmax" else R.nn.log_softmax)(x, axis=ax)]


@converter("layer_norm")
def _layer_norm(bb, node, args, ctx):
    # R.nn.layer_norm matches a two-pass (x - mean)^2 computation in accuracy (measured: same
    # error as the explicit two-pass form up to |mean| = 1000 * std); both differ from numpy only
    # by summation order (numpy sums pairwise).
    dt = out_type(node).dtype
    x = emit(bb, cast(args[0], dt))
    g, b = (emit(bb, cast(v, dt)) for v in args[1:])
    k, nd, s = ndim_of(g), ndim_of(x), shape_of(x)
    g = assert_dims(bb, ctx, g, {j: s[nd - k + j] for j in range(k)})
    b = assert_dims(bb, ctx, b, {j: s[nd - k + j] for j in range(k)})
    return [R.nn.layer_norm(x, g, b, axes=list(range(nd - k, nd)), epsilon=float(node.attrs.eps))]


@converter("topk")
def _topk(bb, node, args, ctx):
    x = args[0]
    a = node.attrs
    nd = ndim_of(x)
    ax = norm_axis(int(a.axis), nd)
    k = int(a.k)
    dt = dtype_of(x)
    if k == 0:     # TVM's topk returns everything for k = 0
        s = list(shape_of(x))
        s[ax] = tirx.IntImm(I64, 0)
        return [full_expr(s, 0, dt), full_expr(s, 0, I64)]
    key = x
    kdt = dt
    if dt == "bool":
        key, kdt = R.astype(x, "int8"), "int8"
    elif is_float(dt):
        # numpy's stable argsort puts NaN last in both directions, after inf; TVM's sort is undefined on NaN
        key = bb.emit_te(te_sort_key, emit(bb, x), bool(a.largest), primfunc_name_hint="dt_sort_key")
        kdt = dtype_of(key)
    n = shape_of(x)[ax]
    if not (isinstance(n, tirx.IntImm) and int(n.value) >= k):
        # A symbolic axis may be shorter than k at run time (numpy raises); TVM's topk then
        # returns indices past the end. Pad the axis with k entries that sort last, so every
        # index stays inside the (padded) tensor. (The key is an integer: a float's is `te_sort_key`'s.)
        info = np.iinfo(kdt)
        pad_v = info.min if a.largest else info.max
        ps = list(shape_of(x))
        ps[ax] = tirx.IntImm(I64, k)
        key = R.concat([key, full_expr(ps, pad_v, kdt)], axis=ax)
        x = R.concat([x, full_expr(ps, 0, dt)], axis=ax)
    key = emit(bb, key)
    res = emit(bb, R.topk(key, k, axis=ax, ret_type="both", largest=bool(a.largest), dtype=I64))
    idx = emit(bb, relax.TupleGetItem(res, 1))
    if kdt == dt and not is_float(dt):
        vals = relax.TupleGetItem(res, 0)
    else:
        vals = R.gather_elements(emit(bb, x), idx, axis=ax)
    return [vals, idx]
