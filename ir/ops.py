"""The op registry: one `OpDef` per op (attrs class, type rule, kind, purity).

Type rules receive input `TensorType`s and the node's attrs and return the output types. They raise
`ShapeError` (a ValueError) with a plain message; the frontend turns it into a `TraceError` that names
the API and the user's source line.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

import numpy as np

from .types import (Dim, TensorType, dim_add, dim_floordiv, dim_max, dim_min, dim_mul, dim_prod, dim_sub,
                    fresh_dim, is_unknown)

STATIC, DYNAMIC_SHAPE, CONTROL_FLOW, REGION = "static", "dynamic_shape", "control_flow", "region"


class ShapeError(ValueError):
    """An op's inputs or attrs do not fit its type rule."""


@dataclass(frozen=True)
class OpDef:
    name: str
    attrs: type
    infer_type: Callable[[list, Any], list]
    kind: str = STATIC
    pure: bool = True
    num_inputs: Any = None        # int, or None for variadic


_OPS: dict[str, OpDef] = {}


def register(name, attrs, infer_type, kind=STATIC, pure=True, num_inputs=None) -> OpDef:
    if name in _OPS:
        raise ValueError(f"op {name!r} registered twice")
    _OPS[name] = OpDef(name, attrs, infer_type, kind, pure, num_inputs)
    return _OPS[name]


def get_op(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


def all_ops() -> dict[str, OpDef]:
    return dict(_OPS)


# Attrs that may hold symbolic dims (e.g. F.reshape(x, (x.shape[0], -1))): kernels evaluate them with the
# symbol values of the running graph, so the graph must define those symbols (see `lint`).
DIM_ATTRS = {"reshape": ("shape",), "broadcast_to": ("shape",), "full": ("shape",), "arange": ("start", "stop")}


def attr_symbols(op: str, attrs) -> set:
    """Symbol names the attrs of an `op` node refer to."""
    from .types import dim_symbols
    out = set()
    for name in DIM_ATTRS.get(op, ()):
        v = getattr(attrs, name)
        for d in v if isinstance(v, tuple) else (v,):
            if isinstance(d, str):
                out |= dim_symbols(d)
    return out


# ----------------------------------------------------------------------------------------- attrs
@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True, eq=False)
class ConstantAttrs:
    value: np.ndarray


@dataclass(frozen=True)
class ReduceAttrs:
    axis: tuple | None = None
    keepdims: bool = False


@dataclass(frozen=True)
class ArgReduceAttrs:
    axis: int | None = None
    keepdims: bool = False


@dataclass(frozen=True)
class ReshapeAttrs:
    shape: tuple


@dataclass(frozen=True)
class TransposeAttrs:
    axes: tuple | None = None


@dataclass(frozen=True)
class AxisAttrs:
    axis: int = 0


@dataclass(frozen=True)
class AxesAttrs:
    axis: tuple | None = None


@dataclass(frozen=True)
class SplitAttrs:
    sections: Any            # int (equal parts) or tuple of split indices
    axis: int = 0


@dataclass(frozen=True)
class SliceAttrs:
    axes: tuple
    starts: tuple            # int or None per axis
    stops: tuple
    steps: tuple


@dataclass(frozen=True)
class ShapeAttrs:
    shape: tuple


@dataclass(frozen=True)
class TileAttrs:
    reps: tuple


@dataclass(frozen=True)
class PadAttrs:
    pad_width: tuple         # ((before, after), ...) per axis
    value: float = 0.0


@dataclass(frozen=True)
class CastAttrs:
    dtype: str


@dataclass(frozen=True)
class LayerNormAttrs:
    eps: float = 1e-5


@dataclass(frozen=True)
class FullAttrs:
    shape: tuple
    fill_value: Any
    dtype: str


@dataclass(frozen=True)
class FullLikeAttrs:
    fill_value: Any
    dtype: str | None = None


