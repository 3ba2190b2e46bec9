"""Numpy kernels: the reference semantics of every non-control-flow op.

``KERNELS[op](attrs, *arrays)`` returns a tuple of numpy arrays; ops with symbolic dims in their attrs
(`OpDef.dim_attrs`) also take ``env=`` (symbol values), see `run_kernel`. Eager mode, the reference
interpreter and the executor all call these, so they agree by construction. A kernel is registered with
`@kernel(name)`. The elementwise groups' members get theirs from one loop over `ops_in(group)`, which adds
the group's dtype handling around ``np.<name>``, or around the function registered with
`@elementwise(name)` where numpy's is named differently or missing.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.attrs import AxesAttrs
from ..ir.ops import Group, get_op, ops_in
from ..ir.types import eval_dim
from . import kernels_index, kernels_lists, kernels_nn, kernels_shape

KERNELS: dict = {}


def kernel(*names):
    def deco(fn):
        for n in names:
            if n in KERNELS:
                raise ValueError(f"kernel for {n!r} registered twice")
            KERNELS[n] = fn
        return fn
    return deco


def run_kernel(node_op: str, attrs, arrays, env=None):
    """Run op `node_op`'s kernel; `env` (symbol values) is passed to ops with symbolic attrs."""
    fn = KERNELS[node_op]
    if get_op(node_op).dim_attrs:
        return fn(attrs, *arrays, env=env or {})
    return fn(attrs, *arrays)


def _in_result_dtype(op: str, x):
    """`x` in the dtype op `op` computes in (float ops on integer inputs compute in float32)."""
    return np.asarray(x).astype(get_op(op).result_dtype([np.asarray(x).dtype.name]), copy=False)


def _attr_shape(shape, env):
    return tuple(d if isinstance(d, int) else eval_dim(d, env) for d in shape)


# ------------------------------------------------------------------------ elementwise families
_erf = np.vectorize(math.erf, otypes=[np.float64])
_ELEMENTWISE: dict = {}      # numpy functions of group members that are not simply np.<name>


def elementwise(name):
    def deco(fn):
        _ELEMENTWISE[name] = fn
        return fn
    return deco


elementwise("rsqrt")(lambda x: 1.0 / np.sqrt(x))
elementwise("sigmoid")(lambda x: 1.0 / (1.0 + np.exp(-x)))
elementwise("erf")(lambda x: _erf(x).astype(x.dtype))
elementwise("gelu")(lambda x: (0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))).astype(x.dtype))
elementwise("relu")(lambda x: np.maximum(x, np.zeros((), x.dtype)))
elementwise("neg")(np.negative)
elementwise("divide")(np.true_divide)


def _family_kernel(name):
    f = _ELEMENTWISE.get(name) or getattr(np, name, None)
    if f is None:
        raise NotImplementedError(f"op {name!r} is in a group but numpy has no np.{name}: register its numpy "
                                  f"function with @elementwise({name!r}) above this loop in runtime/kernels.py")
    opdef = get_op(name)
    to_float = opdef.group is Group.FLOAT_UNARY

    def run(attrs, *xs):
        if to_float:
            xs = [_in_result_dtype(name, x) for x in xs]
        with np.errstate(all="ignore"):
            return (np.asarray(f(*xs)),)
    run.__name__ = name
    return run


for _g in (Group.FLOAT_UNARY, Group.UNARY, Group.PREDICATE, Group.ARITH, Group.COMPARE, Group.LOGICAL):
    for _n in ops_in(_g):
        kernel(_n)(_family_kernel(_n))


def _reduce_kernel(name):
    f = getattr(np, name)
    dtype_rule = get_op(name).result_dtype

    def run(attrs, x):
        dt = dtype_rule([x.dtype.name], attrs)
        kw = {"dtype": dt} if dt != x.dtype.name else {}
        return (np.asarray(f(x, axis=attrs.axis, keepdims=attrs.keepdims, **kw)),)
    return run


for _n in ops_in(Group.REDUCE):
    kernel(_n)(_reduce_kernel(_n))
for _n in ops_in(Group.ARG_REDUCE):
    kernel(_n)(lambda attrs, x, f=getattr(np, _n): (
        np.asarray(f(x, axis=attrs.axis, keepdims=attrs.keepdims)).astype(np.int64),))


@kernel("clip")
def _clip(attrs, x):
    lo, hi = attrs.bounds(x.dtype)
    with np.errstate(all="ignore"):      # min(max(x, a_min), a_max), like np.clip (a_min > a_max gives a_max)
        return (np.asarray(np.clip(x, lo, hi)) if lo is not None or hi is not None else x.copy(),)


@kernel("where")
def _where(attrs, c, x, y):
    return (np.where(c, x, y),)


@kernel("assert_dims_equal")
def _assert_dims_equal(attrs, a, b):
    return (b,)         # the equality is a DimCheck on the node, run before it (runtime/dim_check_run.py)


@kernel("constant")
def _constant(attrs):
    return (attrs.value,)


@kernel("matmul")
def _matmul(attrs, a, b):
    return (np.asarray(np.matmul(a, b)),)


