"""List values at run time (`ir.list_type.ListType`): a Python list of tensors in an executor slot. Checking
a list given as a model input against its type, and moving one between the host and TVM."""
from __future__ import annotations

import numpy as np

from ..ir.list_type import ListType
from ..ir.types import is_symbol, is_unknown
from .tensors import to_numpy
from .torch_inputs import is_torch_tensor, torch_to_numpy


def check_list_value(x, t: ListType, label: str, env: dict, error=ValueError) -> list:
    """`x` (a list or tuple of arrays) as a list of numpy arrays of type `t`: each element of the list's dtype
    and rank, its ints and named symbols as `t` says (named symbols bound in `env`, shared with the other
    inputs; unknown dims may differ per element); the length bound to `t.length` when it is a symbol. Raises
    `error` (InputError for model inputs) naming the element and what was expected."""
    if not isinstance(x, (list, tuple)):
        raise error(f"{label}: expected a Python list of arrays ({t.describe()}), got {type(x).__name__}")
    out = []
    for k, e in enumerate(x):
        where = f"{label}, element {k}"
        if is_torch_tensor(e):
            e = torch_to_numpy(e, where)
        elif not isinstance(e, np.ndarray):
            if isinstance(e, (list, tuple, dict, str, bytes)) or e is None:
                raise error(f"{where}: expected an array ({t.describe()}), got {type(e).__name__}")
            e = to_numpy(e) if hasattr(e, "__dlpack__") else np.asarray(e)
        if e.dtype.name != t.elem.dtype:
            raise error(f"{where}: dtype is {e.dtype.name}, expected {t.elem.dtype} ({t.describe()}; use "
                        f".astype({t.elem.dtype!r}))")
        if e.ndim != t.elem.ndim:
            raise error(f"{where}: rank is {e.ndim} (shape {list(e.shape)}), expected {t.elem.ndim} "
                        f"({t.describe()})")
        for ax, (d, s) in enumerate(zip(t.elem.shape, e.shape)):
            if isinstance(d, int) and d != s:
                raise error(f"{where}: axis {ax} has size {s}, expected {d} ({t.describe()})")
            if is_symbol(d) and not is_unknown(d) and env.setdefault(d, s) != s:
                raise error(f"{where}: axis {ax} is {d}={s}, but {d}={env[d]} elsewhere ({t.describe()})")
        out.append(e)
    length = t.length
    if isinstance(length, int) and length != len(out):
        raise error(f"{label}: a list of {len(out)} tensors, expected {length}")
    if is_symbol(length) and not is_unknown(length) and env.setdefault(length, len(out)) != len(out):
        raise error(f"{label}: a list of {len(out)} tensors, but its length {length} is {env[length]} elsewhere")
    return out


def host_list(x, to_host=to_numpy) -> list:
    """A list value's elements on the host (numpy), for a list kernel or a model output."""
    return [to_host(e) for e in x]