@dataclass(frozen=True)
class ArangeAttrs:
    start: Any
    stop: Any
    step: Any
    dtype: str


@dataclass(frozen=True)
class DtypeAttrs:
    dtype: str


@dataclass(frozen=True)
class UniqueAttrs:
    return_inverse: bool = False
    return_counts: bool = False


@dataclass(frozen=True)
class TopkAttrs:
    k: int | None = None      # None: k comes from the second input (dynamic)
    axis: int = -1
    largest: bool = True


@dataclass(frozen=True)
class CondAttrs:
    num_outputs: int


@dataclass(frozen=True)
class CaseAttrs:
    num_cases: int            # subgraphs: pred_0, fn_0, ..., pred_{n-1}, fn_{n-1}, default
    num_outputs: int


@dataclass(frozen=True)
class ForeachAttrs:
    num_data: int
    num_states: int
    num_outputs: int          # stacked per-step outputs


@dataclass(frozen=True)
class WhileAttrs:
    num_vars: int
    num_outputs: int
    max_iterations: int | None = None   # static bound; a tensor bound is input[num_vars]
    has_max_tensor: bool = False


def attrs_to_json(attrs) -> dict:
    return {f.name: _jsonable(getattr(attrs, f.name)) for f in fields(attrs)}


def _jsonable(v):
    if isinstance(v, tuple):
        return {"tuple": [_jsonable(x) for x in v]}
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, float) and not np.isfinite(v):
        return {"float": repr(v)}
    return v


def attrs_from_json(cls, obj: dict):
    return cls(**{k: _from_jsonable(v) for k, v in obj.items()})


def _from_jsonable(v):
    if isinstance(v, dict) and "tuple" in v:
        return tuple(_from_jsonable(x) for x in v["tuple"])
    if isinstance(v, dict) and "float" in v:
        return float(v["float"])
    if isinstance(v, list):
        return [_from_jsonable(x) for x in v]
    return v


# ------------------------------------------------------------------------------------ helpers
def norm_axis(axis: int, ndim: int, what="axis") -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"{what} {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0


def broadcast_dims(a: Dim, b: Dim) -> Dim:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"cannot broadcast dims {a} and {b}")
    # A symbol against an int: the int wins (the symbol must equal it at run time).
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    raise ShapeError(f"cannot broadcast symbolic dims {a} and {b}: they are not known to be equal")


def broadcast_shapes(*shapes) -> tuple:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        d: Dim = 1
        for s in shapes:
            j = i - (nd - len(s))
            if j >= 0:
                d = broadcast_dims(d, s[j])
        out.append(d)
    return tuple(out)


def _same(ts, a):
    return [ts[0]]


def _bool_out(ts, a):
    return [TensorType(ts[0].shape, "bool")]


def _float_out(ts, a):
    dt = ts[0].dtype if np.issubdtype(np.dtype(ts[0].dtype), np.floating) else "float32"
    return [TensorType(ts[0].shape, dt)]


UNARY_FLOAT = ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "erf", "sin", "cos"]
UNARY_SAME = ["neg", "abs", "relu", "floor", "ceil", "round", "sign"]
UNARY_BOOL = ["logical_not", "isnan"]
BINARY_ARITH = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum"]
BINARY_COMPARE = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]
BINARY_LOGICAL = ["logical_and", "logical_or"]
REDUCE = ["sum", "mean", "max", "min", "prod"]

for _n in UNARY_FLOAT:
    register(_n, NoAttrs, _float_out, num_inputs=1)
for _n in UNARY_SAME:
    register(_n, NoAttrs, _same, num_inputs=1)
for _n in UNARY_BOOL:
    register(_n, NoAttrs, _bool_out, num_inputs=1)


def _binary(result_dtype):
    def rule(ts, a):
        return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), result_dtype(ts[0].dtype, ts[1].dtype))]
    return rule


