"""Where an ONNX model's nodes land: `inspect_onnx(path)` (and `dyntvm inspect model.onnx`).

The importer records on every IR node the ONNX node it was converted from (`Node.source`, the string
`frontend.onnx.node_where` makes: the same one run-time errors name), and the partitioner and `fold_constants`
keep it. This module imports and partitions the model as `dt.compile` does (without compiling), then reads
that provenance back: per ONNX node, the compiled regions, dynamic-shape ops, control-flow ops and host ops of
the executor it became, or that it was computed at import or folded to a constant. A model with ops dyntvm
has no converter for is not imported: every such op is listed at once, with its domain, the opset the model
imports for it and the model's node names.

Unnamed or duplicated ONNX node names are made unique first (``<unnamed Relu #12>``, ``name #12``; the number
counts all nodes, subgraphs included, from 0) so each row names one node.
"""
from __future__ import annotations

import collections
import dataclasses

#: what a placement's `kind` means, in the order the summary lists them
KINDS = {
    "region": "compiled region",
    "dynamic": "dynamic-shape op (executor)",
    "control_flow": "control flow (executor)",
    "host": "host op (executor)",
    "folded": "folded to a constant at compile time",
    "import": "computed at import (constant or no op)",
}
#: the table's word for each kind
SHORT = {"region": "region", "dynamic": "dynamic", "control_flow": "control flow", "host": "host",
         "folded": "folded", "import": "import"}


@dataclasses.dataclass
class OnnxNodeRow:
    """One ONNX node: its name (made unique), op type, domain, and where its IR ops landed."""
    name: str
    op_type: str
    domain: str
    places: list            # [{"kind": one of KINDS, "where": region or IR node name, "ops": [IR op, ...]}]

    @property
    def kinds(self) -> list:
        return list(dict.fromkeys(p["kind"] for p in self.places))


@dataclasses.dataclass
class OnnxInspection:
    """What `inspect_onnx` found. `unsupported` (from `frontend.onnx.unsupported_nodes`) is non-empty when the
    model could not be imported; `error` holds a dyntvm error that stopped the import (a form of an op dyntvm
    does not support, say: the message names the ONNX node); `nodes` is then empty."""
    path: str
    opsets: dict
    onnx_nodes: int                                   # all nodes, subgraphs included
    nodes: list = dataclasses.field(default_factory=list)
    regions: list = dataclasses.field(default_factory=list)   # names of the compiled regions (after folding)
    unsupported: list = dataclasses.field(default_factory=list)
    error: str | None = None
    graph: object = dataclasses.field(default=None, repr=False)   # the partitioned, folded graph (`dt.compile`'s)

    @property
    def ok(self) -> bool:
        return not self.unsupported and self.error is None

    def rows_in(self, kind: str) -> list:
        return [r for r in self.nodes if any(p["kind"] == kind for p in r.places)]

    def by_region(self) -> dict:
        """{region name: [ONNX node rows with an op in it]} in region order."""
        out = {name: [] for name in self.regions}
        for r in self.nodes:
            for where in dict.fromkeys(p["where"] for p in r.places if p["kind"] == "region"):
                out.setdefault(where, []).append(r)
        return out

    def to_json(self) -> dict:
        return {"path": self.path, "opsets": self.opsets, "onnx_nodes": self.onnx_nodes, "ok": self.ok,
                "error": self.error, "unsupported": self.unsupported, "regions": self.regions,
                "counts": {k: len(self.rows_in(k)) for k in KINDS},
                "nodes": [dataclasses.asdict(r) for r in self.nodes]}

    def summary_lines(self) -> list:
        opsets = ", ".join(f"{d} {v}" for d, v in sorted(self.opsets.items()))
        lines = [f"ONNX model {self.path}: {self.onnx_nodes} nodes (subgraphs included); opsets: {opsets}"]
        if self.unsupported:
            lines.append(f"not imported: {len(self.unsupported)} op type(s) without a converter "
                         f"({sum(len(e['nodes']) for e in self.unsupported)} nodes):")
            for e in self.unsupported:
                opset = f"opset {e['opset']}" if e["opset"] is not None else "no opset imported"
                lines.append(f"  unsupported {e['op']} ({e['domain']} {opset}): {len(e['nodes'])} node(s): "
                             + ", ".join(e["nodes"]))
        if self.error:
            lines.append(f"not imported: {self.error}")
        if not self.ok:
            return lines
        lines.append("ONNX nodes by placement (a node converted to several ops may count under several):")
        for kind, text in KINDS.items():
            lines.append(f"  {len(self.rows_in(kind)):>5}  {text}")
        regions = self.by_region()
        lines.append(f"{len(self.regions)} compiled region(s):")
        for name, rows in regions.items():
            ops = collections.Counter(r.op_type for r in rows)
            lines.append(f"  {name}: {len(rows)} ONNX nodes ({_counts(ops)})")
        for kind in ("dynamic", "control_flow", "host"):
            rows = self.rows_in(kind)
            if rows:
                lines.append(f"{KINDS[kind]}: " + ", ".join(f"{r.name} ({r.op_type})" for r in rows))
        lines.append("per op type (ONNX nodes: placements):")
        per_op: dict = collections.defaultdict(collections.Counter)
        for r in self.nodes:
            per_op[r.op_type].update(r.kinds)
        for op in sorted(per_op, key=lambda o: (-sum(per_op[o].values()), o)):
            n = sum(1 for r in self.nodes if r.op_type == op)
            lines.append(f"  {op:<24} {n:>5}  {_counts(per_op[op])}")
        return lines

    def table_lines(self) -> list:
        """One line per ONNX node: name, op type, and its placements grouped by kind ("region dyn_r0, dyn_r3")."""
        width = max([len(r.name) for r in self.nodes] + [9])
        ops = max([len(r.op_type) for r in self.nodes] + [7])
        lines = [f"{'ONNX node':<{width}}  {'op type':<{ops}}  placement"]
        for r in self.nodes:
            groups: dict = {}
            for p in r.places:
                groups.setdefault(p["kind"], []).append(p["where"])
            where = "; ".join(f"{SHORT[k]} {', '.join(w)}".rstrip() for k, w in groups.items())
            lines.append(f"{r.name:<{width}}  {r.op_type:<{ops}}  {where}")
        return lines


