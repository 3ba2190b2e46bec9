"""Draw a partitioned graph (`dyntvm inspect --svg`): regions coloured, dynamic and control-flow nodes distinct.

The top-level graph is one panel; every control-flow subgraph (a loop body, a branch) gets its own
panel titled after the node that owns it, so nesting reads as "node -> its panels". Region nodes are
drawn as one box each (their ops are listed by `dyntvm inspect` in text). Constants are left out.
Layers follow the data flow top to bottom (longest path from the inputs), ordered by the barycentre
of their predecessors to keep crossings down. Deterministic: same graph, same picture.

The SVG is written by hand, not by a plotting library, so that every size is known here: text is set in a
monospace font whose advance is a fixed fraction of its size, boxes are sized to their labels (a label
longer than `MAX_CHARS` is cut, its full text kept as the box's tooltip), and the canvas (``viewBox``) is
the union of everything drawn. The edges leaving a box are labelled, once, under it with the types of the
values they carry; subgraph inputs are named after the value the control-flow node feeds them (the user's
input names where the outer value has one, else the producing node and output number).
"""
from __future__ import annotations

import os
from xml.sax.saxutils import escape, quoteattr

import networkx as nx

from dyntvm.errors import InputError

from ..ir.graph import Graph
from ..ir.ops import CONTROL_FLOW, DYNAMIC_SHAPE

# kind -> (face colour, legend label); regions take their colour from REGION_COLOURS
STYLE = {
    "input": ("#cfe2f3", "graph / subgraph input"),
    "output": ("#d9ead3", "graph output"),
    "static": ("#d9d9d9", "static op outside a region"),
    "dynamic": ("#e06666", "dynamic-shape op (numpy kernel)"),
    "control": ("#f6b26b", "control flow (subgraphs in own panels)"),
    "region": (None, "compiled region"),
}
REGION_COLOURS = ["#6fa8dc", "#93c47d", "#8e7cc3", "#c27ba0", "#76a5af", "#ffd966", "#a4c2f4", "#b6d7a8",
                  "#b4a7d6", "#d5a6bd", "#a2c4c9", "#f9cb9c"]

FONT = 11                 # px, node and legend text
SMALL = 9                 # px, edge labels
TITLE = 14                # px, the picture's title
ADVANCE = 0.62            # monospace advance per character, in font sizes (DejaVu Sans Mono: 0.602)
MAX_CHARS = 30            # longer label lines are cut (full text in the box's tooltip)
PAD, GAP, ROW_GAP, MARGIN = 6, 24, 34, 16


def text_width(text: str, size: float = FONT) -> float:
    return len(text) * ADVANCE * size


def _cut(line: str) -> str:
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 1] + "\u2026"


def _feeds(node) -> list:
    """Per subgraph of a control-flow node: the outer value (or a (value, suffix) pair for a foreach data
    slice) each subgraph input receives, in the subgraph's input order; None where not known."""
    a, ins = node.attrs, list(node.inputs)
    if node.op == "cond":
        return [ins[1:]] * len(node.subgraphs)
    if node.op == "case":
        return [ins] * len(node.subgraphs)
    if node.op == "foreach":
        nd, ns, nv = a.num_data, a.num_states, int(a.has_valid_length)
        return [[(v, "[t]") for v in ins[:nd]] + ins[nd:nd + ns] + ins[nd + ns + nv:]]
    if node.op == "while_loop":
        nv = a.num_vars
        return [ins[:nv] + ins[nv + int(a.has_max_tensor):]] * len(node.subgraphs)
    return [None] * len(node.subgraphs)


def _display_name(v, names: dict) -> str:
    """A value as the picture names it: the user's name of an input, else "<producer>.out<k>" (the node's
    own name, a region's name) rather than an internal SSA name."""
    if v in names:
        return names[v]
    p = v.producer
    if p is None:
        return v.name
    return f"{p.attrs.name if p.op == 'region' else p.name}.out{v.index}"


def panels(graph: Graph, title: str = "", names: dict | None = None) -> list[tuple[str, Graph, dict]]:
    """(title, graph, display names of its inputs) for the graph and, depth first, every control-flow
    subgraph inside it. A subgraph input is named after the outer value fed to it."""
    names = names if names is not None else {v: v.name for v in graph.inputs}
    out = [(title or f"graph {graph.name}", graph, names)]
    for n in graph.nodes:
        if n.opdef.kind != CONTROL_FLOW:
            continue
        for k, (sub, feeds) in enumerate(zip(n.subgraphs, _feeds(n))):
            sub_names = {}
            for i, v in enumerate(sub.inputs):
                fed = feeds[i] if feeds is not None and len(feeds) == len(sub.inputs) else None
                outer, suffix = fed if isinstance(fed, tuple) else (fed, "")
                sub_names[v] = _display_name(outer, names) + suffix if outer is not None else v.name
            out += panels(sub, f"{n.name} ({n.op}) subgraph {k}: {sub.name}", sub_names)
    return out


