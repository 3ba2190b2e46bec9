"""The ONNX op converters of `frontend/onnx.py`: one function per ONNX op, written with `dyntvm.F` ops (so each
ONNX op lands on dyntvm's one op registry). A converter gets the node's input values (numpy arrays for values
known at import time, traced tensors otherwise, None for an omitted optional input), its attributes, the
import context (opset, `run_graph` for subgraphs), the scope and the node; it returns the output values."""
from __future__ import annotations

import math

import numpy as np

from dyntvm.errors import InputError

from . import F
from ..ir.ops_shape_tensors import ReshapeDynAttrs
from ..ir.types import ShapeError, check_tensor_size, dim_bounds, is_static_dim, same_dim
from .list_values import TensorList
from .ops import apply
from .shape_values import known_array, known_of
from .tracer import Tensor

INT_MAX = 2 ** 62           # Slice's "to the end" sentinels (INT64_MAX and friends) are clamped above this


class OnnxImportError(InputError):
    """An ONNX model that cannot be imported as it is (a malformed node, an operand that must be constant)."""


def _np_dtype(elem_type: int, what: str = "a tensor") -> np.dtype:
    """The numpy dtype of ONNX element type `elem_type` (the type of `what`, for the message)."""
    from onnx import helper
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        raise OnnxImportError(f"{what} has element type {elem_type}, " + ("undefined (0)" if elem_type == 0 else
                              "not an ONNX tensor element type")) from None


def _tensor(t, what: str = "initializer") -> np.ndarray:
    """The array of TensorProto `t` (an initializer, a Constant's value), checked: its data read by onnx must be
    whole, of a known dtype and its declared dims. Its external data (if any) was read in when the model was
    loaded (`onnx_load.py`); a tensor still pointing outside is refused, never read relative to the current
    directory."""
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data
    name = f"{what} {t.name!r}" if t.name else what
    if uses_external_data(t):
        raise OnnxImportError(f"{name} keeps its data in an external file that was not loaded (external data is read "
                              "only from the model file's directory, or from_onnx(..., base_dir=))")
    if any(d < 0 for d in t.dims):
        raise OnnxImportError(f"{name} has negative dims {list(t.dims)}")
    _np_dtype(t.data_type, name)
    try:
        return numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - onnx / numpy raise TypeError, KeyError, ValueError... on bad data
        raise OnnxImportError(f"{name} is malformed: its data does not decode as {list(t.dims)} of ONNX type "
                              f"{t.data_type} ({type(e).__name__}: {e})") from None


# ------------------------------------------------------------------------------------------ helpers
def _is_const(x) -> bool:
    return not isinstance(x, (Tensor, TensorList))


def _const(x, what: str, node) -> np.ndarray:
    if not _is_const(x):
        known = known_array(x)      # computed from the inputs' shapes, known while tracing (shape_values.py)
        if known is not None:
            return known
        raise OnnxImportError(f"{what} must be known when the model is imported (a constant or computed from "
                              "constants), but it is computed from the inputs; dyntvm has no data-dependent "
                              f"form of {node.op_type} with it")
    return np.asarray(x)


def _ints(x, what, node) -> list:
    return [int(v) for v in np.asarray(_const(x, what, node)).reshape(-1)]


def _rank(x) -> int:
    return len(x.shape)


def _shape(x) -> tuple:
    return tuple(x.shape)


def _sizes(v, positive: bool = False) -> bool:
    """Whether integer `v` is known while tracing to hold sizes (>= 0, or > 0 with `positive`), as the shape
    arithmetic of the exporters' ``Shape -> Gather -> Div`` chains: dividing those truncates as // does."""
    if np.dtype(v.dtype).kind not in "iu" or _is_const(v) and np.size(v) > 64:
        return False
    entries = np.asarray(v).reshape(-1).tolist() if _is_const(v) else known_of(v)
    if entries is None:
        return False
    return all(e is not None and not isinstance(e, bool) and dim_bounds(e)[0] >= (1 if positive else 0)
               for e in entries)


def _fold(op, xs):
    out = xs[0]
    for x in xs[1:]:
        out = op(out, x)
    return out


