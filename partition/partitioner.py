"""Cycle-free partitioning of a graph into static regions (recursing into control-flow subgraphs).

Pipeline stage 2 of 4 (`dyntvm.pipeline`): after the frontend, before constant folding
(`dyntvm.runtime.fold`) and codegen. Imports only the IR.

A candidate region grows from a seed along edges the selector accepts. Before a node joins, the
merge is checked for convexity (`convexity.py`, linear memory): it is refused if some node outside the
region would be both reachable from the region and able to reach it (A -> dyn -> B plus A -> B must not put
A and B together). The final partition is asserted acyclic. Deterministic: nodes are visited in
graph order and regions named by position.
"""
from __future__ import annotations

import collections
import logging

import networkx as nx

from dyntvm.errors import CompileError

from ..ir.attrs import RegionAttrs
from ..ir.graph import Graph, Node, Value
from ..ir.dims import parse_dim
from ..ir.ops import CONTROL_FLOW, attr_dims, attr_symbols
from ..ir.serialize import graph_from_dict, graph_to_dict
from ..ir.list_type import ListType
from ..ir.types import is_symbol
from .convexity import ConvexityChecker, PositionCount, is_convex
from .empty import fold_empty_values
from .loops import rewrite_loops
from .selector import Selector, StaticRegionSelector

log = logging.getLogger("dyntvm.partition")


def partition(graph: Graph, selector: Selector | None = None) -> Graph:
    """A copy of `graph` in which selected static nodes are grouped into `region` nodes.

    Example:
        >>> pg = partition(dt.trace(fn, *specs))
        >>> [n.attrs.name for n in pg.nodes if n.op == "region"]
        ['main_r0', 'main_r1']
    """
    selector = selector or StaticRegionSelector()
    d, params = graph_to_dict(graph)
    g = graph_from_dict(d, params)            # a private copy: the caller's graph stays untouched
    g.in_tree, g.out_tree = graph.in_tree, graph.out_tree
    fold_empty_values(g)                      # values with a static 0 dim: no kernels (see empty.py)
    rewrite_loops(g)                          # hoisting out of loop bodies (see loops.py)
    out = _partition(g, selector, _ident(g.name or "main"))
    out.lint()
    return out


def _ident(s: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in s)


def _partition(g: Graph, selector: Selector, prefix: str) -> Graph:
    for i, n in enumerate(g.nodes):
        if n.opdef.kind == CONTROL_FLOW:
            n.subgraphs = tuple(_partition(s, selector, f"{prefix}_{i}{_ident(s.name)}") for s in n.subgraphs)
    regions = find_regions(g, selector)
    return contract(g, regions, prefix)


