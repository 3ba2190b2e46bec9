"""Converters of `ir/ops_index.py`'s static ops: `cumsum` (Relax ``cumsum`` in x's dtype) and `scatter_flat`
(Relax ``scatter_elements`` along the one axis: TOPI's kernel applies the updates serially, in order, so the last
of duplicate indices wins as in numpy). `scatter_flat`'s indices are in range by construction: the ONNX
converters that make it (`frontend/onnx_index.py`) check every index against its axis first."""
from __future__ import annotations

from tvm.relax import op as R

from .common import dtype_of
from .registry import converter

_REDUCTIONS = {"none": "update", "add": "add", "mul": "mul", "max": "max", "min": "min"}


@converter("cumsum")
def _cumsum(bb, node, args, ctx):
    return [R.cumsum(args[0], axis=int(node.attrs.axis), dtype=dtype_of(args[0]))]


@converter("scatter_flat")
def _scatter_flat(bb, node, args, ctx):
    data, idx, upd = args
    return [R.scatter_elements(data, idx, upd, axis=0, reduction=_REDUCTIONS[node.attrs.reduction])]