def _scalar_bool(p):
    return F.reshape(p, ()) if _rank(p) else p


# ----------------------------------------------------------------------------------------- converters
CONVERTERS: dict = {}


def converter(*names):
    def reg(fn):
        for n in names:
            CONVERTERS[n] = fn
        return fn
    return reg


def _unary(fn):
    return lambda ins, a, ctx, env, node: fn(ins[0])


for _name, _fn in {"Relu": F.relu, "Sigmoid": F.sigmoid, "Tanh": F.tanh, "Exp": F.exp, "Log": F.log,
                   "Sqrt": F.sqrt, "Abs": F.abs, "Neg": F.negative, "Floor": F.floor, "Ceil": F.ceil, "Erf": F.erf,
                   "Not": F.logical_not, "Sin": F.sin, "Cos": F.cos, "Tan": F.tan, "Sign": F.sign,
                   "Round": F.round, "IsNaN": F.isnan}.items():
    CONVERTERS[_name] = _unary(_fn)


@converter("Identity")
def _identity(ins, a, ctx, env, node):
    return [ins[0]]         # one output, whatever it is: a sequence (a Python list) too

def _operands(ins, a, ctx, node) -> tuple:
    """The two operands of a binary elementwise op. From opset 7 on they broadcast both ways (numpy's rules).
    Before, B is broadcast to A only with ``broadcast=1``: its shape matches A's from axis ``axis`` on (B
    reshaped to A's rank with ones around it), or without ``axis`` A's trailing dims (numpy's rule); with
    ``broadcast=0`` the shapes must be equal."""
    x, y = ins
    if ctx.opset >= 7:
        return x, y
    sx, sy = _shape(x), _shape(y)
    if not a.get("broadcast", 0):
        if len(sx) != len(sy) or any(isinstance(p, int) and isinstance(q, int) and p != q for p, q in zip(sx, sy)):
            raise OnnxImportError(f"{node.op_type} of shapes {sx} and {sy} without broadcast=1: before opset 7 the "
                                  "shapes must be equal")
        return x, y
    axis = a.get("axis")
    if axis is None or all(is_static_dim(d, 1) for d in sy):
        return x, y                             # suffix matching, or a one-element B: numpy's broadcasting
    if not 0 <= axis <= len(sx) - len(sy):
        raise OnnxImportError(f"{node.op_type} with broadcast=1, axis={axis}: B of shape {sy} does not fit A of shape "
                              f"{sx} from axis {axis} (axis must be in [0, {len(sx) - len(sy)}])")
    for _ in range(len(sx) - axis - len(sy)):     # trailing ones: B's dims line up with A's from `axis` on
        y = np.expand_dims(y, -1) if _is_const(y) else F.expand_dims(y, -1)
    return x, y


for _name, _fn in {"Add": F.add, "Sub": F.subtract, "Mul": F.multiply,
                   "Equal": F.equal, "Less": F.less, "Greater": F.greater, "LessOrEqual": F.less_equal,
                   "GreaterOrEqual": F.greater_equal, "And": F.logical_and, "Or": F.logical_or,
                   "Xor": F.not_equal}.items():
    CONVERTERS[_name] = (lambda fn: lambda ins, a, ctx, env, node: fn(*_operands(ins, a, ctx, node)))(_fn)


@converter("Div")
def _div(ins, a, ctx, env, node):
    x, y = _operands(ins, a, ctx, node)
    if _sizes(x) and _sizes(y, positive=True):      # shape arithmetic: // keeps the entries known (shape_values)
        return F.floor_divide(x, y)
    q = F.divide(x, y)
    if np.dtype(x.dtype).kind in "iu":          # integer division truncates toward zero, keeping the dtype
        q = F.astype(q, np.dtype(x.dtype).name)
    return q


