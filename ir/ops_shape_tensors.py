"""Ops that take a shape from a tensor: `reshape_dyn`, `broadcast_to_dyn` (also `full` / `zeros` / `ones` of a
shape tensor, and ONNX `Expand` when `bidirectional`) and `tile_dyn`, each with a 1-d integer operand of static
length whose entries may be computed at run time; and `slice_axes_dyn`, a slice whose axes are such a tensor.

Their output dims are the entries of that operand, so they are DYNAMIC_SHAPE ops: the executor runs their numpy
kernels (`runtime/kernels_shape.py`). The frontend knows some entries while tracing (`frontend/shape_values.py`:
``F.shape_of(x)`` is x's shape); it writes the output dims it knows into `dims` (None where an entry is known only
when the op runs, a fresh unknown dim then), and where it knows them all it emits the static op instead
(`reshape`, `broadcast_to`, `full`, `tile`), which compiles.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .attrs import NoAttrs
from .ops import DYNAMIC_SHAPE, register
from .shapes import ShapeError
from .types import TensorType, check_dim, fresh_dim

_OMIT = {"omit_default": True}      # fields added to an op saved before them: its JSON (and hash) stays the same


def _dims_or_none(dims):
    """`dims` normalised: None, or a tuple of dims (ints >= 0, canonical symbolic strings) and Nones."""
    return None if dims is None else tuple(None if d is None else check_dim(d) for d in dims)


@dataclass(frozen=True)
class ShapeTensorAttrs:
    """`dims`: the output dims known when the graph was traced (None per dim known only when it runs); None:
    none known."""
    dims: tuple | None = field(default=None, metadata=_OMIT)

    def __post_init__(self):
        object.__setattr__(self, "dims", _dims_or_none(self.dims))


@dataclass(frozen=True)
class ReshapeDynAttrs(ShapeTensorAttrs):
    """`copy_zeros`: an entry 0 keeps the input's dim at that position (ONNX Reshape without allowzero); else
    numpy's rule (0 is a size of 0). One entry may be -1 either way."""
    copy_zeros: bool = field(default=False, metadata=_OMIT)


@dataclass(frozen=True)
class BroadcastDynAttrs(ShapeTensorAttrs):
    """`bidirectional`: ONNX Expand's rule (the output is the broadcast of x's shape and the operand's, so an
    entry 1 keeps x's dim); else numpy's `broadcast_to` (the output is the operand, x must broadcast to it)."""
    bidirectional: bool = field(default=False, metadata=_OMIT)


def shape_operand(t: TensorType, what: str) -> int:
    """The static length of a 1-d integer shape operand `t`."""
    if t.ndim != 1 or not isinstance(t.shape[0], int):
        raise ShapeError(f"the {what} tensor must be 1-d with a static length, got {t}")
    if np.dtype(t.dtype).kind not in "iu":
        raise ShapeError(f"the {what} tensor must be integer, got {t.dtype}")
    return t.shape[0]


def _out(dims, rank: int, dtype: str) -> list:
    if dims is not None and len(dims) != rank:
        raise ShapeError(f"{len(dims)} known output dims for an output of rank {rank}")
    return [TensorType(tuple(fresh_dim() if dims is None or d is None else d for d in (dims or (None,) * rank)),
                       dtype)]


def _reshape_dyn(ts, a):
    return _out(a.dims, shape_operand(ts[1], "shape"), ts[0].dtype)


def _broadcast_to_dyn(ts, a):
    x, n = ts[0], shape_operand(ts[1], "shape")
    if not a.bidirectional and n < x.ndim:
        raise ShapeError(f"cannot broadcast {x} to a shape of {n} dims (fewer than its own)")
    return _out(a.dims, max(n, x.ndim), x.dtype)


def _tile_dyn(ts, a):
    x, n = ts[0], shape_operand(ts[1], "repeats")
    return _out(a.dims, max(n, x.ndim), x.dtype)


register("reshape_dyn", ReshapeDynAttrs, _reshape_dyn, kind=DYNAMIC_SHAPE, num_inputs=2, dim_attrs=("dims",))
register("broadcast_to_dyn", BroadcastDynAttrs, _broadcast_to_dyn, kind=DYNAMIC_SHAPE, num_inputs=2,
         dim_attrs=("dims",))
register("tile_dyn", ShapeTensorAttrs, _tile_dyn, kind=DYNAMIC_SHAPE, num_inputs=2, dim_attrs=("dims",))


def _slice_axes_dyn(ts, a):
    x, n = ts[0], shape_operand(ts[4], "axes")
    for what, t in zip(("starts", "stops", "steps"), ts[1:4]):
        if shape_operand(t, what) != n:
            raise ShapeError(f"slice {what} must have one entry per axis ({n}), got {t}")
    return [TensorType(tuple(fresh_dim() for _ in x.shape), x.dtype)]


# x[starts:stops:steps] along `axes`, all four 1-d integer tensors (ONNX Slice with computed axes); once the axes
# are known while tracing it is a `slice_dyn` (frontend/shape_rewrites.py)
register("slice_axes_dyn", NoAttrs, _slice_axes_dyn, kind=DYNAMIC_SHAPE, num_inputs=5)
