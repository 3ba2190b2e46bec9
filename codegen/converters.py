"""Converters: one per STATIC op of our IR, each emitting Relax that computes exactly what the numpy
reference kernel (`runtime/kernels.py`) computes.

Registry: ``CONVERTERS[op_name](bb, node, args, ctx) -> list[relax.Expr]`` with

* ``bb``: the `relax.BlockBuilder`, inside a dataflow block of the function being built;
* ``node``: our `Node` (its ``attrs`` and the input/output `TensorType`s are used);
* ``args``: one Relax expression per ``node.inputs`` (already bound vars, with known shapes);
* ``ctx``: a `ConvertContext`: our dims -> tirx PrimExprs of the function's symbolic vars.

A converter returns one Relax expression per node output, with the output's dtype and rank.
Shapes of results come from Relax's own inference, never from our types: a type describes the
non-degenerate case only (``x[:1]`` is typed ``1`` but has length 0 when N = 0), while the compiled
code computes exactly what numpy computes at every size.

Where Relax/TOPI does not reproduce numpy, the converter works around it (see the notes at each
converter and `UNSUPPORTED_EXACTNESS`). The general rules:

* Shapes Relax cannot prove compatible (broadcasting ``N`` against ``3``, two different
  expressions our IR says are equal, reshape sizes) are made explicit: a ``match_cast`` (checked
  at run time, raises instead of reading out of bounds) where our IR says two dims are equal, a
  materialized numpy broadcast (``dim == 1 ? 0 : i``) where a dim may be 1 at run time.
* Reductions over an axis whose length is symbolic get an epilogue that writes the identity when
  the length is 0: TVM's lowered reductions initialise the accumulator inside the reduction loop,
  so a 0-length symbolic axis leaves the output uninitialised (garbage).
* Slices, splits, take and symbolic broadcasts are our own TE computes: Relax's ``strided_slice``
  infers negative lengths for empty symbolic slices, ``broadcast_to`` reads out of bounds when a
  symbolic dim is 1 at run time, and ``take`` defaults to an unchecked mode.
* Float max/min reductions use a NaN-propagating reducer with a -inf/+inf identity (TOPI's drops
  NaNs depending on order and starts from the lowest *finite* value, so max([-inf]) is -3.4e38);
  argmax/argmin are that extreme followed by a "first index equal to it" min-reduction (numpy's
  first-occurrence and first-NaN rules; a single tuple-reducer pass cannot be scheduled by dlight
  on GPUs).
* Comparisons: float ``!=`` adds ``isnan`` terms (TVM emits an ordered compare); bools compare as
  int8. Integer ``power`` is a TIR while loop (TVM has no integer power). float -> small/unsigned
  int casts go through int32/int64 like numpy's C casts on x86.
"""
from __future__ import annotations

import ast

import numpy as np
import tvm_ffi
from tvm import relax, te, tirx
from tvm.relax import op as R
from tvm.sym import Analyzer, ConstIntBound

from dyntvm.errors import CompileError
from ..ir import ops as O

__all__ = ["CONVERTERS", "ConvertContext", "convert_node", "UNSUPPORTED_EXACTNESS"]

CONVERTERS: dict = {}

#: Known, documented differences between compiled code and the numpy reference (all in cases
#: where numpy raises, or in NaN/inf corner cases).
UNSUPPORTED_EXACTNESS = {
    "take": "out-of-range indices (numpy raises) are clamped to [0, n-1]; an axis of length 0 "
            "yields zeros. Valid negative indices wrap exactly like numpy.",
    "power": "integer power with a negative exponent (numpy raises) gives 1.",
    "topk": "NaN sorts last like numpy, but a NaN and a real -inf (largest=True) / +inf "
            "(largest=False) tie by index instead of the NaN going last. k larger than a "
            "symbolic axis (numpy raises) gives indices >= the axis length for the missing "
            "entries (never an out-of-bounds read).",
    "cast": "float -> int of NaN/inf/out-of-range values follows x86 C casts (like numpy on "
            "x86) only for the low bits; unspecified in general (numpy: platform-dependent).",
    "argmax/argmin": "an empty axis (numpy raises) returns INT64_MAX.",
    "reshape": "a -1 next to symbolic dims that are 0 at run time (numpy raises 'ambiguous') "
               "gives 0 for the -1.",
    "bool ops": "neg / subtract / sign of bools (numpy raises) give logical_not / xor / x.",
    "broadcast": "shapes that numpy refuses to broadcast, but whose mismatch only shows at run "
                 "time, either raise (match_cast) or read clamped indices; never out of bounds.",
    "float sums": "reductions accumulate in order in the input dtype; numpy sums pairwise, so "
                  "float32 sum/mean/layer_norm/softmax/matmul differ by rounding (~n * 1e-7 "
                  "relative; float16 within 1 ulp at small n).",
}

I64 = "int64"
INT64_MAX = (1 << 63) - 1


def converter(*names):
    def deco(fn):
        for n in names:
            CONVERTERS[n] = fn
        return fn
    return deco


def _provably_equal(analyzer, a, b) -> bool:
    if isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm):
        return int(a.value) == int(b.value)
    if tvm_ffi.structural_equal(a, b):
        return True
    try:
        return bool(analyzer.can_prove_equal(a, b))
    except Exception:   # noqa: BLE001 - dtype mismatches and the like: not provable
        return False


# ------------------------------------------------------------------------------------- context
def _names(tree) -> set:
    """Symbol names in a parsed dim (function names of min(...)/max(...) excluded)."""
    funcs = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in funcs}


