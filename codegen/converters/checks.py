"""Converter of `assert_dims_equal` (`ir/ops_checks.py`): `b` match_cast so that its axis has `a`'s dim; Relax then
sees the dims as one (the executor has checked them before the region ran, with a message naming their origins)."""
from __future__ import annotations

from .common import assert_dims
from .registry import converter


@converter("assert_dims_equal")
def _assert_dims_equal(bb, node, args, ctx):
    a, b = node.inputs
    ax = node.attrs.axis_a % a.type.ndim
    ay = node.attrs.axis_b % b.type.ndim
    return [assert_dims(bb, ctx, args[1], {ay: ctx.dim(a.type.shape[ax])})]