@converter("Mod")
def _mod(ins, a, ctx, env, node):
    x, y = ins
    fmod = bool(a.get("fmod", 0))
    if np.dtype(x.dtype) != np.dtype(y.dtype):
        raise OnnxImportError(f"Mod of {np.dtype(x.dtype).name} and {np.dtype(y.dtype).name}: the spec wants one "
                              "dtype")
    r = F.fmod(x, y)                            # C's remainder, exact at every width (ints by 0 give 0)
    if fmod or np.dtype(x.dtype).kind == "u":
        return r
    zero = _c(0, r)                             # np.mod: the remainder takes the sign of y
    fix = F.logical_and(F.not_equal(r, zero), F.not_equal(F.less(r, zero), F.less(y, _c(0, y))))
    r = F.where(fix, r + y, r)
    if np.dtype(x.dtype).kind == "f":           # a zero remainder is +-0 with y's sign (NaN stays NaN)
        r = F.where(F.equal(r, zero), F.where(F.less(y, zero), _c(-0.0, r), zero), r)
    return r


@converter("Pow")
def _pow(ins, a, ctx, env, node):
    x, y = _operands(ins, a, ctx, node)
    if np.dtype(x.dtype) == np.dtype(y.dtype):
        return F.power(x, y)
    ft = x.dtype if np.dtype(x.dtype).kind == "f" else "float64"     # the result has the base's dtype
    return F.astype(F.power(F.astype(x, np.dtype(ft).name), F.astype(y, np.dtype(ft).name)),
                    np.dtype(x.dtype).name)


@converter("Max", "Min", "Sum", "Mean")
def _variadic(ins, a, ctx, env, node):
    op = {"Max": F.maximum, "Min": F.minimum, "Sum": F.add, "Mean": F.add}[node.op_type]
    out = _fold(op, ins)
    return out / np.asarray(len(ins), dtype=out.dtype) if node.op_type == "Mean" else out


@converter("Reciprocal")
def _reciprocal(ins, a, ctx, env, node):
    return np.asarray(1, dtype=ins[0].dtype) / ins[0]


@converter("Dropout")
def _dropout(ins, a, ctx, env, node):
    training = ins[2] if len(ins) > 2 else None
    if training is not None and (not _is_const(training) or bool(np.asarray(training))):
        raise OnnxImportError("Dropout in training mode is not supported (inference: dropout is the identity)")
    return [ins[0], F.full_like(ins[0], True, dtype="bool")]        # inference: all kept


@converter("Constant")
def _constant(ins, a, ctx, env, node):
    if "value" in a:
        return _tensor(a["value"], "Constant's value")
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in a:
            return np.asarray(a[key], dtype=dtype)
    raise OnnxImportError(f"Constant: unsupported attribute(s) {', '.join(a)}")


@converter("Cast")
def _cast(ins, a, ctx, env, node):
    to = _np_dtype(a["to"], "Cast's 'to'")
    return F.astype(ins[0], to.name)


@converter("MatMul")
def _matmul(ins, a, ctx, env, node):
    return F.matmul(ins[0], ins[1])


@converter("Gemm")
def _gemm(ins, a, ctx, env, node):
    x, w = ins[0], ins[1]
    if a.get("transA", 0):
        x = F.transpose(x)
    if a.get("transB", 0):
        w = F.transpose(w)
    y = F.matmul(x, w)
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if alpha != 1.0:
        y = y * np.asarray(alpha, dtype=y.dtype)
    if len(ins) > 2 and ins[2] is not None:
        c = ins[2] if beta == 1.0 else ins[2] * np.asarray(beta, dtype=y.dtype)
        y = y + c
    return y


@converter("Softmax", "LogSoftmax")
def _softmax(ins, a, ctx, env, node):
    x = ins[0]
    axis = a.get("axis", -1 if ctx.opset >= 13 else 1)
    fn = F.softmax if node.op_type == "Softmax" else F.log_softmax
    if ctx.opset >= 13 or axis % _rank(x) == _rank(x) - 1:
        return fn(x, axis=axis)
    # opsets < 13: the softmax of x flattened to 2-d at `axis` (a negative one counts from the end)
    axis %= _rank(x)
    flat = F.flatten(F.flatten(x, axis, -1), 0, axis - 1) if axis else F.expand_dims(F.flatten(x), 0)
    return F.reshape(fn(flat, axis=-1), _shape(x))


