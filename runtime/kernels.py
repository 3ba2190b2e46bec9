"""Numpy kernels: the reference semantics of every non-control-flow op.

``KERNELS[op](attrs, *arrays)`` returns a tuple of numpy arrays. Eager mode and the reference
interpreter both call these, so eager results and interpreted graphs agree by construction.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.ops import DIM_ATTRS
from ..ir.types import eval_dim

KERNELS: dict = {}


def kernel(*names):
    def deco(fn):
        for n in names:
            KERNELS[n] = fn
        return fn
    return deco


def _as(x, dt):
    return np.asarray(x).astype(dt, copy=False)


def _float(x):
    return x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float32)


_erf = np.vectorize(math.erf, otypes=[np.float64])

_UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "erf": lambda x: _erf(x).astype(x.dtype),
    "gelu": lambda x: (0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))).astype(x.dtype),
    "sin": np.sin, "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "sign": np.sign, "logical_not": np.logical_not, "isnan": np.isnan,
}
_FLOAT_IN = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "erf", "sin", "cos"}


def _unary(name):
    f = _UNARY[name]

    def run(attrs, x):
        x = np.asarray(x)
        if name in _FLOAT_IN:
            x = _float(x)
        with np.errstate(all="ignore"):
            return (np.asarray(f(x)),)
    return run


for _n in _UNARY:
    KERNELS[_n] = _unary(_n)

_BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.true_divide,
    "power": np.power, "maximum": np.maximum, "minimum": np.minimum, "equal": np.equal,
    "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
}


def _binary(name):
    f = _BINARY[name]

    def run(attrs, a, b):
        with np.errstate(all="ignore"):
            return (np.asarray(f(a, b)),)
    return run


for _n in _BINARY:
    KERNELS[_n] = _binary(_n)


@kernel("where")
def _where(attrs, c, x, y):
    return (np.where(c, x, y),)


@kernel("constant")
def _constant(attrs):
    return (attrs.value,)


@kernel("matmul")
def _matmul(attrs, a, b):
    return (np.asarray(np.matmul(a, b)),)


def _reduce(fn, name):
    def run(attrs, x):
        kw = {}
        if name in ("sum", "prod") and (x.dtype == np.bool_ or (x.dtype.kind in "iu" and x.dtype.itemsize < 8)):
            kw["dtype"] = np.int64 if x.dtype.kind in "bi" else np.uint64
        if name == "mean" and x.dtype.kind not in "fc":
            kw["dtype"] = np.float64
        return (np.asarray(fn(x, axis=attrs.axis, keepdims=attrs.keepdims, **kw)),)
    return run


for _n, _f in [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min), ("prod", np.prod)]:
    KERNELS[_n] = _reduce(_f, _n)




def _arg(fn):
    def run(attrs, x):
        return (np.asarray(fn(x, axis=attrs.axis, keepdims=attrs.keepdims)).astype(np.int64),)
    return run


KERNELS["argmax"], KERNELS["argmin"] = _arg(np.argmax), _arg(np.argmin)



@kernel("reshape")
def _reshape(attrs, x, env=None):
    shape = tuple(d if isinstance(d, int) else eval_dim(d, env or {}) for d in attrs.shape)
    return (np.reshape(x, shape),)


@kernel("transpose")
def _transpose(attrs, x):
    return (np.transpose(x, attrs.axes),)


@kernel("expand_dims")
def _expand_dims(attrs, x):
    return (np.expand_dims(x, attrs.axis),)


@kernel("squeeze")
def _squeeze(attrs, x):
    axis = attrs.axis
    if axis is None:
        return (np.squeeze(x),)
    return (np.squeeze(x, axis=axis),)


@kernel("concat")
def _concat(attrs, *xs):
    return (np.concatenate(xs, axis=attrs.axis),)


@kernel("stack")
def _stack(attrs, *xs):
    return (np.stack(xs, axis=attrs.axis),)


@kernel("split")
def _split(attrs, x):
    sec = attrs.sections if isinstance(attrs.sections, int) else list(attrs.sections)
    return tuple(np.split(x, sec, axis=attrs.axis))


@kernel("slice")
def _slice(attrs, x):
    idx = [slice(None)] * x.ndim
    for ax, s0, s1, st in zip(attrs.axes, attrs.starts, attrs.stops, attrs.steps):
        idx[ax] = slice(s0, s1, st)
    return (x[tuple(idx)],)


@kernel("take")
def _take(attrs, x, idx):
    n = x.shape[attrs.axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"take: index out of range for axis {attrs.axis} of size {n}")
    return (np.take(x, idx, axis=attrs.axis),)


@kernel("broadcast_to")
def _broadcast_to(attrs, x, env=None):
    shape = tuple(d if isinstance(d, int) else eval_dim(d, env or {}) for d in attrs.shape)
    return (np.ascontiguousarray(np.broadcast_to(x, shape)),)


@kernel("tile")
def _tile(attrs, x):
    return (np.tile(x, attrs.reps),)


@kernel("pad")
def _pad(attrs, x):
    return (np.pad(x, attrs.pad_width, constant_values=np.asarray(attrs.value).astype(x.dtype)),)


@kernel("cast")
def _cast(attrs, x):
    return (np.asarray(x).astype(attrs.dtype),)


@kernel("softmax")
def _softmax(attrs, x):
    x = _float(x)
    e = np.exp(x - np.max(x, axis=attrs.axis, keepdims=True)) if x.size else x
    return (e / np.sum(e, axis=attrs.axis, keepdims=True),)


@kernel("log_softmax")
def _log_softmax(attrs, x):
    x = _float(x)
    if not x.size:
        return (x,)
    s = x - np.max(x, axis=attrs.axis, keepdims=True)
    return (s - np.log(np.sum(np.exp(s), axis=attrs.axis, keepdims=True)),)


@kernel("layer_norm")
def _layer_norm(attrs, x, g, b):
    x = _float(x)
    axes = tuple(range(x.ndim - g.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (((x - mean) / np.sqrt(var + x.dtype.type(attrs.eps)) * g + b).astype(x.dtype),)


@kernel("full")
def _full(attrs, env=None):
    shape = tuple(d if isinstance(d, int) else eval_dim(d, env or {}) for d in attrs.shape)
    return (np.full(shape, attrs.fill_value, dtype=attrs.dtype),)


@kernel("full_like")
def _full_like(attrs, x):
    return (np.full(x.shape, attrs.fill_value, dtype=attrs.dtype or x.dtype),)


@kernel("arange")
def _arange(attrs, env=None):
    start, stop = (eval_dim(d, env or {}) if isinstance(d, str) else d for d in (attrs.start, attrs.stop))
    return (np.arange(start, stop, attrs.step, dtype=attrs.dtype),)


@kernel("boolean_mask")
def _boolean_mask(attrs, x, mask):
    if x.shape[attrs.axis] != mask.shape[0]:
        raise IndexError(f"boolean_mask: mask of length {mask.shape[0]} does not match axis "
                         f"{attrs.axis} of size {x.shape[attrs.axis]}")
    return (np.compress(mask, x, axis=attrs.axis),)


@kernel("nonzero")
def _nonzero(attrs, x):
    nz = np.nonzero(x) if x.ndim else np.nonzero(np.atleast_1d(x))[:0]
    return (np.stack(nz).astype(np.int64) if nz else np.zeros((0, int(np.count_nonzero(x))), np.int64),)


@kernel("unique")
def _unique(attrs, x):
    res = np.unique(x, return_inverse=attrs.return_inverse, return_counts=attrs.return_counts)
    if not isinstance(res, tuple):
        return (res,)
    out = [res[0]]
    i = 1
    if attrs.return_inverse:
        out.append(np.reshape(res[i], x.shape).astype(np.int64))
        i += 1
    if attrs.return_counts:
        out.append(res[i].astype(np.int64))
    return tuple(out)


@kernel("arange_dyn")
def _arange_dyn(attrs, start, stop, step):
    return (np.arange(start.item(), stop.item(), step.item(), dtype=attrs.dtype),)


@kernel("shape_of")
def _shape_of(attrs, x):
    return (np.asarray(x.shape, dtype=np.int64),)


@kernel("reshape_dyn")
def _reshape_dyn(attrs, x, shape):
    return (np.reshape(x, tuple(int(d) for d in shape)),)


def _topk_impl(attrs, x, k):
    ax = attrs.axis % x.ndim
    n = x.shape[ax]
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} must be in [0, {n}] for axis {ax}")
    key = x
    if attrs.largest:            # ~ reverses the order of ints and bools without overflow
        key = -x if x.dtype.kind in "fc" else ~x
    idx = np.argsort(key, axis=ax, kind="stable")
    idx = np.take(idx, np.arange(k), axis=ax)
    return (np.take_along_axis(x, idx, axis=ax), idx.astype(np.int64))


@kernel("topk")
def _topk(attrs, x):
    return _topk_impl(attrs, x, attrs.k)


@kernel("topk_dyn")
def _topk_dyn(attrs, x, k):
    return _topk_impl(attrs, x, int(k))


# Kernels that need the symbol environment (ops whose attrs may hold symbolic dims).
NEEDS_ENV = set(DIM_ATTRS)
