"""Run-time dim checks (`ir.dim_checks.DimCheck`): dims an op needed equal, unified while tracing because
neither equality nor difference could be proved, are compared here once both are known.

Only nodes that have checks pay anything: the reference interpreter tests ``node.checks`` (it is the
oracle, not fast); the executor wraps the steps of such nodes, and of region nodes whose subgraph has some,
when it plans a graph (`checked_step`), so every other step runs as before.
"""
from __future__ import annotations

from ..ir.dim_checks import describe_dim
from ..ir.graph import Node
from ..ir.types import eval_dim
from .control_flow import bind_symbols
from .node_errors import node_failure


def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else ()


def first_failure(checks: list, types: list, shapes: list):
    """``(node, check, kept size, other size)`` of the first of `checks` (pairs ``(node, DimCheck)``) that
    does not hold for inputs of `types` with `shapes`, else None. A check whose dims are not known from
    these inputs is left out (the node that has it checks it)."""
    env: dict = {}
    for t, s in zip(types, shapes):
        bind_symbols(t, s, env)
    for node, c in checks:
        try:
            kept, other = eval_dim(c.kept, env), eval_dim(c.other, env)
        except (KeyError, ValueError):
            continue
        if not c.holds(kept, other):
            return node, c, kept, other
        if isinstance(c.result, str):       # a later check may name the broadcast's dim
            env.setdefault(c.result, c.result_size(kept, other))
    return None


class DimMismatch(ValueError):
    """A run-time dim check failed (message: the condition; the interpreter and executor name the node)."""


def mismatch(node: Node, check, kept: int, other: int, origins: dict | None = None) -> DimMismatch:
    """What failed, why it was checked and how to fix it (the caller adds the node and its source line)."""
    if check.what.startswith("torch's run-time assertion"):     # frontend/torch_asserts.py: a 0/1 count
        return DimMismatch(f"{check.what} failed when the model ran (torch.export recorded it from the program's "
                           f"torch._check / size constraints). To fix: pass inputs for which it holds")
    if check.what == "assert_dims_equal":
        why = "F.assert_dims_equal states that they are equal"
        fix = "pass tensors whose dims match there, or remove the assertion if they may differ"
    elif node.op == "assert_dims_equal":       # stated by an importer: its format's rule
        why = f"{check.what} requires them equal"
        fix = "pass inputs whose shapes follow that rule"
    elif isinstance(check.kept, int) and check.what == "broadcast":       # a symbolic dim against a fixed size
        return DimMismatch(f"{node.op} cannot broadcast {describe_dim(check.other, origins)} = {other} against a "
                           f"fixed size {kept}: it must be {kept} or 1 (numpy's broadcasting rule). To fix: pass an "
                           f"input of size {kept} or 1 there")
    else:
        why = (f"{node.op} needs them equal ({check.what}); they could not be proved equal or different while "
               f"tracing, so they were unified and are checked when the model runs")
        fix = ("make them the same size (e.g. select the rows of both with the same mask or indices), or "
               "broadcast / pad one explicitly" + ("" if check.what != "broadcast" else " (a size of 1 broadcasts)"))
    must = "must be equal" if check.what != "broadcast" else "must be equal (or one of them 1)"
    return DimMismatch(f"dims that {must} differ: {describe_dim(check.other, origins)} is {other}, but "
                       f"{describe_dim(check.kept, origins)} is {kept}; {why}. To fix: {fix}")


def check_node(node: Node, ins: list, origins: dict | None = None) -> None:
    """Raise the `DimMismatch` of the first check of `node` that its inputs `ins` break."""
    bad = first_failure([(node, c) for c in node.checks], [v.type for v in node.inputs], [_shape(a) for a in ins])
    if bad is not None:
        raise mismatch(*bad, origins=origins)


def region_checks(region: Node) -> list:
    """``(inner node, check)`` of every check inside region node `region`'s subgraph."""
    return [(m, c) for m in region.subgraphs[0].nodes for c in m.checks]


def checked_step(step, node: Node, ins: list, origins_of):
    """`step` (the executor's closure for `node`, reading its inputs from ``slots[i]`` for i in `ins`) with
    `node`'s checks, or its region's, run first; `step` itself where there are none. `origins_of()`: the
    graph's dim origins, read only when a check fails."""
    region = node.op == "region"
    checks = region_checks(node) if region else [(node, c) for c in node.checks]
    types = [v.type for v in (node.subgraphs[0].inputs if region else node.inputs)]
    if not checks:
        return step

    def run(slots):
        bad = first_failure(checks, types, [_shape(slots[i]) for i in ins])
        if bad is not None:
            err = mismatch(*bad, origins=origins_of())
            if region:      # name the op inside the region (the executor adds the region as the enclosing node)
                raise node_failure(bad[0], err) from err
            raise err       # the executor names the node
        step(slots)
    return run


def in_range(size: int, lo: int, hi) -> bool:
    return lo <= size and (hi is None or size <= hi)


def dim_range_error(graph, env: dict) -> str | None:
    """What is wrong where a symbol bound in `env` lies outside its range in `graph.dim_ranges` (None if all fit)."""
    for sym, (lo, hi) in graph.dim_ranges.items():
        size = env.get(sym)
        if size is None or in_range(size, lo, hi):
            continue
        where = next((f"input {i} ({v.name!r}) axis {ax}" for i, v in enumerate(graph.inputs)
                      for ax, d in enumerate(getattr(v.type, "shape", ())) if d == sym), "the inputs")
        bound = f"{lo} <= {sym}" + (f" <= {hi}" if hi is not None else "")
        return (f"dim {sym} is {size} ({where}), outside its range {bound} (the range the model was declared "
                f"for, e.g. torch.export's Dim({sym!r}, min=, max=)); pass inputs with {bound}")
    return None
