"""Helpers shared by the converters: Relax types of expressions, casts, numpy shape unification
(broadcasting, asserted dims) and the empty-reduction guard."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax import op as R

from dyntvm.errors import CompileError
from ...ir.ops import get_op
from ..dims import I64, ConvertContext, is_one
from ..te_kernels import (EMPTY_REDUCE, NEGATIVE_POWER, TAKE_OUT_OF_RANGE, pass_if_zero_primfunc, te_broadcast,
                          te_check_device, te_empty_guard)


# ------------------------------------------------------------------------------ expressions
def ty_of(x):
    """The Relax type of `x`, normalizing a not yet emitted expression first."""
    try:
        t = x.ty
    except Exception:      # noqa: BLE001 - no type yet
        t = None
    if not isinstance(t, (relax.TensorType, relax.TupleType)):
        t = relax.BlockBuilder.current().normalize(x).ty
    return t


def dtype_of(x) -> str:
    return str(ty_of(x).dtype)


def shape_of(x):
    """The shape of `x` as a list of PrimExprs, or None where Relax does not know it."""
    sh = ty_of(x).shape
    if sh is None or not hasattr(sh, "values"):
        return None
    return list(sh.values)


def ndim_of(x) -> int:
    return int(ty_of(x).ndim)


def is_int(dtype) -> bool:
    return np.dtype(str(dtype)).kind in "iu"


def const(value, dtype: str) -> relax.Expr:
    return relax.const(np.asarray(value).astype(dtype), dtype)


def cast(x, dtype: str) -> relax.Expr:
    return x if dtype_of(x) == dtype else R.astype(x, dtype)


def emit(bb, e) -> relax.Expr:
    return e if isinstance(e, relax.Var) else bb.emit(e)


def unflatten(bb, flat, shape: list, casts: list | None = None) -> relax.Var:
    """``reshape(flat, shape)`` for a 2-D `flat` [rows, N] whose rows is a dim var of its own (the matmul
    converter's match_cast) equal to ``prod(shape[:-1])``: cast to that product first (checked at run time), so
    that the reshape is provably size-preserving and stays a view (RewriteDataflowReshape), not a copy kernel.
    `casts`: gets the cast's var (`relax_builder` drops it with the view where nothing reads it)."""
    rows = shape_of(flat)[0]
    want = prod(shape[:-1])
    if not isinstance(rows, tirx.IntImm) and not rows.same_as(want):
        flat = bb.match_cast(flat, relax.TensorType([want, shape_of(flat)[1]], dtype_of(flat)))
        if casts is not None:
            casts.append(flat)
    return emit(bb, R.reshape(flat, list(shape)))


def primfunc_once(bb, name: str, make):
    """The GlobalVar of PrimFunc `name` in the module being built, added (``make()``) on first use."""
    gv = next((g for g in bb.get().get_global_vars() if g.name_hint == name), None)
    return gv if gv is not None else bb.add_func(make(), name)


def checked(bb, ctx, name: str, make, x, n, dtype: str, kind: str):
    """``x`` (any shape) through the flat run-time check PrimFunc `name` (``make()``: (x, n) -> out of
    `dtype`), given the int64 extent `n`: the checked values, in x's shape. For a GPU
    (`ctx.device_checks`) the check `kind` is done with `te_check_device` instead (no asserts in kernels)."""
    shape = shape_of(x)
    size = ctx.analyzer.simplify(prod(shape)) if shape else tirx.IntImm(I64, 1)
    flat = emit(bb, R.reshape(x, [size]))
    if ctx.device_checks:
        res = bb.emit_te(te_check_device, flat, n, kind, primfunc_name_hint=f"dt_check_{kind}")
        out, bad = emit(bb, relax.TupleGetItem(res, 0)), emit(bb, relax.TupleGetItem(res, 1))
        k = tirx.Var("dt_bad", I64)
        bb.match_cast(emit(bb, R.tensor_to_shape(bad)), relax.ShapeType([k]))
        message = {"take_index": TAKE_OUT_OF_RANGE, "nonnegative": NEGATIVE_POWER, "nonempty": EMPTY_REDUCE}[kind]
        gv = primfunc_once(bb, f"dt_pass_{kind}_{dtype}", lambda: pass_if_zero_primfunc(dtype, message))
        out = emit(bb, R.call_tir(gv, [out, relax.prim_value(k)], relax.TensorType([size], dtype)))
        return R.reshape(out, shape)
    out = emit(bb, R.call_tir(primfunc_once(bb, name, make), [flat, relax.prim_value(n)],
                              relax.TensorType([size], dtype)))
    return R.reshape(out, shape)


def constant_of(bb, x):
    """The numpy value of `x` if it is (bound to) a constant, else None."""
    if isinstance(x, relax.Var):
        x = bb.lookup_binding(x)
    return x.value.numpy() if isinstance(x, tvm.ir.expr.Constant) else None


def prod(dims):
    out = tirx.IntImm(I64, 1)
    for d in dims:
        out = out * d
    return out


def in_result_dtype(op: str, x) -> relax.Expr:
    """`x` in the dtype op `op` computes in (`OpDef.result_dtype`: e.g. float ops on integer inputs
    compute in float32)."""
    return cast(x, get_op(op).result_dtype([dtype_of(x)]))


def common_dtype(*xs) -> str:
    return np.result_type(*[np.dtype(dtype_of(x)) for x in xs]).name


def out_type(node, i=0):
    """Our `TensorType` of output `i` of `node`."""
    return node.outputs[i].type


def full_expr(shape, value, dt):
    v = np.asarray(value).astype(dt)
    if v.dtype.kind == "f" and not np.isfinite(v):
        # TOPI's full crashes on inf/nan fill values (it tests `"float" in dtype` on a PrimType)
        return R.broadcast_to(relax.const(v, dt), shape)
    return R.full(shape, relax.const(v, dt), dt)


# -------------------------------------------------------------------- shape unification (numpy)
def unify_broadcast(bb, ctx: ConvertContext, xs: list, ours: list, skip_trailing: int = 0) -> list:
    """Make Relax able to infer the numpy broadcast of `xs` (right-aligned, ignoring the last
    `skip_trailing` dims of each operand, e.g. 2 for matmul batch dims).

    Shapes Relax cannot prove compatible (broadcasting ``N`` against ``3``, two different expressions
    our IR says are equal) are made explicit. Per dim position where Relax cannot prove the non-1 dims
    equal: if our IR types agree (the same dim string), the dims are asserted equal with a run-time
    checked ``match_cast`` (raises instead of reading out of bounds); otherwise (e.g. ``N`` against
    ``3``: N may be 1 at run time) the operands are broadcast explicitly to the numpy result dim
    ``d0 == 1 ? d1 : d0`` (a materialized broadcast, `te_broadcast`).
    """
    shapes = [shape_of(x) for x in xs]
    if any(s is None for s in shapes):
        raise CompileError(f"internal: operand of {ctx.node.op if ctx.node else '?'} has an unknown shape")
    lead = [s[:len(s) - skip_trailing] for s in shapes]
    ours_lead = [tuple(t.shape[:t.ndim - skip_trailing]) for t in ours]
    nd = max((len(s) for s in lead), default=0)
    cast_to = [dict() for _ in xs]      # operand -> {pos: new dim} via match_cast
    bcast_to = [dict() for _ in xs]     # operand -> {pos: target dim} via materialized broadcast
    for p in range(nd):
        ent = []
        for k, s in enumerate(lead):
            j = p - (nd - len(s))
            if j >= 0 and not is_one(s[j]):
                ent.append((k, j, s[j], ours_lead[k][j] if j < len(ours_lead[k]) else None))
        if len(ent) <= 1:
            continue
        ref = ent[0][2]
        if all(ctx.relax_equal(ref, e[2]) for e in ent[1:]):
            continue
        if len({str(e[3]) for e in ent}) == 1:
            for k, j, d, _ in ent[1:]:
                if not ctx.relax_equal(ref, d):
                    cast_to[k][j] = ref
        else:
            target = ent[0][2]
            for _, _, d, _ in ent[1:]:
                target = tirx.Select(target == 1, d, target)
            target = ctx.analyzer.simplify(target)
            for k, j, d, _ in ent:
                if not ctx.relax_equal(target, d):
                    bcast_to[k][j] = target
    out = []
    for k, x in enumerate(xs):
        if cast_to[k]:
            s = [cast_to[k].get(j, d) for j, d in enumerate(shape_of(x))]
            x = cast_shape(bb, x, s)
        if bcast_to[k]:
            s = [bcast_to[k].get(j, d) for j, d in enumerate(shape_of(x))]
            x = bb.emit_te(te_broadcast, x, s, primfunc_name_hint="dt_broadcast_to")
        out.append(x)
    return out


def assert_dims(bb, ctx, x, dims: dict):
    """match_cast `x` so that dim j equals dims[j] (run-time checked) where not provable."""
    s = shape_of(x)
    need = {j: d for j, d in dims.items() if not ctx.relax_equal(s[j], d)}
    if not need:
        return x
    return cast_shape(bb, x, [need.get(j, d) for j, d in enumerate(s)])


def _vars_of(dim) -> set:
    return set() if isinstance(dim, (int, tirx.IntImm)) else {v.name for v in tirx.analysis.undefined_vars(dim)}


DIMS_DIFFER = "dyntvm: dims that must be equal differ at run time"


def cast_shape(bb, x, shape: list):
    """`x` with the shape `shape`, checked at run time: a match_cast. Where a dim's expression uses a var that the
    new shape also uses (``min(a + b, W)`` cast to ``W``; Mask R-CNN's mask pasting makes one), TVM 0.27's
    CanonicalizeBindings (run by FuseTIR) turns the cast into ``W := min(a + b, W)`` and recurses without end (a
    segfault), and through a fresh var it drops the var's definition: there the dims are compared in a copy
    kernel (`pass_if_zero_primfunc`) whose output is reshaped to `shape`."""
    old = shape_of(x)
    wanted = set().union(*(_vars_of(d) for d in shape)) if shape else set()
    if not any(not isinstance(d, (int, tirx.Var, tirx.IntImm)) and _vars_of(d) & wanted for d in old):
        return bb.match_cast(x, relax.TensorType(list(shape), dtype_of(x)))
    differ = tirx.IntImm(I64, 0)
    for a, b in zip(old, shape):
        differ = differ + tirx.Select(tirx.EQ(tirx.Cast(I64, a), tirx.Cast(I64, b)), tirx.IntImm(I64, 0),
                                      tirx.IntImm(I64, 1))
    dtype = dtype_of(x)
    flat = emit(bb, R.reshape(x, [prod(old)]))
    gv = primfunc_once(bb, f"dt_pass_dims_{dtype}", lambda: pass_if_zero_primfunc(dtype, DIMS_DIFFER, resized=True))
    out = emit(bb, R.call_tir(gv, [flat, relax.prim_value(differ)], relax.TensorType([prod(shape)], dtype)))
    return emit(bb, R.reshape(out, list(shape)))


# --------------------------------------------------------------------------- empty-axis guards
def _needs_empty_guard(ctx, extents, out_dims) -> bool:
    """True if some reduced extent can be 0 at run time while the output is non-empty."""
    for e in extents:
        if ctx.positive(e):
            continue
        if any(ctx.equal(e, d) for d in out_dims):
            continue                      # the output is empty whenever this extent is 0
        return True
    return False


def guard_empty(bb, ctx, r, src, extents, identity):
    """`r` (a reduction of `src` over `extents`, dims of `src`), or the identity where a symbolic extent is
    0 at run time (see `te_empty_guard`)."""
    r = emit(bb, r)
    if not _needs_empty_guard(ctx, extents, shape_of(r)):
        return r
    return bb.emit_te(te_empty_guard, r, emit(bb, src), prod(extents), identity,
                      primfunc_name_hint="dt_empty_reduce_guard")
