"""Which `foreach` loops run as one compiled function (codegen builds it, the executor calls it).

A `foreach` whose body is a single region node, and whose body outputs (per-step outputs, then new states)
are all outputs of that region, can run as compiled code end to end: codegen adds a function
``compiled_loop_name(region)`` to the kernel library that loops over the steps in TIR and calls the body's
kernels directly (`codegen/compiled_loops.py`). It takes the region's inputs in the region's order, with each
data input whole (``[T, ...]`` instead of a row), and returns the foreach's outputs: the stacked per-step
outputs, then the final states. Codegen may decline a body (a kernel pattern it does not handle); the
executor then finds no such function and runs the loop step by step.
"""
from __future__ import annotations

from .graph import Node

LOOP_SUFFIX = "__loop"


def compiled_loop_name(region_name: str) -> str:
    return region_name + LOOP_SUFFIX


def foreach_loop_plan(node: Node):
    """For an eligible foreach node: ``(region node, roles, outs)``. `roles`, per region input:
    ``("data" | "state" | "const", k)`` (k-th of that kind among the foreach's body inputs); `outs`, per body
    output (per-step outputs, then new states): the region output that gives it. None if not eligible."""
    a = node.attrs
    if node.op != "foreach" or getattr(a, "has_valid_length", False):
        return None
    g = node.subgraphs[0]
    if len(g.nodes) != 1 or g.nodes[0].op != "region":
        return None
    region = g.nodes[0]
    pos = {v: k for k, v in enumerate(g.inputs)}
    made = {v: k for k, v in enumerate(region.outputs)}
    if not all(v in pos for v in region.inputs) or not all(v in made for v in g.outputs):
        return None
    nd, ns = a.num_data, a.num_states
    if nd < 1:
        return None
    roles = []
    for v in region.inputs:
        k = pos[v]
        roles.append(("data", k) if k < nd else ("state", k - nd) if k < nd + ns else ("const", k - nd - ns))
    # a data row to count the steps; every state passed in (with zero steps the final states are the initial)
    if not any(r == "data" for r, _ in roles) or sorted(k for r, k in roles if r == "state") != list(range(ns)):
        return None
    return region, tuple(roles), tuple(made[v] for v in g.outputs)