@converter("Gelu")
def _gelu(ins, a, ctx, env, node):
    if a.get("approximate", b"none") not in (b"none", "none"):
        x = ins[0]
        c = np.asarray(np.sqrt(2 / np.pi), dtype=x.dtype)
        return np.asarray(0.5, x.dtype) * x * (np.asarray(1, x.dtype) + F.tanh(
            c * (x + np.asarray(0.044715, x.dtype) * x * x * x)))
    return F.gelu(ins[0])


@converter("LayerNormalization")
def _layer_norm(ins, a, ctx, env, node):
    x, gamma = ins[0], ins[1]
    beta = ins[2] if len(ins) > 2 and ins[2] is not None else None
    axis = a.get("axis", -1) % _rank(x)
    eps = a.get("epsilon", 1e-5)
    stats = len(node.output) > 1 and any(node.output[1:])
    if axis == _rank(x) - 1 and not stats and np.dtype(x.dtype) == np.float32:
        return F.layer_norm(x, gamma, np.zeros(_shape(gamma), x.dtype) if beta is None else beta, eps=eps)
    axes = tuple(range(axis, _rank(x)))          # over every axis from `axis` on, the statistics in float32+
    ct = "float64" if np.dtype(x.dtype) == np.float64 else "float32"
    xc = F.astype(x, ct)
    mean = F.mean(xc, axis=axes, keepdims=True)
    d = xc - mean
    inv = F.rsqrt(F.mean(d * d, axis=axes, keepdims=True) + np.asarray(eps, ct))
    y = F.astype(d * inv, np.dtype(x.dtype).name) * gamma
    if beta is not None:
        y = y + beta
    return [y, mean, inv]


@converter("Gather")
def _gather(ins, a, ctx, env, node):
    return F.take(ins[0], ins[1], axis=a.get("axis", 0))


@converter("Concat")
def _concat(ins, a, ctx, env, node):
    return F.concat(list(ins), axis=a.get("axis", 1))     # required from opset 4; Concat-1's default is 1


@converter("Transpose")
def _transpose(ins, a, ctx, env, node):
    perm = a.get("perm")
    return F.transpose(ins[0], None if perm is None else tuple(perm))


def _axes(ins, a, node, k=1):
    if len(ins) > k and ins[k] is not None:
        return _ints(ins[k], f"{node.op_type}'s axes", node)
    return a.get("axes")


@converter("Squeeze")
def _squeeze(ins, a, ctx, env, node):
    axes = _axes(ins, a, node)
    return F.squeeze(ins[0], None if axes is None else tuple(axes))


@converter("Unsqueeze")
def _unsqueeze(ins, a, ctx, env, node):
    x = ins[0]
    axes = _axes(ins, a, node)
    out_rank = _rank(x) + len(axes)
    for ax in sorted(ax % out_rank for ax in axes):
        x = F.expand_dims(x, ax)
    return x


@converter("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")
def _reduce(ins, a, ctx, env, node):
    fn = {"ReduceSum": F.sum, "ReduceMean": F.mean, "ReduceMax": F.max, "ReduceMin": F.min,
          "ReduceProd": F.prod}[node.op_type]
    axes = _axes(ins, a, node)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return ins[0]
        axes = None
    return fn(ins[0], axis=None if axes is None else tuple(axes), keepdims=bool(a.get("keepdims", 1)))


@converter("ArgMax", "ArgMin")
def _argmax(ins, a, ctx, env, node):
    fn = F.argmax if node.op_type == "ArgMax" else F.argmin
    x, axis, keep = ins[0], a.get("axis", 0) % _rank(ins[0]), bool(a.get("keepdims", 1))
    if not a.get("select_last_index", 0):
        return fn(x, axis=axis, keepdims=keep)
    rev = F.slice(x, [None], [None], [-1], [axis])          # the last extreme: the first one of the reversal
    n = _shape(x)[axis]
    last = np.asarray(n - 1, np.int64) if isinstance(n, int) else F.take(F.shape_of(x), axis) - np.int64(1)
    return last - fn(rev, axis=axis, keepdims=keep)


@converter("Flatten")
def _flatten(ins, a, ctx, env, node):
    x, axis = ins[0], a.get("axis", 1)
    axis = axis + _rank(x) if axis < 0 else axis
    if axis == 0:
        return F.expand_dims(F.flatten(x), 0)
    if axis == _rank(x):
        return F.expand_dims(F.flatten(x), -1)
    return F.flatten(F.flatten(x, axis, -1), 0, axis - 1)


