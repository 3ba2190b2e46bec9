"""Readable text form of a graph (subgraphs indented under their node)."""
from __future__ import annotations

from dataclasses import fields

import numpy as np


def _attr_str(attrs) -> str:
    parts = []
    for f in fields(attrs):
        v = getattr(attrs, f.name)
        if isinstance(v, np.ndarray):
            v = f"<{v.dtype}{list(v.shape)}>" if v.size > 4 else np.array2string(v, separator=",")
        parts.append(f"{f.name}={v}")
    return ", ".join(parts)


def format_graph(graph, indent: int = 0) -> str:
    pad = "  " * indent
    ins = ", ".join(f"%{v.name}: {v.type}" for v in graph.inputs)
    lines = [f"{pad}graph {graph.name}({ins}) {{"]
    for n in graph.nodes:
        outs = ", ".join(f"%{v.name}: {v.type}" for v in n.outputs)
        args = ", ".join(f"%{v.name}" for v in n.inputs)
        a = _attr_str(n.attrs)
        checks = "".join(f"  # checked: {c.other} == {c.kept} ({c.what})" for c in n.checks)
        lines.append(f"{pad}  {outs} = {n.op}({args}{'; ' + a if a else ''}){checks}")
        for g in n.subgraphs:
            lines.append(format_graph(g, indent + 2))
    lines.append(f"{pad}  return {', '.join('%' + v.name for v in graph.outputs)}")
    lines.append(f"{pad}}}")
    return "\n".join(lines)