def find_regions(g: Graph, selector: Selector) -> list[list[int]]:
    """Node-index lists, one per region, each convex (no path leaves and re-enters it)."""
    producer = {v: i for i, n in enumerate(g.nodes) for v in n.outputs}
    consumers: list[list[int]] = [[] for _ in g.nodes]
    producers: list[list[int]] = [[] for _ in g.nodes]
    for i, n in enumerate(g.nodes):
        for p in sorted({producer[v] for v in n.inputs if v in producer}):
            producers[i].append(p)
            consumers[p].append(i)
    checker = ConvexityChecker(consumers, producers)
    # Nodes a region cannot take: not selectable (constants have no inputs, so no path runs through them) and,
    # as regions are made, their members. A candidate whose window to the region holds none of them needs no
    # convexity search: a path leaving the region and coming back inside that window runs through selectable
    # nodes only, which the growth takes too (with the plain selector, which selects along every edge). The
    # finished region is checked once; should a later refusal have left it non-convex, it is grown again with
    # a search per candidate. (Without this, a 440-node GPT-2 export spent the search budget and ended in 13
    # regions where one is right.)
    fast = _selects_along_edges(selector)
    outside = PositionCount(len(g.nodes))
    for i, n in enumerate(g.nodes):
        if n.op != "constant" and not selector.select(n):
            outside.mark(i)
    assigned: set[int] = set()
    regions = []

    def grow(seed: int, skip_free_windows: bool) -> tuple:
        members, lo, hi = {seed}, seed, seed
        frontier = collections.deque([seed])
        while frontier:
            cur = frontier.popleft()
            cnode = g.nodes[cur]
            cand = []
            for v in cnode.inputs:
                p = producer.get(v)
                if p is not None and selector.select_input(cnode, g.nodes[p]):
                    cand.append(p)
            cand += [c for c in consumers[cur] if selector.select_output(cnode, g.nodes[c])]
            for c in sorted(set(cand)):
                if c in members or c in assigned or not selector.select(g.nodes[c]):
                    continue
                free = skip_free_windows and outside.count(min(lo, c), max(hi, c)) == 0
                if not free and not checker.union_is_convex(members, lo, hi, (c,)):
                    log.debug("refused merging node %d (%s) into region of %d: it would create a cycle",
                              c, g.nodes[c].op, seed)
                    continue
                members.add(c)
                lo, hi = min(lo, c), max(hi, c)
                frontier.append(c)
        return members, lo, hi

    for seed, node in enumerate(g.nodes):
        if seed in assigned or not selector.select(node):
            continue
        members, lo, hi = grow(seed, fast)
        if fast and not is_convex(members, lo, hi, consumers):
            members, lo, hi = grow(seed, False)
        kept = sorted(_filtered(selector, g, members))
        if not kept:
            continue
        assigned.update(kept)
        for i in kept:
            outside.mark(i)
        regions.append(kept)
    dag = g.to_networkx()
    if not selector.merge_independent:
        return _acyclic(g, dag, regions, selector)
    symbolic = {i for i, n in enumerate(g.nodes) if attr_symbols(n.op, n.attrs)}
    merged = _merge_independent(regions, ConvexityChecker(consumers, producers), symbolic,
                                lambda m: not _symbol_carriers(g, sorted(m), producer, True),
                                lambda m: _inputless(g, m, producer))
    # each group is convex, but two groups may still reach each other through other nodes (A -> x -> D and
    # C -> y -> B merged as {A, B}, {C, D}): then keep the regions apart
    return merged if _contracted_cycle(dag, merged) is None else _acyclic(g, dag, regions, selector)


def _acyclic(g: Graph, dag, regions: list, selector) -> list:
    """`regions`, where two of them reach each other through other nodes (each convex, but A -> dyn -> B and
    B -> dyn -> A), with the largest region on such a cycle split into its nodes, until none is left (a node
    alone is never on one: the graph is a DAG and every region convex)."""
    regions = [list(r) for r in regions]
    while (cycle := _contracted_cycle(dag, regions)) is not None:
        k = max(cycle, key=lambda k: len(regions[k]))
        log.debug("regions %s reach each other through other nodes: region %d split into its nodes", cycle, k)
        split = regions.pop(k)
        regions += [[i] for i in split if _filtered(selector, g, {i})]
        regions.sort(key=min)
    return regions


def _selects_along_edges(selector) -> bool:
    """Whether the selector takes a selectable node from either side of any edge (the base behaviour)."""
    cls = type(selector)
    return cls.select_input is Selector.select_input and cls.select_output is Selector.select_output


def _contracted_cycle(dag, groups: list) -> list | None:
    """The groups (by index) on a cycle of the graph with each group contracted to one node, or None."""
    label = {i: k for k, members in enumerate(groups) for i in members}
    q = nx.DiGraph()
    for u, v in dag.edges:
        a, b = label.get(u, ("n", u)), label.get(v, ("n", v))
        if a != b:
            q.add_edge(a, b)
    try:
        edges = nx.find_cycle(q)
    except nx.NetworkXNoCycle:
        return None
    return sorted({x for e in edges for x in e[:2] if isinstance(x, int)})


def _merge_independent(regions: list, checker: ConvexityChecker, symbolic: set, bindable,
                       inputless) -> list[list[int]]:
    """Regions that no path joins through other nodes become one: one compiled call instead of several (in a
    loop body: per step). Each merge keeps the union convex, which keeps the contracted graph acyclic, and
    the symbols its ops' attrs use bindable (`bindable(members)`; only asked where a member is in `symbolic`,
    the nodes whose attrs use symbols). Regions without inputs stay apart: they are folded into constants at
    compile time (`runtime.fold`)."""
    groups: list = []            # [members, least position, greatest position, inputless, any member symbolic]
    for members in regions:
        if inputless(members):
            groups.append([set(members), 0, 0, True, False])
            continue
        uses_symbols = any(i in symbolic for i in members)
        target = None if checker.exhausted else next(
            (gr for gr in groups if not gr[3] and checker.union_is_convex(gr[0], gr[1], gr[2], members)
             and (not (uses_symbols or gr[4]) or bindable(gr[0] | set(members)))), None)
        if target is None:
            groups.append([set(members), members[0], members[-1], False, uses_symbols])
            continue
        target[0].update(members)
        target[1], target[2] = min(target[1], members[0]), max(target[2], members[-1])
        target[4] = target[4] or uses_symbols
    return [sorted(gr[0]) for gr in groups]


