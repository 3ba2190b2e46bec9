"""Elementwise converters: unary (float-unary family, unary ops with numpy corner cases), binary
arithmetic, comparisons and logical ops with numpy broadcasting, ``where``, ``clip`` and ``cast``."""
from __future__ import annotations

import numpy as np
from tvm import relax, tirx, topi
from tvm.relax import op as R

from ...ir.dtypes import is_float
from ...ir.ops import Group, get_op, ops_in
from ..dims import I64
from ..te_kernels import int_power_primfunc, nonnegative_primfunc
from .registry import converter
from .common import (cast, checked, common_dtype, const, constant_of, dtype_of, emit, in_result_dtype, is_int,
                     ndim_of, out_type, primfunc_once, prod, shape_of, unify_broadcast)

# ------------------------------------------------------------------------------------- unary
_FLOAT_UNARY: dict = {}      # Relax builders of float-unary ops that are not simply R.<name>


def float_unary(name):
    def deco(fn):
        _FLOAT_UNARY[name] = fn
        return fn
    return deco


# numpy reference is 1 / sqrt(x): both correctly rounded, so this is bit-exact.
float_unary("rsqrt")(lambda x: R.divide(const(1, dtype_of(x)), R.sqrt(x)))
float_unary("gelu")(lambda x: R.nn.gelu(x))          # erf form, like the reference


def _float_unary(name):
    fn = _FLOAT_UNARY.get(name) or getattr(R, name, None)
    if fn is None:
        raise NotImplementedError(f"float-unary op {name!r}: Relax has no R.{name}; register its builder with "
                                  f"@float_unary({name!r}) above this loop in codegen/converters/elementwise.py")

    def conv(bb, node, args, ctx):
        x = in_result_dtype(name, args[0])
        if name in ("erf", "gelu") and not ctx.device_checks and dtype_of(x) == "float32":
            return [bb.emit_te(_te_fast_gelu if name == "gelu" else _te_fast_erf, emit(bb, x),
                               primfunc_name_hint=f"dt_{name}")]
        return [fn(x)]
    return conv


def _te_fast_erf(x):
    """float32 erf with TVM's vectorizable approximation (`topi.fast_erf`: within 8 ulp of the exact erf, a
    relative 4e-7) where the CPU would call libm's erff per element (13% of the transformer example's time, in
    its GELU); NaN stays NaN (the approximation clamps its argument, which drops it)."""
    from tvm import te
    fast = topi.fast_erf(x)
    return te.compute(x.shape, lambda *i: tirx.Select(tirx.isnan(x(*i)), x(*i), fast(*i)), name="erf")


def _te_fast_gelu(x):
    """The erf form of GELU, ``x / 2 * erfc(-x / sqrt(2))`` (= ``x / 2 * (1 + erf(x / sqrt(2)))`` without its
    cancellation for negative x), erfc from the Chebyshev fit of Numerical Recipes (`erfcc`, fractional error
    below 1.2e-7 everywhere) with TVM's vectorizable `topi.fast_exp`: no libm call per element."""
    from tvm import te
    f32 = "float32"
    coeffs = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
              -0.82215223, 0.17087277)

    def parts(*i):
        w = x(*i) * tirx.const(-0.7071067811865476, f32)
        a = tirx.abs(w)
        t = tirx.const(1.0, f32) / (tirx.const(1.0, f32) + tirx.const(0.5, f32) * a)
        poly = tirx.const(coeffs[-1], f32)
        for c in reversed(coeffs[1:-1]):
            poly = tirx.const(c, f32) + t * poly
        return -a * a + tirx.const(coeffs[0], f32) + t * poly
    exponent = te.compute(x.shape, parts, name="gelu_exponent")
    e = topi.fast_exp(exponent)

    def gelu(*i):
        xi = x(*i)
        a = tirx.abs(xi * tirx.const(0.7071067811865476, f32))
        tail = tirx.const(1.0, f32) / (tirx.const(1.0, f32) + tirx.const(0.5, f32) * a) * e(*i)   # erfc(|w|)
        erfc = tirx.Select(xi <= tirx.const(0.0, f32), tail, tirx.const(2.0, f32) - tail)
        return tirx.const(0.5, f32) * xi * erfc
    return te.compute(x.shape, gelu, name="gelu")