@converter("Clip")
def _clip(ins, a, ctx, env, node):
    lo = ins[1] if len(ins) > 1 else a.get("min")
    hi = ins[2] if len(ins) > 2 else a.get("max")
    x = ins[0]
    if lo is not None:
        x = F.maximum(x, np.asarray(lo, x.dtype) if _is_const(lo) else lo)
    if hi is not None:
        x = F.minimum(x, np.asarray(hi, x.dtype) if _is_const(hi) else hi)
    return x


def _c(v, like):
    """A scalar constant in `like`'s dtype."""
    return np.asarray(v, dtype=like.dtype)


@converter("OneHot")
def _one_hot(ins, a, ctx, env, node):
    idx, depth, values = ins
    if _is_const(depth):
        d = int(np.asarray(depth).reshape(-1)[0])
        if d < 0:
            raise OnnxImportError(f"OneHot: depth {d} is negative")
        _check_size((d,), np.int64, "OneHot's depth")          # its position vector, made here
        d = np.int64(d)
    else:                           # computed (any numeric type, cast to int64 as the spec says)
        if np.size(np.empty(tuple(n if isinstance(n, int) else 2 for n in _shape(depth)), np.int8)) != 1:
            raise OnnxImportError(f"OneHot: depth must have one element, got shape {list(_shape(depth))}")
        d = F.reshape(F.astype(depth, "int64"), ())
    idx = F.astype(idx, "int64")
    idx = F.where(F.less(idx, np.int64(0)), idx + d, idx)         # negative indices count from the end
    hot = F.one_hot(idx, d, axis=a.get("axis", -1), dtype="bool")
    return F.where(hot, F.take(values, np.int64(1)), F.take(values, np.int64(0)))


@converter("Where")
def _where(ins, a, ctx, env, node):
    return F.where(ins[0], ins[1], ins[2])


@converter("Shape")
def _shape_op(ins, a, ctx, env, node):
    x = ins[0]
    start, end = a.get("start", 0), a.get("end")
    dims = _shape(x)[start:end]
    if all(isinstance(d, (int, np.integer)) for d in dims):
        return np.asarray(dims, dtype=np.int64)
    s = F.shape_of(x)           # its entries are known while tracing (x's dims): see shape_values.py
    return s if (start, end) == (0, None) else F.slice(s, [start], [end if end is not None else INT_MAX])


@converter("Size")
def _size(ins, a, ctx, env, node):
    dims = _shape(ins[0])
    if all(isinstance(d, (int, np.integer)) for d in dims):
        return np.asarray(int(np.prod(dims)), dtype=np.int64)
    return F.prod(F.shape_of(ins[0]))


@converter("Reshape")
def _reshape(ins, a, ctx, env, node):
    x, shape = ins[0], ins[1]
    if not _is_const(shape):        # computed: entries known while tracing become dims (shape_rewrites.py)
        return apply("reshape", "reshape_dyn", [x, F.astype(shape, "int64")],
                     ReshapeDynAttrs(copy_zeros=not a.get("allowzero", 0)))[0]
    dims = _ints(shape, "Reshape's shape", node)
    if not a.get("allowzero", 0):
        dims = [_shape(x)[i] if d == 0 else d for i, d in enumerate(dims)]
    return F.reshape(x, tuple(dims))


@converter("Expand")
def _expand(ins, a, ctx, env, node):
    x, shape = ins
    if _is_const(shape):
        shape = np.asarray(_ints(shape, "Expand's shape", node), np.int64)
        _check_size(tuple(shape), x.dtype, "Expand")
    return F.expand(x, shape if _is_const(shape) else F.astype(shape, "int64"))     # ONNX broadcasting, both ways


def _check_size(shape, dtype, op: str) -> None:
    """An OnnxImportError where a tensor of the constant `shape` could never be allocated (`check_tensor_size`)."""
    try:
        check_tensor_size(shape, np.dtype(dtype).name)
    except ShapeError as e:
        raise OnnxImportError(f"{op}: {e}") from None