class ConvertContext:
    """Per-function state: our dims (ints, symbol names, expression strings) -> tirx PrimExprs.

    `bind_input_dim` is called for every dim of every function parameter (by the region builder):
    a plain symbol (``"N"``, or an unknown ``"_u3"``) gets one int64 `tirx.Var` per function; an
    expression dim (``"(T + 1)"``) gets a fresh var too, remembered so that the same expression
    (or a symbol it determines, see `solve`) can be translated later. `dim` translates any dim.
    """

    def __init__(self, fn_name: str = "main"):
        self.fn_name = fn_name
        self.symbols: dict[str, tirx.PrimExpr] = {}
        self.exprs: dict[str, tirx.PrimExpr] = {}      # ast.dump of an input expression -> var
        self._expr_dims: list = []                     # (ast body, var) of expression input dims
        self.analyzer = Analyzer()                     # knows every dim var is >= 0
        self._plain = Analyzer()
        self.node = None                               # the node being converted (for errors)

    # -- binding ---------------------------------------------------------------------------------
    def _new_var(self, hint: str) -> tirx.Var:
        v = tirx.Var(hint, I64)
        self.analyzer.update(v, ConstIntBound(0, ConstIntBound.POS_INF))
        return v

    def bind_input_dim(self, d, hint: str = "d"):
        """The dim of a parameter shape for our dim `d` (int, or a var bound by this parameter)."""
        if isinstance(d, (int, np.integer)):
            return int(d)
        d = str(d)
        body = ast.parse(d, mode="eval").body
        if isinstance(body, ast.Name):
            name = body.id
            if name not in self.symbols:
                self.symbols[name] = self._new_var(name.lstrip("_") or "u")
            return self.symbols[name]
        if isinstance(body, ast.Constant) and isinstance(body.value, int):
            return int(body.value)
        key = ast.dump(body)
        if key not in self.exprs:
            self.exprs[key] = self._new_var(hint)
            self._expr_dims.append((body, self.exprs[key]))
        return self.exprs[key]

    def solve(self):
        """Bind symbols that only occur inside expression input dims when they can be solved for
        (``(T + 1)`` bound to ``d`` gives ``T = d - 1``; also ``-`` and ``*`` by known terms)."""
        progress = True
        while progress:
            progress = False
            for body, var in self._expr_dims:
                unbound = _names(body) - set(self.symbols)
                if len(unbound) != 1:
                    continue
                (sym,) = unbound
                val = self._invert(body, var, sym)
                if val is not None:
                    self.symbols[sym] = self.analyzer.simplify(val)
                    progress = True

    def _invert(self, node, target, sym):
        if isinstance(node, ast.Name) and node.id == sym:
            return target
        if not isinstance(node, ast.BinOp):
            return None
        has_l = sym in _names(node.left)
        known = node.right if has_l else node.left
        try:
            k = self._translate(known)
        except CompileError:
            return None
        inner = node.left if has_l else node.right
        if isinstance(node.op, ast.Add):
            return self._invert(inner, target - k, sym)
        if isinstance(node.op, ast.Sub):
            return self._invert(inner, target + k if has_l else k - target, sym)
        if isinstance(node.op, ast.Mult):
            return self._invert(inner, tirx.floordiv(target, k), sym)
        return None

    # -- translation -----------------------------------------------------------------------------
    def dim(self, d) -> tirx.PrimExpr:
        """Our dim -> an int64 PrimExpr over this function's vars (CompileError if unbound)."""
        if isinstance(d, (int, np.integer)):
            return tirx.IntImm(I64, int(d))
        return self.analyzer.simplify(self._translate(ast.parse(str(d), mode="eval").body))

    def shape(self, dims) -> list:
        return [self.dim(d) for d in dims]

    def _translate(self, n):
        key = ast.dump(n)
        if key in self.exprs:
            return self.exprs[key]
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return tirx.IntImm(I64, n.value)
        if isinstance(n, ast.Name):
            if n.id in self.symbols:
                return self.symbols[n.id]
            where = f" (needed by {self.node.op} node {self.node.name!r})" if self.node is not None else ""
            raise CompileError(
                f"region function {self.fn_name!r}: symbolic dim {n.id!r}{where} is not bound by the "
                f"shape of any region input; bound symbols: {sorted(self.symbols) or 'none'}. Pass a "
                f"tensor whose shape holds {n.id!r} into the region, or make the partitioner keep "
                f"this op with its producer")
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -self._translate(n.operand)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("min", "max") \
                and len(n.args) >= 1 and not n.keywords:
            f = tirx.min if n.func.id == "min" else tirx.max
            out = self._translate(n.args[0])
            for a in n.args[1:]:
                out = f(out, self._translate(a))
            return out
        if isinstance(n, ast.BinOp):
            a, b = self._translate(n.left), self._translate(n.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.FloorDiv: lambda: tirx.floordiv(a, b), ast.Mod: lambda: tirx.floormod(a, b)}
            if type(n.op) in ops:
                return ops[type(n.op)]()
        raise CompileError(f"region function {self.fn_name!r}: unsupported dim expression "
                           f"{ast.unparse(n)!r}")

    # -- proofs ----------------------------------------------------------------------------------
    def equal(self, a, b) -> bool:
        """Provably a == b (structurally or by the analyzer; symbolic dims are >= 0)."""
        if isinstance(a, int):
            a = tirx.IntImm(I64, a)
        if isinstance(b, int):
            b = tirx.IntImm(I64, b)
        return _provably_equal(self.analyzer, a, b)

    def relax_equal(self, a, b) -> bool:
        """Provably a == b the way Relax's shape inference sees it (structurally, or by an analyzer
        that knows nothing about the vars): where this is False, converters make the equality
        explicit (match_cast) so that Relax can infer the result shape."""
        return _provably_equal(self._plain, a, b)

    def positive(self, a) -> bool:
        if isinstance(a, int):
            return a > 0
        if isinstance(a, tirx.IntImm):
            return int(a.value) > 0
        return bool(self.analyzer.can_prove(a > 0))


# ------------------------------------------------------------------------------------- helpers
def _ty(x):
    """The Relax type of `x`, normalizing a not yet emitted expression first."""
    try:
        t = x.ty
    except Exception:      # noqa: BLE001 - no type yet
        t = None
    if not isinstance(t, (relax.TensorType, relax.TupleType)):
        t = relax.BlockBuilder.current().normalize(x).ty
    return t


def _dtype(x) -> str:
    return str(_ty(x).dtype)


def _shape(x):
    sh = _ty(x).shape
    if sh is None or not hasattr(sh, "values"):
        return None
    return list(sh.values)


def _ndim(x) -> int:
    return int(_ty(x).ndim)


def _is_one(d) -> bool:
    return isinstance(d, tirx.IntImm) and int(d.value) == 1


def _is_float(dtype) -> bool:
    return np.dtype(str(dtype)).kind == "f"


def _is_int(dtype) -> bool:
    return np.dtype(str(dtype)).kind in "iu"


