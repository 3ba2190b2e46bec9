"""Shape algebra shared by type rules, kernels and converters: axes, broadcasting, dim unification,
reshape and slice lengths. Everything here works on `Dim`s (ints and symbolic dims)."""
from __future__ import annotations

import numpy as np

from .types import (Dim, ShapeError, TensorType, dim_add, dim_floordiv, dim_max, dim_min, dim_mul, dim_prod, dim_sub,
                    is_unknown)


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
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"cannot broadcast dims {a} and {b}")
    # A symbol against an int: the int wins (the symbol must equal it at run time).
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    raise ShapeError(f"cannot broadcast symbolic dims {a} and {b}: they are not known to be equal")


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
    symbols); an int or a known symbol wins over an unknown dim."""
    if a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"{what}: dims {a} and {b} differ")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    if is_unknown(a):
        return b
    if is_unknown(b):
        return a
    raise ShapeError(f"{what}: symbolic dims {a} and {b} are not known to be equal")



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
    """len(range(d)[start:stop:step]).

    Over a symbolic `d`, a length that depends on `d` is exact (`x[1:]` is ``max((N - 1), 0)``), but
    bounds that give a static length are assumed to lie inside the axis: `x[:1]` and `x[-3:]` have lengths
    1 and 3 (numpy would clamp them on a shorter axis; the reference interpreter reports that case as an
    error, since the result no longer has its type)."""
    if isinstance(d, int):
        return len(range(*slice(start, stop, step).indices(d)))
    if step < 0 and (start is not None or stop is not None):
        raise ShapeError(f"a slice with negative step {step} and bounds over symbolic dim {d} is not supported")
    start = None if start == 0 else start
    if start is None and stop is None:
        n = d
    elif stop is None:                           # x[k:], x[-k:]
        n = -start if start < 0 else dim_max(dim_sub(d, start), 0)
    elif start is None:                          # x[:k], x[:-k]
        n = stop if stop >= 0 else dim_max(dim_add(d, stop), 0)
    elif (start < 0) == (stop < 0):              # both count from the same end: d drops out
        n = max(stop - start, 0)
    else:                                        # x[k:-j], x[-k:j]: may be an empty range
        lo, hi = (start, dim_add(d, stop)) if start >= 0 else (dim_max(dim_add(d, start), 0), dim_min(stop, d))
        n = dim_max(dim_sub(hi, lo), 0)
    step = abs(step)
    return n if step == 1 else dim_floordiv(dim_add(n, step - 1), step)


