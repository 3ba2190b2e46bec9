"""The converters of `from_torch` (`torch_export.py`): one per core ATen op, over `dyntvm.F`.

A converter gets the node's arguments with each FX node replaced by its value (a traced `Tensor`, a dim for a
SymInt, a tuple for a multi-output op) and returns the node's value. It follows torch's semantics where they
differ from numpy's (`squeeze` of a non-1 axis is a no-op, `slice` ends past the size clamp, `nonzero` is
[K, rank]); dtypes follow the node's recorded result (`torch_export` casts where a converter's numpy rule gave
another), so a converter needs to cast only its operands. Torch is never imported here: dtypes come in as
`torch.dtype` objects and are read by name.
"""
from __future__ import annotations

import builtins
import operator

import numpy as np

from dyntvm.errors import InputError

from ..ir.types import dim_add, dim_compare, dim_minmax, dim_mul, is_static_dim
from . import F
from ..ir.ops import Group, ops_in
from .tracer import Tensor

__all__ = ["CONVERTERS", "TorchImportError", "np_dtype"]


class TorchImportError(InputError):
    """A torch program that `from_torch` cannot take: torch.export refused it, or a form of an op dyntvm lacks."""


CONVERTERS: dict = {}
_INT64_MAX = 2 ** 63 - 1


def converter(*names):
    """Register a converter under ATen overload names ("aten.add.Tensor") or other targets' names."""
    def reg(fn):
        for n in names:
            CONVERTERS[n] = fn
        return fn
    return reg