def _const(value, dtype: str) -> relax.Expr:
    return relax.const(np.asarray(value).astype(dtype), dtype)


def _cast(x, dtype: str) -> relax.Expr:
    return x if _dtype(x) == dtype else R.astype(x, dtype)


def _emit(bb, e) -> relax.Expr:
    return e if isinstance(e, relax.Var) else bb.emit(e)


def _prod(dims):
    out = tirx.IntImm(I64, 1)
    for d in dims:
        out = out * d
    return out


def _float_in(x):
    """numpy's `_float`: non-float inputs of float ops become float32."""
    return x if _is_float(_dtype(x)) else R.astype(x, "float32")


def _common_dtype(*xs) -> str:
    return np.result_type(*[np.dtype(_dtype(x)) for x in xs]).name


def _out(node, i=0):
    return node.outputs[i].type


# -------------------------------------------------------------------- shape unification (numpy)
def unify_broadcast(bb, ctx: ConvertContext, xs: list, ours: list, skip_trailing: int = 0) -> list:
    """Make Relax able to infer the numpy broadcast of `xs` (right-aligned, ignoring the last
    `skip_trailing` dims of each operand, e.g. 2 for matmul batch dims).

    Per dim position where Relax cannot prove the non-1 dims equal: if our IR types agree (the
    same dim string), the dims are asserted equal with a run-time checked ``match_cast``;
    otherwise (e.g. ``N`` against ``3``: N may be 1 at run time) the operands are broadcast
    explicitly to the numpy result dim ``d0 == 1 ? d1 : d0``.
    """
    shapes = [_shape(x) for x in xs]
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
            if j >= 0 and not _is_one(s[j]):
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
            s = [cast_to[k].get(j, d) for j, d in enumerate(_shape(x))]
            x = bb.match_cast(x, relax.TensorType(s, _dtype(x)))
        if bcast_to[k]:
            s = [bcast_to[k].get(j, d) for j, d in enumerate(_shape(x))]
            x = bb.emit_te(_te_broadcast, x, s, primfunc_name_hint="dt_broadcast_to")
        out.append(x)
    return out


def _assert_dims(bb, ctx, x, dims: dict):
    """match_cast `x` so that dim j equals dims[j] (run-time checked) where not provable."""
    s = _shape(x)
    need = {j: d for j, d in dims.items() if not ctx.relax_equal(s[j], d)}
    if not need:
        return x
    return bb.match_cast(x, relax.TensorType([need.get(j, d) for j, d in enumerate(s)], _dtype(x)))


# ------------------------------------------------------------------------------------ TE bodies
def _analyzer_equal(a, b) -> bool:
    if isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm):
        return int(a.value) == int(b.value)
    return tvm_ffi.structural_equal(a, b) or bool(Analyzer().can_prove_equal(a, b))


def _te_broadcast(x, target):
    """numpy broadcast of `x` to `target`; a dim that is neither 1 nor the target at run time
    (numpy raises) reads clamped indices, never out of bounds."""
    off = len(target) - len(x.shape)

    def f(*i):
        idx, conds = [], []
        for k, d in enumerate(x.shape):
            t, ii = target[k + off], i[k + off]
            if _analyzer_equal(d, t):
                idx.append(ii)
            elif _is_one(d):
                idx.append(tirx.IntImm(I64, 0))
            else:
                idx.append(tirx.Select(d == 1, tirx.IntImm(I64, 0), tirx.min(ii, d - 1)))
                if not (isinstance(d, tirx.IntImm) and int(d.value) > 0):
                    conds.append(d > 0)
        v = x(*idx)
        if conds:
            v = tirx.if_then_else(tirx.all(*conds), v, tirx.const(0, x.dtype))
        return v
    return te.compute(list(target), f, name="broadcast_to")


def _te_slice(x, axes, begins, lengths, steps):
    """out[.., i, ..] = x[.., begin + i * step, ..] along `axes` (begins/lengths canonical)."""
    spec = {int(a): (b, n, s) for a, b, n, s in zip(axes, begins, lengths, steps)}
    shape = [spec[a][1] if a in spec else d for a, d in enumerate(x.shape)]

    def f(*i):
        return x(*[spec[a][0] + i[a] * spec[a][2] if a in spec else i[a] for a in range(len(x.shape))])
    return te.compute(shape, f, name="strided_slice")


def _te_take(x, idx, axis, n):
    """np.take with numpy's negative-index wrap; out-of-range indices are clamped (numpy raises)
    and an empty axis gives 0 (never an out-of-bounds read)."""
    nd_i = len(idx.shape)
    shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])

    def f(*i):
        j = idx(*i[axis:axis + nd_i])
        j = j if str(idx.dtype) == I64 else tirx.Cast(I64, j)
        j = tirx.Select(j < 0, j + n, j)
        j = tirx.max(tirx.min(j, n - 1), tirx.IntImm(I64, 0))
        v = x(*i[:axis], j, *i[axis + nd_i:])
        if not (isinstance(n, tirx.IntImm) and int(n.value) > 0):
            v = tirx.if_then_else(n > 0, v, tirx.const(0, x.dtype))
        return v
    return te.compute(shape, f, name="take")


def _te_empty_guard(r, extent, identity):
    """r where the reduced extent > 0, else the reduction identity (see module doc)."""
    ident = tirx.const(identity, r.dtype)
    return te.compute(list(r.shape), lambda *i: tirx.if_then_else(extent > 0, r(*i), ident),
                      name="empty_reduce_guard")


def _te_mean_div(s, count):
    """mean = sum / count in the sum's float dtype; nan for an empty reduction (numpy)."""
    nan = tirx.const(float("nan"), s.dtype)
    cnt = count.astype(s.dtype)
    return te.compute(list(s.shape),
                      lambda *i: tirx.if_then_else(count > 0, s(*i) / cnt, nan), name="mean_div")


def _reduce_index_map(nd, axes, keepdims, rvars):
    def full(i):
        it = iter(i)
        out = []
        for a in range(nd):
            if a in axes:
                if keepdims:
                    next(it)
                out.append(rvars[a])
            else:
                out.append(next(it))
        return out
    return full