def _counts(counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def _unique_names(model) -> None:
    """Give every node of `model` (a private copy) a unique, non-empty name, so provenance maps back to one node."""
    from .frontend.onnx_load import walk_nodes
    seen = collections.Counter(n.name for n in walk_nodes(model.graph) if n.name)
    for k, n in enumerate(walk_nodes(model.graph)):
        if not n.name:
            n.name = f"<unnamed {n.op_type} #{k}>"
        elif seen[n.name] > 1:
            n.name = f"{n.name} #{k}"


def inspect_onnx(model, input_shapes: dict | None = None, base_dir=None) -> OnnxInspection:
    """Import and partition an ONNX model (a path or an `onnx.ModelProto`) as `dt.compile` would, without
    compiling, and say where each ONNX node landed (see the module docstring).

    Never raises for a model dyntvm cannot import: unsupported ops fill `unsupported` (all of them) and other
    dyntvm errors `error`. A file that is not a readable ONNX model raises as `dt.from_onnx` does.

    Example:
        >>> info = dt.inspect_onnx("model.onnx")
        >>> print("\\n".join(info.summary_lines()))
    """
    from dyntvm.errors import DyntvmError

    from .frontend.onnx import _opsets, from_onnx, node_where, unsupported_nodes
    from .frontend.onnx_load import load, walk_nodes
    path = model if isinstance(model, str) else "<ModelProto>"
    proto = load(model, base_dir)
    if proto is model:                          # never rename the caller's nodes
        proto = type(model)()
        proto.CopyFrom(model)
    onnx_nodes = list(walk_nodes(proto.graph))
    info = OnnxInspection(path, _opsets(proto), len(onnx_nodes), unsupported=unsupported_nodes(proto))
    if info.unsupported:
        return info
    _unique_names(proto)
    try:
        graph = from_onnx(proto, input_shapes=input_shapes)
    except DyntvmError as e:
        info.error = f"{type(e).__name__}: {e}"
        return info
    from .partition import partition
    pg = partition(graph)
    by_where = {node_where(n): n.name for n in onnx_nodes}
    places: dict = {n.name: {} for n in onnx_nodes}       # name -> {(kind, where): placement}
    for source, kind, where, op in _ir_ops(pg, ""):
        key = _onnx_node_of(source, by_where)
        if key is not None:
            place = places[key].setdefault((kind, where), {"kind": kind, "where": where, "ops": []})
            if op not in place["ops"]:
                place["ops"].append(op)
    info.regions = _fold(pg, [p for node_places in places.values() for p in node_places.values()])
    info.graph = pg
    info.nodes = [OnnxNodeRow(n.name, n.op_type, n.domain or "ai.onnx", list(places[n.name].values())
                              or [{"kind": "import", "where": "", "ops": []}]) for n in onnx_nodes]
    return info


def _onnx_node_of(source: str, by_where: dict) -> str | None:
    """The ONNX node name of an IR node's `source`: a `node_where` string, or one followed by ": detail"."""
    if source in by_where:
        return by_where[source]
    cut = source.find(": ")
    while cut >= 0:
        if source[:cut] in by_where:
            return by_where[source[:cut]]
        cut = source.find(": ", cut + 1)
    return None


def _ir_ops(g, within: str):
    """(source, kind, where, op) for every IR op of the partitioned graph `g`, control-flow bodies included."""
    from .ir.ops import OpKind
    for n in g.nodes:
        if n.op == "region":
            for m in n.subgraphs[0].nodes:
                if m.op != "constant":
                    yield m.source, "region", n.attrs.name, m.op
            continue
        if n.op != "constant":
            kind = {OpKind.DYNAMIC_SHAPE: "dynamic", OpKind.CONTROL_FLOW: "control_flow"}.get(n.opdef.kind, "host")
            yield n.source, kind, n.name + within, n.op
        for s in n.subgraphs:
            yield from _ir_ops(s, f" in {n.name}")


def _fold(pg, places: list) -> list:
    """The regions `dt.compile` keeps: an input-less region is folded to constants (`runtime/fold.py`), and the
    placements in it become "folded"."""
    from .runtime.fold import fold_constants
    kept = [n.attrs.name for n in fold_constants(pg).walk() if n.op == "region"]     # folds in place
    for p in places:
        if p["kind"] == "region" and p["where"] not in kept:
            p["kind"] = "folded"
    return kept
