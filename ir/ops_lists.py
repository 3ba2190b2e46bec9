"""The list ops (`ir.list_type.ListType` values): make, append, insert, erase, at, length, stack / concat and
split into a list. Functional: each returns a new list. All are DYNAMIC_SHAPE ops, so they never enter a
compiled region: the executor runs their numpy kernels (`runtime/kernels_lists.py`) on Python lists of
tensors, and the static ops that compute the elements still compile around them.

Positions (`list_insert`, `list_erase`, `list_at`) are int64 scalar tensors (the frontend makes a constant of
a Python int): negative ones count from the end, as in ONNX; out of range is an ExecutionError at run time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attrs import NoAttrs, _bool, _int, _set
from .list_type import ListType, element_of, join_elems
from .ops import DYNAMIC_SHAPE, register
from .shapes import ShapeError, norm_axis
from .types import TensorType, check_dim, dim_add, dim_mul, dim_sub, fresh_dim, normalize_dtype

LIST_OPS = ("list_empty", "make_list", "list_append", "list_insert", "list_erase", "list_at", "list_length",
            "list_stack", "list_concat", "split_to_list")


@dataclass(frozen=True)
class ListEmptyAttrs:
    """The element type of an empty list: a dtype and a shape whose entries are ints, or None where elements
    may differ (their number is the rank)."""
    dtype: str
    shape: tuple

    def __post_init__(self):
        _set(self, dtype=normalize_dtype(self.dtype),
             shape=tuple(None if d is None else _int(d, "an element dim") for d in self.shape))
        if any(d is not None and d < 0 for d in self.shape):
            raise ValueError(f"element dims must be >= 0 (or None), got {self.shape}")


@dataclass(frozen=True)
class ListJoinAttrs:
    """list_stack / list_concat: the axis, and the element type when it is fully known (`empty_shape`, None
    otherwise): the result of an empty list needs it."""
    axis: int
    dtype: str
    empty_shape: tuple | None = None

    def __post_init__(self):
        _set(self, axis=_int(self.axis), dtype=normalize_dtype(self.dtype),
             empty_shape=None if self.empty_shape is None else tuple(_int(d, "a dim") for d in self.empty_shape))


@dataclass(frozen=True)
class SplitToListAttrs:
    """split_to_list: the axis; `has_split` says whether input 1 holds the sizes (a scalar: pieces of that size,
    the last one smaller; a 1-d tensor: one size per piece); `keepdims` (only without split) keeps the axis."""
    axis: int = 0
    keepdims: bool = True
    has_split: bool = False

    def __post_init__(self):
        _set(self, axis=_int(self.axis), keepdims=_bool(self.keepdims, "keepdims"),
             has_split=_bool(self.has_split, "has_split"))


def _list(t, what="input 0") -> ListType:
    if not isinstance(t, ListType):
        raise ShapeError(f"{what} must be a list (F.make_list, F.list_empty), got the tensor {t}")
    return t


def _tensor(t, what) -> TensorType:
    if isinstance(t, ListType):
        raise ShapeError(f"{what} must be a tensor, got the list {t}")
    return t


def _fits(lst: ListType, t: TensorType, what="the tensor") -> None:
    if t.dtype != lst.elem.dtype or t.ndim != lst.elem.ndim:
        raise ShapeError(f"{what} {t} cannot join a list of {lst.elem.dtype} tensors of rank {lst.elem.ndim} "
                         f"(a list holds one dtype and one rank)")


def _position(t, what="position") -> None:
    _tensor(t, what)
    if t.ndim != 0 or np.dtype(t.dtype).kind not in "iu":
        raise ShapeError(f"{what} must be an integer scalar, got {t}")


def _empty(ts, a):
    elem = TensorType(tuple(fresh_dim() if d is None else d for d in a.shape), a.dtype)
    return [ListType(elem, 0)]


def _make(ts, a):
    if not ts:
        raise ShapeError("make_list needs one tensor at least; an empty list is F.list_empty(dtype, rank)")
    elem = _tensor(ts[0], "element 0")
    for k, t in enumerate(ts[1:], 1):
        _tensor(t, f"element {k}")
        _fits(ListType(elem, 0), t, f"element {k}")
        elem = join_elems(elem, t)
    return [ListType(elem, len(ts))]


def _append(ts, a):
    lst, t = _list(ts[0]), _tensor(ts[1], "input 1")
    _fits(lst, t)
    return [ListType(join_elems(lst.elem, t), dim_add(lst.length, 1))]


def _insert(ts, a):
    lst, t = _list(ts[0]), _tensor(ts[1], "input 1")
    _fits(lst, t)
    _position(ts[2])
    return [ListType(join_elems(lst.elem, t), dim_add(lst.length, 1))]


def _erase(ts, a):
    lst = _list(ts[0])
    _position(ts[1])
    if lst.length == 0:
        raise ShapeError("cannot erase from an empty list")
    return [ListType(lst.elem, dim_sub(lst.length, 1))]


def _at(ts, a):
    lst = _list(ts[0])
    _position(ts[1], "index")
    if lst.length == 0:
        raise ShapeError("cannot take an element of an empty list")
    return [element_of(lst)]


def _length(ts, a):
    _list(ts[0])
    return [TensorType((), "int64")]


def _join_check(ts, a, new_axis: bool) -> tuple:
    lst = _list(ts[0])
    ax = norm_axis(a.axis, lst.elem.ndim + new_axis)
    if a.dtype != lst.elem.dtype:
        raise ShapeError(f"dtype {a.dtype} does not match the list's {lst.elem.dtype}")
    return lst, ax, list(element_of(lst).shape)


def _stack(ts, a):
    lst, ax, shape = _join_check(ts, a, True)
    return [TensorType(tuple(shape[:ax] + [lst.length] + shape[ax:]), lst.elem.dtype)]


def _concat(ts, a):
    lst, ax, shape = _join_check(ts, a, False)
    d = lst.elem.shape[ax]
    shape[ax] = dim_mul(lst.length, d) if isinstance(d, int) and isinstance(lst.length, int) else fresh_dim()
    return [TensorType(tuple(shape), lst.elem.dtype)]


def _split_to_list(ts, a):
    x = _tensor(ts[0], "input 0")
    if x.ndim == 0:
        raise ShapeError(f"split_to_list needs a tensor with axes, got {x}")
    ax = norm_axis(a.axis, x.ndim)
    if len(ts) != 1 + a.has_split:
        raise ShapeError(f"split_to_list takes {1 + a.has_split} inputs (has_split={a.has_split}), got {len(ts)}")
    shape = list(x.shape)
    if not a.has_split:
        shape[ax] = 1
        if not a.keepdims:
            del shape[ax]
        return [ListType(TensorType(tuple(shape), x.dtype), x.shape[ax])]
    split = _tensor(ts[1], "split")
    if split.ndim > 1 or np.dtype(split.dtype).kind not in "iu":
        raise ShapeError(f"split must be an integer scalar or 1-d tensor, got {split}")
    shape[ax] = fresh_dim()
    length = split.shape[0] if split.ndim == 1 else fresh_dim()
    return [ListType(TensorType(tuple(shape), x.dtype), check_dim(length))]


_DOC = "See dyntvm.F.{} (frontend/lists.py)."
for _name, _attrs, _rule, _n in (
        ("list_empty", ListEmptyAttrs, _empty, 0), ("make_list", NoAttrs, _make, None),
        ("list_append", NoAttrs, _append, 2), ("list_insert", NoAttrs, _insert, 3),
        ("list_erase", NoAttrs, _erase, 2), ("list_at", NoAttrs, _at, 2), ("list_length", NoAttrs, _length, 1),
        ("list_stack", ListJoinAttrs, _stack, 1), ("list_concat", ListJoinAttrs, _concat, 1),
        ("split_to_list", SplitToListAttrs, _split_to_list, None)):
    register(_name, _attrs, _rule, kind=DYNAMIC_SHAPE, num_inputs=_n, doc=_DOC.format(_name))