def _kind(node) -> str:
    if node.op == "region":
        return "region"
    kind = node.opdef.kind
    return {DYNAMIC_SHAPE: "dynamic", CONTROL_FLOW: "control"}.get(kind, "static")


def to_networkx(graph: Graph, names: dict | None = None) -> nx.DiGraph:
    """Nodes ("in", k), ("n", i), ("out", k) with `kind` and `label`; one edge per producer/consumer pair,
    its `types` the types of the values it carries."""
    names = names or {}
    g = nx.DiGraph()
    producer = {}

    def connect(v, dst):
        if v in producer:
            if not g.has_edge(producer[v], dst):
                g.add_edge(producer[v], dst, types=[])
            if str(v.type) not in g.edges[producer[v], dst]["types"]:
                g.edges[producer[v], dst]["types"].append(str(v.type))
    for k, v in enumerate(graph.inputs):
        g.add_node(("in", k), kind="input", label=names.get(v, v.name))
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
        for v in n.inputs:
            connect(v, ("n", i))
        for v in n.outputs:
            producer[v] = ("n", i)
    for k, v in enumerate(graph.outputs):
        g.add_node(("out", k), kind="output", label=f"out {k}")
        connect(v, ("out", k))
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
        if y > 0:       # a node without placed predecessors keeps its place (list.sort hides the list meanwhile)
            place = {u: k for k, u in enumerate(row)}

            def bary(u, place=place):
                xs = [pos[p][0] for p in g.predecessors(u) if p in pos]
                return sum(xs) / len(xs) if xs else place[u]
            row.sort(key=bary)
        for j, u in enumerate(row):
            pos[u] = (j - (len(row) - 1) / 2, -y)
    return pos


class _Panel:
    """One panel's boxes (node -> x, y, w, h relative to the panel), the label under each box (the types of
    the values its edges carry), and the panel's size. Each box sits centred in a slot wide enough for
    both its label and the types under it, so neighbouring texts never overlap."""

    def __init__(self, title: str, g: nx.DiGraph):
        self.title, self.g = title, g
        pos = layout(g)
        rows: dict = {}
        for u, (x, y) in pos.items():
            rows.setdefault(-y, []).append((x, u))
        self.lines = {u: [_cut(s) for s in d["label"].split("\n")] for u, d in g.nodes(data=True)}
        self.types = {}
        for u, _, d in g.edges(data=True):
            self.types.setdefault(u, [])
            self.types[u] += [t for t in d["types"] if t not in self.types[u]]
        self.types = {u: ", ".join(ts) for u, ts in self.types.items()}
        size = {u: (max(text_width(s) for s in ls) + 2 * PAD, len(ls) * FONT * 1.3 + 2 * PAD)
                for u, ls in self.lines.items()}
        slot = {u: max(size[u][0], text_width(self.types.get(u, ""), SMALL) + 4) for u in size}
        top = FONT * 1.3 + 2 * PAD                         # the panel's title line
        widths = [sum(slot[u] for _, u in r) + GAP * (len(r) - 1) for r in rows.values()]
        self.w = max([text_width(title) + 2 * PAD] + [w + 2 * PAD for w in widths])
        self.box, y = {}, top
        for r, rw in zip((sorted(rows[k]) for k in sorted(rows)), widths):
            x = (self.w - rw) / 2
            for _, u in r:
                self.box[u] = (x + (slot[u] - size[u][0]) / 2, y, *size[u])
                x += slot[u] + GAP
            y += max(size[u][1] for _, u in r) + ROW_GAP
        self.h = y - ROW_GAP + PAD if rows else top


def _svg_text(x, y, text, size=FONT, anchor="start", cls="", weight=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"'
            f'{f" class={quoteattr(cls)}" if cls else ""}{f" font-weight={quoteattr(weight)}" if weight else ""}>'
            f'{escape(text)}</text>')


