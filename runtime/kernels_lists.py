"""Numpy kernels of the list ops (`ir/ops_lists.py`): a list is a Python list of numpy arrays. Each kernel
returns a new list (the ops are functional: an input list is never changed, elements are shared). Registered
into `kernels.KERNELS` by `kernels.py`. A bad position or a join of unequal elements raises an IndexError /
ValueError naming it, which the caller reports as an ExecutionError at the node (or the user's line)."""
from __future__ import annotations

import numpy as np


def _pos(lst: list, p, insert: bool = False, what: str = "position") -> int:
    n = len(lst)
    pos = int(np.asarray(p).reshape(-1)[0])
    hi = n if insert else n - 1
    if not -n <= pos <= hi:
        raise IndexError(f"{what} {pos} is out of range [{-n}, {hi}] for a list of {n} tensor{'s' if n != 1 else ''}"
                         + (" (an empty list has no elements)" if n == 0 and not insert else ""))
    return pos + n if pos < 0 else pos


def list_empty(a):
    return ([],)


def make_list(a, *xs):
    return (list(xs),)


def list_append(a, lst, x):
    return (list(lst) + [x],)


def list_insert(a, lst, x, p):
    out = list(lst)
    out.insert(_pos(lst, p, insert=True), x)
    return (out,)


def list_erase(a, lst, p):
    out = list(lst)
    del out[_pos(lst, p)]
    return (out,)


def list_at(a, lst, i):
    return (lst[_pos(lst, i, what="index")],)


def list_length(a, lst):
    return (np.asarray(len(lst), np.int64),)


def _join(a, lst, fn, what):
    if not lst:
        if a.empty_shape is None:
            raise ValueError(f"{what} of an empty list: no tensor gives the result's shape (check the list's "
                             "length first; F.list_stack of a list made by F.list_empty(dtype, shape) with every "
                             "element dim given, or F.list_concat with every dim but the axis given, is an empty "
                             "tensor)")
        shape = list(a.empty_shape)
        if fn is np.stack:
            shape.insert(a.axis % (len(shape) + 1), 0)
        else:
            shape[a.axis % len(shape)] = 0
        return (np.zeros(shape, a.dtype),)
    shapes = {np.shape(x) for x in lst}
    if fn is np.stack and len(shapes) > 1:
        raise ValueError(f"{what}: the list's tensors have different shapes {sorted(shapes)}; stacking needs one")
    try:
        return (fn([np.asarray(x) for x in lst], axis=a.axis),)
    except ValueError as e:
        raise ValueError(f"{what}: the list's tensors of shapes {sorted(shapes)} do not fit along axis "
                         f"{a.axis}: {e}") from None


def list_stack(a, lst):
    return _join(a, lst, np.stack, "list_stack")


def list_concat(a, lst):
    return _join(a, lst, np.concatenate, "list_concat")


def split_sizes(n: int, split) -> list:
    """The sizes of the pieces of an axis of size `n` (ONNX SplitToSequence's rule): 1 each for no `split`; a
    scalar: pieces of that size, the last one smaller; a 1-d split: its entries (adding up to `n`)."""
    if split is None:
        return [1] * n
    split = np.asarray(split)
    if split.ndim == 0:
        s = int(split)
        if s <= 0:
            raise ValueError(f"split {s} must be positive")
        return [s] * (n // s) + ([n % s] if n % s else [])
    sizes = [int(v) for v in split.reshape(-1)]
    if any(v < 0 for v in sizes) or sum(sizes) != n:
        raise ValueError(f"split {sizes} must be non-negative sizes adding up to the axis' size {n}")
    return sizes


def split_to_list(a, x, split=None):
    ax = a.axis % x.ndim
    n = x.shape[ax]
    if split is None:
        pieces = np.split(x, n, axis=ax) if n else []
        return ([p if a.keepdims else np.squeeze(p, ax) for p in pieces],)
    sizes = split_sizes(n, split)
    bounds = np.cumsum([0] + sizes)
    index = [slice(None)] * x.ndim
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        index[ax] = slice(int(lo), int(hi))
        out.append(x[tuple(index)])
    return (out,)


KERNELS = {f.__name__: f for f in (list_empty, make_list, list_append, list_insert, list_erase, list_at, list_length,
                                   list_stack, list_concat, split_to_list)}