def _inputless(g: Graph, members: list, producer: dict) -> bool:
    """The region reads nothing but its own values and constants (and binds no symbol of its attrs from outside)."""
    inside = set(members)
    for i in members:
        for v in g.nodes[i].inputs:
            p = producer.get(v)
            if p is None or (p not in inside and g.nodes[p].op != "constant"):
                return False
    return not _symbol_carriers(g, sorted(members), producer)


def _filtered(selector, g, members) -> list[int]:
    nodes = [g.nodes[i] for i in sorted(members)]
    keep = selector.filter(nodes)
    index = {id(n): i for i, n in zip(sorted(members), nodes)}
    return [index[id(n)] for n in keep]


def contract(g: Graph, regions: list[list[int]], prefix: str) -> Graph:
    """Replace each region's nodes by one region node owning them as a closed subgraph."""
    region_of = {i: r for r, members in enumerate(regions) for i in members}
    producer = {v: i for i, n in enumerate(g.nodes) for v in n.outputs}
    used_outside: set = set(g.outputs)
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            p = producer.get(v)
            if p is None or region_of.get(p) != region_of.get(i) or i not in region_of:
                used_outside.add(v)
    carriers = [_symbol_carriers(g, members, producer) for members in regions]
    for extra in carriers:                     # a carrier made inside another region must leave it
        used_outside.update(extra)
    # order: contracted DAG, topologically sorted with original positions as tie-breaker
    dag = nx.DiGraph()
    key = {}
    for i, n in enumerate(g.nodes):
        u = ("r", region_of[i]) if i in region_of else ("n", i)
        key[u] = min(key.get(u, i), i)
        dag.add_node(u)
    for i, n in enumerate(g.nodes):
        u = ("r", region_of[i]) if i in region_of else ("n", i)
        for v in n.inputs:
            p = producer.get(v)
            if p is not None:
                w = ("r", region_of[p]) if p in region_of else ("n", p)
                if w != u:
                    dag.add_edge(w, u)
    for r, extra in enumerate(carriers):       # a region also depends on the values that carry its attrs' symbols
        for v in extra:
            p = producer.get(v)
            if p is not None:
                w = ("r", region_of[p]) if p in region_of else ("n", p)
                if w != ("r", r):
                    dag.add_edge(w, ("r", r))
    if not nx.is_directed_acyclic_graph(dag):
        raise CompileError(f"partition of {prefix} is cyclic (a partitioner bug); regions {regions}")
    # (built after the DAG: making a region node rewires its members' inputs)
    new_nodes: dict[int, Node] = {}
    for r, members in enumerate(regions):
        new_nodes[min(members)] = _region_node(g, members, producer, used_outside, f"{prefix}_r{r}", carriers[r])
    nodes = []
    for u in nx.lexicographical_topological_sort(dag, key=lambda u: key[u]):
        if u[0] == "r":
            nodes.append(new_nodes[min(regions[u[1]])])
        else:
            nodes.append(g.nodes[u[1]])
    # constants only read by regions were copied into them: drop the originals
    used = {v for n in nodes for v in n.inputs} | set(g.outputs)
    nodes = [n for n in nodes if n.op != "constant" or any(v in used for v in n.outputs)]
    return Graph(g.inputs, nodes, g.outputs, g.name, g.in_tree, g.out_tree, dict(g.dim_origins), dict(g.dim_ranges))


