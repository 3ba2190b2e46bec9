"""Constant folding, the pass after partitioning: a region without inputs computes constants.

`dyntvm.pipeline` runs it right after `partition()` (and `dyntvm inspect` does too, so it shows what
`dyntvm compile` builds). Each input-less region is evaluated now with the numpy reference interpreter
and replaced by one `constant` node per output, named `<region>_const<k>`; the executor then hands out
copies of a constant rather than a buffer the VM returns on every call. It lives in the runtime because
it runs the reference interpreter; the partitioner imports nothing from the runtime.
"""
from __future__ import annotations

import numpy as np

from ..ir.attrs import ConstantAttrs
from ..ir.graph import Graph, Node
from ..ir.ops import OpKind
from .interpreter import Interpreter


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
        if n.op != "region" or n.inputs:
            nodes.append(n)
            continue
        for v, value in zip(n.outputs, Interpreter(n.subgraphs[0]).run()):
            data = np.array(value)
            data.flags.writeable = False
            c = Node("constant", (), ConstantAttrs(data), (v,), name=f"{n.attrs.name}_const{v.index}")
            v.producer, v.index = c, 0
            nodes.append(c)
    g.nodes = nodes
