"""`F.assert_dims_equal`: say that two dims are equal when tracing cannot prove it (checked at run time)."""
from __future__ import annotations

import numpy as np

from dyntvm.errors import ExecutionError

from ..ir.ops_checks import DimPairAttrs
from ..ir.shapes import ShapeError, norm_axis
from .ops import _attrs_of, _is_traced, apply
from .tracer import as_array, trace_error, user_source


def assert_dims_equal(a, b, axis_a: int = 0, axis_b: int = 0):
    """`b`, with its axis `axis_b` known to equal axis `axis_a` of `a`.

    Python equivalent::

        assert a.shape[axis_a] == b.shape[axis_b]
        return b

    Traced, later ops see one dim (a's) for both, so ``x + y`` of ``x[k]`` and ``y[k2]`` traces; the equality is
    checked each time the node runs (every iteration inside a loop body), in Python and compiled code alike, and
    a mismatch raises an `ExecutionError` naming both dims by their origin and this line. On numpy arrays it
    checks at once and raises the same error.

    Example::

        score = F.assert_dims_equal(h, score, 0, 0)     # h[k, H] and score[k]: now one dim k
        total = score + F.sum(h, axis=1)
    """
    attrs = _attrs_of("assert_dims_equal", DimPairAttrs, axis_a, axis_b)
    if _is_traced([a, b]):
        return apply("assert_dims_equal", "assert_dims_equal", [a, b], attrs)[0]
    x, y = as_array(a), as_array(b)
    try:
        ax, ay = norm_axis(attrs.axis_a, x.ndim, "axis_a"), norm_axis(attrs.axis_b, y.ndim, "axis_b")
    except ShapeError as e:
        raise trace_error(f"assert_dims_equal: {e}") from None
    if np.shape(x)[ax] != np.shape(y)[ay]:
        src = user_source()
        raise ExecutionError(f"assert_dims_equal failed: axis {ax} of the first tensor has size {np.shape(x)[ax]}, "
                             f"axis {ay} of the second has size {np.shape(y)[ay]}; F.assert_dims_equal states that "
                             f"they are equal. To fix: pass tensors whose dims match there, or remove the assertion "
                             f"if they may differ" + (f"\n    at {src}" if src else ""), op="assert_dims_equal",
                             source=src)
    return y
