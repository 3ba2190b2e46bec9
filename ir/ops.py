"""The op registry: one `OpDef` per op holding every per-op fact, and the op groups.

An `OpDef` says what an op *is*: its attrs class, type rule, kind, arity, group, result-dtype rule,
which attrs hold symbolic dims, and how the frontend exposes it (the `F` function name, a Tensor
method or operator). Every stage reads these facts from here; each stage then defines the one thing
it adds per op with its own decorator: `runtime.kernels.kernel` (numpy, the reference semantics) and
`codegen.converters.converter` (Relax). Families of ops (`Group`) are listed once, in `GROUPS`, and
every stage loops over `ops_in(group)`.

Type rules take the input `TensorType`s and the node's attrs and return the output types; they raise
`ShapeError` with a plain message, which the frontend turns into a `TraceError` naming the API and the
user's source line. How to add an op: docs/contributing.md, "Adding an op".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

import numpy as np

from .attrs import (check_fill, ArangeAttrs, ArgReduceAttrs, AxesAttrs, AxisAttrs, CaseAttrs, ClipAttrs, CondAttrs,
                    ConstantAttrs, DtypeAttrs, ForeachAttrs, FullAttrs, FullLikeAttrs, LayerNormAttrs, NoAttrs,
                    PadAttrs, ReduceAttrs, RegionAttrs, ShapeAttrs, SliceAttrs, SplitAttrs, TileAttrs, TopkAttrs,
                    TransposeAttrs, WhileAttrs)
from .dims import parse_dim
from .dim_checks import equate_dims
from .lift import lift_all_axis, lift_axis, lift_elementwise, lift_matmul, lift_reduce, lift_reshape, lift_transpose
from .dtypes import arith_dtype, float_dtype, reduce_dtype
from .shapes import (ShapeError, arange_length, broadcast_shapes, infer_reshape, norm_axis, reduce_shape, slice_length,
                     unify_dims)
from .types import (Dim, TensorType, dim_add, dim_floordiv, dim_max, dim_mul, dim_sub, dim_symbols, dims_equal,
                    fresh_dim)


class OpKind(Enum):
    STATIC = "static"                  # output shapes follow from input shapes: compiled in regions
    DYNAMIC_SHAPE = "dynamic_shape"    # output shapes depend on input values: run by the executor
    CONTROL_FLOW = "control_flow"      # owns subgraphs; the executor drives them
    REGION = "region"                  # a compiled static region (made by the partitioner)


STATIC, DYNAMIC_SHAPE, CONTROL_FLOW, REGION = OpKind.STATIC, OpKind.DYNAMIC_SHAPE, OpKind.CONTROL_FLOW, OpKind.REGION


class Group(Enum):
    """Op families whose members share a type rule, a kernel shape and a converter shape."""
    FLOAT_UNARY = "float_unary"    # float result; integer and bool inputs compute in float32
    UNARY = "unary"                # elementwise, same dtype
    PREDICATE = "predicate"        # elementwise, bool result
    ARITH = "arith"                # binary, numpy broadcasting and dtype promotion
    COMPARE = "compare"            # binary, bool result
    LOGICAL = "logical"            # binary on bools
    REDUCE = "reduce"              # over `axis`, numpy's accumulation dtypes
    ARG_REDUCE = "arg_reduce"      # index of the extreme along one axis, int64


#: The one list of every group's members.
GROUPS: dict[Group, tuple] = {
    Group.FLOAT_UNARY: ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "erf", "sin", "cos", "tan"),
    Group.UNARY: ("neg", "abs", "relu", "floor", "ceil", "round", "sign"),
    Group.PREDICATE: ("logical_not", "isnan"),
    Group.ARITH: ("add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "fmod", "floor_divide",
                  "mod"),
    Group.COMPARE: ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"),
    Group.LOGICAL: ("logical_and", "logical_or"),
    Group.REDUCE: ("sum", "mean", "max", "min", "prod"),
    Group.ARG_REDUCE: ("argmax", "argmin"),
}


#: arithmetic whose numpy kernel raises on some integer operands (a zero divisor, a negative power): such an op
#: may not run on values a branch was chosen to avoid (`frontend/torch_cond.py`)
RAISE_ON_INTEGERS = frozenset({"floor_divide", "mod", "fmod", "power"})

#: arithmetic whose second operand divides (`partition/cond_select.py` selects no branch dividing by a computed
#: value)
DIVIDING = frozenset({"divide", "floor_divide", "mod", "fmod"})


def ops_in(group: Group) -> tuple:
    return GROUPS[group]


@dataclass(frozen=True)
class OpDef:
    """Every fact about one op that more than one stage needs.

    Attributes:
        name: the op's name in graphs.
        attrs: its frozen attrs dataclass.
        infer_type: type rule ``(input types, attrs) -> output types``.
        kind: an `OpKind`.
        num_inputs: the arity, or None for variadic.
        group: the `Group` it belongs to, if any.
        result_dtype: ``(input dtypes, attrs) -> dtype`` of output 0 where it is not simply the input's
            (float ops on ints, numpy's reduction accumulators); kernels and converters compute in it.
        dim_attrs: names of attrs fields that may hold symbolic dims (evaluated against the symbol values
            of the running graph, see `attr_symbols`).
        api: name of the `F` function generated for it (``F.<api>(*tensors, *attr fields)``), or None
            when the frontend writes its function by hand or the op is internal.
        promote_scalars: positions of tensor arguments where a Python scalar takes the dtype of the tensor
            argument next to it (numpy's rule for Python scalars).
        method: also a `Tensor` method (``x.sum(axis=0)``).
        operator: Python operator it implements (``"add"`` -> ``__add__``), reflected too if `reflected`.
        doc: docstring of the generated `F` function.
        shape_only: the op reads only its inputs' shapes and dtypes, not their values (on a GPU the
            executor then copies nothing to the host for it).
        lift: how the op runs over a whole sequence at once (loop hoisting); see `ir.lift`.
    """
    name: str
    attrs: type
    infer_type: Callable[[list, Any], list]
    kind: OpKind = OpKind.STATIC
    num_inputs: int | None = None
    group: Group | None = None
    result_dtype: Callable | None = None
    dim_attrs: tuple = ()
    api: str | None = None
    promote_scalars: tuple = ()
    method: bool = False
    operator: str | None = None
    reflected: bool = False
    doc: str = ""
    shape_only: bool = False
    lift: Callable | None = None

    def map_dim_attrs(self, attrs, fn):
        """`attrs` with `fn` applied to every symbolic (string) dim of its `dim_attrs` fields."""
        def f(v):
            return fn(v) if isinstance(v, str) else v
        return dataclasses.replace(attrs, **{
            k: tuple(map(f, getattr(attrs, k))) if isinstance(getattr(attrs, k), tuple) else f(getattr(attrs, k))
            for k in self.dim_attrs})


_OPS: dict[str, OpDef] = {}


def register(name, attrs, infer_type, kind=OpKind.STATIC, **facts) -> OpDef:
    if name in _OPS:
        raise ValueError(f"op {name!r} registered twice")
    _OPS[name] = OpDef(name, attrs, infer_type, kind, **facts)
    return _OPS[name]


def get_op(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


def all_ops() -> dict[str, OpDef]:
    return dict(_OPS)


def attr_dims(op: str, attrs) -> list:
    """The symbolic (string) dims the attrs of an `op` node hold."""
    out = []
    for name in get_op(op).dim_attrs:
        v = getattr(attrs, name)
        out.extend(d for d in (v if isinstance(v, tuple) else (v,)) if isinstance(d, str))
    return out


def attr_symbols(op: str, attrs, atoms=frozenset()) -> set:
    """Symbol names the attrs of an `op` node refer to, but for those inside sub-expressions in `atoms`
    (expression dims of values at hand, whose sizes are known as a whole: see `DimExpr.evaluate`)."""
    return set().union(*(parse_dim(d).free_symbols(atoms) for d in attr_dims(op, attrs)))


# ------------------------------------------------------------------------------ group rules
def _elementwise(ts, a, dtype_rule):
    return [TensorType(ts[0].shape, dtype_rule([t.dtype for t in ts], a))]


_GROUP_DOCS = {
    Group.FLOAT_UNARY: "Elementwise `{fn}` (numpy semantics); integer inputs compute in float32.",
    Group.UNARY: "Elementwise `{fn}` (numpy semantics).",
    Group.PREDICATE: "Elementwise `{fn}`, a bool result.",
    Group.ARITH: "Elementwise `{fn}` with numpy broadcasting and dtype promotion.",
    Group.COMPARE: "Elementwise `{fn}` with numpy broadcasting; a bool result.",
    Group.LOGICAL: "Elementwise `{fn}` of bool tensors with numpy broadcasting.",
    Group.REDUCE: "`{fn}(x, axis, keepdims)` (numpy's accumulation dtypes).",
    Group.ARG_REDUCE: "`{fn}(x, axis, keepdims)` as int64 (first occurrence; NaN counts as the extreme).",
}
_NUMPY_NAMES = {"neg": "np.negative", "relu": "np.maximum(x, 0)", "rsqrt": "1 / np.sqrt(x)",
                "sigmoid": "1 / (1 + np.exp(-x))", "gelu": "0.5 * x * (1 + erf(x / sqrt(2)))", "erf": "math.erf",
                "divide": "np.true_divide"}
_OPERATORS = {"add": ("add", True), "subtract": ("sub", True), "multiply": ("mul", True),
              "divide": ("truediv", True), "power": ("pow", True),
              "floor_divide": ("floordiv", True), "mod": ("mod", True), "equal": ("eq", False),
              "not_equal": ("ne", False), "less": ("lt", False), "less_equal": ("le", False),
              "greater": ("gt", False), "greater_equal": ("ge", False), "neg": ("neg", False),
              "abs": ("abs", False), "logical_and": ("and", True), "logical_or": ("or", True),
              "logical_not": ("invert", False)}


def _binary_rule(dtype_rule):
    def rule(ts, a):
        return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), dtype_rule([t.dtype for t in ts], a))]
    return rule


def _reduce_rule(dtype_rule):
    def rule(ts, a):
        shape = tuple(d for d in reduce_shape(ts[0], a.axis, a.keepdims) if d is not None)
        return [TensorType(shape, dtype_rule([ts[0].dtype], a))]
    return rule


def _argreduce(ts, a):
    t = ts[0]
    if a.axis is None:
        shape = (1,) * t.ndim if a.keepdims else ()
    else:
        shape = tuple(d for d in reduce_shape(t, (a.axis,), a.keepdims) if d is not None)
    return [TensorType(shape, "int64")]


def _register_group(group, attrs, arity, make_rule, dtype_of):
    for name in ops_in(group):
        op, refl = _OPERATORS.get(name, (None, False))
        dtype_rule = dtype_of(name)
        register(name, attrs, make_rule(dtype_rule), num_inputs=arity, group=group, result_dtype=dtype_rule,
                 lift=None if name in _NO_LIFT else _GROUP_LIFT.get(group), api=name,
                 promote_scalars=(0, 1) if arity == 2 else (), operator=op, reflected=refl,
                 method=group in (Group.REDUCE, Group.ARG_REDUCE),
                 doc=_GROUP_DOCS[group].format(fn=_NUMPY_NAMES.get(name, f"np.{name}")))


_NO_LIFT = frozenset({"max", "min", "power"})   # may raise: an empty axis, integer power of a negative exponent
_GROUP_LIFT = {g: lift_elementwise for g in GROUPS if g not in (Group.REDUCE, Group.ARG_REDUCE)} | {
    Group.REDUCE: lift_reduce}
_unary_rule = lambda dtype_rule: lambda ts, a: _elementwise(ts, a, dtype_rule)   # noqa: E731
_register_group(Group.FLOAT_UNARY, NoAttrs, 1, _unary_rule, lambda n: float_dtype)
_register_group(Group.UNARY, NoAttrs, 1, _unary_rule, lambda n: lambda dts, a=None: dts[0])
_register_group(Group.PREDICATE, NoAttrs, 1, _unary_rule, lambda n: lambda dts, a=None: "bool")
_register_group(Group.ARITH, NoAttrs, 2, _binary_rule, arith_dtype)
_register_group(Group.COMPARE, NoAttrs, 2, _binary_rule, lambda n: lambda dts, a=None: "bool")
_register_group(Group.LOGICAL, NoAttrs, 2, _binary_rule, lambda n: lambda dts, a=None: "bool")
_register_group(Group.REDUCE, ReduceAttrs, 1, _reduce_rule, reduce_dtype)
_register_group(Group.ARG_REDUCE, ArgReduceAttrs, 1, lambda r: _argreduce, lambda n: lambda dts, a=None: "int64")


# ------------------------------------------------------------------------------ single ops
def _clip(ts, a):
    if a.a_min is None and a.a_max is None:
        raise ShapeError("clip needs a_min or a_max (or both)")
    return [ts[0]]


register("clip", ClipAttrs, _clip, num_inputs=1, api="clip", method=True, lift=lift_elementwise,
         doc="`np.clip(x, a_min, a_max)` with scalar bounds (None: open on that side; NaN refused). The result "
             "keeps x's dtype: on integer x the bounds round inward and saturate to the dtype's range. NaN in x "
             "stays NaN; a_min > a_max gives a_max everywhere, like numpy.")


def _where(ts, a):
    if ts[0].dtype != "bool":
        raise ShapeError(f"condition must be bool, got {ts[0].dtype}")
    shape = broadcast_shapes(ts[0].shape, ts[1].shape, ts[2].shape)
    return [TensorType(shape, np.result_type(ts[1].dtype, ts[2].dtype).name)]


register("where", NoAttrs, _where, num_inputs=3, api="where", promote_scalars=(1, 2), lift=lift_elementwise,
         doc="`np.where(cond, x, y)`; `cond` must be bool.")


register("constant", ConstantAttrs, lambda ts, a: [TensorType(a.value.shape, a.value.dtype.name)], num_inputs=0)


def _matmul(ts, a):
    x, y = ts
    if x.ndim == 0 or y.ndim == 0:
        raise ShapeError("matmul does not take 0-d tensors")
    xs = x.shape if x.ndim > 1 else (1,) + x.shape
    ys = y.shape if y.ndim > 1 else y.shape + (1,)
    k1, k2 = xs[-1], ys[-2]
    same = dims_equal(k1, k2)           # canonical forms: provably equal, provably different, or undecided (None)
    if same is False:
        raise ShapeError(f"matmul contraction dims differ: {x} @ {y}")
    if same is None and isinstance(k1, str) and isinstance(k2, str):
        equate_dims(k1, k2, "matmul contraction")       # unified, checked at run time (or refused)
    batch = broadcast_shapes(xs[:-2], ys[:-2])
    out = batch + (xs[-2] if x.ndim > 1 else None, ys[-1] if y.ndim > 1 else None)
    return [TensorType(tuple(d for d in out if d is not None), np.result_type(x.dtype, y.dtype).name)]


register("matmul", NoAttrs, _matmul, num_inputs=2, api="matmul", promote_scalars=(0, 1), operator="matmul",
         reflected=True, lift=lift_matmul, doc="`np.matmul`: batched and broadcasting.")


def _reshape(ts, a):
    shape = infer_reshape(ts[0].shape, a.shape)
    if all(isinstance(d, int) for d in shape + ts[0].shape) and \
            int(np.prod(shape, dtype=np.int64)) != int(np.prod(ts[0].shape, dtype=np.int64)):
        raise ShapeError(f"cannot reshape {ts[0]} to {a.shape}")
    return [TensorType(shape, ts[0].dtype)]


register("reshape", ShapeAttrs, _reshape, num_inputs=1, dim_attrs=("shape",), lift=lift_reshape)


def _transpose(ts, a):
    t = ts[0]
    axes = tuple(reversed(range(t.ndim))) if a.axes is None else tuple(norm_axis(x, t.ndim) for x in a.axes)
    if sorted(axes) != list(range(t.ndim)):
        raise ShapeError(f"transpose axes {a.axes} are not a permutation of {t.ndim} axes")
    return [TensorType(tuple(t.shape[i] for i in axes), t.dtype)]


register("transpose", TransposeAttrs, _transpose, num_inputs=1, api="transpose", lift=lift_transpose,
         doc="`np.transpose`.")


def _expand_dims(ts, a):
    t = ts[0]
    ax = norm_axis(a.axis, t.ndim + 1)
    return [TensorType(t.shape[:ax] + (1,) + t.shape[ax:], t.dtype)]


register("expand_dims", AxisAttrs, _expand_dims, num_inputs=1, api="expand_dims", lift=lift_axis,
         doc="`np.expand_dims` with one axis.")


def _squeeze(ts, a):
    t = ts[0]
    if a.axis is None:
        if not t.is_static:
            raise ShapeError(f"squeeze without an axis is ambiguous for {t} (a symbolic dim may be 1 at "
                             "run time); pass axis=")
        axes = {i for i, d in enumerate(t.shape) if d == 1}
    else:
        axes = {norm_axis(x, t.ndim) for x in a.axis}
        for x in axes:           # a symbolic dim is checked when the kernel runs
            if isinstance(t.shape[x], int) and t.shape[x] != 1:
                raise ShapeError(f"cannot squeeze axis {x} of size {t.shape[x]} (must be 1)")
    return [TensorType(tuple(d for i, d in enumerate(t.shape) if i not in axes), t.dtype)]


register("squeeze", AxesAttrs, _squeeze, num_inputs=1, api="squeeze", doc="`np.squeeze`.")


def _concat(ts, a):
    if not ts:
        raise ShapeError("concat needs at least one tensor")
    nd = ts[0].ndim
    if nd == 0:
        raise ShapeError("cannot concat 0-d tensors")
    ax = norm_axis(a.axis, nd)
    dt = np.result_type(*[t.dtype for t in ts]).name
    out = list(ts[0].shape)
    total: Dim = 0
    for t in ts:
        if t.ndim != nd:
            raise ShapeError(f"concat inputs must have the same rank, got {[str(t) for t in ts]}")
        for i in range(nd):
            if i != ax:
                out[i] = unify_dims(out[i], t.shape[i], "concat")
        total = dim_add(total, t.shape[ax])
    out[ax] = total
    return [TensorType(tuple(out), dt)]


register("concat", AxisAttrs, _concat, lift=lift_all_axis)


def _stack(ts, a):
    if not ts:
        raise ShapeError("stack needs at least one tensor")
    nd = ts[0].ndim
    shape = list(ts[0].shape)
    for t in ts[1:]:
        if t.ndim != nd:
            raise ShapeError(f"stack inputs must have the same rank, got {[str(t) for t in ts]}")
        shape = [unify_dims(x, y, "stack") for x, y in zip(shape, t.shape)]
    ax = norm_axis(a.axis, nd + 1)
    shape.insert(ax, len(ts))
    return [TensorType(tuple(shape), np.result_type(*[t.dtype for t in ts]).name)]


register("stack", AxisAttrs, _stack)


def _split(ts, a):
    t = ts[0]
    ax = norm_axis(a.axis, t.ndim)
    d = t.shape[ax]
    if isinstance(a.sections, int):
        if a.sections <= 0 or isinstance(d, int) and d % a.sections:
            raise ShapeError(f"cannot split axis of size {d} into {a.sections} equal parts")
        sizes = [dim_floordiv(d, a.sections)] * a.sections
    else:                        # np.split slices between consecutive indices: x[lo:hi]
        bounds = [None, *a.sections, None]
        sizes = [slice_length(d, lo, hi, 1) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return [TensorType(t.shape[:ax] + (s,) + t.shape[ax + 1:], t.dtype) for s in sizes]


register("split", SplitAttrs, _split, num_inputs=1, lift=lift_axis)


def _slice(ts, a):
    t = ts[0]
    shape = list(t.shape)
    if len({norm_axis(ax, t.ndim) for ax in a.axes}) != len(a.axes):
        raise ShapeError(f"slice axes {a.axes} repeat an axis")
    for ax, s0, s1, st in zip(a.axes, a.starts, a.stops, a.steps):
        ax = norm_axis(ax, t.ndim)
        if st == 0:
            raise ShapeError("slice step cannot be zero")
        shape[ax] = slice_length(t.shape[ax], s0, s1, st)
    return [TensorType(tuple(shape), t.dtype)]


register("slice", SliceAttrs, _slice, num_inputs=1)


def _take(ts, a):
    data, idx = ts
    if not np.issubdtype(np.dtype(idx.dtype), np.integer):
        raise ShapeError(f"indices must be integers, got {idx.dtype}")
    ax = norm_axis(a.axis, data.ndim)
    return [TensorType(data.shape[:ax] + idx.shape + data.shape[ax + 1:], data.dtype)]


register("take", AxisAttrs, _take, num_inputs=2, api="take",
         doc="`np.take(x, indices, axis)`; indices must be in range.")


def _broadcast_to(ts, a):
    t = ts[0]
    if len(a.shape) < t.ndim:
        raise ShapeError(f"cannot broadcast {t} to fewer dims {a.shape}")
    out = broadcast_shapes(t.shape, a.shape)
    if tuple(out) != tuple(a.shape) and all(isinstance(d, int) for d in out + tuple(a.shape)):
        raise ShapeError(f"cannot broadcast {t} to {a.shape}")
    return [TensorType(tuple(a.shape), t.dtype)]


register("broadcast_to", ShapeAttrs, _broadcast_to, num_inputs=1, dim_attrs=("shape",))


def _tile(ts, a):
    t = ts[0]
    reps = tuple(a.reps)
    nd = max(t.ndim, len(reps))
    shape = (1,) * (nd - t.ndim) + t.shape
    reps = (1,) * (nd - len(reps)) + reps
    return [TensorType(tuple(dim_mul(d, r) for d, r in zip(shape, reps)), t.dtype)]


register("tile", TileAttrs, _tile, num_inputs=1)      # F.tile: frontend/ops.py (reps may be a tensor)


def _pad(ts, a):
    t = ts[0]
    if len(a.pad_width) != t.ndim:
        raise ShapeError(f"pad_width needs one (before, after) pair per axis ({t.ndim}), got {a.pad_width}")
    return [TensorType(tuple(dim_add(d, lo + hi) for d, (lo, hi) in zip(t.shape, a.pad_width)), t.dtype)]


register("pad", PadAttrs, _pad, num_inputs=1)
register("cast", DtypeAttrs, lambda ts, a: [TensorType(ts[0].shape, a.dtype)], num_inputs=1, api="cast",
         lift=lift_elementwise, doc="`x.astype(dtype)`.")


def _softmax(ts, a):
    norm_axis(a.axis, ts[0].ndim)
    return _elementwise(ts, a, float_dtype)


register("softmax", AxisAttrs, _softmax, num_inputs=1, result_dtype=float_dtype, lift=lift_axis)
register("log_softmax", AxisAttrs, _softmax, num_inputs=1, result_dtype=float_dtype, lift=lift_axis)


def _layer_norm(ts, a):
    x, g, b = ts
    k = g.ndim
    try:
        if k == 0 or k > x.ndim or b.ndim != k:
            raise ShapeError("ranks differ")
        for d, e, f in zip(x.shape[x.ndim - k:], g.shape, b.shape):
            unify_dims(unify_dims(d, e, "layer_norm"), f, "layer_norm")
    except ShapeError as e:
        raise ShapeError(f"gamma {g} and beta {b} must both match the trailing dims of {x}") from e
    return _elementwise([x], a, float_dtype)


register("layer_norm", LayerNormAttrs, _layer_norm, num_inputs=3, api="layer_norm", result_dtype=float_dtype,
         doc="Layer norm over the trailing `gamma.ndim` axes: `(x - mean) / sqrt(var + eps) * gamma + beta`.")
register("full", FullAttrs, lambda ts, a: [TensorType(tuple(a.shape), a.dtype)], num_inputs=0,
         dim_attrs=("shape",))
def _full_like(ts, a):
    try:
        check_fill(a.fill_value, a.dtype or ts[0].dtype)     # numpy raises for -1 into a uint8 x's dtype
    except ValueError as e:
        raise ShapeError(str(e)) from None
    return [TensorType(ts[0].shape, a.dtype or ts[0].dtype)]


register("full_like", FullLikeAttrs, _full_like, num_inputs=1)


def _arange(ts, a):
    if not (isinstance(a.start, str) or isinstance(a.stop, str)):
        return [TensorType((arange_length(a.start, a.stop, a.step, a.dtype),), a.dtype)]
    # Symbolic bounds (F.arange(x.shape[0])): integer start/step, length max(ceil((stop - start) / step), 0).
    if not all(isinstance(v, (int, str)) for v in (a.start, a.stop)) or not isinstance(a.step, int) or not a.step:
        raise ShapeError(f"arange with symbolic bounds needs integer start, stop and a nonzero integer step, got "
                         f"({a.start}, {a.stop}, {a.step})")
    span = dim_sub(a.stop, a.start) if a.step > 0 else dim_sub(a.start, a.stop)
    step = abs(a.step)
    n = span if step == 1 else dim_floordiv(dim_add(span, step - 1), step)
    return [TensorType((dim_max(n, 0),), a.dtype)]


register("arange", ArangeAttrs, _arange, num_inputs=0, dim_attrs=("start", "stop"))

# -------------------------------------------------------------------------- dynamic-shape ops


def _boolean_mask(ts, a):
    data, mask = ts
    if mask.dtype != "bool":
        raise ShapeError(f"mask must be bool, got {mask.dtype}")
    if data.ndim == 0:
        raise ShapeError("data must have at least one axis")
    ax = norm_axis(a.axis, data.ndim)
    if mask.ndim != 1:
        raise ShapeError(f"mask must be 1-d, got {mask}")
    unify_dims(data.shape[ax], mask.shape[0], "boolean_mask")
    kept = fresh_dim(origin="rows kept by boolean_mask" if ax == 0 else f"entries of axis {ax} kept by boolean_mask")
    return [TensorType(data.shape[:ax] + (kept,) + data.shape[ax + 1:], data.dtype)]


register("boolean_mask", AxisAttrs, _boolean_mask, kind=DYNAMIC_SHAPE, num_inputs=2)


def mask_gather_name(dtype: str, rank: int, axis: int) -> str:
    """The compiled helper of `boolean_mask` on a device: ``take(data, indices, axis)`` for data of this dtype
    and rank (`codegen.build.mask_gathers` builds it, the executor calls it: on a GPU only the mask crosses
    to the host, never the data)."""
    return f"dt_mask_gather_{dtype}_{rank}_{axis % rank}"
register("nonzero", NoAttrs, lambda ts, a: [TensorType((ts[0].ndim, fresh_dim(
    origin="the number of non-zero entries found by nonzero")), "int64")],
         kind=DYNAMIC_SHAPE, num_inputs=1, api="nonzero",
         doc="int64 indices of the non-zero entries, shape (x.ndim, n): `np.stack(np.nonzero(x))`.")


def _scalar_inputs(ts, what):
    for t in ts:
        if t.ndim != 0:
            raise ShapeError(f"{what} must be 0-d tensors, got {t}")


def _arange_dyn(ts, a):
    _scalar_inputs(ts, "arange bounds")
    return [TensorType((fresh_dim(origin="the length of arange"),), a.dtype)]


register("arange_dyn", DtypeAttrs, _arange_dyn, kind=DYNAMIC_SHAPE, num_inputs=3)
register("shape_of", NoAttrs, lambda ts, a: [TensorType((ts[0].ndim,), "int64")], num_inputs=1, api="shape_of",
         shape_only=True, doc="The shape of `x` as an int64 vector.")


def _topk(ts, a):
    x = ts[0]
    ax = norm_axis(a.axis, x.ndim)
    if a.k is None:
        _scalar_inputs(ts[1:], "topk's k")
        k: Dim = fresh_dim(origin="the k given to topk")
    else:
        k = a.k
        if isinstance(x.shape[ax], int) and k > x.shape[ax]:
            raise ShapeError(f"k={k} is larger than axis {ax} of size {x.shape[ax]}")
    shape = x.shape[:ax] + (k,) + x.shape[ax + 1:]
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


register("topk", TopkAttrs, _topk, num_inputs=1)
register("topk_dyn", TopkAttrs, _topk, kind=DYNAMIC_SHAPE, num_inputs=2)

# ------------------------------------------------------------------ control flow (types come
# from the traced subgraphs; these rules re-derive them for lint)


def _subgraph_rule(ts, a):
    raise ShapeError("types of control-flow and region nodes come from their subgraphs")


for _n, _a in [("cond", CondAttrs), ("case", CaseAttrs), ("foreach", ForeachAttrs), ("while_loop", WhileAttrs)]:
    register(_n, _a, _subgraph_rule, kind=CONTROL_FLOW)
register("region", RegionAttrs, _subgraph_rule, kind=REGION)