def _symbol_carriers(g: Graph, members: list, producer: dict, unbound: bool = False):
    """Values outside the region that must become region inputs only to bind symbolic dims its ops' attrs
    use (``F.arange(x.shape[0])`` alone in a region: the compiled function needs a tensor whose shape holds
    ``N``). Graph inputs first, else the earliest value defined before the region. With `unbound`: the
    symbols no such value binds instead."""
    member_set = set(members)
    bound: set = set()
    atoms: set = set()           # expression dims of the region's inputs: known as a whole inside it
    for i in members:
        for v in g.nodes[i].inputs:
            p = producer.get(v)
            if p is None or p not in member_set:
                bound |= {d for d in v.type.shape if is_symbol(d)}
                atoms |= {d for d in v.type.shape if isinstance(d, str) and not is_symbol(d)}
    need = set().union(*(attr_symbols(g.nodes[i].op, g.nodes[i].attrs) for i in members)) - bound
    out: list = []
    if not need:                 # (most regions: then no need to walk the values before it)
        return set() if unbound else out
    first = min(members)
    candidates = [v for v in list(g.inputs) + [v for i, n in enumerate(g.nodes[:first]) if i not in member_set
                                               and n.op != "constant" for v in n.outputs]
                  if not isinstance(v.type, ListType)]        # a list never enters a region
    # an expression dim of the attrs (``((N + 1) // 2)``) that a value has as a dim binds as a whole; its symbols
    # are still needed where another dim of the attrs uses them (arange(15 * X, 30 * X) bound by 15 * X alone)
    unbound_symbols: set = set()
    for d in sorted({d for i in members for d in attr_dims(g.nodes[i].op, g.nodes[i].attrs)}):
        syms = parse_dim(d).free_symbols(atoms) & need
        if not syms:
            continue
        if not is_symbol(d):
            v = next((c for c in candidates if d in c.type.shape), None)
            if v is not None:
                if v not in out:
                    out.append(v)
                continue
        unbound_symbols |= syms
    need &= unbound_symbols
    missing = set()
    for sym in sorted(need):
        v = next((c for c in candidates if sym in c.type.shape), None)
        if v is None:
            missing.add(sym)
        elif v not in out:
            out.append(v)
    return missing if unbound else out


def _embeddable(const: Node) -> bool:
    """Whether a constant may be copied into a region. Not an empty one (a 0 dim): TVM writes it into the
    kernel library as a 0-byte tensor that it cannot load back ("Invalid DLTensor file format": the compile
    cache and dt.load failed), so it stays outside and is passed in (found by the fuzzer)."""
    value = const.attrs.value
    return getattr(value, "ndim", 0) == 0 or getattr(value, "size", 1) > 0


def _region_node(g, members, producer, used_outside, name, carriers=()) -> Node:
    inner = [g.nodes[i] for i in members]
    member_set = set(members)
    ext_inputs: list[Value] = []
    mapping: dict = {}
    consts: list[Node] = []
    for n in inner:
        for v in n.inputs:
            p = producer.get(v)
            if (p is None or p not in member_set) and v not in mapping:
                if p is not None and g.nodes[p].op == "constant" and _embeddable(g.nodes[p]):
                    c = Node("constant", (), g.nodes[p].attrs, name=g.nodes[p].name)
                    c.outputs = (Value(v.type, v.name, c, 0),)
                    consts.append(c)
                    mapping[v] = c.outputs[0]
                else:
                    ext_inputs.append(v)
                    mapping[v] = Value(v.type, v.name)
    for v in carriers:
        if v not in mapping:
            ext_inputs.append(v)
            mapping[v] = Value(v.type, v.name)
    body_nodes = []
    for n in inner:
        n.inputs = tuple(mapping.get(v, v) for v in n.inputs)
        body_nodes.append(n)
    outs = [v for n in inner for v in n.outputs if v in used_outside]
    sub = Graph([mapping[v] for v in ext_inputs], consts + body_nodes, outs, name)
    node = Node("region", tuple(ext_inputs), RegionAttrs(name), (), (sub,), name=name)
    # the region's outputs are the same Value objects the rest of the graph already uses;
    # inside the subgraph they are rebound to fresh values so each graph owns its own.
    inner_outs = []
    for v in outs:
        nv = Value(v.type, v.name, v.producer, v.index)
        v.producer.outputs = tuple(nv if o is v else o for o in v.producer.outputs)
        inner_outs.append(nv)
    rebound = dict(zip(outs, inner_outs))
    for n in body_nodes:
        n.inputs = tuple(rebound.get(v, v) for v in n.inputs)
    sub.outputs = inner_outs
    node.outputs = tuple(outs)
    for k, v in enumerate(outs):
        v.producer, v.index = node, k
    return node
