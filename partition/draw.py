"""Draw a partitioned graph (`dyntvm inspect --svg`): regions coloured, dynamic and control-flow nodes distinct.

The top-level graph is one panel; every control-flow subgraph (a loop body, a branch) gets its own
panel titled after the node that owns it, so nesting reads as "node -> its panels". Region nodes are
drawn as one box each (their ops are listed by `dyntvm inspect` in text). Constants are left out.
Layers follow the data flow top to bottom (longest path from the inputs), ordered by the barycentre
of their predecessors to keep crossings down. Deterministic: same graph, same picture.
"""
from __future__ import annotations

import math
import os

import networkx as nx

from ..ir.graph import Graph
from ..ir.ops import CONTROL_FLOW, DYNAMIC_SHAPE

# kind -> (marker, face colour, legend label); regions take their colour from REGION_COLOURS
STYLE = {
    "input": ("v", "#cfe2f3", "graph input"),
    "output": ("^", "#d9ead3", "graph output"),
    "static": ("o", "#d9d9d9", "static op outside a region"),
    "dynamic": ("D", "#e06666", "dynamic-shape op (numpy kernel)"),
    "control": ("H", "#f6b26b", "control flow (subgraphs in own panels)"),
    "region": ("s", None, "compiled region"),
}
REGION_COLOURS = ["#6fa8dc", "#93c47d", "#8e7cc3", "#c27ba0", "#76a5af", "#ffd966", "#a4c2f4", "#b6d7a8",
                  "#b4a7d6", "#d5a6bd", "#a2c4c9", "#f9cb9c"]


def panels(graph: Graph, title: str = "") -> list[tuple[str, Graph]]:
    """(title, graph) for the graph and, depth first, every control-flow subgraph inside it."""
    out = [(title or f"graph {graph.name}", graph)]
    for n in graph.nodes:
        if n.opdef.kind == CONTROL_FLOW:
            for k, sub in enumerate(n.subgraphs):
                out += panels(sub, f"{n.name} ({n.op}) subgraph {k}: {sub.name}")
    return out


def _kind(node) -> str:
    if node.op == "region":
        return "region"
    kind = node.opdef.kind
    return {DYNAMIC_SHAPE: "dynamic", CONTROL_FLOW: "control"}.get(kind, "static")


def to_networkx(graph: Graph) -> nx.DiGraph:
    """Nodes ("in", k), ("n", i), ("out", k) with `kind` and `label`; one edge per data dependency."""
    g = nx.DiGraph()
    producer = {}
    for k, v in enumerate(graph.inputs):
        g.add_node(("in", k), kind="input", label=v.name)
        producer[v] = ("in", k)
    for i, n in enumerate(graph.nodes):
        if n.op == "constant":
            continue
        if n.op == "region":
            ops = sum(m.op != "constant" for m in n.subgraphs[0].nodes)
            label = f"{n.attrs.name}\n{ops} ops"
        elif n.opdef.kind == CONTROL_FLOW:
            label = f"{n.op}\n{n.name}"
        else:
            label = n.op
        g.add_node(("n", i), kind=_kind(n), label=label, region=n.attrs.name if n.op == "region" else None)
        for v in n.outputs:
            producer[v] = ("n", i)
        for v in n.inputs:
            if v in producer:
                g.add_edge(producer[v], ("n", i))
    for k, v in enumerate(graph.outputs):
        g.add_node(("out", k), kind="output", label=f"out {k}")
        if v in producer:
            g.add_edge(producer[v], ("out", k))
    return g


def layout(g: nx.DiGraph) -> dict:
    """Top-down layered positions: y = -(longest path from a source), x by predecessor barycentre."""
    layer = {}
    for u in nx.topological_sort(g):
        layer[u] = max((layer[p] + 1 for p in g.predecessors(u)), default=0)
    last = max(layer.values(), default=0)
    for u in g:                                        # all outputs on the last row
        if u[0] == "out":
            layer[u] = last
    rows: dict[int, list] = {}
    for u in g:                                        # insertion order: graph order
        rows.setdefault(layer[u], []).append(u)
    pos: dict = {}
    for y in sorted(rows):
        row = rows[y]
        if y > 0:
            def bary(u, row=row):
                xs = [pos[p][0] for p in g.predecessors(u) if p in pos]
                return sum(xs) / len(xs) if xs else row.index(u)
            row.sort(key=bary)
        for j, u in enumerate(row):
            pos[u] = (j - (len(row) - 1) / 2, -y)
    return pos


