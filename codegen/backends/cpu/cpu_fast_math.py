"""Vectorizable fp32 math for the CPU build: ``exp``, ``tanh``, ``sigmoid``, ``softmax`` and
``log_softmax`` legalized to polynomial TIR that LLVM vectorizes (TVM's own lowering calls scalar
``expf``, ~2 ns each), and a float ``sum`` over a symbolic trailing axis in vector lanes. Other dtypes keep TVM's
legalization. Used by `cpu_schedule.legalize_and_fuse`.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax, te, tirx, topi

__all__ = ["FAST_MATH", "exp_f32", "tanh_f32"]

#: softmax's exp of ``x - max(x)`` (<= 0) without `exp_f32`'s overflow branch (`exp_nonpositive_f32`)
SOFTMAX_NONPOSITIVE_EXP = True


def _f32(value: float) -> tirx.PrimExpr:
    return tirx.const(value, "float32")


def _let(value: tirx.PrimExpr, body: Callable, name: str = "t") -> tirx.PrimExpr:
    """``body(v)`` with v bound to value once (a shared subexpression, not a copied tree)."""
    var = tirx.Var(name, "float32")
    return tirx.Let(var, value, body(var))


def _exp(v: tirx.PrimExpr, overflow: bool) -> tirx.PrimExpr:
    """exp(v) as Cephes expf: n = round(v / ln2), r = v - n ln2 (ln2 in two parts, exact), degree-6 polynomial,
    times 2^n from exponent bits. 0 below -87.34, NaN propagated; with `overflow`, inf above 88.72 and 2^n in
    two halves (n = 128 stays finite), else (v <= 0 or NaN only) one exponent-bits value, n in [-126, 0]."""
    def pow2(k):  # 2^k for an integer-valued k in [-126, 127]
        return tirx.reinterpret("float32", (tirx.Cast("int32", k) + 127) * 8388608)

    def with_n(x, n):
        def with_r(r):
            p = _f32(1.9875691500e-4)
            for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                      5.0000001201e-1):
                p = p * r + _f32(c)
            if not overflow:
                return (p * r * r + r + _f32(1.0)) * pow2(n)
            half = tirx.floor(n * _f32(0.5))
            return (p * r * r + r + _f32(1.0)) * pow2(half) * pow2(n - half)
        return _let(x - n * _f32(0.693359375) + n * _f32(2.12194440e-4), with_r, "r")

    def body(v):
        low = tirx.max(tirx.min(v, _f32(88.72283905206835)) if overflow else v, _f32(-87.33654475))
        out = _let(low, lambda x: _let(tirx.floor(x * _f32(1.44269504088896341) + _f32(0.5)),
                                       lambda n: with_n(x, n), "n"), "x")
        if overflow:
            out = tirx.Select(v > _f32(88.72283905206835), _f32(float("inf")), out)
        out = tirx.Select(v < _f32(-87.33654475), _f32(0.0), out)
        return tirx.Select(tirx.isnan(v), v, out)
    return _let(v, body, "v")


def exp_f32(v: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp(v) (`_exp`). Max rel. error 8e-8 against float64; inf / 0 outside the fp32 range; NaN propagates."""
    return _exp(v, overflow=True)