def _arith_dtype(name):
    def f(x, y):
        dt = np.result_type(np.dtype(x), np.dtype(y))
        if name == "divide" and not np.issubdtype(dt, np.floating):
            dt = np.dtype("float64")
        if name == "power" and dt == np.bool_:       # numpy has no bool power loop
            dt = np.dtype("int8")
        return dt.name
    return f


for _n in BINARY_ARITH:
    register(_n, NoAttrs, _binary(_arith_dtype(_n)), num_inputs=2)
for _n in BINARY_COMPARE + BINARY_LOGICAL:
    register(_n, NoAttrs, _binary(lambda x, y: "bool"), num_inputs=2)


def _where(ts, a):
    if ts[0].dtype != "bool":
        raise ShapeError(f"condition must be bool, got {ts[0].dtype}")
    shape = broadcast_shapes(ts[0].shape, ts[1].shape, ts[2].shape)
    return [TensorType(shape, np.result_type(ts[1].dtype, ts[2].dtype).name)]


register("where", NoAttrs, _where, num_inputs=3)


def _constant(ts, a):
    return [TensorType(a.value.shape, a.value.dtype.name)]


register("constant", ConstantAttrs, _constant, num_inputs=0)


def _matmul(ts, a):
    x, y = ts
    if x.ndim == 0 or y.ndim == 0:
        raise ShapeError("matmul does not take 0-d tensors")
    xs = x.shape if x.ndim > 1 else (1,) + x.shape
    ys = y.shape if y.ndim > 1 else y.shape + (1,)
    k1, k2 = xs[-1], ys[-2]
    if k1 != k2 and not (isinstance(k1, str) != isinstance(k2, str)):
        raise ShapeError(f"matmul contraction dims differ: {x} @ {y}")
    batch = broadcast_shapes(xs[:-2], ys[:-2])
    out = batch + (xs[-2] if x.ndim > 1 else None, ys[-1] if y.ndim > 1 else None)
    return [TensorType(tuple(d for d in out if d is not None), np.result_type(x.dtype, y.dtype).name)]


register("matmul", NoAttrs, _matmul, num_inputs=2)


def _reduce_shape(t: TensorType, axis, keepdims):
    axes = range(t.ndim) if axis is None else [norm_axis(ax, t.ndim) for ax in axis]
    axes = set(axes)
    return tuple((1 if keepdims else None) if i in axes else d for i, d in enumerate(t.shape))


def _reduce(name):
    def rule(ts, a):
        t = ts[0]
        shape = tuple(d for d in _reduce_shape(t, a.axis, a.keepdims) if d is not None)
        dt = t.dtype
        if name == "mean" and not np.issubdtype(np.dtype(dt), np.floating):
            dt = "float64"
        if name in ("sum", "prod") and (dt == "bool" or (np.issubdtype(np.dtype(dt), np.integer)
                                                          and np.dtype(dt).itemsize < 8)):
            dt = "int64" if np.dtype(dt).kind in "bi" else "uint64"
        return [TensorType(shape, dt)]
    return rule


for _n in REDUCE:
    register(_n, ReduceAttrs, _reduce(_n), num_inputs=1)


def _argreduce(ts, a):
    t = ts[0]
    if a.axis is None:
        shape = (1,) * t.ndim if a.keepdims else ()
    else:
        shape = tuple(d for d in _reduce_shape(t, (a.axis,), a.keepdims) if d is not None)
    return [TensorType(shape, "int64")]


register("argmax", ArgReduceAttrs, _argreduce, num_inputs=1)
register("argmin", ArgReduceAttrs, _argreduce, num_inputs=1)


