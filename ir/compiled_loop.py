"""Which `foreach` and `while_loop` loops run as one compiled function (codegen builds it, the executor calls it).

A loop whose body is a single region node, and whose body outputs are all outputs of that region, can run as
compiled code end to end: codegen adds a function ``compiled_loop_name(region)`` to the kernel library that
loops over the steps in TIR and calls the body's kernels directly (`codegen/compiled_loops.py`). It takes the
region's inputs in the region's order and returns the loop's outputs:

* foreach: each data input whole (``[T, ...]`` instead of a row); returns the stacked per-step outputs, then
  the final states.
* while_loop (only with its condition in the body, ``WhileAttrs.cond_in_body``): one more argument, a shape
  ``(cap,)``: run at most `cap` iterations, while the condition the body computes holds (the caller has checked
  it for the first one). Returns the per-step outputs stacked to ``[cap, ...]`` (the first `count` rows
  written), the final vars, then an int64 ``[2]`` tensor ``(count, go)``: the iterations run and whether the
  condition still held after the last one. The caller continues with a larger `cap` from the final vars when
  the loop stopped at `cap` with the condition holding.

On a device (the executor's `DevicePlacement`: a GPU) the loop is the device loop, ``compiled_loop_name(region,
device=True)``, with the same arguments and results (all on the device). Its while_loop cannot read the
condition on the host at every step (that is a synchronisation): each call runs all `cap` steps, those after the
condition failed computing values that are ignored, and keeps ``(count, go)`` on the device, where the final vars
are copied from the state after the last step that ran with the condition holding; the caller reads
``(count, go)`` once per call, and keeps `cap` small (`runtime/loop_calls.py`).

Codegen may decline a body (a kernel pattern it does not handle); the executor then finds no such function and
runs the loop step by step.
"""
from __future__ import annotations

from .graph import Node

LOOP_SUFFIX = "__loop"
DEVICE_LOOP_SUFFIX = "__dloop"


def compiled_loop_name(region_name: str, device: bool = False) -> str:
    """The loop function's name: the host loop (the CPU library's), or `device`: the device loop (a CUDA
    library's; a CPU library has it only when built to test the device path, see `codegen/build.py`)."""
    return region_name + (DEVICE_LOOP_SUFFIX if device else LOOP_SUFFIX)


def _single_region(body, n_ys: int, n_states: int, first_state: int, n_data: int = 0):
    """``(region, pos, outs)`` if `body` is one region node computing every body output from body inputs;
    `outs`, per body output: ``("region", k)`` (the region's k-th output), or for a per-step output that is
    a body input as the step got it, ``("state", k)`` / ``("data", k)`` (the k-th state / data row)."""
    if len(body.nodes) != 1 or body.nodes[0].op != "region":
        return None
    if any(m.checks for m in body.nodes[0].subgraphs[0].nodes):
        return None         # run-time dim checks: the executor's plan runs them before each step
    region = body.nodes[0]
    pos = {v: k for k, v in enumerate(body.inputs)}
    made = {v: k for k, v in enumerate(region.outputs)}
    if not all(v in pos for v in region.inputs):
        return None
    outs = []
    for j, v in enumerate(body.outputs):
        if v in made:
            outs.append(("region", made[v]))
        elif j < n_ys and v in pos and first_state <= pos[v] < first_state + n_states:
            outs.append(("state", pos[v] - first_state))
        elif j < n_ys and v in pos and pos[v] < n_data:
            outs.append(("data", pos[v]))
        else:
            return None
    # every state passed in (with zero steps the final states are the initial ones)
    if sorted(pos[v] - first_state for v in region.inputs
              if first_state <= pos[v] < first_state + n_states) != list(range(n_states)):
        return None
    return region, pos, tuple(outs)


def foreach_loop_plan(node: Node):
    """For an eligible foreach node: ``(region node, roles, outs)``. `roles`, per region input:
    ``("data" | "state" | "const", k)`` (k-th of that kind among the foreach's body inputs); `outs`, per body
    output (per-step outputs, then new states): where it comes from (see `_single_region`). None if not
    eligible."""
    a = node.attrs
    if node.op != "foreach" or getattr(a, "has_valid_length", False):
        return None
    g = node.subgraphs[0]
    nd, ns = a.num_data, a.num_states
    found = _single_region(g, len(g.outputs) - ns, ns, nd, nd) if nd >= 1 else None
    if found is None:
        return None
    region, pos, outs = found
    roles = []
    for v in region.inputs:
        k = pos[v]
        roles.append(("data", k) if k < nd else ("state", k - nd) if k < nd + ns else ("const", k - nd - ns))
    if not any(r == "data" for r, _ in roles):      # a data row counts the steps
        return None
    return region, tuple(roles), outs


def while_loop_plan(node: Node):
    """For an eligible while_loop node (condition in its body): ``(region node, roles, outs)``. `roles`, per
    region input: ``("state" | "const", k)`` (k-th loop var / capture); `outs`, per body output (per-step
    outputs, new vars, the condition): where it comes from (see `_single_region`). None if not eligible."""
    a = node.attrs
    if node.op != "while_loop" or not a.cond_in_body:
        return None
    body = node.subgraphs[1]
    nv = a.num_vars
    found = _single_region(body, len(body.outputs) - nv - 1, nv, 0)
    if found is None:
        return None
    region, pos, outs = found
    roles = tuple(("state", pos[v]) if pos[v] < nv else ("const", pos[v] - nv) for v in region.inputs)
    return region, roles, outs
