"""Constant folding, the pass after partitioning: a region without inputs computes constants.

`dyntvm.pipeline` runs it right after `partition()` (and `dyntvm inspect` does too, so it shows what
`dyntvm compile` builds). Each input-less region is evaluated now with the numpy reference interpreter
and replaced by one `constant` node per output, named `<region>_const<k>`; the executor then hands out
copies of a constant rather than a buffer the VM returns on every call. A region whose values take more than
`FOLD_LIMIT` bytes stays a region: folding would hold all of it in memory now and store it in the artifact
(a fill of gigabytes is cheaper to compute per call than to load). It lives in the runtime because
it runs the reference interpreter; the partitioner imports nothing from the runtime.
"""
from __future__ import annotations

import logging
import math

import numpy as np

from ..ir.attrs import ConstantAttrs
from ..ir.graph import Graph, Node
from ..ir.ops import OpKind
from ..ir.types import format_bytes
from .interpreter import Interpreter

log = logging.getLogger("dyntvm.fold")

#: the most bytes (all values of the region together) that one region may take to be folded
FOLD_LIMIT = 64 * 2 ** 20


def fold_constants(graph: Graph) -> Graph:
    """Replace every input-less region of a partitioned `graph` (control-flow bodies included) by
    constants. Works in place (the partitioner's output is a private copy) and returns `graph`.

    Example:
        >>> pg = fold_constants(partition(dt.trace(fn, *specs)))
    """
    _fold(graph)
    return graph.lint()


def _fold(g: Graph) -> None:
    nodes = []
    for n in g.nodes:
        if n.opdef.kind == OpKind.CONTROL_FLOW:
            for s in n.subgraphs:
                _fold(s)
        if n.op != "region" or n.inputs or _too_large_to_fold(n):
            nodes.append(n)
            continue
        for v, value in zip(n.outputs, Interpreter(n.subgraphs[0]).run()):
            data = np.array(value)
            data.flags.writeable = False
            c = Node("constant", (), ConstantAttrs(data), (v,), name=f"{n.attrs.name}_const{v.index}")
            v.producer, v.index = c, 0
            nodes.append(c)
    g.nodes = nodes


def _too_large_to_fold(region: Node) -> bool:
    nbytes = 0
    for m in region.subgraphs[0].nodes:
        for v in m.outputs:
            if not v.type.is_static:
                return True
            nbytes += math.prod(v.type.shape) * np.dtype(v.type.dtype).itemsize
    if nbytes > FOLD_LIMIT:
        log.debug("not folding %s: its values take %s (more than %s)", region.attrs.name, format_bytes(nbytes),
                  format_bytes(FOLD_LIMIT))
        return True
    return False
