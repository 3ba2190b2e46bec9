"""The `F` namespace: every op, usable eagerly on numpy arrays and while tracing.

Each function checks its arguments, builds the op's attrs, then either runs the numpy kernel (eager:
no tensor argument is traced) or records a node (tracing). Eager results are the reference semantics.
"""
from __future__ import annotations

import builtins

import numpy as np

from dyntvm.errors import ExecutionError

from ..ir import attrs as A
from ..ir import ops as O
from ..ir.ops_shape_tensors import BroadcastDynAttrs, ReshapeDynAttrs, ShapeTensorAttrs
from ..runtime.kernels import run_kernel
from ..ir.shapes import ShapeError, broadcast_shapes
from ..ir.types import TensorType, is_static_dim, same_dim
from .shape_values import as_dim, known_of
from .tracer import Tensor, as_array, current, infer_types, source_hint, trace_error, tracing, user_source



def _is_traced(args) -> bool:
    return any(isinstance(a, Tensor) for a in args)


def _scalar_dtype(x, other: np.dtype) -> str:
    """dtype of a Python scalar next to a tensor of dtype `other`: numpy's rule for Python scalars (NEP 50),
    so that `x + 1.5` has one dtype eagerly (numpy operators) and traced."""
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, int):
        return other.name if other.kind in "iuf" else "int64"
    return other.name if other.kind == "f" else "float64"


def _prep(api: str, args: list, positions=(0, 1)) -> list:
    """Python scalars at `positions` take the dtype of the tensor/array at the other positions."""
    ref = next((args[i] for i in positions if isinstance(args[i], (Tensor, np.ndarray, np.generic))), None)
    out = list(args)
    for i in positions:
        a = args[i]
        if type(a) in (bool, int, float) and ref is not None:     # numpy scalars keep their dtype
            dt = _scalar_dtype(a, np.dtype(ref.dtype))
            try:
                out[i] = np.asarray(a, dt)
            except OverflowError:
                raise trace_error(f"{api}: the Python int {a} does not fit {dt}, the dtype of the tensor next to "
                                  f"it; cast the tensor first (F.cast(x, 'int64'))") from None
    return out


def apply(api: str, op: str, args: list, attrs=None):
    """Run (eager) or record (tracing) `op` on `args`; returns a list of outputs.

    Ops without tensor inputs (`full`, `arange`) are recorded whenever a trace is active."""
    attrs = A.NoAttrs() if attrs is None else attrs
    for a in args:
        if isinstance(a, str):
            raise trace_error(f"{api}: got the symbolic dim {a!r} where a tensor is expected; use "
                              "F.shape_of(x)[i] for the size of an axis as a tensor")
    if _is_traced(args) or (not args and tracing()):
        if not tracing():
            raise trace_error(f"{api}: got a traced tensor outside of dt.trace (it escaped a finished trace)")
        b = current()
        vals = [a.value if isinstance(a, Tensor) else b.constant(as_array(a)) for a in args]
        return [Tensor(v, b) for v in b.emit(op, vals, attrs, api=api)]
    arrays = [as_array(a) for a in args]
    try:
        in_types = [TensorType(a.shape, a.dtype) for a in arrays]
    except ShapeError as e:
        raise trace_error(f"{api}: {e}") from None
    infer_types(op, api, in_types, attrs)          # eager accepts what tracing accepts, with the same error
    try:
        return list(run_kernel(op, attrs, arrays))
    except Exception as e:       # the same error a graph run gives: the op, the condition, the user's line
        src = user_source()
        raise ExecutionError(f"{api} failed: {str(e).strip() or type(e).__name__}" + (f"\n    at {src}" if src else ""),
                             op=op, source=src) from e


def _attrs_of(api: str, cls, *args):
    """`cls(*args)`, with a bad argument reported as a TraceError naming `api`."""
    try:
        return cls(*args)
    except (TypeError, ValueError) as e:
        raise trace_error(f"{api}: {e}") from None


def _one(api, op, args, attrs=None):
    return apply(api, op, args, attrs)[0]


