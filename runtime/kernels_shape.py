"""Numpy kernels of the ops that take a shape from a tensor (`ir/ops_shape_tensors.py`): `reshape_dyn`,
`broadcast_to_dyn`, `tile_dyn`. `runtime/kernels.py` registers them.

The shape operand is data: each kernel checks it before allocating (no negative sizes, a size the machine can
hold) and raises a ValueError naming the operand, which the executor reports as an ExecutionError of the node.
The output dims the trace derived (`attrs.dims`) are checked against the result where their symbols are bound:
they hold by construction, so a mismatch is a dyntvm bug caught before it spreads."""
from __future__ import annotations

import numpy as np

from ..ir.types import ShapeError, check_tensor_size, eval_dim


def _entries(t: np.ndarray, what: str, allow=()) -> list:
    """The entries of the 1-d integer operand `t` as Python ints; a negative one (other than those in `allow`)
    is refused."""
    vals = [int(v) for v in np.asarray(t).reshape(-1)]
    bad = [v for v in vals if v < 0 and v not in allow]
    if bad:
        raise ValueError(f"the {what} {vals} has a negative entry ({bad[0]}); entries must be >= 0"
                         + (" (or -1 for one inferred dim)" if -1 in allow else ""))
    return vals


def allocatable(shape, dtype, what: str) -> None:
    try:
        check_tensor_size(tuple(shape), np.dtype(dtype).name)
    except ShapeError as e:
        raise ValueError(f"the {what} {list(shape)}: {e}") from None


def _check_known(attrs, shape, env) -> None:
    for ax, (d, size) in enumerate(zip(attrs.dims or (), shape)):
        if d is None:
            continue
        try:
            want = eval_dim(d, env)
        except (KeyError, ZeroDivisionError):       # its symbols are not bound yet: nothing to compare
            continue
        if want != size:
            raise ValueError(f"axis {ax} has size {size} but the trace derived it as {d} = {want} (a dyntvm bug: "
                             "please report it)")


def reshape_dyn(attrs, x, shape, env=None):
    target = _entries(shape, "shape", allow=(-1,))
    if attrs.copy_zeros:
        if any(v == 0 and i >= x.ndim for i, v in enumerate(target)):
            raise ValueError(f"the shape {target} has a 0 (copy the input's dim) past the input's {x.ndim} dims")
        target = [x.shape[i] if v == 0 else v for i, v in enumerate(target)]
    if target.count(-1) > 1:
        raise ValueError(f"the shape {target} has more than one -1")
    try:
        out = np.reshape(x, target)
    except ValueError:
        raise ValueError(f"cannot reshape a tensor of shape {list(x.shape)} ({x.size} elements) to {target}") \
            from None
    _check_known(attrs, out.shape, env or {})
    return (out,)


def broadcast_to_dyn(attrs, x, shape, env=None):
    target = _entries(shape, "shape")
    if attrs.bidirectional:
        try:
            target = list(np.broadcast_shapes(x.shape, tuple(target)))
        except ValueError:
            raise ValueError(f"cannot broadcast a tensor of shape {list(x.shape)} with the shape {target}") \
                from None
    elif len(target) < x.ndim or any(d not in (1, t) for d, t in zip(x.shape[::-1], target[::-1])):
        raise ValueError(f"cannot broadcast a tensor of shape {list(x.shape)} to the shape {target}")
    allocatable(target, x.dtype, "shape")
    _check_known(attrs, target, env or {})
    return (np.array(np.broadcast_to(x, tuple(target))),)


def tile_dyn(attrs, x, reps, env=None):
    reps = _entries(reps, "repeats")
    nd = max(x.ndim, len(reps))
    shape = (1,) * (nd - x.ndim) + x.shape
    out = [d * r for d, r in zip(shape, [1] * (nd - len(reps)) + reps)]
    allocatable(out, x.dtype, "tiled shape")
    _check_known(attrs, out, env or {})
    return (np.tile(x, reps),)


def slice_axes(x, axes) -> tuple:
    """The axes operand of `slice_axes_dyn`, checked (each in [-rank, rank), none twice) and made non-negative."""
    r, vals = x.ndim, [int(v) for v in np.asarray(axes).reshape(-1)]
    bad = [v for v in vals if not -r <= v < r]
    if bad:
        raise ValueError(f"the slice axes {vals} have {bad[0]}, out of range for a tensor of rank {r}")
    norm = [v % r for v in vals]
    if len(set(norm)) != len(norm):
        raise ValueError(f"the slice axes {vals} repeat an axis")
    return tuple(norm)
