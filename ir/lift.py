"""Lift rules (`OpDef.lift`): how an op runs over a whole sequence at once, for loop hoisting
(`partition.loops`).

``lift(attrs, ranks, lifted) -> attrs | None``: per step the op sees inputs of ranks `ranks`; `lifted[k]`
says input k gains a leading sequence axis. The result is the attrs that compute every step's result at
once, stacked on a new axis 0, or None where the op cannot. Ops with a rule never raise on values, so they
may also move out of a loop whose body may not run at all.
"""
from __future__ import annotations

import dataclasses


def _shift(axis: int) -> int:
    """A non-negative axis of a per-step value, on its lifted value (negative axes count from the end)."""
    return axis + 1 if axis >= 0 else axis


def lift_elementwise(a, ranks, lifted):
    """Numpy broadcasting aligns trailing axes: a lifted input must have the result's rank, so that its new
    leading axis meets no axis of an input that is not lifted."""
    r = max(ranks)
    return a if all(k == r for k, up in zip(ranks, lifted) if up) else None


def lift_matmul(a, ranks, lifted):
    return a if lifted == [True, False] and ranks[1] <= 2 else None     # [T, .., K] @ [K, N]: a batched GEMM


def lift_reduce(a, ranks, lifted):
    axes = tuple(range(ranks[0])) if a.axis is None else a.axis
    return dataclasses.replace(a, axis=tuple(_shift(x) for x in axes))


def lift_axis(a, ranks, lifted):
    return dataclasses.replace(a, axis=_shift(a.axis))


def lift_all_axis(a, ranks, lifted):
    return dataclasses.replace(a, axis=_shift(a.axis)) if all(lifted) else None




def lift_transpose(a, ranks, lifted):
    """The sequence axis stays first; the step's axes keep their order after it."""
    axes = tuple(range(ranks[0]))[::-1] if a.axes is None else tuple(x % ranks[0] for x in a.axes)
    return dataclasses.replace(a, axes=(0,) + tuple(x + 1 for x in axes))


def lift_reshape(a, ranks, lifted):
    """Each step's row reshaped to a static shape of no 0 dim: the whole sequence to ``(-1, *shape)`` (the -1 is
    the number of steps; a 0 dim next to it would make it ambiguous, and a symbolic one may be 0)."""
    shape = tuple(a.shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        return None
    return dataclasses.replace(a, shape=(-1,) + shape)