def _generated(opdef):
    """The `F` function of a registered op: ``F.<api>(*tensors, *attrs fields)`` (the attrs class
    normalises its fields, e.g. an int axis to a tuple)."""
    import dataclasses
    import inspect
    n_in, attrs_cls = opdef.num_inputs, opdef.attrs
    tensor_names = ["x"] if n_in == 1 else ["a", "b"] if n_in == 2 else [f"x{i}" for i in range(n_in)]
    if opdef.name == "where":
        tensor_names = ["cond", "x", "y"]
    elif opdef.name == "take":
        tensor_names = ["x", "indices"]
    elif opdef.name == "layer_norm":
        tensor_names = ["x", "gamma", "beta"]
    fields = dataclasses.fields(attrs_cls)
    P = inspect.Parameter
    params = [P(t, P.POSITIONAL_OR_KEYWORD) for t in tensor_names] + [
        P(f.name, P.POSITIONAL_OR_KEYWORD, **({} if f.default is dataclasses.MISSING else {"default": f.default}))
        for f in fields]
    sig = inspect.Signature(params)
    op, api, promote = opdef.name, opdef.api, opdef.promote_scalars

    def f(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise trace_error(f"{api}: {e}; signature is {api}{sig}") from None
        bound.apply_defaults()
        vals = list(bound.arguments.values())
        tensors = vals[:n_in]
        attrs = _attrs_of(api, attrs_cls, *vals[n_in:])
        return _one(api, op, _prep(api, tensors, promote) if promote else tensors, attrs)
    f.__name__ = f.__qualname__ = api
    f.__signature__ = sig
    f.__doc__ = opdef.doc
    f.__module__ = __name__
    return f


_F = {d.api: _generated(d) for d in O.all_ops().values() if d.api}     # generated F functions
globals().update(_F)
negative, astype = _F["neg"], _F["cast"]


def _shape_tensor(shape, api):
    """A shape given as data: a traced 1-d integer tensor, a 0-d one (one dim), or a list holding 0-d traced
    tensors (``(F.shape_of(x)[0], 4)``), as a 1-d int64 tensor; None for a shape of ints and dims (static)."""
    if isinstance(shape, (Tensor, np.ndarray)):     # (an array too: data, checked when the op runs, as traced)
        if np.dtype(shape.dtype).kind not in "iu" or shape.ndim > 1:
            raise trace_error(f"{api}: a shape tensor must be a 1-d integer tensor, got "
                              f"{shape.type if isinstance(shape, Tensor) else f'{shape.dtype}{list(shape.shape)}'}")
        return shape if shape.ndim else _F["expand_dims"](shape, 0)
    if isinstance(shape, (list, tuple)) and any(isinstance(d, Tensor) for d in shape):
        for d in shape:
            if isinstance(d, Tensor) and (d.ndim or np.dtype(d.dtype).kind not in "iu"):
                raise trace_error(f"{api}: a shape entry given as a tensor must be a 0-d integer tensor, got "
                                  f"{d.type}")
            if isinstance(d, str):
                raise trace_error(f"{api}: a shape mixing tensors and symbolic dims: use F.shape_of(x)[i] "
                                  f"for the dim {d!r}")
        return stack([_F["cast"](d, "int64") if isinstance(d, Tensor) else np.int64(d) for d in shape])
    return None


def _dims(shape, api):
    if isinstance(shape, (int, np.integer, str)):
        shape = (shape,)
    out = []
    for d in shape:
        if isinstance(d, (int, np.integer)):
            out.append(int(d))
        elif isinstance(d, str):
            out.append(str(d))           # a plain str, not the SymDim that x.shape gives
        else:
            raise trace_error(f"{api}: shape entries must be ints or dims from x.shape, got {d!r}")
    return tuple(out)


def reshape(x, shape):
    """`np.reshape`; one -1 allowed; symbolic dims from `x.shape` allowed. `shape` may be a 1-d integer tensor
    (or hold 0-d ones) computed at run time: its entries known while tracing are the dims (``F.shape_of(y)``
    keeps y's symbols), the others are known when it runs."""
    st = _shape_tensor(shape, "reshape")
    if st is not None:
        return _one("reshape", "reshape_dyn", [x, st], ReshapeDynAttrs())
    return _one("reshape", "reshape", [x], A.ShapeAttrs(_dims(shape, "reshape")))


def concat(xs, axis=0):
    """`np.concatenate`."""
    return _one("concat", "concat", _prep("concat", list(xs), range(len(xs))),
                _attrs_of("concat", A.AxisAttrs, axis))


concatenate = concat


def stack(xs, axis=0):
    """`np.stack`."""
    return _one("stack", "stack", _prep("stack", list(xs), range(len(xs))), _attrs_of("stack", A.AxisAttrs, axis))


def split(x, sections, axis=0):
    """`np.split`: `sections` is a count of equal parts or a list of split indices. Returns a list."""
    return apply("split", "split", [x], _attrs_of("split", A.SplitAttrs, sections, axis))


def slice(x, starts, stops, steps=None, axes=None):
    """`x[starts[i]:stops[i]:steps[i]]` along `axes` (default: the first len(starts) axes). Bounds and steps
    are ints (None: to the end), or each a 1-d integer tensor with one entry per axis: a data-dependent slice
    (Python's clamping; its sliced dims are known when it runs, or while tracing where the bounds are known:
    ``F.shape_of(y)[0]`` as a bound keeps y's symbol). `axes` may be a 1-d integer tensor too."""
    if any(isinstance(v, Tensor) for v in (starts, stops, steps, axes)):
        return _slice_dyn(x, starts, stops, steps, axes)
    n = len(starts)
    axes = tuple(range(n)) if axes is None else tuple(int(a) for a in axes)
    steps = (1,) * n if steps is None else tuple(steps)
    def norm(v):
        if v is None or isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            return None if v is None else int(v)
        raise trace_error(f"slice: bounds and steps must be Python ints or None, or 1-d integer tensors, got "
                          f"{v!r}")
    return _one("slice", "slice", [x], A.SliceAttrs(axes, tuple(map(norm, starts)), tuple(map(norm, stops)),
                                                    tuple(norm(s) for s in steps)))


def _slice_dyn(x, starts, stops, steps, axes):
    first = starts if starts is not None else stops
    n = (axes.shape[0] if axes.ndim == 1 else None) if isinstance(axes, Tensor) else len(axes) if axes is not None \
        else first.shape[0] if isinstance(first, Tensor) and first.ndim == 1 else \
        len(first) if isinstance(first, (list, tuple, np.ndarray)) else None
    if not isinstance(n, int):
        raise trace_error("slice: with tensor bounds give `axes`, or bounds of a static length (one per axis)")
    axes_t = _F["cast"](axes, "int64") if isinstance(axes, Tensor) else None
    axes = tuple(range(n)) if axes is None or axes_t is not None else tuple(int(a) for a in axes)
    if steps is None:
        steps = [1] * n
    big = np.iinfo(np.int64).max

    def vec(v, end):
        if isinstance(v, Tensor):
            return _F["cast"](v, "int64") if np.dtype(v.dtype) != np.int64 else v
        v = [None] * n if v is None else list(v)
        if any(e is None for e in v) and isinstance(steps, Tensor):
            raise trace_error("slice: a None bound needs the steps known when tracing (its end depends on the sign)")
        return np.asarray([(big if (s > 0) == end else -big) if e is None else e
                           for e, s in zip(v, [1] * len(v) if isinstance(steps, Tensor) else steps)], np.int64)
    bounds = [x, vec(starts, False), vec(stops, True), vec(steps, True)]
    if axes_t is not None:
        return _one("slice", "slice_axes_dyn", bounds + [axes_t])
    return _one("slice", "slice_dyn", bounds, _attrs_of("slice", A.AxesAttrs, axes))


strided_slice = slice


def getitem(x, idx):
    """numpy basic indexing (ints, slices, None, ...) plus an int tensor (take) or bool tensor (mask)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if len(idx) == 1 and isinstance(idx[0], list):
        idx = (np.asarray(idx[0]),)
    if len(idx) == 1 and isinstance(idx[0], (Tensor, np.ndarray)) and not isinstance(idx[0], (int, np.integer)):
        i = idx[0]
        if np.dtype(i.dtype) == np.bool_:
            return boolean_mask(x, i)
        return _F["take"](x, i, axis=0)
    ndim = x.ndim if isinstance(x, Tensor) else np.ndim(x)
    n_real = builtins.sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > ndim:
        raise trace_error(f"index {idx} has too many entries for a tensor of rank {ndim}")
    expanded = []
    for i in idx:
        if i is Ellipsis:
            expanded.extend([builtins.slice(None)] * (ndim - n_real))
        else:
            expanded.append(i)
    axes, starts, stops, steps, squeeze_axes, new_axes, takes = [], [], [], [], [], [], []
    ax = 0
    out_pos = 0
    for i in expanded:
        if i is None:
            new_axes.append(out_pos)
            out_pos += 1
            continue
        if isinstance(i, (bool, np.bool_)):
            raise trace_error(f"unsupported index {i!r}; use ints, slices, None, or one int/bool tensor")
        if isinstance(i, (int, np.integer)):
            i = int(i)
            d = (x.shape if isinstance(x, Tensor) else np.shape(x))[ax]
            if isinstance(d, int) and not -d <= i < d:
                raise trace_error(f"index {i} is out of range for axis {ax} of size {d}")
            if isinstance(d, int):
                axes.append(ax), starts.append(i), stops.append(i + 1 if i != -1 else None), steps.append(1)
                squeeze_axes.append(ax)
            else:           # a symbolic axis: a take, whose run-time check names the index and the axis size
                takes.append((ax, i))
        elif isinstance(i, builtins.slice):
            if i != builtins.slice(None):
                axes.append(ax), starts.append(i.start), stops.append(i.stop), steps.append(1 if i.step is None else i.step)
            out_pos += 1
        else:
            raise trace_error(f"unsupported index {i!r}; use ints, slices, None, or one int/bool tensor")
        ax += 1
    y = slice(x, starts, stops, steps, axes) if axes else x
    for ax, i in reversed(takes):
        y = _F["take"](y, np.int64(i), axis=ax)
    if squeeze_axes:
        y = _F["squeeze"](y, tuple(a - builtins.sum(1 for t, _ in takes if t < a) for a in squeeze_axes))
    for p in new_axes:
        y = _F["expand_dims"](y, p)
    return y


def embedding(ids, weight):
    """Embedding lookup: `weight[ids]`."""
    return _F["take"](weight, ids, axis=0)


def broadcast_to(x, shape):
    """`np.broadcast_to` (materialized). `shape` may be a 1-d integer tensor (see `reshape`)."""
    st = _shape_tensor(shape, "broadcast_to")
    if st is not None:
        return _one("broadcast_to", "broadcast_to_dyn", [x, st], BroadcastDynAttrs())
    return _one("broadcast_to", "broadcast_to", [x], A.ShapeAttrs(_dims(shape, "broadcast_to")))


def expand(x, shape):
    """ONNX `Expand`: x broadcast with `shape` both ways (numpy's rule on the two shapes: an entry 1 keeps x's
    dim, and the result may have more dims than `shape`). `shape` may be a 1-d integer tensor (see `reshape`)."""
    st = _shape_tensor(shape, "expand")
    if st is None:
        dims = _dims(shape, "expand")
        if any(isinstance(d, str) for d in dims):       # symbolic dims: the broadcast of the two shapes
            return broadcast_to(x, broadcast_shapes(x.type.shape if isinstance(x, Tensor) else np.shape(x),
                                                      dims))
        st = np.asarray(dims, np.int64)
    return _one("expand", "broadcast_to_dyn", [x, st], BroadcastDynAttrs(bidirectional=True))


def tile(x, reps):
    """`np.tile`. `reps` may be a 1-d integer tensor computed at run time (see `reshape`; negative repeats
    raise)."""
    st = _shape_tensor(reps, "tile")
    if st is None:
        return _one("tile", "tile", [x], _attrs_of("tile", A.TileAttrs, reps))
    return _one("tile", "tile_dyn", [x, st], ShapeTensorAttrs())


def one_hot(indices, depth, axis=-1, dtype="float32"):
    """One-hot encoding (like `jax.nn.one_hot`): a new axis `axis` of `depth` entries, 1 where the position
    equals the index (an index outside [0, depth) gives all zeros). `depth` is an int, a dim from `x.shape` or a
    0-d integer tensor computed at run time (a negative one raises)."""
    if isinstance(depth, (Tensor, np.ndarray)):
        one_element = depth.ndim <= 1 and all(is_static_dim(d, 1) for d in depth.shape)
        if np.dtype(depth.dtype).kind not in "iu" or not one_element:
            raise trace_error(f"one_hot: depth must be an integer with one element, got {depth.dtype}"
                              f"{list(depth.shape)}")
        known = known_of(depth) if isinstance(depth, Tensor) else None
        if known is not None and as_dim(known[0]) is not None:
            depth = known[0]            # a size known while tracing (F.shape_of(x)[1]): its dim
        else:                           # known when it runs: checked then (a depth-sized vector of zeros
            with source_hint(f"{user_source()} (checks that the depth of one_hot is >= 0)"):
                check = zeros(reshape(depth, (1,)), "int64")    # refuses a negative one), then the positions
            depth = _F["cast"](reshape(depth, ()), "int64") + _F["sum"](check)
    if isinstance(depth, (int, np.integer)) and depth < 0:
        raise trace_error(f"one_hot: depth {depth} is negative")
    positions = arange(depth)
    nd = (indices.ndim if isinstance(indices, Tensor) else np.ndim(indices)) + 1
    if not -nd <= axis < nd:
        raise trace_error(f"one_hot: axis {axis} is out of range for a result of rank {nd}")
    along = tuple(positions.shape[0] if k == axis % nd else 1 for k in range(nd))
    hot = _F["equal"](_F["expand_dims"](_F["cast"](indices, "int64"), axis % nd), reshape(positions, along))
    return hot if np.dtype(dtype) == np.bool_ else _F["cast"](hot, np.dtype(dtype).name)


def flatten(x, start_axis=0, end_axis=-1):
    """Merge axes `start_axis..end_axis` into one (torch.flatten). Default: to 1-d."""
    shape = x.shape if isinstance(x, Tensor) else np.shape(x)
    nd = len(shape)
    if nd == 0:
        return reshape(x, (1,))
    s, e = start_axis % nd, end_axis % nd
    merged = 1                   # not -1: numpy cannot infer -1 next to a 0 dim
    for d in shape[s:e + 1]:
        merged = d * merged
    return reshape(x, tuple(shape[:s]) + (merged,) + tuple(shape[e + 1:]))


def pad(x, pad_width, value=0.0):
    """`np.pad(x, pad_width, constant_values=value)` (constant mode)."""
    ndim = x.ndim if isinstance(x, Tensor) else np.ndim(x)
    pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (ndim, 2))
    return _one("pad", "pad", [x], A.PadAttrs(tuple((int(a), int(b)) for a, b in pw), float(value)))




def softmax(x, axis=-1):
    """Softmax along `axis`."""
    return _one("softmax", "softmax", [x], _attrs_of("softmax", A.AxisAttrs, axis))


def log_softmax(x, axis=-1):
    """Log-softmax along `axis`."""
    return _one("log_softmax", "log_softmax", [x], _attrs_of("log_softmax", A.AxisAttrs, axis))


def full(shape, fill_value, dtype=None):
    """`np.full`; dtype defaults to float32 for floats, int64 for ints, bool for bools. `shape` may be a 1-d
    integer tensor computed at run time (see `reshape`); so may that of `zeros` and `ones`."""
    return _full(shape, fill_value, dtype, "full")


def _full(shape, fill_value, dtype, api):
    """`full` under the name the user called (zeros, ones: their errors name them)."""
    if dtype is None:
        dtype = as_array(fill_value).dtype
    st = _shape_tensor(shape, api)
    if st is not None:          # a shape tensor: the fill value broadcast to it
        value = np.asarray(_pyscalar(fill_value, api), np.dtype(dtype))
        return _one(api, "broadcast_to_dyn", [value, st], BroadcastDynAttrs())
    return _one(api, "full", [], _attrs_of(api, A.FullAttrs, _dims(shape, api),
                                           _pyscalar(fill_value, api), np.dtype(dtype).name))


def _pyscalar(v, api):
    v = v.item() if isinstance(v, (np.generic, np.ndarray)) and np.size(v) == 1 else v
    if not isinstance(v, (bool, int, float)):
        raise trace_error(f"{api}: expected a Python or numpy scalar, got {v!r}; for a tensor value use "
                          "F.full_like(x, 0) + value")
    return v


def zeros(shape, dtype="float32"):
    """`np.zeros` (float32 by default)."""
    return _full(shape, 0, dtype, "zeros")


def ones(shape, dtype="float32"):
    """`np.ones` (float32 by default)."""
    return _full(shape, 1, dtype, "ones")


def full_like(x, fill_value, dtype=None):
    """`np.full_like`."""
    attrs = _attrs_of("full_like", A.FullLikeAttrs, _pyscalar(fill_value, "full_like"),
                      None if dtype is None else np.dtype(dtype).name)
    return _one("full_like", "full_like", [x], attrs)


def zeros_like(x, dtype=None):
    """`np.zeros_like`."""
    return full_like(x, 0, dtype)


def ones_like(x, dtype=None):
    """`np.ones_like`."""
    return full_like(x, 1, dtype)


def arange(start, stop=None, step=1, dtype=None):
    """`np.arange`; tensor bounds give a data-dependent length. dtype: int64 for ints, else float32."""
    if stop is None:
        start, stop = 0, start
    bounds = [start, stop, step]
    if dtype is None:
        kinds = [np.dtype(b.dtype).kind if isinstance(b, (Tensor, np.ndarray, np.generic)) else
                 ("f" if isinstance(b, float) else "i") for b in bounds]     # a symbolic dim (str) is "i"
        dtype = "float32" if "f" in kinds else "int64"
    dtype = np.dtype(dtype).name
    if _is_traced(bounds):
        return _one("arange", "arange_dyn", [_F["cast"](b, dtype) if isinstance(b, Tensor) else np.asarray(b, dtype)
                                             for b in bounds], A.DtypeAttrs(dtype))
    return _one("arange", "arange", [], A.ArangeAttrs(*[str(b) if isinstance(b, str) else _pyscalar(b, "arange")
                                                         for b in bounds], dtype))


# ------------------------------------------------------------------- sliding windows (ir/ops_nn.py)
def _spatial_rank(api, x) -> int:
    nd = x.ndim if isinstance(x, Tensor) else np.ndim(x)
    if not 3 <= nd <= 5:
        raise trace_error(f"{api}: x must have axes N, C and 1 to 3 spatial axes (rank 3 to 5), got rank {nd}")
    return nd - 2


def _per_axis(api, what, v, nsp) -> tuple:
    """An int for every spatial axis, or one per axis."""
    if isinstance(v, str) or np.ndim(v) == 0:
        return (v,) * nsp
    v = tuple(v)
    if len(v) != nsp:
        raise trace_error(f"{api}: {what} needs one entry per spatial axis ({nsp}), got {v}")
    return v


def _window_pads(api, padding, nsp) -> tuple:
    """`padding`: an int for every side, one int per spatial axis (both sides), or a (before, after) pair per
    spatial axis -> ((before, after), ...)."""
    return tuple((p, p) if isinstance(p, str) or np.ndim(p) == 0 else tuple(p)
                 for p in _per_axis(api, "padding", padding, nsp))


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """N-d convolution (cross-correlation, like `torch.nn.functional.conv1d/2d/3d`) of `x` [N, C, *spatial]
    (1 to 3 spatial axes) with `weight` [O, C / groups, *kernel] (static shape), plus `bias` [O] if given.
    `stride`, `dilation`: an int or one per spatial axis; `padding` (zeros): an int, one per axis or a
    (before, after) pair per axis; `groups` splits the channels (groups == C: depthwise). Float dtypes; the
    output is [N, O, *out] with ``out = (size + before + after - dilation * (k - 1) - 1) // stride + 1``."""
    nsp = _spatial_rank("conv", x)
    attrs = _attrs_of("conv", A.ConvAttrs, _per_axis("conv", "stride", stride, nsp),
                      _per_axis("conv", "dilation", dilation, nsp), _window_pads("conv", padding, nsp), groups)
    y = _one("conv", "conv", [x, weight], attrs)
    if bias is None:
        return y
    b = bias if isinstance(bias, Tensor) else as_array(bias)
    if len(b.shape) != 1 or np.dtype(b.dtype) != np.dtype(y.dtype) or isinstance(b.shape[0], int) and \
            not same_dim(b.shape[0], y.shape[1]):
        raise trace_error(f"conv: bias must be 1-d with one {y.dtype} value per output channel ({y.shape[1]}), "
                          f"got {b.dtype}{list(b.shape)}")
    return _F["add"](y, reshape(b, (-1,) + (1,) * nsp))


def _pool(api, x, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad=False):
    nsp = _spatial_rank(api, x)
    kernel = _per_axis(api, "kernel_size", kernel_size, nsp)
    attrs = _attrs_of(api, A.PoolAttrs, kernel, kernel if stride is None else _per_axis(api, "stride", stride, nsp),
                      _per_axis(api, "dilation", dilation, nsp), _window_pads(api, padding, nsp), ceil_mode,
                      count_include_pad)
    return _one(api, api, [x], attrs)


def max_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """N-d max pooling (like `torch.nn.functional.max_pool1d/2d/3d`) over the spatial axes of `x` [N, C,
    *spatial]: the maximum of each window's taps inside x (padding never wins; NaN propagates). `stride`
    defaults to `kernel_size`; `ceil_mode` rounds the output size up, keeping only windows that start inside x
    or its before-padding. Numeric dtypes."""
    return _pool("max_pool", x, kernel_size, stride, padding, dilation, ceil_mode)


def avg_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, count_include_pad=True):
    """N-d average pooling (like `torch.nn.functional.avg_pool1d/2d/3d`): the mean of each window's taps
    inside x, or inside x and its zero padding (`count_include_pad`); the taps `ceil_mode` adds past the
    padding never count. `stride` defaults to `kernel_size`. Float dtypes."""
    return _pool("avg_pool", x, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad)