def exp_nonpositive_f32(v: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp(v) for v <= 0 or NaN (softmax's ``x - max(x)``), as `exp_f32` without its overflow branch: about a
    quarter fewer vector instructions; equal to `exp_f32` for those v."""
    return _exp(v, overflow=False)


def tanh_f32(v: tirx.PrimExpr) -> tirx.PrimExpr:
    """tanh(v) = sign(v) (1 - 2 / (exp(2|v|) + 1)); the odd Taylor series to v^11 below
    |v| = 0.25, where that form cancels. Max rel. error 2.6e-7, abs. 1e-7."""
    def body(v):
        def with_big(big):
            v2, poly = v * v, _f32(-1382.0 / 155925)
            for c in (62.0 / 2835, -17.0 / 315, 2.0 / 15, -1.0 / 3):
                poly = poly * v2 + _f32(c)
            return tirx.Select(tirx.abs(v) < _f32(0.25), v + v * v2 * poly,
                               tirx.Select(v < _f32(0.0), -big, big))
        return _let(_f32(1.0) - _f32(2.0) / (exp_f32(tirx.abs(v) * _f32(2.0)) + _f32(1.0)),
                    with_big, "big")
    return _let(v, body, "v")


def _legalize_with(make_compute, op_name: str):
    """A LegalizeOps function: the TE compute of ``make_compute(call)`` for fp32 inputs, TVM's
    own legalization for other dtypes."""
    fallback = tvm.ir.Op.get(op_name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if call.args[0].ty.dtype != "float32":
            return fallback(bb, call)
        return bb.call_te(make_compute(call), call.args[0],
                          primfunc_name_hint=op_name.rsplit(".", 1)[-1])

    return legalize


def _elementwise(fn):
    return lambda _call: lambda x: te.compute(x.shape, lambda *i: fn(x(*i)), name="compute")


#: Lanes of the partial results of a row reduction over a symbolic last axis (`_row_reduce`); blocks named
#: with the suffix LANES_SUFFIX get their lane loop vectorized by the CPU row-reduction schedule.
ROW_LANES, LANES_SUFFIX = 16, "_lanes"


def _row_reduce(x, kind: str, name: str):
    """max / sum of `x` over its last axis, of symbolic length n, as ROW_LANES partial results per row: lane l
    reduces elements ``c * ROW_LANES + l`` over the n // ROW_LANES full chunks (the lanes a vector, the chunks a
    loop around it), the last n % ROW_LANES elements are reduced apart, then the lanes. A plain reduction
    over a symbolic axis was a scalar loop (one dependent max / add per element; LLVM does not reassociate)."""
    n, rows = x.shape[-1], list(x.shape[:-1])
    lanes = tirx.IntImm(str(n.ty), ROW_LANES)
    chunks = tirx.floordiv(n, lanes)
    reduce = topi.max if kind == "max" else topi.sum
    red = te.max if kind == "max" else te.sum
    combine = (lambda a, b: tirx.max(a, b)) if kind == "max" else (lambda a, b: a + b)
    c = te.reduce_axis((tirx.IntImm(str(n.ty), 0), chunks), "c")
    part = te.compute(rows + [lanes], lambda *i: red(x(*i[:-1], c * lanes + i[-1]), axis=c),
                      name=f"{name}{LANES_SUFFIX}")
    t = te.reduce_axis((tirx.IntImm(str(n.ty), 0), n - chunks * lanes), "t")
    tail = te.compute(rows, lambda *i: red(x(*i, chunks * lanes + t), axis=t), name=f"{name}_tail")
    folded = reduce(part, axis=-1)
    return te.compute(rows, lambda *i: combine(folded(*i), tail(*i)), name=name)


def _softmax(log: bool):
    def make(call):
        def compute(x):
            axis = int(call.attrs.axis) % len(x.shape)
            symbolic_rows = axis == len(x.shape) - 1 and not isinstance(x.shape[axis], tirx.IntImm)
            # no keepdims: row loops then match the output's
            mx = _row_reduce(x, "max", "T_max") if symbolic_rows else topi.max(x, axis=axis)

            def row(i):
                return [idx for d, idx in enumerate(i) if d != axis]

            exp = exp_nonpositive_f32 if SOFTMAX_NONPOSITIVE_EXP else exp_f32
            e = te.compute(x.shape, lambda *i: exp(x(*i) - mx(*row(i))), name="T_exp")
            s = _row_reduce(e, "sum", "T_sum") if symbolic_rows else topi.sum(e, axis=axis)
            if log:
                return te.compute(x.shape, lambda *i: x(*i) - mx(*row(i)) - tirx.log(s(*row(i))),
                                  name="T_log_softmax")
            if SOFTMAX_NONPOSITIVE_EXP:         # one division a row, then a multiply per element
                inv = te.compute(s.shape, lambda *i: _f32(1.0) / s(*i), name="T_inv")
                return te.compute(x.shape, lambda *i: e(*i) * inv(*row(i)), name="T_softmax")
            return te.compute(x.shape, lambda *i: e(*i) / s(*row(i)), name="T_softmax")
        return compute
    return make


#: a float sum over one trailing axis of symbolic length (`_row_sum`): in ROW_LANES lanes, vectorized
ROW_SUM_LANES = True


def _row_sum(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """relax.sum of a float32 / float64 tensor of 2 or more dims over its last axis alone, of symbolic length:
    `_row_reduce`'s lanes (a plain reduction over a symbolic axis is a scalar chain: one dependent add per
    element). Any other sum: TVM's own legalization."""
    x = call.args[0]
    shape = getattr(x.ty, "shape", None)
    nd = len(shape.values) if isinstance(shape, relax.ShapeExpr) else -1
    axis = call.attrs.axis
    axes = [int(a) % nd for a in axis] if axis is not None and nd > 0 else None
    if (not ROW_SUM_LANES or nd < 2 or x.ty.dtype not in ("float32", "float64") or axes != [nd - 1]
            or isinstance(shape.values[-1], tirx.IntImm)):
        return _SUM_DEFAULT(bb, call)
    keep = bool(call.attrs.keepdims)

    def compute(x):
        r = _row_reduce(x, "sum", "T_row_sum")
        if not keep:
            return r
        return te.compute(list(x.shape[:-1]) + [tirx.IntImm(str(x.shape[-1].ty), 1)],
                          lambda *i: r(*i[:-1]), name="T_row_sum_keep")
    return bb.call_te(compute, x, primfunc_name_hint="sum")


_SUM_DEFAULT = tvm.ir.Op.get("relax.sum").get_attr("FLegalize")

#: LegalizeOps overrides (`customize_legalize_map`) for fp32 inputs.
FAST_MATH = {
    "relax.sum": _row_sum,
    "relax.exp": _legalize_with(_elementwise(exp_f32), "relax.exp"),
    "relax.tanh": _legalize_with(_elementwise(tanh_f32), "relax.tanh"),
    "relax.sigmoid": _legalize_with(
        _elementwise(lambda v: _f32(1.0) / (_f32(1.0) + exp_f32(-v))), "relax.sigmoid"),
    "relax.nn.softmax": _legalize_with(_softmax(log=False), "relax.nn.softmax"),
    "relax.nn.log_softmax": _legalize_with(_softmax(log=True), "relax.nn.log_softmax"),
}