def _reduce_out_shape(shape, axes, keepdims):
    return [(tirx.IntImm(I64, 1) if keepdims else None) if a in axes else d
            for a, d in enumerate(shape) if keepdims or a not in axes]


def _te_nan_reduce(x, axes, keepdims, is_max):
    """np.max/np.min over float `axes`: NaN propagates (TVM's max/min keep whichever operand
    the comparison picks, so a NaN can be lost)."""
    axes = [int(a) for a in axes]
    nd = len(x.shape)
    rvars = {a: te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes}

    def combine(a, b):
        m = tirx.max(a, b) if is_max else tirx.min(a, b)
        return tirx.Select(tirx.isnan(a), a, tirx.Select(tirx.isnan(b), b, m))

    def ident(dtype):       # -inf / +inf: min_value(float) is the lowest *finite* value
        inf = tirx.infinity(dtype)
        return -inf if is_max else inf
    red = te.comm_reducer(combine, ident, name="nanmax" if is_max else "nanmin")
    full = _reduce_index_map(nd, set(axes), keepdims, rvars)
    shape = _reduce_out_shape(x.shape, set(axes), keepdims)
    return te.compute(shape, lambda *i: red(x(*full(i)), axis=[rvars[a] for a in axes]),
                      name="max" if is_max else "min")


def _te_first_index(x, m, axis, keepdims):
    """Second pass of argmax/argmin: the first index along `axis` where x equals the extreme `m`
    (kept-dims shape), or is NaN where `m` is NaN. A plain min-reduction, which every backend
    schedules (dlight cannot do cross-thread reductions with a custom tuple combiner)."""
    axis = int(axis)
    nd = len(x.shape)
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    full = _reduce_index_map(nd, {axis}, keepdims, {axis: k})
    shape = _reduce_out_shape(x.shape, {axis}, keepdims)
    is_f = _is_float(x.dtype)

    def f(*i):
        xi = full(i)
        mi = [tirx.IntImm(I64, 0) if a == axis else xi[a] for a in range(nd)]
        v, mv = x(*xi), m(*mi)
        hit = v == mv
        if is_f:
            hit = tirx.any(hit, tirx.all(tirx.isnan(v), tirx.isnan(mv)))
        return te.min(tirx.Select(hit, tirx.Cast(I64, k.var), tirx.const(INT64_MAX, I64)), axis=k)
    return te.compute(shape, f, name="arg_index")


def _argreduce_expr(bb, ctx, x, axis, keepdims, is_max):
    """numpy argmax/argmin along `axis`: the extreme (NaN-propagating for floats), then the first
    index holding it; an empty axis (numpy raises) gives INT64_MAX."""
    if _is_float(_dtype(x)):
        m = bb.emit_te(_te_nan_reduce, x, [axis], True, is_max, primfunc_name_hint="dt_" + ("max" if is_max else "min"))
    else:
        m = _emit(bb, (R.max if is_max else R.min)(x, axis=[axis], keepdims=True))
    return bb.emit_te(_te_first_index, x, m, axis, keepdims,
                      primfunc_name_hint="dt_" + ("argmax" if is_max else "argmin"))