def _draw_panel(p: _Panel, ox: float, oy: float, colour: dict) -> list:
    out = [f'<g class="panel"><rect class="frame" x="{ox:.1f}" y="{oy:.1f}" width="{p.w:.1f}" height="{p.h:.1f}" '
           f'fill="#fbfbfb" stroke="#bbbbbb"/>', _svg_text(ox + PAD, oy + PAD + FONT, p.title, cls="panel-title")]
    for u, v in p.g.edges():
        (ux, uy, uw, uh), (vx, vy, vw, _) = p.box[u], p.box[v]
        out.append(f'<line class="edge" x1="{ox + ux + uw / 2:.1f}" y1="{oy + uy + uh:.1f}" '
                   f'x2="{ox + vx + vw / 2:.1f}" y2="{oy + vy:.1f}" stroke="#666666" marker-end="url(#arrow)"/>')
    for u, types in p.types.items():                  # under the producer: what its edges carry
        x, y, w, h = p.box[u]
        out.append(_svg_text(ox + x + w / 2, oy + y + h + SMALL + 2, types, SMALL, "middle", "edge-label"))
    for u, d in p.g.nodes(data=True):
        x, y, w, h = p.box[u]
        face = colour[d["region"]] if d["kind"] == "region" else STYLE[d["kind"]][0]
        radius = 8 if d["kind"] in ("input", "output") else 2
        out.append(f'<g class="node {d["kind"]}"><title>{escape(d["label"])}</title>'
                   f'<rect x="{ox + x:.1f}" y="{oy + y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{radius}" '
                   f'fill="{face}" stroke="#333333"/>')
        for j, line in enumerate(p.lines[u]):
            out.append(_svg_text(ox + x + w / 2, oy + y + PAD + FONT * (1.3 * j + 1), line, anchor="middle"))
        out.append("</g>")
    return out + ["</g>"]


def _legend(items: list, width: float, oy: float) -> tuple[list, float]:
    """Legend swatches wrapped into rows no wider than `width`; returns (svg parts, height)."""
    out, x, y = ['<g class="legend">'], MARGIN, oy
    for face, label in items:
        w = 16 + text_width(label) + GAP
        if x + w > width - MARGIN and x > MARGIN:
            x, y = MARGIN, y + FONT * 1.8
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" fill="{face}" stroke="#333333"/>')
        out.append(_svg_text(x + 16, y + FONT - 1, label))
        x += w
    return out + ["</g>"], y + FONT * 1.8 - oy


def check_svg_path(path, who: str = "draw_partition") -> None:
    """An InputError for a picture path that is not SVG (`dyntvm inspect --svg` checks it before any work)."""
    if os.path.splitext(str(path))[1].lower() in (".png", ".pdf", ".jpg", ".jpeg"):
        raise InputError(f"{who} writes SVG, got the path {path!r}; write a .svg file and convert it "
                         "(e.g. rsvg-convert -o model.png model.svg)")


def draw_partition(graph: Graph, path: str, title: str | None = None) -> str:
    """Write an SVG of the partitioned `graph` to `path` and return `path`.

    Example:
        >>> draw_partition(partition(dt.trace(fn, *specs)), "model.svg")
    """
    check_svg_path(path, "draw_partition")
    regions = [n.attrs.name for n in graph.walk() if n.op == "region"]
    colour = {r: REGION_COLOURS[i % len(REGION_COLOURS)] for i, r in enumerate(regions)}
    views = [_Panel(name, to_networkx(sub, names)) for name, sub, names in panels(graph)]
    ncols = min(3, len(views))
    grid = [views[i:i + ncols] for i in range(0, len(views), ncols)]
    col_w = [max(row[c].w for row in grid if c < len(row)) for c in range(ncols)]
    heading = title or f"dyntvm partition of {graph.name!r}: {len(regions)} compiled region(s)"
    items = [(face, label) for k, (face, label) in STYLE.items() if k != "region"]
    items += [(colour[r], f"compiled region {r}") for r in regions[:12]]
    if len(regions) > 12:
        items.append(("#ffffff", f"... {len(regions) - 12} more regions"))
    width = 2 * MARGIN + max(sum(col_w) + GAP * (ncols - 1), text_width(heading, TITLE),
                             max(16 + text_width(lab) for _, lab in items))
    body, y = [], MARGIN + TITLE * 1.3 + PAD
    for row in grid:
        x = MARGIN
        for c, p in enumerate(row):
            body += _draw_panel(p, x, y, colour)
            x += col_w[c] + GAP
        y += max(p.h for p in row) + GAP
    legend, legend_h = _legend(items, width, y)
    height = y + legend_h + MARGIN
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.1f} {height:.1f}" width="{width:.0f}" '
           f'height="{height:.0f}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#666666"/></marker></defs>',
           '<style>.edge-label { paint-order: stroke; stroke: #ffffff; stroke-width: 3px; fill: #444444; }</style>',
           f'<rect x="0" y="0" width="{width:.1f}" height="{height:.1f}" fill="#ffffff"/>',
           _svg_text(width / 2, MARGIN + TITLE, heading, TITLE, "middle", "title", "bold")]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(svg + body + legend + ["</svg>", ""]))
    return path
