"""Regions that compute the same function share one compiled function.

An exported detector post-processes each class alike: SSDlite's ONNX graph repeats the same few index ops for
each of its 90 classes, between dynamic ops (`nonzero`, `topk`), so it partitions into 2,207 small regions. Each
region was a Relax function of its own, with its own shape function and VM code, and LLVM compiled them all
(8 minutes). Only 135 of them differ. `share_identical_regions` names every region after the first one that is
structurally equal to it (TVM's structural equality of the lowered Relax functions: the same ops, attributes,
dtypes, shapes up to a renaming of the symbolic dims, and constants of equal content; value and node names do
not matter). The executor calls a region's function by its name, so equal regions call one function, and
`build.collect_regions` builds each name once.

Regions inside a loop body keep their own names: a loop body's region is compiled into its loop
(`compiled_loops`), which is built per region.
"""
from __future__ import annotations

import dataclasses

from ..ir.graph import Graph, Node

#: the control-flow ops whose subgraph regions are compiled into loops (never shared)
LOOP_OPS = ("foreach", "while_loop")


def shareable_regions(graph: Graph) -> list[Node]:
    """The region nodes of `graph` outside loop bodies (the top level and `cond` / `case` branches), in order."""
    out: list[Node] = []

    def visit(g: Graph):
        for n in g.nodes:
            if n.op == "region":
                out.append(n)
            elif n.subgraphs and n.op not in LOOP_OPS:
                for sg in n.subgraphs:
                    visit(sg)
    visit(graph)
    return out


def share_identical_regions(graph: Graph) -> int:
    """Rename (in place) each region of `graph` that is structurally equal to an earlier one to that one's name;
    returns how many were renamed. Deterministic: the first region in graph order keeps its name."""
    try:
        import tvm_ffi
        from tvm import relax
    except (ImportError, AttributeError):   # a runtime-only TVM: nothing is compiled (the build says so)
        return 0

    from .relax_builder import build_region_function, unsupported_ops

    by_outline: dict = {}       # only regions of the same outline can be equal: the others are not lowered here
    for n in shareable_regions(graph):
        if not unsupported_ops(n.subgraphs[0]):
            by_outline.setdefault(_outline(n.subgraphs[0]), []).append(n)
    nodes = [n for group in by_outline.values() if len(group) > 1 for n in group]
    if not nodes:
        return 0
    bb = relax.BlockBuilder()
    names: set = set()
    for n in nodes:
        build_region_function(bb, n.subgraphs[0], n.attrs.name, taken=names)
    mod = bb.get()
    firsts: dict = {}           # structural hash -> [(name, function)] of the regions keeping their name
    renamed = 0
    for n in nodes:
        func = mod[n.attrs.name].without_attr("global_symbol")
        key = tvm_ffi.structural_hash(func, map_free_vars=True)
        same = next((name for name, other in firsts.get(key, ())
                     if tvm_ffi.structural_equal(func, other, map_free_vars=True)), None)
        if same is None:
            firsts.setdefault(key, []).append((n.attrs.name, func))
        else:
            n.attrs = dataclasses.replace(n.attrs, name=same)
            renamed += 1
    return renamed


def _outline(g: Graph) -> tuple:
    """What structurally equal regions have in common, cheap to compute: each node's op, and the dtype and rank
    of every input and output (attribute values may name symbolic dims, which equal regions may name apart)."""
    def types(values):
        return tuple((str(getattr(v.type, "dtype", "")), len(getattr(v.type, "shape", ()))) for v in values)
    return (types(g.inputs), types(g.outputs),
            tuple((n.op, types(n.outputs)) for n in g.nodes))
