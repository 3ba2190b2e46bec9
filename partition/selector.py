"""Node selectors (after MXNet's SubgraphSelector): which nodes may share a compiled region."""
from __future__ import annotations

from ..ir.graph import Node
from ..ir.ops import STATIC


class Selector:
    """Decides region membership. Subclass and pass to `partition(graph, selector)` / `dt.compile`.

    * `select(node)`: may `node` seed a new region?
    * `select_input(node, producer)`: grow from `node` (in the region) to the node producing its input?
    * `select_output(node, consumer)`: grow from `node` to a node consuming its output?
    * `filter(nodes)`: prune a finished candidate region (return the nodes to keep).
    * `merge_independent`: finished regions that no path joins (through other nodes) become one region,
      so they cost one compiled call instead of several (set False to keep them apart).
    """

    merge_independent = True

    def select(self, node: Node) -> bool:
        raise NotImplementedError

    def select_input(self, node: Node, producer: Node) -> bool:
        return self.select(producer)

    def select_output(self, node: Node, consumer: Node) -> bool:
        return self.select(consumer)

    def filter(self, nodes: list) -> list:
        return nodes


class StaticRegionSelector(Selector):
    """The seed's default: a static node collects every static node reachable from it; dynamic-shape
    and control-flow nodes are never inside a region (their subgraphs are partitioned recursively).
    Constants are not seeds: each region gets its own copy of the constants it reads."""

    # Ops numpy runs as views (no data movement), and shape_of: a region of nothing else would only add a
    # VM call and copies, so it is left to the executor's numpy kernels.
    VIEW_OPS = frozenset({"reshape", "squeeze", "expand_dims", "slice", "transpose", "shape_of"})

    def select(self, node: Node) -> bool:
        return node.opdef.kind == STATIC and node.op != "constant"

    def filter(self, nodes: list) -> list:
        if all(n.op in self.VIEW_OPS for n in nodes):
            return []
        return nodes


class OpListSelector(StaticRegionSelector):
    """Only the listed static ops go into regions (the rest run as numpy kernels) — handy for
    debugging a miscompiled op by excluding it."""

    def __init__(self, exclude=(), include=None):
        self.exclude, self.include = set(exclude), None if include is None else set(include)

    def select(self, node: Node) -> bool:
        if not super().select(node) or node.op in self.exclude:
            return False
        return self.include is None or node.op in self.include
