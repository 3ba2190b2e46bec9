"""Shape algebra shared by type rules, kernels and converters: axes, broadcasting, dim unification,
reshape and slice lengths. Everything here works on `Dim`s (ints and symbolic dims)."""
from __future__ import annotations

import math

import numpy as np

from .types import (Dim, ShapeError, TensorType, dim_add, dim_bounds, dim_floordiv, dim_max, dim_min, dim_mul,
                    dim_prod, dim_sub, dims_equal, is_unknown, simplify_dim)
from .dim_checks import broadcast_to_own_symbol, broadcast_to_size, equate_dims, recording_checks


def norm_axes(axis, ndim: int) -> tuple:
    """`axis` (None, an int or a sequence) as sorted non-negative axes of a rank-`ndim` tensor."""
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, (int, np.integer)) else axis
    return tuple(sorted({norm_axis(int(a), ndim) for a in axis}))


def norm_axis(axis: int, ndim: int, what="axis") -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"{what} {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0


def broadcast_dims(a: Dim, b: Dim) -> Dim:
    """The dim of two broadcast dims: equal ones (compared in canonical form: ``(H - 1) + 1`` is ``H``), or the
    other where one is 1. Symbolic dims that are not provably equal raise here (the one place that does)."""
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"cannot broadcast dims {a} and {b}")
    if dims_equal(a, b):
        return simplify_dim(a)
    # A symbol against an int: the int wins (the symbol must equal it, or be 1, at run time: checked).
    if isinstance(a, int):
        return broadcast_to_size(a, b)
    if isinstance(b, int):
        return broadcast_to_size(b, a)
    # A dim that is 0 or 1 (`x[:1]` has min(N, 1) rows) against d: d where it is 1, 0 (numpy needs d <= 1 then)
    # where it is 0; that is d * it, or simply d against min(d, 1).
    for one, d in ((a, b), (b, a)):
        if dim_bounds(one)[1] <= 1:
            return d if dims_equal(one, dim_min(d, 1)) else dim_mul(d, one)
    own = broadcast_to_own_symbol(a, b)         # min(S, 64) against S: S wherever it broadcasts, checked
    if own is not None:
        return own
    return equate_dims(a, b, "broadcast")      # undecided: unified, checked at run time (or refused)


def broadcast_dims_ahead(a: Dim, b: Dim) -> Dim:
    """`broadcast_dims` for a dim worked out before the node whose rule checks it is recorded (ONNX Expand's
    target shape): a dim kept under a run-time check (``S`` for ``min(S, 64)`` against ``S``) is given, the node's
    rule recording the check again; one that would be a dim of its own is refused, as outside tracing."""
    with recording_checks():
        out = broadcast_dims(a, b)
    if isinstance(out, str) and is_unknown(out) and out not in (a, b):
        return broadcast_dims(a, b)
    return out


def broadcast_shapes(*shapes) -> tuple:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        d: Dim = 1
        for s in shapes:
            j = i - (nd - len(s))
            if j >= 0:
                d = broadcast_dims(d, s[j])
        out.append(d)
    return tuple(out)


def unify_dims(a, b, what):
    """The one dim that `a` and `b` must both be (ShapeError where they provably differ or are unrelated
    symbols); an int or a known symbol wins over an unknown dim. Dims are compared in canonical form, so
    ``(H - 1) + 1`` and ``H`` are one dim."""
    if a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"{what}: dims {a} and {b} differ")
    equal = dims_equal(a, b)
    if equal:
        return simplify_dim(a)
    if equal is False:
        raise ShapeError(f"{what}: dims {a} and {b} differ for every size")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    if is_unknown(a):
        return b
    if is_unknown(b):
        return a
    return equate_dims(a, b, what)             # undecided: unified, checked at run time (or refused)


def reduce_shape(t: TensorType, axis, keepdims):
    """`t`'s shape reduced over `axis` (None: all); reduced axes are 1 with keepdims, else None."""
    axes = list(range(t.ndim)) if axis is None else [norm_axis(ax, t.ndim) for ax in axis]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"duplicate axis in {tuple(axis)}")
    axes = set(axes)
    return tuple((1 if keepdims else None) if i in axes else d for i, d in enumerate(t.shape))