for _name in ops_in(Group.FLOAT_UNARY):
    converter(_name)(_float_unary(_name))


@converter("clip")
def _clip(bb, node, args, ctx):
    # np.clip is minimum(maximum(x, a_min), a_max): written with selects so that NaN stays NaN (TVM's
    # max/min may drop a NaN operand) and a_min > a_max gives a_max everywhere, like numpy.
    x = args[0]
    dt = dtype_of(x)
    lo, hi = node.attrs.bounds(dt)          # the bounds the numpy kernel clips to
    y = cast(x, "int8") if dt == "bool" else x
    cdt = dtype_of(y)
    if lo is not None:
        lo = const(lo, cdt)
        y = R.where(R.less(y, lo), lo, y)
    if hi is not None:
        hi = const(hi, cdt)
        y = R.where(R.greater(y, hi), hi, y)
    return [cast(y, dt)]


@converter("neg")
def _neg(bb, node, args, ctx):
    x = args[0]
    if dtype_of(x) == "bool":        # numpy raises; compiled code gives logical_not
        return [R.logical_not(x)]
    if np.dtype(dtype_of(x)).kind == "u":
        # numpy wraps. TVM's negative builds a -1 of the uint dtype (an InternalError), and its simplifier
        # folds uint32/uint64 `0 - x` to 0: negate in int64 and keep the low bits
        return [R.astype(R.negative(R.astype(x, I64)), dtype_of(x))]
    return [R.negative(x)]


@converter("abs")
def _abs(bb, node, args, ctx):
    x = args[0]
    if dtype_of(x) == "bool" or np.dtype(dtype_of(x)).kind == "u":
        return [x]
    return [R.abs(x)]


@converter("relu")
def _relu(bb, node, args, ctx):
    # np.maximum(x, 0): NaN propagates. TVM's max(x, 0) drops a NaN first operand, so use
    # x < 0 ? 0 : x (NaN < 0 is false -> NaN; -0.0 stays -0.0 like numpy).
    x = args[0]
    dt = dtype_of(x)
    if dt == "bool" or np.dtype(dt).kind == "u":
        return [x]
    # one TE compute with the zero inline: R.where(R.less(x, 0), 0, x) passed the zero as a 0-d tensor and
    # a bool cast to int64 per element; fused after a convolution's register tile it cost 4x the convolution
    if ctx.device_checks:
        return [R.where(R.less(x, const(0, dt)), const(0, dt), x)]
    from tvm import te
    zero = tirx.const(0, dt)
    return [bb.emit_te(lambda t: te.compute(t.shape, lambda *i: tirx.Select(t(*i) < zero, zero, t(*i)), name="relu"),
                       emit(bb, x), primfunc_name_hint="dt_relu")]


@converter("floor", "ceil", "round")     # TVM rounds half to even like np.round (checked)
def _float_only(bb, node, args, ctx):
    x = args[0]
    return [getattr(R, node.op)(x) if is_float(dtype_of(x)) else x]    # identity on ints/bools (numpy)


@converter("sign")
def _sign(bb, node, args, ctx):
    x = args[0]
    dt = dtype_of(x)
    if dt == "bool":               # numpy raises; compiled code gives x
        return [x]
    if is_float(dt):          # TVM's sign(nan) is 0; numpy's is nan
        return [R.where(R.isnan(x), x, R.sign(x))]
    if np.dtype(dt).kind == "u":        # 0 or 1; TVM's sign builds a -1 of the uint dtype
        return [cast(R.greater(x, const(0, dt)), dt)]
    return [R.sign(x)]


