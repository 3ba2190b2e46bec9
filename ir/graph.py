"""Values, nodes and graphs: the SSA IR every stage works on (torch.fx / jaxpr shaped, typed)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from .dims import parse_dim
from .list_type import ListType
from .types import TensorType, dim_origin, map_type_dims


class Value:
    """One SSA value: a graph input or a node output. Always typed."""

    __slots__ = ("type", "name", "producer", "index")

    def __init__(self, type: TensorType | ListType, name: str = "", producer: "Node | None" = None, index: int = 0):
        if not isinstance(type, (TensorType, ListType)):
            raise TypeError(f"Value type must be a TensorType or a ListType, got {type!r}")
        self.type, self.name, self.producer, self.index = type, name, producer, index

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(eq=False)
class Node:
    """An op applied to values. ``attrs`` is the op's frozen attrs dataclass."""

    op: str
    inputs: tuple
    attrs: Any
    outputs: tuple = ()
    subgraphs: tuple = ()
    source: str = ""           # user's source line, "file.py:12: code"
    name: str = ""
    checks: tuple = ()         # `dim_checks.DimCheck`s run before the node (dims unified while tracing)

    @property
    def opdef(self):
        from .ops import get_op
        return get_op(self.op)


@dataclass(eq=False)
class Graph:
    """A list of nodes in topological order with typed inputs and outputs.

    Subgraphs (bodies of control-flow and region nodes) are closed: they see outer values only
    through their own ``inputs`` (the owning node passes captures explicitly).
    ``in_tree``/``out_tree`` record the user's nesting of inputs/outputs (see `tree_flatten`).
    """

    inputs: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    name: str = "main"
    in_tree: Any = None
    out_tree: Any = None
    dim_origins: dict = field(default_factory=dict)    # unknown dim -> where it comes from (for messages)
    # input symbol -> (lowest, highest or None) it may take (torch.export's Dim(min=, max=)): checked on each call
    dim_ranges: dict = field(default_factory=dict)

    def values(self):
        yield from self.inputs
        for n in self.nodes:
            yield from n.outputs

    def walk(self):
        """Every node, depth first through subgraphs."""
        for n in self.nodes:
            yield n
            for g in n.subgraphs:
                yield from g.walk()

    def users(self) -> dict:
        """Value -> list of consumer nodes (graph outputs not included)."""
        out = {v: [] for v in self.values()}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(v, []).append(n)
        return out

    def lint(self):
        from .lint import lint
        lint(self)
        return self

    def to_networkx(self):
        """A DiGraph over nodes (by index) with an edge per data dependency."""
        import networkx as nx
        g = nx.DiGraph()
        producer = {}
        for i, n in enumerate(self.nodes):
            g.add_node(i, node=n)
            for v in n.outputs:
                producer[v] = i
        for i, n in enumerate(self.nodes):
            for v in n.inputs:
                if v in producer:
                    g.add_edge(producer[v], i)
        return g

    def __str__(self) -> str:
        from .printer import format_graph
        return format_graph(self)


def assign_names(graph: Graph, counter=None, reserved: set | None = None) -> Graph:
    """Give every unnamed value and node a unique, deterministic name (whole tree). Generated names
    (``v0``, ``v1``, ...) skip every name already given in the tree (a parameter may be called ``v2``)."""
    counter = counter if counter is not None else itertools.count()
    if reserved is None:
        reserved = {v.name for g in [graph] + [s for n in graph.walk() for s in n.subgraphs] for v in g.values()
                    if v.name}

    def fresh() -> str:
        while True:
            name = f"v{next(counter)}"
            if name not in reserved:
                return name
    taken = set()
    for v in graph.inputs:
        if not v.name or v.name in taken:
            v.name = fresh()
        taken.add(v.name)
    for n in graph.nodes:
        for v in n.outputs:
            if not v.name or v.name in taken:
                v.name = fresh()
            taken.add(v.name)
        if not n.name:
            n.name = f"{n.op}_{next(counter)}"
        for sg in n.subgraphs:
            assign_names(sg, counter, reserved)
    return graph


def canonicalize_unknown_dims(graph: Graph) -> Graph:
    """Rename unknown dims (fresh names from a process-wide counter) to ``_d0, _d1, ...`` in order of first
    use over the whole tree, so that tracing the same function twice gives equal graphs. (`fresh_dim` never
    makes ``_d`` names, so later passes cannot collide with these.)"""
    mapping: dict = {}

    def rename(s):
        return mapping.setdefault(s, f"_d{len(mapping)}") if s.startswith("_") else s

    def canon(d):
        e = parse_dim(d)
        return e.rename(rename).to_dim() if any(s.startswith("_") for s in e.symbols) else d

    def retype(t):
        if isinstance(t, ListType):
            return ListType(map_type_dims(t.elem, canon), canon(t.length) if isinstance(t.length, str) else t.length)
        return map_type_dims(t, canon)

    def walk(g):
        for v in g.inputs:
            v.type = retype(v.type)
        for n in g.nodes:
            if n.opdef.dim_attrs:
                n.attrs = n.opdef.map_dim_attrs(n.attrs, canon)
            for v in n.outputs:
                v.type = retype(v.type)
            if n.checks:
                n.checks = tuple(c.renamed(canon) for c in n.checks)
            for sg in n.subgraphs:
                walk(sg)
    walk(graph)
    old = {new: old for old, new in mapping.items()}
    graph.dim_origins = {new: graph.dim_origins.get(o) or dim_origin(o) for new, o in old.items()
                         if graph.dim_origins.get(o) or dim_origin(o)}
    return graph
