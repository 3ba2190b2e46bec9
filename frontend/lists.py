"""The `F` functions of lists of tensors (`ir/ops_lists.py`): make, append, insert, erase, at, length,
stack / concat and split into a list. Functional: each returns a new list and leaves its input as it was.

Eagerly they take and return `ArrayList`s (Python lists of numpy arrays); while tracing, `TensorList`s. A
plain Python list (or tuple) of tensors where a list is expected is made into one (`make_list`). Positions
are ints or integer scalar tensors; negative ones count from the end (as in ONNX).
"""
from __future__ import annotations

import numpy as np

from dyntvm.errors import ExecutionError

from ..ir.list_type import ListType
from ..ir.ops_lists import ListEmptyAttrs, ListJoinAttrs, SplitToListAttrs
from ..ir.attrs import NoAttrs
from ..ir.shapes import ShapeError
from ..ir.types import TensorType
from ..runtime.kernels import run_kernel
from .list_values import ArrayList, TensorList
from .tracer import Tensor, as_array, current, infer_types, trace_error, tracing, user_source, wrap

_TRACED = (Tensor, TensorList)


def constant_list(b, x: ArrayList):
    """An eager list used in a trace: a value of builder `b` (its elements constants)."""
    if not len(x):
        elem = x.type.elem
        (v,) = b.emit("list_empty", [], ListEmptyAttrs(elem.dtype, tuple(d if isinstance(d, int) else None
                                                                         for d in elem.shape)), api="list_empty")
        return v
    (v,) = b.emit("make_list", [b.constant(as_array(e)) for e in x], NoAttrs(), api="make_list")
    return v


def _apply(api: str, op: str, args: list, attrs=None) -> list:
    """Run (eager) or record (tracing) list op `op`: like `ops.apply`, with list arguments and results."""
    attrs = NoAttrs() if attrs is None else attrs
    if any(isinstance(a, _TRACED) for a in args) or (not args and tracing()):
        if not tracing():
            raise trace_error(f"{api}: got a traced value outside of dt.trace (it escaped a finished trace)")
        b = current()
        vals = [a.value if isinstance(a, _TRACED) else constant_list(b, a) if isinstance(a, ArrayList) else
                b.constant(as_array(a)) for a in args]
        return [wrap(v, b) for v in b.emit(op, vals, attrs, api=api)]
    vals = [a if isinstance(a, ArrayList) else as_array(a) for a in args]
    try:
        in_types = [a.type if isinstance(a, ArrayList) else TensorType(a.shape, a.dtype) for a in vals]
    except ShapeError as e:
        raise trace_error(f"{api}: {e}") from None
    out_types = infer_types(op, api, in_types, attrs)     # eager accepts what tracing accepts
    try:
        res = run_kernel(op, attrs, vals)
    except Exception as e:       # the error a graph run gives: the op, the condition, the user's line
        src = user_source()
        raise ExecutionError(f"{api} failed: {str(e).strip() or type(e).__name__}" + (f"\n    at {src}" if src else ""),
                             op=op, source=src) from e
    return [ArrayList(r, t) if isinstance(t, ListType) else r for r, t in zip(res, out_types)]


def _list_arg(api: str, lst, like=None):
    """`lst` as a list value: a TensorList / ArrayList as it is, a Python list or tuple of tensors made one (an
    empty one holding tensors of the dtype and rank of `like`, the tensor going into it)."""
    if isinstance(lst, (TensorList, ArrayList)):
        return lst
    if isinstance(lst, (list, tuple)):
        if not lst and like is not None:
            like = like if isinstance(like, Tensor) else as_array(like)
            return list_empty(np.dtype(like.dtype).name, len(like.shape))
        if not lst:
            raise trace_error(f"{api}: an empty Python list has no dtype; make it with F.list_empty(dtype, rank)")
        return make_list(*lst)
    raise trace_error(f"{api}: expected a list of tensors (F.make_list, F.list_empty), got "
                      f"{type(lst).__name__}" + (f" {lst.type}" if isinstance(lst, Tensor) else ""))


def _position(api: str, p, what="position"):
    if isinstance(p, Tensor):
        return p
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer, np.ndarray)):
        raise trace_error(f"{api}: {what} must be an int or an integer scalar tensor, got {type(p).__name__} {p!r}")
    return np.asarray(p, np.int64) if isinstance(p, (int, np.integer)) else p


