"""The type of a list of tensors, a value the graph carries at run time (`F.make_list`, ONNX sequences).

A list holds tensors of one dtype and one rank; their dims may differ from element to element. In
``ListType(elem, length)`` the element type says what every element has in common: an int or a named symbol
(``"N"``, shared with the rest of the graph) is the same in every element; an *unknown* dim (``"_u3"``, a
leading underscore) may be different in each. An element taken out of a list (`list_at`, `list_stack`) gets
a fresh unknown dim for each of those. The length is a dim too: an int when the trace knows it, else a
symbol or an expression (``"(_u4 + 1)"`` after an append).

Lists never enter compiled regions: every list op is a DYNAMIC_SHAPE op the executor runs on the host, where
a list is a Python list of tensors. Stages that read a value's ``shape`` handle a list by name
(`value_dims`) or refuse it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .types import Dim, TensorType, check_dim, dim_symbols, fresh_dim, is_unknown, join_types


@dataclass(frozen=True)
class ListType:
    """A list of tensors: every element has `elem`'s dtype and rank; `length` is a dim."""

    elem: TensorType
    length: Dim = 0

    def __post_init__(self):
        if not isinstance(self.elem, TensorType):
            raise TypeError(f"a list's element type must be a TensorType, got {self.elem!r}")
        object.__setattr__(self, "length", check_dim(self.length))

    @property
    def is_static(self) -> bool:
        return False

    @property
    def dtype(self) -> str:
        """The elements' dtype."""
        return self.elem.dtype

    def symbols(self) -> set:
        return set(dim_symbols(self.length)) | self.elem.symbols()

    def __str__(self) -> str:
        return f"list[{self.elem} x {self.length}]"

    def describe(self) -> str:
        """For messages: "a list of float32[?,4]" (a dim that may differ per element, or an unknown length, is ?)."""
        dims = ",".join("?" if isinstance(d, str) and is_unknown(d) else str(d) for d in self.elem.shape)
        n = "" if isinstance(self.length, str) and is_unknown(self.length) else f" of length {self.length}"
        return f"a list{n} of {self.elem.dtype}[{dims}]"

    def to_json(self):
        return {"list": self.elem.to_json(), "length": self.length}

    @staticmethod
    def from_json(obj) -> "ListType":
        return ListType(TensorType.from_json(obj["list"]), obj["length"])


def is_list_type(t) -> bool:
    return isinstance(t, ListType)


def type_from_json(obj):
    """A TensorType or a ListType from its JSON form."""
    return ListType.from_json(obj) if isinstance(obj, dict) and "list" in obj else TensorType.from_json(obj)


def value_dims(t) -> tuple:
    """The dims a value of type `t` has at run time as a whole: a tensor's shape, a list's length (the dims of
    its elements belong to each element)."""
    return (t.length,) if isinstance(t, ListType) else t.shape


def value_shape(x) -> tuple:
    """The run-time counterpart of `value_dims`: an array's shape, a list's ``(length,)``."""
    return (len(x),) if isinstance(x, list) else x.shape


def element_of(t: ListType) -> TensorType:
    """The type of one element taken out of a list: its varying (unknown) dims fresh, so that the elements of
    one list never share a size by accident."""
    return TensorType(tuple(fresh_dim() if isinstance(d, str) and is_unknown(d) else d for d in t.elem.shape),
                      t.elem.dtype)


def join_elems(a: TensorType, b: TensorType) -> TensorType:
    """The element type of a list holding elements of types `a` and `b` (same dtype and rank): their common
    dims, a fresh unknown dim where they differ or either varies."""
    return a if a == b else TensorType(tuple(x if x == y else fresh_dim() for x, y in zip(a.shape, b.shape)),
                                       a.dtype)


def join_list_types(a: ListType, b: ListType, keep=frozenset()) -> ListType:
    """The type of a loop-carried list that is `a` on entry and `b` after an iteration."""
    elem = a.elem if a.elem == b.elem else TensorType(
        tuple(x if x == y or x in keep else fresh_dim() for x, y in zip(a.elem.shape, b.elem.shape)), a.elem.dtype)
    length = a.length if a.length == b.length or a.length in keep else fresh_dim()
    return ListType(elem, length)


def same_kind(a, b) -> bool:
    """Whether values of types `a` and `b` may stand for each other (a loop carry, branches): the same dtype and
    rank; both lists (of such elements) or both tensors."""
    if isinstance(a, ListType) or isinstance(b, ListType):
        return isinstance(a, ListType) and isinstance(b, ListType) and same_kind(a.elem, b.elem)
    return a.dtype == b.dtype and a.ndim == b.ndim


def all_dims(t) -> tuple:
    """Every dim in type `t` (a list's length and its element dims)."""
    return (t.length,) + t.elem.shape if isinstance(t, ListType) else t.shape


def join_carried(a, b, keep=frozenset()):
    """`types.join_types` for tensors and lists: the type of a value that is `a` on one path and `b` on another."""
    return join_list_types(a, b, keep) if isinstance(a, ListType) else join_types(a, b, keep)
