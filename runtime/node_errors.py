"""Run-time failures named by their node: the op, the node's name, the failing condition and the user's line.

The interpreter and the executor catch what a node raises and re-raise it with `node_failure(...)`
``from`` the cause. An `ExecutionError` coming out of a control-flow node already names the innermost
node that failed; `note_within` only adds the enclosing node (and loop iteration) as a line of context.
"""
from __future__ import annotations

from dyntvm.errors import ExecutionError

from ..ir.dim_checks import name_internal_dims
from ..ir.graph import Node


def _label(node: Node) -> str:
    label = f"{node.op} node {node.name!r}" if node.name else f"{node.op} node"
    if node.op == "region" and node.attrs.name != node.name:
        label += f" ({node.attrs.name})"
    return label


def node_failure(node: Node, cause: BaseException, detail: str = "") -> ExecutionError:
    """The ExecutionError for `cause` raised while `node` ran (the caller raises it ``from cause``)."""
    condition = str(cause).strip() or type(cause).__name__
    msg = f"{_label(node)} failed: {condition}{detail}"
    if node.source:
        msg += f"\n    at {node.source}"
    msg = name_internal_dims(msg)       # types in the condition: no bare internal dim names
    return ExecutionError(msg, op=node.op, node=node.name, source=node.source)


def note_within(err: ExecutionError, node: Node) -> None:
    """Record on `err` (raised inside `node`'s subgraphs) that it happened within `node`."""
    it, err.iteration = err.iteration, None
    line = "in " + _label(node) + (f", iteration {it}" if it is not None else "")
    err.within.append(line + (f", at {node.source}" if node.source else ""))
