"""Operators and methods of the traced `Tensor`, installed from the op registry (JAX's array_methods).

`+`, `<`, `-x`, ... come from `OpDef.operator`, methods such as `x.sum()` from `OpDef.method`; `x[i]`,
`x.T`, `x.astype`, `x.reshape` and `x.transpose` are written here. They all call the `F` functions of
`ops.py`, so this module sits above both `tracer.py` (which defines `Tensor` and never imports `ops`)
and `ops.py`. `frontend/__init__.py` imports it: a Tensor has its operators whenever the frontend is
loaded, with or without `dyntvm.F`.
"""
from __future__ import annotations

import numpy as np

from ..ir.ops import all_ops
from . import ops
from .tracer import Tensor, trace_error

_BOOL_ONLY = {"and": "&", "or": "|", "invert": "~"}   # numpy's & | ~ are bitwise on ints: bool only here


def _bool_only(dunder, f):
    sym = _BOOL_ONLY[dunder]

    def g(a, *b):
        for x in (a, *b):
            if np.dtype(x.dtype if isinstance(x, (Tensor, np.ndarray, np.generic)) else type(x)) != np.bool_:
                raise trace_error(f"{sym} is only supported on bool tensors (numpy's {sym} on ints is bitwise, "
                                  f"which dyntvm has no op for); got {getattr(x, 'dtype', type(x).__name__)}")
        return f(a, *b)
    return g


def _astype(self, dtype):
    return ops.cast(self, dtype)


def _reshape(self, *shape):
    return ops.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)


def _transpose(self, *axes):
    return ops.transpose(self, (axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes)
                         or None)


def _getitem(self, idx):
    return ops.getitem(self, idx)


def install() -> None:
    """Set the Tensor operators and methods (idempotent)."""
    for d in all_ops().values():
        f = getattr(ops, d.api) if d.api else None
        if d.operator:
            wrap = _bool_only if d.operator in _BOOL_ONLY else (lambda dunder, g: g)
            if d.num_inputs == 1:
                setattr(Tensor, f"__{d.operator}__", wrap(d.operator, lambda a, f=f: f(a)))
            else:
                setattr(Tensor, f"__{d.operator}__", wrap(d.operator, lambda a, b, f=f: f(a, b)))
                if d.reflected:
                    setattr(Tensor, f"__r{d.operator}__", wrap(d.operator, lambda a, b, f=f: f(b, a)))
        if d.method:
            setattr(Tensor, d.api, f)
    Tensor.T = property(lambda self: ops.transpose(self), doc="`transpose(x)`: axes reversed.")
    Tensor.astype = _astype
    Tensor.reshape = _reshape
    Tensor.transpose = _transpose
    Tensor.__getitem__ = _getitem


install()