def _int_power_primfunc(dtype: str):
    """Flat numpy integer power: square-and-multiply in a while loop (wraps on overflow like
    numpy's C loop; a negative exponent, where numpy raises, gives 1). TIR, because an unrolled
    TE expression over the exponent's bits makes TVM's simplifier exponential. The loop state
    lives in the output and two scratch outputs (no block-local buffer: those break when a
    schedule duplicates the block, and GPU code cannot allocate global memory)."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def int_power(a: T.handle, b: T.handle, c: T.handle, sb: T.handle, se: T.handle):
        # opaque (8): never fused, so the scratch outputs stay function arguments
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})
        n = T.int64()
        A = T.match_buffer(a, (n,), dtype)
        B = T.match_buffer(b, (n,), dtype)
        C = T.match_buffer(c, (n,), dtype)
        SB = T.match_buffer(sb, (n,), dtype)
        SE = T.match_buffer(se, (n,), dtype)
        for i in range(n):
            with T.sblock("int_power"):       # a spatial block: dlight binds it on GPUs
                vi = T.axis.spatial(n, i)
                T.reads(A[vi], B[vi])
                T.writes(C[vi], SB[vi], SE[vi])
                C[vi] = T.Cast(dtype, 1)
                SB[vi] = A[vi]
                SE[vi] = B[vi]
                while SE[vi] > T.Cast(dtype, 0):
                    if SE[vi] % T.Cast(dtype, 2) == T.Cast(dtype, 1):
                        C[vi] = C[vi] * SB[vi]
                    SB[vi] = SB[vi] * SB[vi]
                    SE[vi] = SE[vi] // T.Cast(dtype, 2)
    return int_power


def _int_power(bb, ctx, a, b):
    dt = _dtype(a)
    shape = _shape(bb.normalize(R.add(a, b)))
    name = f"dt_int_power_{dt}"
    gv = next((g for g in bb.get().get_global_vars() if g.name_hint == name), None)
    if gv is None:
        gv = bb.add_func(_int_power_primfunc(dt), name)
    size = ctx.analyzer.simplify(_prod(shape))
    flat = []
    for x in (a, b):
        if not (len(_shape(x)) == len(shape) and all(ctx.relax_equal(d, e) for d, e in zip(_shape(x), shape))):
            x = R.broadcast_to(x, shape)
        flat.append(_emit(bb, R.reshape(x, [size])))
    t = relax.TensorType([size], dt)
    r = _emit(bb, R.call_tir(gv, flat, [t, t, t]))
    return R.reshape(_emit(bb, relax.TupleGetItem(r, 0)), shape)


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


def _guard_empty(bb, ctx, r, extents, identity):
    r = _emit(bb, r)
    if not _needs_empty_guard(ctx, extents, _shape(r)):
        return r
    return bb.emit_te(_te_empty_guard, r, _prod(extents), identity, primfunc_name_hint="dt_empty_reduce_guard")


def _norm_axes(axis, nd):
    if axis is None:
        return list(range(nd))
    return sorted({int(a) % nd if nd else 0 for a in (axis if isinstance(axis, (tuple, list)) else (axis,))})


# ---------------------------------------------------------------------------------- constants
@converter("constant")
def _constant(bb, node, args, ctx):
    v = np.asarray(node.attrs.value)
    return [relax.const(v, v.dtype.name)]


# ------------------------------------------------------------------------------------- unary
_FLOAT_UNARY: dict = {}      # Relax builders of float-unary ops that are not simply R.<name>


def float_unary(name):
    def deco(fn):
        _FLOAT_UNARY[name] = fn
        return fn
    return deco


# numpy reference is 1 / sqrt(x): both correctly rounded, so this is bit-exact.
float_unary("rsqrt")(lambda x: R.divide(_const(1, _dtype(x)), R.sqrt(x)))
float_unary("gelu")(lambda x: R.nn.gelu(x))          # erf form, like the reference


def _float_unary(name):
    fn = _FLOAT_UNARY.get(name) or getattr(R, name)

    def conv(bb, node, args, ctx):
        return [fn(_float_in(args[0]))]
    return conv


for _name in O.ops_in(O.Group.FLOAT_UNARY):
    converter(_name)(_float_unary(_name))


@converter("clip")
def _clip(bb, node, args, ctx):
    # np.clip is minimum(maximum(x, a_min), a_max): written with selects so that NaN stays NaN (TVM's
    # max/min may drop a NaN operand) and a_min > a_max gives a_max everywhere, like numpy.
    x = args[0]
    dt = _dtype(x)
    y = _cast(x, "int8") if dt == "bool" else x
    cdt = _dtype(y)
    if node.attrs.a_min is not None:
        lo = _const(np.asarray(node.attrs.a_min).astype(dt), cdt)
        y = R.where(R.less(y, lo), lo, y)
    if node.attrs.a_max is not None:
        hi = _const(np.asarray(node.attrs.a_max).astype(dt), cdt)
        y = R.where(R.greater(y, hi), hi, y)
    return [_cast(y, dt)]


@converter("neg")
def _neg(bb, node, args, ctx):
    x = args[0]
    if _dtype(x) == "bool":        # numpy raises; compiled code gives logical_not
        return [R.logical_not(x)]
    return [R.negative(x)]


@converter("abs")
def _abs(bb, node, args, ctx):
    x = args[0]
    if _dtype(x) == "bool" or np.dtype(_dtype(x)).kind == "u":
        return [x]
    return [R.abs(x)]


@converter("relu")
def _relu(bb, node, args, ctx):
    # np.maximum(x, 0): NaN propagates. TVM's max(x, 0) drops a NaN first operand, so use
    # x < 0 ? 0 : x (NaN < 0 is false -> NaN; -0.0 stays -0.0 like numpy).
    x = args[0]
    dt = _dtype(x)
    if dt == "bool" or np.dtype(dt).kind == "u":
        return [x]
    return [R.where(R.less(x, _const(0, dt)), _const(0, dt), x)]


def _float_only(fn):
    def conv(bb, node, args, ctx):
        x = args[0]
        return [fn(x) if _is_float(_dtype(x)) else x]    # identity on ints/bools (numpy)
    return conv


CONVERTERS["floor"] = _float_only(R.floor)
CONVERTERS["ceil"] = _float_only(R.ceil)
CONVERTERS["round"] = _float_only(R.round)     # TVM rounds half to even like np.round (checked)


@converter("sign")
def _sign(bb, node, args, ctx):
    x = args[0]
    dt = _dtype(x)
    if dt == "bool":               # numpy raises; compiled code gives x
        return [x]
    if _is_float(dt):          # TVM's sign(nan) is 0; numpy's is nan
        return [R.where(R.isnan(x), x, R.sign(x))]
    return [R.sign(x)]


@converter("logical_not")
def _logical_not(bb, node, args, ctx):
    return [R.logical_not(_cast(args[0], "bool"))]


@converter("isnan")
def _isnan(bb, node, args, ctx):
    x = args[0]
    if _is_float(_dtype(x)):
        return [R.isnan(x)]
    return [R.full_like(x, _const(False, "bool"), "bool")]


# ------------------------------------------------------------------------------------ binary
def _binary_prep(bb, node, args, ctx, dtype):
    a, b = (_cast(x, dtype) for x in args)
    a, b = (_emit(bb, x) for x in (a, b))
    return unify_broadcast(bb, ctx, [a, b], [v.type for v in node.inputs])


def _arith(name):
    rel = {"add": R.add, "subtract": R.subtract, "multiply": R.multiply, "divide": R.divide,
           "power": R.power, "maximum": R.maximum, "minimum": R.minimum}[name]

    def conv(bb, node, args, ctx):
        dt = _out(node).dtype
        if dt == "bool":
            return [_bool_arith(bb, node, args, ctx, name)]
        a, b = _binary_prep(bb, node, args, ctx, dt)
        if name == "power" and _is_int(dt):
            return [_int_power(bb, ctx, a, b)]
        if name in ("maximum", "minimum") and _is_float(dt):
            # np.maximum/minimum propagate NaN from either side; TVM's max/min do not.
            either_nan = R.logical_or(R.isnan(a), R.isnan(b))
            return [R.where(either_nan, R.add(a, b), rel(a, b))]
        return [rel(a, b)]
    return conv


def _bool_arith(bb, node, args, ctx, name):
    a, b = _binary_prep(bb, node, args, ctx, "bool")
    if name in ("add", "maximum"):
        return R.logical_or(a, b)
    if name in ("multiply", "minimum"):
        return R.logical_and(a, b)
    if name == "power":                  # True ** y = 1, False ** y = (y == 0)
        return R.logical_or(a, R.logical_not(b))
    # subtract (numpy raises for bools): xor, what numpy's message suggests
    return R.not_equal(R.astype(a, "int8"), R.astype(b, "int8"))


for _name in O.ops_in(O.Group.ARITH):
    CONVERTERS[_name] = _arith(_name)


def _compare(name):
    rel = {"equal": R.equal, "not_equal": R.not_equal, "less": R.less, "less_equal": R.less_equal,
           "greater": R.greater, "greater_equal": R.greater_equal}[name]

    def conv(bb, node, args, ctx):
        dt = _common_dtype(*args)
        if dt == "bool":       # TVM cannot compare i1 values: compare as int8 (False < True)
            dt = "int8"
        a, b = _binary_prep(bb, node, args, ctx, dt)
        if name == "not_equal" and _is_float(dt):
            # TVM emits an ordered != (false for NaN) and simplifies !(a == b) back to it; numpy's
            # != is true when either side is NaN.
            return [R.logical_or(R.not_equal(a, b), R.logical_or(R.isnan(a), R.isnan(b)))]
        return [rel(a, b)]
    return conv


for _name in O.ops_in(O.Group.COMPARE):
    CONVERTERS[_name] = _compare(_name)


@converter("logical_and", "logical_or")
def _logical(bb, node, args, ctx):
    a, b = _binary_prep(bb, node, args, ctx, "bool")
    return [(R.logical_and if node.op == "logical_and" else R.logical_or)(a, b)]


@converter("where")
def _where(bb, node, args, ctx):
    dt = _out(node).dtype
    c = _emit(bb, _cast(args[0], "bool"))
    x, y = (_emit(bb, _cast(v, dt)) for v in args[1:])
    c, x, y = unify_broadcast(bb, ctx, [c, x, y], [v.type for v in node.inputs])
    return [R.where(c, x, y)]


# ------------------------------------------------------------------------------------ matmul
@converter("matmul")
def _matmul(bb, node, args, ctx):
    dt = _out(node).dtype
    work = "int32" if dt == "bool" else dt      # numpy bool matmul: any(a & b)
    a, b = (_emit(bb, _cast(x, work)) for x in args)
    ta, tb = (v.type for v in node.inputs)
    if _ndim(a) >= 2 and _ndim(b) >= 2:
        a, b = unify_broadcast(bb, ctx, [a, b], [ta, tb], skip_trailing=2)
    ka = _shape(a)[-1]
    b = _assert_dims(bb, ctx, b, {(_ndim(b) - 2 if _ndim(b) >= 2 else 0): ka})
    r = _emit(bb, R.matmul(a, b, out_dtype=work))
    r = _guard_empty(bb, ctx, r, [ka], 0)          # K == 0: numpy gives zeros
    if dt == "bool":
        r = R.not_equal(r, _const(0, work))
    return [r]


# -------------------------------------------------------------------------------- reductions
def _reduce(name):
    def conv(bb, node, args, ctx):
        x = args[0]
        nd = _ndim(x)
        axes = _norm_axes(node.attrs.axis, nd)
        keep = bool(node.attrs.keepdims)
        dt = _out(node).dtype
        shape = _shape(x)
        extents = [shape[a] for a in axes]
        if name in ("sum", "prod"):
            x = _cast(x, dt)
            fn = R.sum if name == "sum" else R.prod
            r = fn(x, axis=axes, keepdims=keep) if axes else x
            return [_guard_empty(bb, ctx, r, extents, 0 if name == "sum" else 1) if axes else r]
        if name == "mean":
            x = _cast(x, dt)
            if not axes:
                return [x]
            s = _emit(bb, R.sum(x, axis=axes, keepdims=keep))
            count = ctx.analyzer.simplify(_prod(extents))
            if isinstance(count, tirx.IntImm) and int(count.value) > 0:
                return [R.divide(s, _const(int(count.value), dt))]
            return [bb.emit_te(_te_mean_div, s, count, primfunc_name_hint="dt_mean_div")]
        # max / min: numpy raises on empty axes, so no guard
        if not axes:
            return [x]
        if _is_float(dt):
            return [bb.emit_te(_te_nan_reduce, _emit(bb, x), axes, keep, name == "max",
                               primfunc_name_hint="dt_" + name)]
        if dt == "bool":
            r = (R.max if name == "max" else R.min)(R.astype(x, "int8"), axis=axes, keepdims=keep)
            return [R.astype(r, "bool")]
        return [(R.max if name == "max" else R.min)(x, axis=axes, keepdims=keep)]
    return conv


for _name in O.ops_in(O.Group.REDUCE):
    CONVERTERS[_name] = _reduce(_name)


@converter("argmax", "argmin")
def _argreduce(bb, node, args, ctx):
    x = args[0]
    nd = _ndim(x)
    keep = bool(node.attrs.keepdims)
    is_max = node.op == "argmax"
    if _dtype(x) == "bool":
        x = R.astype(x, "int8")
    x = _emit(bb, x)
    if node.attrs.axis is None:            # flattened, like numpy
        flat = _emit(bb, R.reshape(x, [_prod(_shape(x)) if nd else tirx.IntImm(I64, 1)]))
        r = _argreduce_expr(bb, ctx, flat, 0, False, is_max)
        if keep:
            r = R.reshape(r, [tirx.IntImm(I64, 1)] * nd)
        return [r]
    if nd == 0:
        return [_const(0, I64)]
    return [_argreduce_expr(bb, ctx, x, int(node.attrs.axis) % nd, keep, is_max)]


# ------------------------------------------------------------------------------ shape changes
def _checked_reshape(bb, ctx, x, target: list):
    """R.reshape to `target`; when Relax cannot prove the sizes equal, flatten and match_cast to
    the target size first (checked at run time: R.reshape itself is not)."""
    src = _shape(x)
    if ctx.equal(_prod(src), _prod(target)):
        return R.reshape(x, target)
    flat = _emit(bb, R.reshape(x, [ctx.analyzer.simplify(_prod(src))]))
    flat = bb.match_cast(flat, relax.TensorType([ctx.analyzer.simplify(_prod(target))], _dtype(x)))
    return R.reshape(flat, target)


@converter("reshape")
def _reshape(bb, node, args, ctx):
    x = args[0]
    want = list(node.attrs.shape)
    out_t = _out(node).shape
    src = _shape(x)
    if -1 in want:
        j = want.index(-1)
        target = [ctx.dim(d) if k != j else None for k, d in enumerate(want)]
        try:
            cand = ctx.dim(out_t[j])           # the type rule's resolved -1 (keeps static dims)
        except CompileError:
            cand = None
        if cand is not None and ctx.equal(_prod(src), _prod([cand if d is None else d for d in target])):
            target[j] = cand
        else:                                  # size / product of the others (guarded against 0)
            known = _prod([d for d in target if d is not None])
            target[j] = ctx.analyzer.simplify(tirx.floordiv(_prod(src), tirx.max(known, 1)))
    else:
        target = ctx.shape(want)
    return [_checked_reshape(bb, ctx, x, target)]


@converter("transpose")
def _transpose(bb, node, args, ctx):
    axes = node.attrs.axes
    nd = _ndim(args[0])
    axes = list(reversed(range(nd))) if axes is None else [int(a) % nd for a in axes]
    return [R.permute_dims(args[0], axes)]


@converter("expand_dims")
def _expand_dims(bb, node, args, ctx):
    nd = _ndim(args[0])
    return [R.expand_dims(args[0], int(node.attrs.axis) % (nd + 1))]


@converter("squeeze")
def _squeeze(bb, node, args, ctx):
    x = args[0]
    t = node.inputs[0].type
    if node.attrs.axis is None:
        axes = [i for i, d in enumerate(t.shape) if d == 1]
    else:
        axes = sorted({int(a) % t.ndim for a in node.attrs.axis})
    if not axes:
        return [x]
    s = _shape(x)
    if all(_is_one(s[a]) for a in axes):
        return [R.squeeze(x, axes)]
    # Relax cannot prove the dim is 1: a checked reshape (raises at run time if it is not).
    return [_checked_reshape(bb, ctx, x, [d for i, d in enumerate(s) if i not in axes])]


@converter("concat")
def _concat(bb, node, args, ctx):
    dt = _out(node).dtype
    xs = [_emit(bb, _cast(x, dt)) for x in args]
    nd = _ndim(xs[0])
    ax = int(node.attrs.axis) % nd
    ref = _shape(xs[0])
    xs = [xs[0]] + [_assert_dims(bb, ctx, x, {j: ref[j] for j in range(nd) if j != ax}) for x in xs[1:]]
    return [R.concat(xs, axis=ax)]


@converter("stack")
def _stack(bb, node, args, ctx):
    dt = _out(node).dtype
    xs = [_emit(bb, _cast(x, dt)) for x in args]
    nd = _ndim(xs[0])
    ax = int(node.attrs.axis) % (nd + 1)
    ref = _shape(xs[0])
    xs = [xs[0]] + [_assert_dims(bb, ctx, x, dict(enumerate(ref))) for x in xs[1:]]
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
    s = _shape(x)
    nd = len(s)
    A, B, N, S = [], [], [], []
    for ax, s0, s1, st in zip(axes, starts, stops, steps):
        ax = int(ax) % nd
        st = int(st)
        if st == 0:
            raise CompileError("slice step cannot be zero")
        b, n = _canonical_slice(ctx, s[ax], s0, s1, st)
        A.append(ax), B.append(b), N.append(n), S.append(st)
    if not A:
        return x
    if all(ctx.equal(b, 0) and ctx.equal(n, s[a]) and st == 1 for a, b, n, st in zip(A, B, N, S)):
        return x                           # full slice
    return bb.emit_te(_te_slice, x, A, B, N, S, primfunc_name_hint="dt_strided_slice")


@converter("slice")
def _slice(bb, node, args, ctx):
    a = node.attrs
    return [_slice_expr(bb, ctx, args[0], a.axes, a.starts, a.stops, a.steps)]


@converter("split")
def _split(bb, node, args, ctx):
    x = args[0]
    nd = _ndim(x)
    ax = int(node.attrs.axis) % nd
    L = _shape(x)[ax]
    sec = node.attrs.sections
    outs = []
    if isinstance(sec, int):
        size = ctx.analyzer.simplify(tirx.floordiv(L, sec))
        if sec > 1 and not (isinstance(L, tirx.IntImm)):
            # numpy raises unless L % sections == 0: check it at run time.
            x = _assert_dims(bb, ctx, x, {ax: ctx.analyzer.simplify(size * sec)})
        for i in range(sec):
            outs.append(bb.emit_te(_te_slice, x, [ax], [ctx.analyzer.simplify(size * i)], [size], [1],
                                   primfunc_name_hint="dt_split") if sec > 1 else x)
        return outs
    bounds = [0, *[int(i) for i in sec], None]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        outs.append(_slice_expr(bb, ctx, x, [ax], [lo], [hi], [1]))
    return outs


@converter("take")
def _take(bb, node, args, ctx):
    x, idx = args
    nd = _ndim(x)
    ax = int(node.attrs.axis) % nd
    return [bb.emit_te(_te_take, x, idx, ax, _shape(x)[ax], primfunc_name_hint="dt_take")]


@converter("broadcast_to")
def _broadcast_to(bb, node, args, ctx):
    x = args[0]
    target = ctx.shape(node.attrs.shape)
    s = _shape(x)
    off = len(target) - len(s)
    if all(_is_one(d) or ctx.relax_equal(d, target[k + off]) for k, d in enumerate(s)):
        if len(s) == len(target) and all(ctx.relax_equal(d, t) for d, t in zip(s, target)):
            return [x]
        return [R.broadcast_to(x, target)]
    return [bb.emit_te(_te_broadcast, x, target, primfunc_name_hint="dt_broadcast_to")]


@converter("tile")
def _tile(bb, node, args, ctx):
    return [R.tile(args[0], [int(r) for r in node.attrs.reps])]


@converter("pad")
def _pad(bb, node, args, ctx):
    x = args[0]
    dt = _dtype(x)
    flat = [int(v) for pair in node.attrs.pad_width for v in pair]
    if not any(flat):
        return [x]
    value = np.asarray(node.attrs.value).astype(dt).item()     # np.pad's cast of the value
    return [R.nn.pad(x, flat, pad_mode="constant", pad_value=float(value))]


@converter("cast")
def _cast_op(bb, node, args, ctx):
    x, dt = args[0], np.dtype(node.attrs.dtype)
    if _is_float(_dtype(x)) and dt.kind in "iu" and (dt.itemsize < 4 or dt.kind == "u"):
        # numpy (C casts as gcc emits them on x86) truncates to a 32/64-bit int and keeps the low
        # bits, e.g. uint8(-2.5) = 254; LLVM's direct fptoui/fptosi would give poison.
        if dt.name == "uint64":
            neg = R.astype(R.astype(x, I64), "uint64")
            return [R.where(R.less(x, _const(0, _dtype(x))), neg, R.astype(x, "uint64"))]
        via = "int32" if dt.itemsize < 4 else I64
        return [R.astype(R.astype(x, via), dt.name)]
    return [_cast(x, dt.name)]


@converter("softmax", "log_softmax")
def _softmax(bb, node, args, ctx):
    x = _float_in(args[0])
    nd = _ndim(x)
    ax = int(node.attrs.axis) % max(nd, 1)
    if nd == 0:      # softmax of a scalar: exp(0)/exp(0) = 1; log_softmax: 0 (nan/inf stay nan)
        z = R.subtract(x, x)
        return [R.exp(z) if node.op == "softmax" else z]
    return [(R.nn.softmax if node.op == "softmax" else R.nn.log_softmax)(x, axis=ax)]


@converter("layer_norm")
def _layer_norm(bb, node, args, ctx):
    # R.nn.layer_norm matches a two-pass (x - mean)^2 computation in accuracy (measured: same
    # error as the explicit two-pass form up to |mean| = 1000 * std); both differ from numpy only
    # by summation order (numpy sums pairwise).
    dt = _out(node).dtype
    x = _emit(bb, _cast(args[0], dt))
    g, b = (_emit(bb, _cast(v, dt)) for v in args[1:])
    k, nd, s = _ndim(g), _ndim(x), _shape(x)
    g = _assert_dims(bb, ctx, g, {j: s[nd - k + j] for j in range(k)})
    b = _assert_dims(bb, ctx, b, {j: s[nd - k + j] for j in range(k)})
    return [R.nn.layer_norm(x, g, b, axes=list(range(nd - k, nd)), epsilon=float(node.attrs.eps))]


# ----------------------------------------------------------------------------------- creation
def _full_expr(shape, value, dt):
    v = np.asarray(value).astype(dt)
    if v.dtype.kind == "f" and not np.isfinite(v):
        # TOPI's full crashes on inf/nan fill values (it tests `"float" in dtype` on a PrimType)
        return R.broadcast_to(relax.const(v, dt), shape)
    return R.full(shape, relax.const(v, dt), dt)


@converter("full")
def _full(bb, node, args, ctx):
    a = node.attrs
    return [_full_expr(ctx.shape(a.shape), a.fill_value, np.dtype(a.dtype).name)]


@converter("full_like")
def _full_like(bb, node, args, ctx):
    return [_full_expr(_shape(args[0]), node.attrs.fill_value, _out(node).dtype)]


def _te_arange(start, step, length, dtype):
    return te.compute([length], lambda i: (start + i * step).astype(dtype), name="arange")


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
        return [bb.emit_te(_te_arange, start, tirx.IntImm(I64, step), n, dt, primfunc_name_hint="dt_arange")]
    ref = np.arange(a.start, a.stop, a.step, dtype=dt)
    if _is_int(dt) and ref.size > 64:
        return [R.arange(int(a.start), int(a.stop), int(a.step), dt)]
    # float arange: numpy's fill (start + i * delta in the output dtype) is reproduced exactly by
    # embedding the values; small int ranges too.
    return [relax.const(ref, dt)]


@converter("topk")
def _topk(bb, node, args, ctx):
    x = args[0]
    a = node.attrs
    nd = _ndim(x)
    ax = int(a.axis) % nd
    k = int(a.k)
    dt = _dtype(x)
    if k == 0:     # TVM's topk returns everything for k = 0
        s = list(_shape(x))
        s[ax] = tirx.IntImm(I64, 0)
        return [_full_expr(s, 0, dt), _full_expr(s, 0, I64)]
    key = x
    kdt = dt
    if dt == "bool":
        key, kdt = R.astype(x, "int8"), "int8"
    elif _is_float(dt):
        # numpy's stable argsort puts NaN last in both directions; TVM's sort is undefined on NaN.
        key = R.where(R.isnan(x), _const(-np.inf if a.largest else np.inf, dt), x)
    n = _shape(x)[ax]
    if not (isinstance(n, tirx.IntImm) and int(n.value) >= k):
        # A symbolic axis may be shorter than k at run time (numpy raises); TVM's topk then
        # returns indices past the end. Pad the axis with k entries that sort last, so every
        # index stays inside the (padded) tensor.
        if _is_float(kdt):
            pad_v = -np.inf if a.largest else np.inf
        else:
            info = np.iinfo(kdt)
            pad_v = info.min if a.largest else info.max
        ps = list(_shape(x))
        ps[ax] = tirx.IntImm(I64, k)
        key = R.concat([key, _full_expr(ps, pad_v, kdt)], axis=ax)
        x = R.concat([x, _full_expr(ps, 0, dt)], axis=ax)
    key = _emit(bb, key)
    res = _emit(bb, R.topk(key, k, axis=ax, ret_type="both", largest=bool(a.largest), dtype=I64))
    idx = _emit(bb, relax.TupleGetItem(res, 1))
    if kdt == dt and not _is_float(dt):
        vals = relax.TupleGetItem(res, 0)
    else:
        vals = R.gather_elements(_emit(bb, x), idx, axis=ax)
    return [vals, idx]


# ------------------------------------------------------------------------------------ driver
def convert_node(bb, node, args: list, ctx: ConvertContext) -> list:
    """Run the converter of `node` and emit its results; checks dtype/rank against our types."""
    fn = CONVERTERS.get(node.op)
    if fn is None:
        from dyntvm.errors import UnsupportedOpError
        raise UnsupportedOpError(f"op {node.op!r} has no Relax converter (node {node.name!r}"
                                 f"{', ' + node.source if node.source else ''})")
    ctx.node = node
    outs = fn(bb, node, list(args), ctx)
    if len(outs) != len(node.outputs):
        raise CompileError(f"internal: converter of {node.op} returned {len(outs)} results, "
                           f"expected {len(node.outputs)}")
    res = []
    for v, e in zip(node.outputs, outs):
        e = _emit(bb, e)
        t = v.type
        if not isinstance(_ty(e), relax.TensorType) or _dtype(e) != t.dtype or _ndim(e) != t.ndim:
            raise CompileError(f"internal: converter of {node.op} (node {node.name!r}) produced "
                               f"{e.ty}, expected {t}")
        if _shape(e) is None:
            raise CompileError(f"internal: Relax could not infer the shape of {node.op} "
                               f"(node {node.name!r}, {e.ty}); the converter must make shapes provable")
        res.append(e)
    ctx.node = None
    return res