@converter("ConstantOfShape")
def _constant_of_shape(ins, a, ctx, env, node):
    value = _tensor(a["value"], "ConstantOfShape's value") if "value" in a else np.zeros(1, np.float32)
    fill = value.reshape(-1)[0].item()
    if not _is_const(ins[0]):       # computed: entries known while tracing become dims
        return F.full(F.astype(ins[0], "int64"), fill, dtype=value.dtype.name)
    shape = tuple(_ints(ins[0], "ConstantOfShape's shape", node))
    _check_size(shape, value.dtype, "ConstantOfShape")
    return F.full(shape, fill, dtype=value.dtype.name)


@converter("Range")
def _range(ins, a, ctx, env, node):
    start, limit, delta = ins
    dtype = np.dtype(start.dtype)
    if all(_is_const(v) for v in ins):
        if delta != 0:       # (numpy's error for a zero step stays the malformed-node error)
            if dtype.kind in "iu":      # exact in Python ints (int64 bounds may overflow in numpy)
                length = -((int(start) - int(limit)) // int(delta))
            else:
                length = math.ceil((float(limit) - float(start)) / float(delta))
            _check_size((max(length, 0),), dtype, "Range")
        return np.arange(start, limit, delta, dtype=dtype)
    return F.arange(start, limit, delta, dtype=dtype.name)


@converter("Tile")
def _tile(ins, a, ctx, env, node):
    x, reps = ins
    if len(_shape(reps)) != 1 or not same_dim(_shape(reps)[0], _rank(x)):
        raise OnnxImportError(f"Tile: repeats of shape {list(_shape(reps))} for a rank-{_rank(x)} input (one "
                              "repeat per axis)")
    if _is_const(reps):
        return F.tile(x, tuple(_ints(reps, "Tile's repeats", node)))
    return F.tile(x, F.astype(reps, "int64"))           # computed: negative repeats raise when it runs


@converter("NonZero")
def _nonzero(ins, a, ctx, env, node):
    return F.nonzero(ins[0])


@converter("Compress")
def _compress(ins, a, ctx, env, node):
    x, cond = ins
    axis = a.get("axis")
    if axis is None:
        x, axis = F.flatten(x), 0
    axis %= _rank(x)
    n, k = _shape(x)[axis], _shape(cond)[0]
    if isinstance(n, int) and isinstance(k, int) and k < n:     # a shorter condition: the rest is dropped
        x = F.slice(x, [0], [k], [1], [axis])
    elif not (isinstance(n, int) and isinstance(k, int)) and not same_dim(n, k):    # lengths known at run time only:
        idx = F.nonzero(cond)[0]                                # the selected slices that exist (as onnxruntime)
        return F.take(x, F.boolean_mask(idx, F.less(idx, F.shape_of(x)[axis])), axis=axis)
    return F.boolean_mask(x, cond, axis=axis)


@converter("TopK")
def _topk(ins, a, ctx, env, node):
    x, k = ins[0], ins[1]
    k = F.reshape(k, ()) if not _is_const(k) else int(np.asarray(k).reshape(-1)[0])
    axis, largest = a.get("axis", -1), bool(a.get("largest", 1))
    if not largest or np.dtype(x.dtype).kind != "f":
        return F.topk(x, k, axis=axis, largest=largest)
    # ONNX (its reference, onnxruntime) ranks NaN above everything; F.topk sorts NaN last either way. A key in
    # a wider float orders NaN (-> inf) above inf (-> the widest finite) above every value of x; float64 has
    # no wider type: there a finite 1.8e308 ties with inf (and reads back as inf)
    wide = {"float16": "float32", "float32": "float64"}.get(np.dtype(x.dtype).name, "float64")
    inf, big = np.asarray(np.inf, wide), np.asarray(np.finfo(wide).max, wide)
    xw = F.astype(x, wide)
    key = F.where(F.isnan(xw), inf, F.where(F.equal(xw, inf), big, xw))
    v, i = F.topk(key, k, axis=axis, largest=True)
    v = F.where(F.equal(v, inf), np.asarray(np.nan, wide), F.where(F.equal(v, big), inf, v))
    return [F.astype(v, np.dtype(x.dtype).name), i]
