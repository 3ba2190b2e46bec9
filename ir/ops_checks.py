"""`assert_dims_equal`: the user states that two dims are equal (`F.assert_dims_equal`); checked at run time.

``assert_dims_equal(a, b; axis_a, axis_b)`` returns `b` with axis `axis_b` typed as `a`'s axis `axis_a`, so later
ops see one dim; the node records a `DimCheck` (`ir/dim_checks.py`) that the interpreter and the executor run
before it. Compiled, it is a `match_cast` of `b` (`codegen/converters/checks.py`); numpy returns `b` as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .attrs import _int, _set
from .dim_checks import state_equal
from .ops import register
from .shapes import ShapeError, norm_axis
from .types import TensorType


@dataclass(frozen=True)
class DimPairAttrs:
    axis_a: int = 0
    axis_b: int = 0
    # who states the equality where not the user: an importer enforcing its format's rule ("ONNX ScatterND:
    # the updates' shape"), named when the check fails; empty: the user (F.assert_dims_equal)
    rule: str = field(default="", metadata={"omit_default": True})

    def __post_init__(self):
        if not isinstance(self.rule, str):
            raise TypeError(f"assert_dims_equal: rule must be a str, got {type(self.rule).__name__}")
        _set(self, axis_a=_int(self.axis_a, "axis_a"), axis_b=_int(self.axis_b, "axis_b"))


def _assert_dims_equal(ts, a):
    x, y = ts
    ax = norm_axis(a.axis_a, x.ndim, "axis_a")
    ay = norm_axis(a.axis_b, y.ndim, "axis_b")
    if x.ndim == 0 or y.ndim == 0:
        raise ShapeError(f"both tensors need axes, got {x} and {y}")
    dx, dy = x.shape[ax], y.shape[ay]
    if dx == dy:
        return [y]
    if isinstance(dx, int) and isinstance(dy, int):
        raise ShapeError(f"axis {ax} of the first tensor ({dx}) and axis {ay} of the second ({dy}) differ")
    state_equal(dx, dy, a.rule or "assert_dims_equal")
    return [TensorType(y.shape[:ay] + (dx,) + y.shape[ay + 1:], y.dtype)]


register("assert_dims_equal", DimPairAttrs, _assert_dims_equal, num_inputs=2,
         doc="`b`, with its axis `axis_b` typed as axis `axis_a` of `a` (checked equal at run time).")
