"""Dynamic-shape ops registered outside `ir/ops.py` (at its size limit): `unique` and `slice_dyn`. Like the other
DYNAMIC_SHAPE ops they are never compiled: the executor runs their numpy kernels (`runtime/kernels.py`) between
compiled regions, and a loop body holding one runs step by step (it is not a single region)."""
from __future__ import annotations

import numpy as np

from .attrs import AxesAttrs, UniqueAttrs
from .ops import DYNAMIC_SHAPE, register
from .shapes import ShapeError, norm_axis
from .types import TensorType, fresh_dim


def _unique(ts, a):
    x = ts[0]
    u = fresh_dim()
    if a.axis is None:
        out = [TensorType((u,), x.dtype)]
        inverse = TensorType(x.shape, "int64")
    else:
        if x.ndim == 0:
            raise ShapeError(f"unique along axis {a.axis} needs a tensor with axes, got {x}")
        ax = norm_axis(a.axis, x.ndim)
        out = [TensorType(x.shape[:ax] + (u,) + x.shape[ax + 1:], x.dtype)]
        inverse = TensorType((x.shape[ax],), "int64")
    if a.return_index:
        out.append(TensorType((u,), "int64"))
    if a.return_inverse:
        out.append(inverse)
    if a.return_counts:
        out.append(TensorType((u,), "int64"))
    return out


register("unique", UniqueAttrs, _unique, kind=DYNAMIC_SHAPE, num_inputs=1)


def _slice_dyn(ts, a):
    x, bounds = ts[0], ts[1:]
    axes = [norm_axis(ax, x.ndim) for ax in a.axis]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"slice axes {a.axis} repeat an axis")
    for what, t in zip(("starts", "stops", "steps"), bounds):
        n = t.shape[0] if t.ndim == 1 else None
        if not np.issubdtype(np.dtype(t.dtype), np.integer) or t.ndim != 1 or isinstance(n, int) and n != len(axes):
            raise ShapeError(f"slice {what} must be a 1-d integer tensor with one entry per axis ({len(axes)}), "
                             f"got {t}")
    shape = list(x.shape)
    for ax in axes:
        shape[ax] = fresh_dim()
    return [TensorType(tuple(shape), x.dtype)]


register("slice_dyn", AxesAttrs, _slice_dyn, kind=DYNAMIC_SHAPE, num_inputs=4)