def infer_reshape(in_shape: tuple, target: tuple) -> tuple:
    """Resolve one -1 in `target` against `in_shape`, symbolically when it must."""
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeError(f"reshape target {target} has more than one -1")
    if -1 not in target:
        return tuple(target)
    known = [d for d in target if d != -1]
    rest = list(d for d in in_shape if not isinstance(d, int))
    int_in = int(np.prod([d for d in in_shape if isinstance(d, int)], dtype=np.int64))
    int_out = int(np.prod([d for d in known if isinstance(d, int)], dtype=np.int64))
    sym_ok = True
    for d in (d for d in known if not isinstance(d, int)):
        if d in rest:
            rest.remove(d)
        else:
            sym_ok = False
    if sym_ok and int_out and int_in % int_out == 0:
        missing = dim_mul(dim_prod(rest), int_in // int_out)
    elif int_out == 0:
        raise ShapeError(f"cannot reshape {in_shape} to {target}: -1 is ambiguous with a 0 dim")
    else:
        missing = dim_floordiv(dim_prod(in_shape), dim_prod(known))
    if isinstance(missing, int) and all(isinstance(d, int) for d in in_shape) and \
            missing * int_out != int_in:
        raise ShapeError(f"cannot reshape {in_shape} to {target}")
    return tuple(missing if d == -1 else d for d in target)


def _reshape(ts, a):
    shape = infer_reshape(ts[0].shape, a.shape)
    if all(isinstance(d, int) for d in shape + ts[0].shape) and \
            int(np.prod(shape, dtype=np.int64)) != int(np.prod(ts[0].shape, dtype=np.int64)):
        raise ShapeError(f"cannot reshape {ts[0]} to {a.shape}")
    return [TensorType(shape, ts[0].dtype)]


register("reshape", ReshapeAttrs, _reshape, num_inputs=1)


def _transpose(ts, a):
    t = ts[0]
    axes = tuple(reversed(range(t.ndim))) if a.axes is None else tuple(norm_axis(x, t.ndim) for x in a.axes)
    if sorted(axes) != list(range(t.ndim)):
        raise ShapeError(f"transpose axes {a.axes} are not a permutation of {t.ndim} axes")
    return [TensorType(tuple(t.shape[i] for i in axes), t.dtype)]


register("transpose", TransposeAttrs, _transpose, num_inputs=1)


def _expand_dims(ts, a):
    t = ts[0]
    ax = norm_axis(a.axis, t.ndim + 1)
    return [TensorType(t.shape[:ax] + (1,) + t.shape[ax:], t.dtype)]


register("expand_dims", AxisAttrs, _expand_dims, num_inputs=1)


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


register("squeeze", AxesAttrs, _squeeze, num_inputs=1)


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
                out[i] = _equal_dim(out[i], t.shape[i], "concat")
        total = dim_add(total, t.shape[ax])
    out[ax] = total
    return [TensorType(tuple(out), dt)]


def _equal_dim(a, b, what):
    if a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"{what}: dims {a} and {b} differ")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    if is_unknown(a):
        return b
    if is_unknown(b):
        return a
    raise ShapeError(f"{what}: symbolic dims {a} and {b} are not known to be equal")


register("concat", AxisAttrs, _concat)


def _stack(ts, a):
    if not ts:
        raise ShapeError("stack needs at least one tensor")
    nd = ts[0].ndim
    shape = list(ts[0].shape)
    for t in ts[1:]:
        if t.ndim != nd:
            raise ShapeError(f"stack inputs must have the same rank, got {[str(t) for t in ts]}")
        shape = [_equal_dim(x, y, "stack") for x, y in zip(shape, t.shape)]
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


register("split", SplitAttrs, _split, num_inputs=1)