# ------------------------------------------------------------------------------ dynamic-shape ops
def boolean_mask(data, mask, axis=0):
    """`data[mask]` along `axis` (`np.compress(mask, data, axis)`); `mask` is 1-d bool.

    Masking several tensors with the same traced mask gives results that share one length."""
    outs = apply("boolean_mask", "boolean_mask", [data, mask], _attrs_of("boolean_mask", A.AxisAttrs, axis))
    if isinstance(outs[0], Tensor) and isinstance(mask, Tensor):
        b = current()
        key = b.lift(mask.value)
        v = outs[0].value
        ax = int(axis) % v.type.ndim
        dim = b.mask_dims.setdefault(key, v.type.shape[ax])
        if dim != v.type.shape[ax]:
            from ..ir.types import TensorType
            v.type = TensorType(v.type.shape[:ax] + (dim,) + v.type.shape[ax + 1:], v.type.dtype)
    return outs[0]


def unique(x, return_inverse=False, return_counts=False, *, return_index=False, axis=None, sorted=True):
    """`np.unique`: the unique values of the flattened input (`axis` None) or the unique sub-tensors along
    `axis`, then those asked for, in numpy's order: the index of each one's first occurrence, the inverse
    (shaped like x; along an axis 1-d) and the counts. `sorted=False` orders them by first occurrence."""
    attrs = _attrs_of("unique", A.UniqueAttrs, return_inverse, return_counts, return_index, axis, sorted)
    outs = apply("unique", "unique", [x], attrs)
    return outs[0] if len(outs) == 1 else tuple(outs)


def topk(x, k, axis=-1, largest=True):
    """The `k` largest (or smallest) entries along `axis`, sorted, and their int64 indices.
    `k` may be a 0-d integer tensor (data-dependent output size)."""
    if isinstance(k, (Tensor, np.ndarray)) and not isinstance(k, np.generic):   # eager too: k checked when run
        return tuple(apply("topk", "topk_dyn", [x, k], _attrs_of("topk", A.TopkAttrs, None, axis, largest)))
    return tuple(apply("topk", "topk", [x], _attrs_of("topk", A.TopkAttrs, k, axis, largest)))


def all_ops_names() -> list:
    """Names of the public F functions (for docs and tests)."""
    return sorted(n for n, v in globals().items() if callable(v) and not n.startswith("_") and
                  getattr(v, "__module__", "") == __name__ and n not in ("apply", "all_ops_names"))


__all__ = all_ops_names() + ["all_ops_names"]
