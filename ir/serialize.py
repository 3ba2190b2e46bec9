"""JSON round trip of graphs. Constant data goes to a separate params dict (the artifact's params.npz)."""
from __future__ import annotations

import json

import numpy as np

from dyntvm.errors import GraphError

from .graph import Graph, Node, Value
from .attrs import ConstantAttrs, attrs_from_json, attrs_to_json
from .dim_checks import DimCheck
from .ops import get_op
from .list_type import type_from_json

FORMAT = 1


def graph_to_dict(graph: Graph, params: dict | None = None) -> tuple[dict, dict]:
    """(JSON-able dict, params) for `graph`; constant arrays are stored in params under unique keys."""
    params = {} if params is None else params
    ids: dict = {}

    def vid(v):
        return ids.setdefault(v, len(ids))

    def enc(g: Graph) -> dict:
        nodes = []
        for n in g.nodes:
            if isinstance(n.attrs, ConstantAttrs):
                key = f"c{len(params)}"
                params[key] = n.attrs.value
                attrs = {"param": key}
            else:
                attrs = attrs_to_json(n.attrs)
            nodes.append({"op": n.op, "name": n.name, "inputs": [vid(v) for v in n.inputs], "attrs": attrs,
                          "outputs": [[vid(v), v.name, v.type.to_json()] for v in n.outputs],
                          "subgraphs": [enc(s) for s in n.subgraphs], "source": n.source})
            if n.checks:                # only then: graphs without checks keep their JSON (and hashes)
                nodes[-1]["checks"] = [c.to_json() for c in n.checks]
        return {"name": g.name, "inputs": [[vid(v), v.name, v.type.to_json()] for v in g.inputs],
                "nodes": nodes, "outputs": [vid(v) for v in g.outputs],
                "in_tree": g.in_tree, "out_tree": g.out_tree}
    out = {"format": FORMAT, "graph": enc(graph)}
    if graph.dim_origins:       # messages only: hashes of the graph leave it out (`strip_messages`)
        out["dim_origins"] = dict(graph.dim_origins)
    if graph.dim_ranges:        # only then: graphs without ranges keep their JSON (and hashes)
        out["dim_ranges"] = {k: list(v) for k, v in graph.dim_ranges.items()}
    return out, params


def _bound(v) -> int:
    """A dim range's bound: a non-negative JSON integer (not a float or a bool)."""
    if type(v) is not int or v < 0:
        raise ValueError(f"a dim range bound must be a non-negative integer, got {v!r}")
    return v


def graph_from_dict(obj: dict, params: dict) -> Graph:
    if not isinstance(obj, dict) or "graph" not in obj:
        raise GraphError("graph JSON: missing top-level 'graph' entry")
    if obj.get("format") != FORMAT:
        raise GraphError(f"graph JSON: format {obj.get('format')!r} is not supported (expected {FORMAT})")
    values: dict = {}

    def val(i):
        try:
            return values[i]
        except KeyError:
            raise GraphError(f"graph JSON: value {i} is used before it is defined") from None

    def dec(g: dict) -> Graph:
        inputs = []
        for i, name, t in g["inputs"]:
            values[i] = Value(type_from_json(t), name)
            inputs.append(values[i])
        nodes = []
        for nd in g["nodes"]:
            opdef = get_op(nd["op"])
            if opdef.attrs is ConstantAttrs:
                key = nd["attrs"]["param"]
                if key not in params:
                    raise GraphError(f"graph JSON: constant {key!r} is missing from params")
                arr = np.asarray(params[key])
                arr.flags.writeable = False
                attrs = ConstantAttrs(arr)
            else:
                attrs = attrs_from_json(opdef.attrs, nd["attrs"])
            subs = tuple(dec(s) for s in nd["subgraphs"])
            node = Node(nd["op"], tuple(val(i) for i in nd["inputs"]), attrs, (), subs, nd.get("source", ""),
                        nd["name"], tuple(DimCheck.from_json(c) for c in nd.get("checks", ())))
            outs = []
            for k, (i, name, t) in enumerate(nd["outputs"]):
                values[i] = Value(type_from_json(t), name, node, k)
                outs.append(values[i])
            node.outputs = tuple(outs)
            nodes.append(node)
        return Graph(inputs, nodes, [val(i) for i in g["outputs"]], g["name"], g.get("in_tree"), g.get("out_tree"))
    try:
        graph = dec(obj["graph"])
        graph.dim_origins = {str(k): str(v) for k, v in obj.get("dim_origins", {}).items()}  # older graphs: none
        graph.dim_ranges = {str(k): (_bound(lo), None if hi is None else _bound(hi))
                            for k, (lo, hi) in obj.get("dim_ranges", {}).items()}
        return graph
    except GraphError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:   # (a list where a dict goes)
        raise GraphError(f"graph JSON is malformed: {type(e).__name__}: {e}") from e


def graph_to_json(graph: Graph) -> tuple[str, dict]:
    """(JSON text, params dict)."""
    d, params = graph_to_dict(graph)
    return json.dumps(d), params


def graph_from_json(text: str, params: dict | None = None) -> Graph:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphError(f"graph JSON does not parse: {e}") from e
    return graph_from_dict(obj, params or {})


def save_graph(graph: Graph, path: str) -> None:
    """One-file form: JSON with params embedded as lists (for `dyntvm compile graph.json`)."""
    d, params = graph_to_dict(graph)
    d["params"] = {k: {"dtype": v.dtype.name, "shape": list(v.shape), "data": v.ravel().tolist()}
                   for k, v in params.items()}
    with open(path, "w") as f:
        json.dump(d, f)


def load_graph(path: str) -> Graph:
    with open(path) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise GraphError(f"{path}: not valid graph JSON: {e}") from e
    params = {k: np.asarray(p["data"], dtype=p["dtype"]).reshape(p["shape"]) for k, p in d.get("params", {}).items()}
    return graph_from_dict(d, params)


def graphs_equal(a: Graph, b: Graph) -> bool:
    """Structural equality (ops, attrs, types, names, wiring, constants); source lines do not count."""
    da, pa = graph_to_dict(a)
    db, pb = graph_to_dict(b)
    return _sourceless(da) == _sourceless(db) and pa.keys() == pb.keys() and all(
        pa[k].dtype == pb[k].dtype and np.array_equal(pa[k], pb[k], equal_nan=True) for k in pa)


def _sourceless(obj):
    if isinstance(obj, dict):
        return {k: _sourceless(v) for k, v in obj.items() if k != "source"}
    if isinstance(obj, list):
        return [_sourceless(v) for v in obj]
    return obj