@kernel("reshape")
def _reshape(attrs, x, env):
    return (np.reshape(x, _attr_shape(attrs.shape, env)),)


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
def _broadcast_to(attrs, x, env):
    return (np.ascontiguousarray(np.broadcast_to(x, _attr_shape(attrs.shape, env))),)


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
    x = _in_result_dtype("softmax", x)
    e = np.exp(x - np.max(x, axis=attrs.axis, keepdims=True)) if x.size else x
    return (e / np.sum(e, axis=attrs.axis, keepdims=True),)


@kernel("log_softmax")
def _log_softmax(attrs, x):
    x = _in_result_dtype("log_softmax", x)
    if not x.size:
        return (x,)
    s = x - np.max(x, axis=attrs.axis, keepdims=True)
    return (s - np.log(np.sum(np.exp(s), axis=attrs.axis, keepdims=True)),)


@kernel("layer_norm")
def _layer_norm(attrs, x, g, b):
    x = _in_result_dtype("layer_norm", x)
    axes = tuple(range(x.ndim - g.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (((x - mean) / np.sqrt(var + x.dtype.type(attrs.eps)) * g + b).astype(x.dtype),)


@kernel("full")
def _full(attrs, env):
    return (np.full(_attr_shape(attrs.shape, env), attrs.fill_value, dtype=attrs.dtype),)


@kernel("full_like")
def _full_like(attrs, x):
    return (np.full(x.shape, attrs.fill_value, dtype=attrs.dtype or x.dtype),)


@kernel("arange")
def _arange(attrs, env):
    start, stop = (eval_dim(d, env) if isinstance(d, str) else d for d in (attrs.start, attrs.stop))
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
    ax = attrs.axis
    if ax is not None and x.ndim == 0:
        raise ValueError(f"unique: axis {ax} of a 0-d tensor")
    want_idx = attrs.return_index or not attrs.sorted           # (only what is asked: the index needs a stable sort)
    res = np.unique(x, return_index=want_idx, return_inverse=attrs.return_inverse,
                    return_counts=attrs.return_counts, axis=ax)
    res = list(res) if isinstance(res, tuple) else [res]
    y = res.pop(0)
    idx = res.pop(0) if want_idx else None
    inv = res.pop(0).reshape(-1) if attrs.return_inverse else None
    cnt = res.pop(0) if attrs.return_counts else None
    if not attrs.sorted:                         # in the order of first occurrence
        order = np.argsort(idx, kind="stable")
        idx = idx[order]
        if inv is not None:
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            inv = rank[inv]
        cnt = None if cnt is None else cnt[order]
        y = np.take(x.reshape(-1), idx) if ax is None else np.take(x, idx, axis=ax)
    out = [y]
    if attrs.return_index:
        out.append(idx.astype(np.int64))
    if attrs.return_inverse:
        out.append((inv.reshape(x.shape) if ax is None else inv).astype(np.int64))
    if attrs.return_counts:
        out.append(cnt.astype(np.int64))
    return tuple(out)


@kernel("slice_dyn")
def _slice_dyn(attrs, x, starts, stops, steps):
    if not len(starts) == len(stops) == len(steps) == len(attrs.axis):
        raise ValueError(f"slice: {len(starts)} starts, {len(stops)} stops and {len(steps)} steps for "
                         f"{len(attrs.axis)} axes")
    if not np.all(steps):
        raise ValueError(f"slice: a step is 0 (steps {steps.tolist()})")
    idx = [slice(None)] * x.ndim
    for ax, a, b, s in zip(attrs.axis, starts.tolist(), stops.tolist(), steps.tolist()):
        idx[ax] = slice(a, b, s)                 # Python's clamping (ONNX Slice's too)
    return (np.ascontiguousarray(x[tuple(idx)]),)


@kernel("arange_dyn")
def _arange_dyn(attrs, start, stop, step):
    a, b, d = start.item(), stop.item(), step.item()
    if d == 0:
        raise ValueError(f"arange: the step is 0 (start {a}, stop {b})")
    n = (b - a) / d
    if not math.isfinite(n):
        raise ValueError(f"arange: start {a}, stop {b} and step {d} give no finite length")
    kernels_shape.allocatable((max(math.ceil(n), 0),), attrs.dtype, "arange length")   # before numpy tries
    return (np.arange(a, b, d, dtype=attrs.dtype),)


@kernel("shape_of")
def _shape_of(attrs, x):
    return (np.asarray(x.shape, dtype=np.int64),)


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


kernel("conv")(kernels_nn.conv)             # the sliding-window ops: runtime/kernels_nn.py
kernel("max_pool")(kernels_nn.max_pool)
kernel("avg_pool")(kernels_nn.avg_pool)
kernel("reshape_dyn")(kernels_shape.reshape_dyn)     # ops taking a shape tensor: runtime/kernels_shape.py
kernel("broadcast_to_dyn")(kernels_shape.broadcast_to_dyn)
kernel("tile_dyn")(kernels_shape.tile_dyn)
kernel("slice_axes_dyn")(lambda attrs, x, starts, stops, steps, axes: _slice_dyn(
    AxesAttrs(kernels_shape.slice_axes(x, axes)), x, starts, stops, steps))
for _name, _fn in kernels_lists.KERNELS.items():     # the list ops: runtime/kernels_lists.py
    kernel(_name)(_fn)
for _n in ("cumsum", "scatter_flat", "roi_align", "nms"):     # the index / detection ops: runtime/kernels_index.py
    kernel(_n)(getattr(kernels_index, _n))