@converter("logical_not")
def _logical_not(bb, node, args, ctx):
    return [R.logical_not(cast(args[0], "bool"))]


@converter("isnan")
def _isnan(bb, node, args, ctx):
    x = args[0]
    if is_float(dtype_of(x)):
        return [R.isnan(x)]
    return [R.full_like(x, const(False, "bool"), "bool")]


@converter("cast")
def _cast_op(bb, node, args, ctx):
    x, dt = args[0], np.dtype(node.attrs.dtype)
    if is_float(dtype_of(x)) and dt.kind in "iu" and (dt.itemsize < 4 or dt.kind == "u"):
        # numpy (C casts as gcc emits them on x86) truncates to a 32/64-bit int and keeps the low
        # bits, e.g. uint8(-2.5) = 254; LLVM's direct fptoui/fptosi would give poison.
        if dt.name == "uint64":
            neg = R.astype(R.astype(x, I64), "uint64")
            return [R.where(R.less(x, const(0, dtype_of(x))), neg, R.astype(x, "uint64"))]
        via = "int32" if dt.itemsize < 4 else I64
        return [R.astype(R.astype(x, via), dt.name)]
    return [cast(x, dt.name)]


# ------------------------------------------------------------------------------------ binary
def _binary_prep(bb, node, args, ctx, dtype):
    a, b = (cast(x, dtype) for x in args)
    a, b = (emit(bb, x) for x in (a, b))
    return unify_broadcast(bb, ctx, [a, b], [v.type for v in node.inputs])


def _int_power(bb, ctx, a, b):
    """numpy integer power (see `int_power_primfunc`), on the flattened broadcast operands."""
    dt = dtype_of(a)
    shape = shape_of(bb.normalize(R.add(a, b)))
    gv = primfunc_once(bb, f"dt_int_power_{dt}", lambda: int_power_primfunc(dt))
    size = ctx.analyzer.simplify(prod(shape))
    known = constant_of(bb, b)
    flat = []
    for x in (a, b):
        if not (len(shape_of(x)) == len(shape) and all(ctx.relax_equal(d, e) for d, e in zip(shape_of(x), shape))):
            x = R.broadcast_to(x, shape)
        flat.append(emit(bb, R.reshape(x, [size])))
    if np.dtype(dt).kind == "i" and (known is None or (known < 0).any()):
        # numpy raises on a negative exponent (of the broadcast result: none if it is empty)
        flat[1] = emit(bb, checked(bb, ctx, f"dt_check_nonnegative_{dt}", lambda: nonnegative_primfunc(dt),
                                   flat[1], tirx.IntImm("int64", 0), dt, "nonnegative"))
    t = relax.TensorType([size], dt)
    r = emit(bb, R.call_tir(gv, flat, [t, t, t]))
    return R.reshape(emit(bb, relax.TupleGetItem(r, 0)), shape)


def _fmod(a, b, dt):
    """np.fmod, C's remainder (the sign of a; R.mod: truncmod, LLVM frem for floats). An integer remainder by 0
    is 0 as numpy gives it, and by -1 too (INT_MIN % -1 traps in C): the divisor is replaced by 1 there."""
    if not is_int(dt):
        return R.mod(a, b)
    zero = const(0, dt)
    bad = R.equal(b, zero)
    if np.dtype(dt).kind == "i":
        bad = R.logical_or(bad, R.equal(b, const(-1, dt)))
    return R.where(bad, zero, R.mod(a, R.where(bad, const(1, dt), b)))