_DTYPES = {"float32": "float32", "float64": "float64", "float16": "float16", "int64": "int64", "int32": "int32",
           "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}


def np_dtype(dtype) -> str:
    """The numpy dtype name of a `torch.dtype` (a TorchImportError for one dyntvm has no counterpart of)."""
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise TorchImportError(f"from_torch: dtype {dtype} has no dyntvm counterpart (supported: "
                               f"{', '.join(sorted(_DTYPES))})")
    return _DTYPES[name]


# ------------------------------------------------------------------------------------------ helpers
def _rank(x) -> int:
    return len(x.shape)


def _axis(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _as(x, dtype: str):
    """`x` (a tensor or a Python scalar) as `dtype`."""
    if isinstance(x, (Tensor, np.ndarray)):
        return x if np.dtype(x.dtype) == np.dtype(dtype) else F.cast(x, dtype)
    if isinstance(x, str):              # a SymInt operand (a size): its value as a tensor
        return F.cast(dim_tensor(x), dtype)
    return np.asarray(x, dtype)


def _promoted(*xs) -> str:
    """torch's result dtype of tensors and Python scalars (scalars are weak: they raise int to float only)."""
    tensors = [np.dtype(x.dtype) for x in xs if isinstance(x, (Tensor, np.ndarray))]
    dt = np.result_type(*tensors) if tensors else np.dtype("int64")
    if dt.kind in "biu" and any(isinstance(x, float) for x in xs):
        dt = np.dtype("float32")
    elif dt.kind == "b" and any(isinstance(x, int) and not isinstance(x, bool) for x in xs):
        dt = np.dtype("int64")
    return dt.name


def dim_tensor(d):
    """A dim (int or symbolic, as a SymInt converts to) as a 0-d int64 value: the size of an axis that has it."""
    if isinstance(d, Tensor):
        return _as(d, "int64")
    if is_static_dim(d):
        return np.int64(int(d))
    from ..ir.dims import parse_dim
    from .tracer import current
    b = current()

    def sym(name):
        b.define_symbol(name)
        v = b.sym_values.get(name) or next(bb.sym_values[name] for bb in _outer(b) if name in bb.sym_values)
        return F.take(F.shape_of(Tensor(b.lift(v), b)), np.int64(v.type.shape.index(name)))
    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": F.floor_divide, "%": F.mod}
    return parse_dim(str(d)).fold(np.int64, sym, lambda op, a, c: ops[op](a, c),
                                  lambda fn, args: (F.minimum if fn == "min" else F.maximum)(*args),
                                  lambda a: -a)


def _outer(b):
    while b is not None:
        yield b
        b = b.parent


def _dims_or_tensor(sizes):
    """Sizes (ints, dims) for F.reshape / F.full: as they are where they are dims of tensors dyntvm names, else a
    1-d tensor (a size known only when it runs: an unbacked one)."""
    if all(is_static_dim(s) or isinstance(s, str) for s in sizes):
        return tuple(int(s) if is_static_dim(s) else s for s in sizes)
    return F.stack([dim_tensor(s) for s in sizes]) if sizes else ()


def _binary(fn):
    """An elementwise op of two operands (tensors or Python scalars) in torch's promoted dtype; `alpha` scales b."""
    def conv(a, b, alpha=1):
        dt = _promoted(a, b)
        if alpha != 1:
            b = F.multiply(_as(b, dt), _as(alpha, dt))
        return fn(_as(a, dt), _as(b, dt))
    return conv


for _names, _fn in {("add.Tensor", "add.Scalar"): F.add, ("sub.Tensor", "sub.Scalar"): F.subtract,
                    ("mul.Tensor", "mul.Scalar"): F.multiply, ("maximum.default",): F.maximum,
                    ("minimum.default",): F.minimum, ("fmod.Tensor", "fmod.Scalar"): F.fmod,
                    ("remainder.Tensor", "remainder.Scalar"): F.mod,
                    ("eq.Tensor", "eq.Scalar"): F.equal, ("ne.Tensor", "ne.Scalar"): F.not_equal,
                    ("lt.Tensor", "lt.Scalar"): F.less, ("le.Tensor", "le.Scalar"): F.less_equal,
                    ("gt.Tensor", "gt.Scalar"): F.greater, ("ge.Tensor", "ge.Scalar"): F.greater_equal,
                    ("logical_and.default",): F.logical_and, ("logical_or.default",): F.logical_or}.items():
    converter(*("aten." + n for n in _names))(_binary(_fn))


def _bool_only(name, fn):
    """A bitwise op: on bool tensors the logical one; dyntvm has no bitwise ops on integers (refused by name)."""
    def conv(*args):
        if any(getattr(a, "dtype", "bool") != "bool" for a in args):
            raise TorchImportError(f"{name} on {[getattr(a, 'dtype', type(a).__name__) for a in args]}: dyntvm "
                                   "has bitwise ops on bool tensors only (logical and / or / not / xor)")
        return fn(*args)
    return conv


CONVERTERS["aten.bitwise_and.Tensor"] = _bool_only("bitwise_and", F.logical_and)
CONVERTERS["aten.bitwise_or.Tensor"] = _bool_only("bitwise_or", F.logical_or)
CONVERTERS["aten.bitwise_not.default"] = _bool_only("bitwise_not", F.logical_not)
CONVERTERS["aten.rsub.Scalar"] = lambda a, b, alpha=1: F.subtract(_as(b, _promoted(a, b)),
                                                                  F.multiply(_as(a, _promoted(a, b)), alpha))


@converter("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(a, b, rounding_mode=None):
    dt = _promoted(a, b)
    if rounding_mode is None:
        dt = dt if np.dtype(dt).kind == "f" else "float32"
        return F.divide(_as(a, dt), _as(b, dt))
    q = F.floor_divide(_as(a, dt), _as(b, dt)) if rounding_mode == "floor" else None
    if rounding_mode == "trunc":
        if np.dtype(dt).kind == "f":
            d = F.divide(_as(a, dt), _as(b, dt))
            return F.where(d < 0, F.ceil(d), F.floor(d))
        fa, fb = _as(a, "float64"), _as(b, "float64")       # int64 quotients of < 2**53 are exact in float64
        d = F.divide(fa, fb)
        return F.cast(F.where(d < 0, F.ceil(d), F.floor(d)), dt)
    if q is None:
        raise TorchImportError(f"div: rounding_mode {rounding_mode!r} (torch has None, 'floor' and 'trunc')")
    return q


@converter("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(a, b):
    dt = _promoted(a, b)
    if isinstance(b, (int, float)) and b == 2:
        return F.multiply(_as(a, dt), _as(a, dt))
    return F.power(_as(a, dt), _as(b, dt))


def _unary(fn, floats=False):
    def conv(x, *rest, **kw):
        if floats and np.dtype(x.dtype).kind != "f":
            x = F.cast(x, "float32")
        return fn(x)
    return conv


# the elementwise groups of the registry (ir/ops.py GROUPS): ATen's names are the ops' names
for _name in ops_in(Group.UNARY):
    CONVERTERS[f"aten.{_name}.default"] = _unary(getattr(F, _name))
for _name in ops_in(Group.FLOAT_UNARY):
    if _name != "gelu":                                        # its own converter below (the tanh form)
        CONVERTERS[f"aten.{_name}.default"] = _unary(getattr(F, _name), floats=True)
for _name, _fn in {"logical_not": F.logical_not, "isnan": F.isnan, "clone": lambda x: x, "alias": lambda x: x, "lift_fresh_copy": lambda x: x,
                   "detach": lambda x: x, "contiguous": lambda x: x}.items():
    CONVERTERS[f"aten.{_name}.default"] = _unary(_fn)
for _name, _fn in {"reciprocal": lambda x: 1.0 / x, "log1p": lambda x: F.log(x + 1.0),
                   "expm1": lambda x: F.exp(x) - 1.0, "silu": lambda x: x * F.sigmoid(x)}.items():
    CONVERTERS[f"aten.{_name}.default"] = _unary(_fn, floats=True)


@converter("aten.gelu.default")
def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + F.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + 0.044715 * x * x * x)))
    return F.gelu(x)


@converter("aten.clamp.default", "aten.clip.default")
def _clamp(x, min=None, max=None):
    return F.clip(x, min, max)


@converter("aten.hardtanh.default")
def _hardtanh(x, min_val=-1.0, max_val=1.0):
    return F.clip(x, min_val, max_val)


@converter("aten.clamp.Tensor")
def _clamp_t(x, min=None, max=None):
    y = x if min is None else F.maximum(x, _as(min, x.dtype.name))
    return y if max is None else F.minimum(y, _as(max, x.dtype.name))


@converter("aten.leaky_relu.default")
def _leaky_relu(x, negative_slope=0.01):
    return F.where(x > 0, x, x * negative_slope)


@converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(c, a, b):
    dt = _promoted(a, b)
    return F.where(c, _as(a, dt), _as(b, dt))


@converter("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(x, mask, value):
    return F.where(mask, _as(value, x.dtype.name), x)


# ------------------------------------------------------------------------------------- reductions
def _reduce(fn):
    def conv(x, dim=None, keepdim=False, *, dtype=None):
        if dtype is not None:
            x = F.cast(x, np_dtype(dtype))
        if dim is not None and not isinstance(dim, (list, tuple)):
            dim = [dim]
        axes = None if dim is None or len(dim) == 0 else tuple(_axis(d, _rank(x)) for d in dim)
        if _rank(x) == 0:
            return x
        return fn(x, axes, keepdim)
    return conv


for _names, _fn in {("sum.dim_IntList", "sum.default"): F.sum, ("mean.dim", "mean.default"): F.mean,
                    ("amax.default", "max.default"): F.max, ("amin.default", "min.default"): F.min,
                    ("prod.dim_int", "prod.default"): F.prod}.items():
    converter(*("aten." + n for n in _names))(_reduce(_fn))


def _count_true(x, dim, keepdim):
    return _reduce(F.sum)(F.cast(F.not_equal(x, 0), "int64"), dim, keepdim)


def _any(x, dim=None, keepdim=False):
    """any: some value is nonzero (a count, so an empty axis gives False, as torch does; max would fail there)."""
    return _count_true(x, dim, keepdim) > 0


def _all(x, dim=None, keepdim=False):
    """all: no value is zero (an empty axis gives True)."""
    return F.logical_not(_count_true(F.logical_not(F.not_equal(x, 0)), dim, keepdim) > 0)


CONVERTERS["aten.any.dim"] = CONVERTERS["aten.any.dims"] = CONVERTERS["aten.any.default"] = _any
CONVERTERS["aten.all.dim"] = CONVERTERS["aten.all.dims"] = CONVERTERS["aten.all.default"] = _all


def _extreme_dim(values, arg):
    def conv(x, dim, keepdim=False):
        return values(x, _axis(dim, _rank(x)), keepdim), arg(x, _axis(dim, _rank(x)), keepdim)
    return conv


CONVERTERS["aten.max.dim"] = _extreme_dim(F.max, F.argmax)
CONVERTERS["aten.min.dim"] = _extreme_dim(F.min, F.argmin)
CONVERTERS["aten.argmax.default"] = lambda x, dim=None, keepdim=False: F.argmax(x, dim, keepdim)
CONVERTERS["aten.argmin.default"] = lambda x, dim=None, keepdim=False: F.argmin(x, dim, keepdim)


@converter("aten.var.correction", "aten.var.dim")
def _var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    axes = tuple(range(_rank(x))) if not dim else tuple(_axis(d, _rank(x)) for d in dim)
    dev = x - F.mean(x, axes, True)
    n = 1
    for a in axes:
        n = dim_mul(n, x.shape[a])
    c = 1 if correction is None and unbiased in (None, True) else (0 if correction is None else correction)
    return F.sum(dev * dev, axes, keepdim) / F.cast(dim_tensor(n) - c, x.dtype.name)


@converter("aten.cumsum.default")
def _cumsum(x, dim, *, dtype=None):
    if dtype is None and (x.dtype == "bool" or np.dtype(x.dtype).kind in "iu"):
        x = F.cast(x, "int64")              # torch accumulates bools and integers in int64
    return F.cumsum(x if dtype is None else F.cast(x, np_dtype(dtype)), _axis(dim, _rank(x)))


@converter("aten._softmax.default", "aten.softmax.int")
def _softmax(x, dim, half_to_float=False, *rest):
    return F.softmax(x, _axis(dim, _rank(x)))


@converter("aten._log_softmax.default", "aten.log_softmax.int")
def _log_softmax(x, dim, half_to_float=False, *rest):
    return F.log_softmax(x, _axis(dim, _rank(x)))


# ------------------------------------------------------------------------------------------ shapes
@converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(x, shape):
    return F.reshape(x, _dims_or_tensor(list(shape)))


@converter("aten.permute.default")
def _permute(x, dims):
    return F.transpose(x, tuple(_axis(d, _rank(x)) for d in dims))


@converter("aten.t.default")
def _t(x):
    return F.transpose(x, (1, 0)) if _rank(x) == 2 else x


@converter("aten.transpose.int")
def _transpose(x, a, b):
    perm = list(range(_rank(x)))
    a, b = _axis(a, _rank(x)), _axis(b, _rank(x))
    perm[a], perm[b] = perm[b], perm[a]
    return F.transpose(x, tuple(perm))


@converter("aten.unsqueeze.default")
def _unsqueeze(x, dim):
    return F.expand_dims(x, dim % (_rank(x) + 1))


@converter("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def _squeeze(x, dims=None):
    dims = range(_rank(x)) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = tuple(sorted({_axis(d, _rank(x)) for d in dims if is_static_dim(x.shape[_axis(d, _rank(x))], 1)}))
    return F.squeeze(x, axes) if axes else x        # torch: a non-1 axis is left alone


@converter("aten.expand.default")
def _expand(x, sizes, implicit=False):
    lead = len(sizes) - _rank(x)
    dims = [x.shape[k - lead] if s == -1 else s for k, s in enumerate(sizes)]
    dims = _dims_or_tensor(dims)
    return F.broadcast_to(x, dims)


@converter("aten.cat.default")
def _cat(tensors, dim=0):
    tensors = [t for t in tensors if not (_rank(t) == 1 and is_static_dim(t.shape[0], 0))] or tensors[:1]
    dt = _promoted(*tensors)
    return F.concat([_as(t, dt) for t in tensors], _axis(dim, _rank(tensors[0])))


@converter("aten.stack.default")
def _stack(tensors, dim=0):
    return F.stack(list(tensors), dim % (_rank(tensors[0]) + 1))


@converter("aten.slice.Tensor")
def _slice(x, dim=0, start=None, end=None, step=1):
    ax = _axis(dim, _rank(x))
    start = None if start in (None, 0) else start
    end = None if end is None or (is_static_dim(end) and int(end) >= _INT64_MAX) else end
    if all(v is None or isinstance(v, (int, np.integer)) for v in (start, end)):
        return F.slice(x, [start], [end], [step], [ax])
    lo = np.int64(0) if start is None else dim_tensor(start)
    hi = np.int64(_INT64_MAX) if end is None else dim_tensor(end)
    return F.slice(x, F.reshape(lo, (1,)), F.reshape(hi, (1,)), [step], [ax])


@converter("aten.select.int")
def _select(x, dim, index):
    ax = _axis(dim, _rank(x))
    if isinstance(index, (int, np.integer)):
        return F.getitem(x, (builtins.slice(None),) * ax + (int(index),))
    return F.take(x, dim_tensor(index), axis=ax)


@converter("aten.split_with_sizes.default", "aten.split.Tensor")
def _split(x, sizes, dim=0):
    ax = _axis(dim, _rank(x))
    if isinstance(sizes, (int, np.integer)):
        n = x.shape[ax]
        if not is_static_dim(n):
            raise TorchImportError(f"split into chunks of {sizes} along a symbolic axis ({n}): the number of "
                                   "chunks is known only when it runs; dyntvm has no data-dependent split")
        sizes = [min(sizes, int(n) - k) for k in range(0, int(n), sizes)]
    if len(sizes) <= 1:
        return (x,)
    if all(is_static_dim(k) for k in sizes):
        return tuple(F.split(x, [int(i) for i in np.cumsum([int(k) for k in sizes])[:-1]], ax))
    parts, start = [], 0                # sizes from symbolic dims (SymInts): one slice per part
    for k in sizes:
        if is_static_dim(start) and is_static_dim(k):
            stop = int(start) + int(k)
        elif isinstance(start, Tensor) or isinstance(k, Tensor):           # a size read from data
            stop = F.add(dim_tensor(start), dim_tensor(k))
        else:
            stop = dim_add(start, k)
        parts.append(_slice(x, ax, start, stop))
        start = stop
    return tuple(parts)


@converter("aten.flip.default")
def _flip(x, dims):
    for d in dims:
        x = F.slice(x, [None], [None], [-1], [_axis(d, _rank(x))])
    return x


@converter("aten.constant_pad_nd.default")
def _pad(x, pad, value=0.0):
    width = [(0, 0)] * _rank(x)
    for k in range(len(pad) // 2):
        width[_rank(x) - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    if any(a < 0 or b < 0 for a, b in width):
        raise TorchImportError("constant_pad_nd with negative padding (cropping) is not supported")
    return F.pad(x, width, value)


# ------------------------------------------------------------------------------- creation, casts
@converter("aten._to_copy.default", "aten.to.dtype")
def _to_copy(x, *args, dtype=None, **kw):
    if args and not isinstance(args[0], (str, type(None))) and "dtype" in str(type(args[0])):
        dtype = args[0]
    return x if dtype is None else _as(x, np_dtype(dtype))


@converter("aten.full.default")
def _full(size, fill_value, *, dtype=None, **kw):
    dt = np_dtype(dtype) if dtype is not None else ("float32" if isinstance(fill_value, float) else
                                                     "bool" if isinstance(fill_value, bool) else "int64")
    return F.full(_dims_or_tensor(list(size)), fill_value, dt)


@converter("aten.zeros.default", "aten.ones.default", "aten.empty.memory_format")
def _zeros(size, *, dtype=None, **kw):
    return F.zeros(_dims_or_tensor(list(size)), np_dtype(dtype) if dtype is not None else "float32")


CONVERTERS["aten.ones.default"] = lambda size, *, dtype=None, **kw: F.ones(
    _dims_or_tensor(list(size)), np_dtype(dtype) if dtype is not None else "float32")


@converter("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default")
def _full_like(x, fill_value=0, *, dtype=None, **kw):
    return F.full_like(x, fill_value, None if dtype is None else np_dtype(dtype))


CONVERTERS["aten.ones_like.default"] = lambda x, *, dtype=None, **kw: _full_like(x, 1, dtype=dtype)


@converter("aten.scalar_tensor.default")
def _scalar_tensor(v, *, dtype=None, **kw):
    return _as(v, np_dtype(dtype) if dtype is not None else "float32")


@converter("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(start, end=None, step=1, *, dtype=None, **kw):
    if end is None:
        start, end = 0, start
    dt = np_dtype(dtype) if dtype is not None else None
    if all(isinstance(v, (int, float, str)) for v in (start, end, step)):
        return F.arange(start, end, step, dt)
    return F.arange(*[dim_tensor(v) if not isinstance(v, float) else v for v in (start, end, step)], dtype=dt)


# ------------------------------------------------------------------ sizes (SymInts), asserts, getitem
@converter("aten.sym_size.int")
def _sym_size(x, dim):
    return x.shape[_axis(dim, _rank(x))]


@converter("aten.sym_numel.default")
def _sym_numel(x):
    n = 1
    for d in x.shape:
        n = n * d
    return n


# dtype / shape metadata torch asserts: dyntvm's types check those itself (value asserts: torch_asserts.py)
CONVERTERS["aten._assert_tensor_metadata.default"] = lambda *a, **k: None
for _op in (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg):
    CONVERTERS[f"_operator.{_op.__name__}"] = _op


def _size_test(op, fn):
    """A comparison of SymInts: a Python bool where tracing decides it, else a 0-d bool tensor (a `cond` on it)."""
    def conv(a, b):
        if is_static_dim(a) and is_static_dim(b):
            return op(int(a), int(b))
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):    # dims: decided by the algebra where it can
            known = dim_compare(a, _CMP[op], b)
            if known is not None:
                return known
        return fn(dim_tensor(a), dim_tensor(b))
    return conv


_CMP = {operator.eq: "==", operator.ne: "!=", operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">="}
for _op, _fn in ((operator.eq, F.equal), (operator.ne, F.not_equal), (operator.lt, F.less),
                 (operator.le, F.less_equal), (operator.gt, F.greater), (operator.ge, F.greater_equal)):
    CONVERTERS[f"_operator.{_op.__name__}"] = _size_test(_op, _fn)
CONVERTERS["_operator.getitem"] = operator.getitem


def _sym_extreme(fn, name):
    """torch.sym_min / sym_max of two SymInts: a dim expression (min(N, M)) where both are dims, through the dim
    algebra (not text), else a 0-d value where one is a tensor (a size read from data)."""
    def conv(a, b):
        if is_static_dim(a) and is_static_dim(b):
            return fn(int(a), int(b))
        if isinstance(a, (str, int, np.integer)) and isinstance(b, (str, int, np.integer)):
            return dim_minmax(name, *(int(d) if is_static_dim(d) else d for d in (a, b)))
        return (F.minimum if fn is min else F.maximum)(dim_tensor(a), dim_tensor(b))
    return conv


CONVERTERS["torch.sym_min"] = _sym_extreme(min, "min")
CONVERTERS["torch.sym_max"] = _sym_extreme(max, "max")