def draw_partition(graph: Graph, path: str, title: str | None = None) -> str:
    """Write an SVG of the partitioned `graph` to `path` (PNG or PDF if it ends so) and return `path`.

    Example:
        >>> draw_partition(partition(dt.trace(fn, *specs)), "model.svg")
    """
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    todo = panels(graph)
    regions = [n.attrs.name for n in graph.walk() if n.op == "region"]
    colour = {r: REGION_COLOURS[i % len(REGION_COLOURS)] for i, r in enumerate(regions)}
    views = []
    for name, sub in todo:
        g = to_networkx(sub)
        pos = layout(g)
        width = max((sum(1 for p in pos.values() if p[1] == y) for y in {p[1] for p in pos.values()}), default=1)
        height = 1 - min((p[1] for p in pos.values()), default=0)
        views.append((name, g, pos, width, height))
    ncols = min(3, len(views))
    nrows = math.ceil(len(views) / ncols)
    cell_w = max(4.0, 1.4 * max(v[3] for v in views))
    cell_h = max(3.0, 0.9 * max(v[4] for v in views))
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dyntvm"}):
        fig = Figure(figsize=(cell_w * ncols, cell_h * nrows + 1.2))
        for idx, (name, g, pos, width, height) in enumerate(views):
            ax = fig.add_subplot(nrows, ncols, idx + 1)
            _draw_panel(ax, g, pos, colour)
            ax.set_title(name, fontsize=9)
            ax.set_xlim(-width / 2 - 0.2, width / 2 + 0.2)
            ax.set_ylim(-height + 0.5, 0.5)
            ax.axis("off")
        handles = [Line2D([], [], marker=m, color="w", markerfacecolor=c or "#ffffff", markeredgecolor="#333333",
                          markersize=10, label=lab) for k, (m, c, lab) in STYLE.items() if k != "region"]
        handles += [Line2D([], [], marker="s", color="w", markerfacecolor=colour[r], markeredgecolor="#333333",
                           markersize=10, label=f"region {r}") for r in regions[:12]]
        if len(regions) > 12:
            handles.append(Line2D([], [], color="w", label=f"... {len(regions) - 12} more regions"))
        fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
        fig.suptitle(title or f"dyntvm partition of {graph.name!r}: {len(regions)} compiled region(s)")
        fig.tight_layout(rect=(0, 0.08 + 0.04 * math.ceil(len(handles) / 4) / max(1, nrows), 1, 0.96))
        fmt = os.path.splitext(path)[1][1:].lower()
        fig.savefig(path, format=fmt if fmt in ("png", "pdf") else "svg",
                    metadata={"Date": None} if fmt not in ("png",) else None)
    return path


def _draw_panel(ax, g: nx.DiGraph, pos: dict, colour: dict) -> None:
    nx.draw_networkx_edges(g, pos, ax=ax, arrows=True, arrowsize=10, edge_color="#666666", node_size=900,
                           node_shape="s")
    for kind, (marker, face, _) in STYLE.items():
        nodes = [u for u, d in g.nodes(data=True) if d["kind"] == kind]
        if not nodes:
            continue
        faces = [colour[g.nodes[u]["region"]] for u in nodes] if kind == "region" else face
        nx.draw_networkx_nodes(g, pos, nodelist=nodes, ax=ax, node_shape=marker, node_color=faces,
                               edgecolors="#333333", node_size=1400 if kind == "region" else 900)
    nx.draw_networkx_labels(g, pos, labels={u: d["label"] for u, d in g.nodes(data=True)}, ax=ax, font_size=7)