def _floor_div_mod(name, a, b, dt):
    """np.floor_divide / np.mod (Python's // and %: the quotient rounded down, the remainder with the divisor's
    sign). Integers: by 0 both give 0 as numpy does; by -1 the quotient is -a (INT_MIN // -1
    wraps to INT_MIN as in numpy, computed without signed overflow), the remainder 0. Floats follow numpy's npy_divmod step by
    step (floor(a / b) differs: 1 // 0.1 is 9.0, not 10.0); float16 computes in float32 as numpy does."""
    if is_int(dt):
        zero, signed = const(0, dt), np.dtype(dt).kind == "i"
        bad = R.equal(b, zero)
        if signed:
            bad = R.logical_or(bad, R.equal(b, const(-1, dt)))
        safe_b = R.where(bad, const(1, dt), b)
        if name == "mod":
            return R.where(bad, zero, R.floor_mod(a, safe_b))
        q = R.where(R.equal(b, zero), zero, R.floor_divide(a, safe_b))
        if not signed:
            return q
        # -a without signed overflow: INT_MIN stays INT_MIN (numpy wraps). Not as unsigned 0 - a cast back: in
        # this where() TVM 0.27 compiled that to 0 for every int32 / int64 a (x // -1 was 0)
        lowest = const(np.iinfo(dt).min, dt)
        is_min = R.equal(a, lowest)
        neg_a = R.where(is_min, lowest, R.subtract(zero, R.where(is_min, zero, a)))
        return R.where(R.equal(b, const(-1, dt)), neg_a, q)
    if dt == "float16":
        return R.astype(_floor_div_mod(name, R.astype(a, "float32"), R.astype(b, "float32"), "float32"), dt)
    zero = const(0, dt)
    fmod = R.mod(a, b)                                   # C's fmod (LLVM frem)
    flip = R.logical_and(R.not_equal(fmod, zero), R.logical_xor(R.less(b, zero), R.less(fmod, zero)))
    b_zero = R.equal(b, zero)
    if name == "mod":                                     # by 0: fmod's NaN
        signed_zero = R.where(R.less(b, zero), const(-0.0, dt), zero)
        mod = R.where(flip, R.add(fmod, b), R.where(R.equal(fmod, zero), signed_zero, fmod))
        return R.where(b_zero, fmod, mod)
    div = R.subtract(R.divide(R.subtract(a, fmod), b), R.where(flip, const(1, dt), zero))
    floor = R.floor(div)
    rounded = R.where(R.greater(R.subtract(div, floor), const(0.5, dt)), R.add(floor, const(1, dt)), floor)
    quotient = R.divide(a, b)
    # numpy: copysign(0, a / b), and a / b may be -0.0 (0 // -1): its sign read as 1 / (a / b) < 0 (-inf)
    zero_div = R.where(R.less(R.divide(const(1, dt), quotient), zero), const(-0.0, dt), zero)
    return R.where(b_zero, quotient, R.where(R.equal(div, zero), zero_div, rounded))


def _arith(name):
    rel = getattr(R, "mod" if name == "fmod" else name, None)
    dtype_rule = get_op(name).result_dtype

    def conv(bb, node, args, ctx):
        dt = dtype_rule([dtype_of(x) for x in args], node.attrs)
        if dt == "bool":
            return [_bool_arith(bb, node, args, ctx, name)]
        k = _small_int_exponent(bb, args) if name == "power" and is_float(dt) else None
        a, b = _binary_prep(bb, node, args, ctx, dt)
        if name == "power" and is_int(dt):
            return [_int_power(bb, ctx, a, b)]
        if k is not None:
            return [_power_by_multiplying(a, k, dt)]
        if name == "fmod":
            return [_fmod(a, b, dt)]
        if name in ("floor_divide", "mod"):
            return [_floor_div_mod(name, a, b, dt)]
        if name in ("maximum", "minimum") and is_float(dt):
            clamp = _clamp_by_constant(bb, ctx, name, a, b)
            if clamp is not None:
                return [clamp]
            # np.maximum/minimum propagate NaN from either side; TVM's max/min do not.
            either_nan = R.logical_or(R.isnan(a), R.isnan(b))
            return [R.where(either_nan, R.add(a, b), rel(a, b))]
        return [rel(a, b)]
    return conv