def infer_reshape(in_shape: tuple, target: tuple) -> tuple:
    """Resolve one -1 in `target` against `in_shape`, symbolically when it must."""
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeError(f"reshape target {target} has more than one -1")
    if -1 not in target:
        return tuple(target)
    known = [d for d in target if d != -1]
    rest = list(d for d in in_shape if not isinstance(d, int))
    int_in = int(np.prod([d for d in in_shape if isinstance(d, int)], dtype=np.int64))
    int_out = int(np.prod([d for d in known if isinstance(d, int)], dtype=np.int64))
    sym_ok = True
    for d in (d for d in known if not isinstance(d, int)):
        if d in rest:
            rest.remove(d)
        else:
            sym_ok = False
    if sym_ok and int_out and int_in % int_out == 0:
        missing = dim_mul(dim_prod(rest), int_in // int_out)
    elif int_out == 0:
        raise ShapeError(f"cannot reshape {in_shape} to {target}: -1 is ambiguous with a 0 dim")
    else:
        missing = dim_floordiv(dim_prod(in_shape), dim_prod(known))
    if isinstance(missing, int) and all(isinstance(d, int) for d in in_shape) and \
            missing * int_out != int_in:
        raise ShapeError(f"cannot reshape {in_shape} to {target}")
    return tuple(missing if d == -1 else d for d in target)


def slice_length(d: Dim, start, stop, step) -> Dim:
    """len(range(d)[start:stop:step]), exact for every size of a symbolic `d`.

    Bounds clamp as numpy clamps them, so a length over a symbolic axis may be a `min`/`max` expression:
    `x[:2]` and `x[-2:]` have ``min(N, 2)`` rows, `x[1:]` has ``max((N - 1), 0)``, `x[1:3]` has
    ``max((min(N, 3) - 1), 0)``. A negative step visits what the flipped bounds visit with a positive
    step: ``len(range(d)[a:b:-s]) == len(range(d)[~a:~b:s])``."""
    if isinstance(d, int):
        return len(range(*slice(start, stop, step).indices(d)))
    if step == 0:
        raise ShapeError("slice step cannot be zero")
    if step < 0:
        return slice_length(d, None if start is None else ~start, None if stop is None else ~stop, -step)
    a, b = (None if start == 0 else start), stop
    if a is None and b is None:
        n = d
    elif b is None:                              # x[k:], x[-k:]
        n = dim_max(dim_sub(d, a), 0) if a >= 0 else dim_min(d, -a)
    elif a is None:                              # x[:k], x[:-k]
        n = dim_min(d, b) if b >= 0 else dim_max(dim_add(d, b), 0)
    elif (a >= 0) == (b >= 0):                   # both from the same end: x[j:k], x[-j:-k]
        n = 0 if b <= a else dim_max(dim_sub(dim_min(d, b if b >= 0 else -a), a if a >= 0 else -b), 0)
    elif a >= 0:                                 # x[j:-k]
        n = dim_max(dim_sub(d, a - b), 0)
    else:                                        # x[-j:k]: both ends clamp
        n = dim_max(dim_sub(dim_min(d, b), dim_max(dim_add(d, a), 0)), 0)
    return n if step == 1 else dim_floordiv(dim_add(n, step - 1), step)


def arange_length(start, stop, step, dtype) -> int:
    """numpy's length of ``arange(start, stop, step)``, max(ceil((stop - start) / step), 0) in Python's
    true division as numpy computes it, without building a huge one; ShapeError where numpy raises."""
    what = f"arange({start}, {stop}, {step})"
    try:
        span = (stop - start) / step
    except ZeroDivisionError:
        raise ShapeError(f"{what}: step must not be 0") from None
    except OverflowError:
        span = math.inf
    if not math.isfinite(span):
        raise ShapeError(f"{what}: cannot compute the length (a bound or the step is NaN or infinite)")
    n = max(math.ceil(span), 0)
    if n * np.dtype(dtype).itemsize >= 2 ** 62:
        raise ShapeError(f"{what}: {n} elements of {dtype} are more than an array can hold")
    if n > 1 << 20:
        return n
    try:
        return len(np.arange(start, stop, step, dtype=dtype))
    except (ValueError, OverflowError, TypeError) as e:      # e.g. negative values as uint8
        raise ShapeError(f"{what} as {dtype}: {e}") from None