def slice_length(d: Dim, start, stop, step) -> Dim:
    """len(range(d)[start:stop:step]).

    Over a symbolic `d`, a length that depends on `d` is exact (`x[1:]` is ``max((N - 1), 0)``), but
    bounds that give a static length are assumed to lie inside the axis: `x[:1]` and `x[-3:]` have lengths
    1 and 3 (numpy would clamp them on a shorter axis; the reference interpreter reports that case as an
    error, since the result no longer has its type)."""
    if isinstance(d, int):
        return len(range(*slice(start, stop, step).indices(d)))
    if step < 0 and (start is not None or stop is not None):
        raise ShapeError(f"a slice with negative step {step} and bounds over symbolic dim {d} is not supported")
    start = None if start == 0 else start
    if start is None and stop is None:
        n = d
    elif stop is None:                           # x[k:], x[-k:]
        n = -start if start < 0 else dim_max(dim_sub(d, start), 0)
    elif start is None:                          # x[:k], x[:-k]
        n = stop if stop >= 0 else dim_max(dim_add(d, stop), 0)
    elif (start < 0) == (stop < 0):              # both count from the same end: d drops out
        n = max(stop - start, 0)
    else:                                        # x[k:-j], x[-k:j]: may be an empty range
        lo, hi = (start, dim_add(d, stop)) if start >= 0 else (dim_max(dim_add(d, start), 0), dim_min(stop, d))
        n = dim_max(dim_sub(hi, lo), 0)
    step = abs(step)
    return n if step == 1 else dim_floordiv(dim_add(n, step - 1), step)


def _slice(ts, a):
    t = ts[0]
    shape = list(t.shape)
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


register("take", AxisAttrs, _take, num_inputs=2)


def _broadcast_to(ts, a):
    t = ts[0]
    if len(a.shape) < t.ndim:
        raise ShapeError(f"cannot broadcast {t} to fewer dims {a.shape}")
    out = broadcast_shapes(t.shape, a.shape)
    if tuple(out) != tuple(a.shape) and all(isinstance(d, int) for d in out + tuple(a.shape)):
        raise ShapeError(f"cannot broadcast {t} to {a.shape}")
    return [TensorType(tuple(a.shape), t.dtype)]


register("broadcast_to", ShapeAttrs, _broadcast_to, num_inputs=1)


def _tile(ts, a):
    t = ts[0]
    reps = tuple(a.reps)
    nd = max(t.ndim, len(reps))
    shape = (1,) * (nd - t.ndim) + t.shape
    reps = (1,) * (nd - len(reps)) + reps
    return [TensorType(tuple(dim_mul(d, r) for d, r in zip(shape, reps)), t.dtype)]


register("tile", TileAttrs, _tile, num_inputs=1)


def _pad(ts, a):
    t = ts[0]
    if len(a.pad_width) != t.ndim:
        raise ShapeError(f"pad_width needs one (before, after) pair per axis ({t.ndim}), got {a.pad_width}")
    return [TensorType(tuple(dim_add(d, lo + hi) for d, (lo, hi) in zip(t.shape, a.pad_width)), t.dtype)]


register("pad", PadAttrs, _pad, num_inputs=1)
register("cast", CastAttrs, lambda ts, a: [TensorType(ts[0].shape, a.dtype)], num_inputs=1)


def _softmax(ts, a):
    norm_axis(a.axis, ts[0].ndim)
    return _float_out(ts, a)


register("softmax", AxisAttrs, _softmax, num_inputs=1)
register("log_softmax", AxisAttrs, _softmax, num_inputs=1)


def _layer_norm(ts, a):
    x, g, b = ts
    k = g.ndim
    try:
        if k == 0 or k > x.ndim or b.ndim != k:
            raise ShapeError("ranks differ")
        for d, e, f in zip(x.shape[x.ndim - k:], g.shape, b.shape):
            _equal_dim(_equal_dim(d, e, "layer_norm"), f, "layer_norm")
    except ShapeError:
        raise ShapeError(f"gamma {g} and beta {b} must both match the trailing dims of {x}") from None
    return _float_out([x], a)


register("layer_norm", LayerNormAttrs, _layer_norm, num_inputs=3)
register("full", FullAttrs, lambda ts, a: [TensorType(tuple(a.shape), a.dtype)], num_inputs=0)
register("full_like", FullLikeAttrs,
         lambda ts, a: [TensorType(ts[0].shape, a.dtype or ts[0].dtype)], num_inputs=1)