def list_empty(dtype="float32", rank=1):
    """An empty list of tensors of `dtype`. `rank`: the elements' rank (their dims may then differ from element
    to element), or their shape, a tuple of ints and None (a dim that may differ): ``F.list_empty("float32",
    (None, 4))``. A list stacked while it may be empty needs every element dim given."""
    shape = (None,) * rank if isinstance(rank, (int, np.integer)) and not isinstance(rank, bool) else rank
    if not isinstance(shape, (tuple, list)):
        raise trace_error(f"list_empty: rank must be an int or an element shape (a tuple), got {rank!r}")
    try:
        attrs = ListEmptyAttrs(dtype, tuple(shape))
    except (TypeError, ValueError) as e:
        raise trace_error(f"list_empty: {e}") from None
    return _apply("list_empty", "list_empty", [], attrs)[0]


def make_list(*tensors):
    """A list of the given tensors (one dtype and rank; their shapes may differ). ``make_list([a, b])`` is
    ``make_list(a, b)``."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if not tensors:
        raise trace_error("make_list: no tensors given; an empty list is F.list_empty(dtype, rank)")
    return _apply("make_list", "make_list", list(tensors))[0]


def list_append(lst, x):
    """A new list: `lst` with `x` at the end."""
    return _apply("list_append", "list_append", [_list_arg("list_append", lst, x), x])[0]


def list_insert(lst, x, pos):
    """A new list: `lst` with `x` inserted before position `pos` (``len(lst)`` appends; negative
    positions count from the end, -1 inserts before the last element)."""
    return _apply("list_insert", "list_insert", [_list_arg("list_insert", lst, x), x, _position("list_insert", pos)])[0]


def list_erase(lst, pos=-1):
    """A new list: `lst` without the element at `pos` (default the last one)."""
    return _apply("list_erase", "list_erase", [_list_arg("list_erase", lst), _position("list_erase", pos)])[0]


def list_at(lst, i):
    """Element `i` of `lst` (an int or an integer scalar tensor; -1 is the last one)."""
    return _apply("list_at", "list_at", [_list_arg("list_at", lst), _position("list_at", i, "index")])[0]


def list_length(lst):
    """The number of tensors in `lst`, an int64 scalar tensor."""
    return _apply("list_length", "list_length", [_list_arg("list_length", lst)])[0]


def join(api, lst, axis, allow_empty: bool = True):
    """list_stack / list_concat. An empty list gives an empty result where the element shape is known (every
    dim an int; for list_concat every dim but `axis`, whose size is then 0) and `allow_empty`; else it is an
    ExecutionError (ONNX's ConcatFromSequence refuses one)."""
    lst = _list_arg(api, lst)
    elem = lst.type.elem
    shape = list(elem.shape)
    if (api == "list_concat" and isinstance(axis, int) and -len(shape) <= axis < len(shape)
            and not isinstance(shape[axis], int)):
        shape[axis] = 0      # the joined axis is 0 long anyway: rows of any length concatenate to float32[0]
    static = allow_empty and all(isinstance(d, int) for d in shape)
    try:
        attrs = ListJoinAttrs(axis, elem.dtype, tuple(shape) if static else None)
    except (TypeError, ValueError) as e:
        raise trace_error(f"{api}: {e}") from None
    return _apply(api, api, [lst], attrs)[0]


def list_stack(lst, axis=0):
    """The tensors of `lst` (all of one shape) stacked along a new axis `axis`. An empty list gives an empty
    tensor where every element dim is known (``F.list_empty("float32", (4,))``), else an ExecutionError."""
    return join("list_stack", lst, axis)


def list_concat(lst, axis=0):
    """The tensors of `lst` joined along their axis `axis`. An empty list gives an empty tensor where every
    element dim but `axis` is known (``F.list_empty("float32", 1)``: float32[0]), else an ExecutionError."""
    return join("list_concat", lst, axis)


def split_to_list(x, split=None, axis=0, keepdims=True):
    """`x` split along `axis` into a list: pieces of size 1 (without the axis when not `keepdims`) when `split`
    is None; pieces of size `split` (the last one smaller) for an int; one piece per entry of a 1-d `split`.
    `split` may be a tensor computed at run time, and the axis symbolic: the list's length is then known when
    the model runs."""
    try:
        attrs = SplitToListAttrs(axis, keepdims, split is not None)
    except (TypeError, ValueError) as e:
        raise trace_error(f"split_to_list: {e}") from None
    if split is not None and not isinstance(split, Tensor):
        split = np.asarray(split, np.int64) if not isinstance(split, np.ndarray) else split
    return _apply("split_to_list", "split_to_list", [x] + ([] if split is None else [split]), attrs)[0]


LIST_FUNCTIONS = ("list_empty", "make_list", "list_append", "list_insert", "list_erase", "list_at", "list_length",
                  "list_stack", "list_concat", "split_to_list")