def _clamp_by_constant(bb, ctx, name: str, a, b):
    """max / min of `a` and a constant non-NaN scalar `b` (either order) as one TE compute with the constant
    inline and NaN from `a` kept (numpy's rule), or None for other operands. The general form (isnan of both,
    logical_or, where) passed the constant as 0-d tensors: hardswish's clamps after a convolution's register
    tile ran at a third of the convolution's speed."""
    if ctx.device_checks:
        return None
    for x, c in ((a, b), (b, a)):
        k = constant_of(bb, c)
        if k is not None and k.size == 1 and ndim_of(c) <= ndim_of(x) and not np.isnan(k).any():
            break
    else:
        return None
    from tvm import te
    dt = dtype_of(x)
    value = tirx.const(float(k.reshape(())), dt)
    pick = tirx.max if name == "maximum" else tirx.min

    def clamp(t):
        return te.compute(t.shape, lambda *i: tirx.Select(tirx.isnan(t(*i)), t(*i), pick(t(*i), value)), name=name)
    return bb.emit_te(clamp, x, primfunc_name_hint=f"dt_{name}")


#: float ``x ** k`` for these constant exponents is computed by multiplying (`_power_by_multiplying`)
MULTIPLIED_EXPONENTS = (0, 1, 2, 3, 4)


def _small_int_exponent(bb, args):
    """k where the exponent is a constant k of `MULTIPLIED_EXPONENTS` (every element of a constant the base's
    shape absorbs: size 1, rank no higher), else None."""
    k = constant_of(bb, args[1])
    if k is None or k.size != 1 or k.ndim > ndim_of(args[0]) or not np.isfinite(k).all():
        return None
    k = float(k.reshape(()))
    return int(k) if k in MULTIPLIED_EXPONENTS else None


def _power_by_multiplying(a, k: int, dt: str):
    """``a ** k`` as k - 1 multiplications (a call of libm's pow per element was the slowest part of GPT-2's
    GELU: 15% of its time). Narrow floats multiply in float64 and round once, which is as close to the exact
    power as pow itself (both within an ulp; they differ in the last bit for ~0.05% of float32 values); float64
    multiplies in float64 (within ~1.6 ulp of pow); x ** 0 is 1 for every x, NaN included, as in numpy."""
    if k == 0:
        return R.ones_like(a)
    wide = dt != "float64"
    x = R.astype(a, "float64") if wide else a
    out = x
    for _ in range(k - 1):
        out = R.multiply(out, x)
    return R.astype(out, dt) if wide else out


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


for _name in ops_in(Group.ARITH):
    converter(_name)(_arith(_name))


def _compare(name):
    rel = getattr(R, name)

    def conv(bb, node, args, ctx):
        dt = common_dtype(*args)
        if dt == "bool":       # TVM cannot compare i1 values: compare as int8 (False < True)
            dt = "int8"
        a, b = _binary_prep(bb, node, args, ctx, dt)
        if name == "not_equal" and is_float(dt):
            # TVM emits an ordered != (false for NaN) and simplifies !(a == b) back to it; numpy's
            # != is true when either side is NaN.
            return [R.logical_or(R.not_equal(a, b), R.logical_or(R.isnan(a), R.isnan(b)))]
        return [rel(a, b)]
    return conv


for _name in ops_in(Group.COMPARE):
    converter(_name)(_compare(_name))


@converter(*ops_in(Group.LOGICAL))
def _logical(bb, node, args, ctx):
    a, b = _binary_prep(bb, node, args, ctx, "bool")
    return [getattr(R, node.op)(a, b)]


@converter("where")
def _where(bb, node, args, ctx):
    dt = out_type(node).dtype
    c = emit(bb, cast(args[0], "bool"))
    x, y = (emit(bb, cast(v, dt)) for v in args[1:])
    c, x, y = unify_broadcast(bb, ctx, [c, x, y], [v.type for v in node.inputs])
    return [R.where(c, x, y)]