def _arange(ts, a):
    if not (isinstance(a.start, str) or isinstance(a.stop, str)):
        return [TensorType((len(np.arange(a.start, a.stop, a.step, dtype=a.dtype)),), a.dtype)]
    # Symbolic bounds (F.arange(x.shape[0])): integer start/step, length max(ceil((stop - start) / step), 0).
    if not all(isinstance(v, (int, str)) for v in (a.start, a.stop)) or not isinstance(a.step, int) or not a.step:
        raise ShapeError(f"arange with symbolic bounds needs integer start, stop and a nonzero integer step, got "
                         f"({a.start}, {a.stop}, {a.step})")
    span = dim_sub(a.stop, a.start) if a.step > 0 else dim_sub(a.start, a.stop)
    step = abs(a.step)
    n = span if step == 1 else dim_floordiv(dim_add(span, step - 1), step)
    return [TensorType((dim_max(n, 0),), a.dtype)]


register("arange", ArangeAttrs, _arange, num_inputs=0)

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
    _equal_dim(data.shape[ax], mask.shape[0], "boolean_mask")
    return [TensorType(data.shape[:ax] + (fresh_dim(),) + data.shape[ax + 1:], data.dtype)]


register("boolean_mask", AxisAttrs, _boolean_mask, kind=DYNAMIC_SHAPE, num_inputs=2)
register("nonzero", NoAttrs, lambda ts, a: [TensorType((ts[0].ndim, fresh_dim()), "int64")],
         kind=DYNAMIC_SHAPE, num_inputs=1)


def _unique(ts, a):
    u = fresh_dim()
    out = [TensorType((u,), ts[0].dtype)]
    if a.return_inverse:
        out.append(TensorType(ts[0].shape, "int64"))
    if a.return_counts:
        out.append(TensorType((u,), "int64"))
    return out


register("unique", UniqueAttrs, _unique, kind=DYNAMIC_SHAPE, num_inputs=1)


def _scalar_inputs(ts, what):
    for t in ts:
        if t.ndim != 0:
            raise ShapeError(f"{what} must be 0-d tensors, got {t}")


def _arange_dyn(ts, a):
    _scalar_inputs(ts, "arange bounds")
    return [TensorType((fresh_dim(),), a.dtype)]


register("arange_dyn", DtypeAttrs, _arange_dyn, kind=DYNAMIC_SHAPE, num_inputs=3)
register("shape_of", NoAttrs, lambda ts, a: [TensorType((ts[0].ndim,), "int64")], kind=DYNAMIC_SHAPE,
         num_inputs=1)


def _reshape_dyn(ts, a):
    x, s = ts
    if s.ndim != 1 or not isinstance(s.shape[0], int):
        raise ShapeError(f"the shape tensor must be 1-d with a static length, got {s}")
    if not np.issubdtype(np.dtype(s.dtype), np.integer):
        raise ShapeError(f"the shape tensor must be integer, got {s.dtype}")
    return [TensorType(tuple(fresh_dim() for _ in range(s.shape[0])), x.dtype)]


register("reshape_dyn", NoAttrs, _reshape_dyn, kind=DYNAMIC_SHAPE, num_inputs=2)


def _topk(ts, a):
    x = ts[0]
    ax = norm_axis(a.axis, x.ndim)
    if a.k is None:
        _scalar_inputs(ts[1:], "topk's k")
        k: Dim = fresh_dim()
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


def _cf_rule(ts, a):
    raise ShapeError("control-flow types are inferred from subgraphs")


for _n, _a in [("cond", CondAttrs), ("case", CaseAttrs), ("foreach", ForeachAttrs), ("while_loop", WhileAttrs)]:
    register(_n, _a, _cf_rule, kind=CONTROL_FLOW)
