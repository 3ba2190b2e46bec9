"""Reference interpreter: runs any Graph with numpy kernels. The oracle for every compiled result.

fx `Interpreter` style: `run` walks the nodes, `run_node` dispatches on the node's op kind, so a
subclass overrides one handler. Values are dropped after their last use. Control flow runs through the
shared runner (`control_flow.py`); a node that fails raises an `ExecutionError` naming it (`node_errors.py`).
"""
from __future__ import annotations

import numpy as np

from dyntvm.errors import ExecutionError, GraphError, InputError

from ..ir.dim_checks import name_internal_dims
from ..ir.graph import Graph, Node
from ..ir.list_type import ListType, value_shape
from ..ir.types import expression_dim_errors, shape_matches
from . import control_flow as cf
from .control_flow import bind_symbols
from .dim_check_run import check_node, dim_range_error
from .kernels import run_kernel
from .lists import check_list_value
from .node_errors import node_failure, note_within
from .torch_inputs import is_torch_tensor, torch_to_numpy


def last_uses(graph: Graph) -> dict:
    """node index -> values whose last use is that node (graph outputs are never freed)."""
    last = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last[v] = i
    keep = set(graph.outputs)
    out: dict = {}
    for v, i in last.items():
        if v not in keep:
            out.setdefault(i, []).append(v)
    return out


class Interpreter:
    """Runs a graph on numpy arrays. ``Interpreter(graph).run(*arrays) -> list of arrays``."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._last = {}

    # -- graph walking -------------------------------------------------------------------------
    def run(self, *args):
        try:
            self.check_inputs(args)
        except InputError as e:     # types with unknown dims (TensorSpec None): named by their origin
            raise InputError(name_internal_dims(str(e), self.graph.dim_origins)) from None
        return self.run_graph(self.graph, list(args))

    def check_inputs(self, args) -> None:
        g = self.graph
        if len(args) != len(g.inputs):
            raise InputError(f"graph {g.name!r} takes {len(g.inputs)} inputs, got {len(args)}")
        env: dict = {}
        for i, (v, a) in enumerate(zip(g.inputs, args)):
            if isinstance(v.type, ListType):
                args = list(args)
                args[i] = check_list_value(a, v.type, f"graph {g.name!r}: input {i} (%{v.name})", env, InputError)
                continue
            dtype = np.asarray(a).dtype.name
            if dtype != v.type.dtype or not shape_matches(v.type, np.shape(a), env):
                raise InputError(f"graph {g.name!r}: input {i} (%{v.name}) must be {v.type}, got "
                                 f"{dtype}{list(np.shape(a))}" + (f" (symbols so far: {env})" if env else ""))
        tensors = [k for k, v in enumerate(g.inputs) if not isinstance(v.type, ListType)]
        for k, ax, d, size in expression_dim_errors([g.inputs[i].type for i in tensors],
                                                    [np.shape(args[i]) for i in tensors], env):
            i = tensors[k]
            raise InputError(f"graph {g.name!r}: input {i} (%{g.inputs[i].name}) axis {ax} has size {size}, which "
                             f"does not fit its dim {d} (symbols: {env})")
        bad = dim_range_error(g, env)
        if bad:
            raise InputError(f"graph {g.name!r}: {bad}")

    def run_graph(self, graph: Graph, args: list) -> list:
        if len(args) != len(graph.inputs):
            raise InputError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, got {len(args)}")
        env: dict = {}
        values = {}
        for v, a in zip(graph.inputs, args):
            values[v] = a
            bind_symbols(v.type, value_shape(a) if isinstance(a, list) else np.shape(a), env)
        last = self._last.get(id(graph))
        if last is None:
            last = self._last[id(graph)] = last_uses(graph)
        for i, node in enumerate(graph.nodes):
            try:
                if node.checks:         # dims unified while tracing: checked before the node runs
                    check_node(node, [values[v] for v in node.inputs], self.graph.dim_origins)
                outs = self.run_node(node, [values[v] for v in node.inputs], env)
                for v, o in zip(node.outputs, outs):
                    self.check_output(node, v, o, env)
                    values[v] = o
            except ExecutionError as e:        # already names the innermost node
                note_within(e, node)
                raise
            except GraphError:
                raise
            except Exception as e:
                raise node_failure(node, e) from e
            for v in last.get(i, ()):
                values.pop(v, None)
        return [values[v] for v in graph.outputs]

    def run_node(self, node: Node, ins: list, env: dict):
        handler = getattr(self, "run_" + node.op, None)
        if handler is not None:
            return handler(node, ins, env)
        return self.run_kernel(node, ins, env)

    def run_kernel(self, node: Node, ins: list, env: dict):
        return run_kernel(node.op, node.attrs, [a if isinstance(a, list) else np.asarray(a) for a in ins], env)

    def check_output(self, node: Node, v, out, env: dict) -> None:
        """Bind `v`'s symbols to the sizes seen, and check that `out` has `v`'s type (a wrong type rule
        would otherwise go unnoticed here and break compiled code)."""
        if isinstance(v.type, ListType):
            check_list_value(out, v.type, f"{node.op} node {node.name!r} output %{v.name}", env, GraphError)
            return
        dtype = np.asarray(out).dtype.name
        if dtype != v.type.dtype or not shape_matches(v.type, np.shape(out), env):
            raise GraphError(f"{node.op} node {node.name!r} produced {dtype}{list(np.shape(out))} for %{v.name}: "
                             f"{v.type} (symbols: {env})" + (f"\n    at {node.source}" if node.source else ""))

    def run_region(self, node: Node, ins: list, env: dict):
        return self.run_graph(node.subgraphs[0], ins)

    # -- control flow (driven by the shared runner) ------------------------------------------------
    def _runner(self, graph: Graph):
        return lambda args: self.run_graph(graph, args)

    def run_cond(self, node: Node, ins: list, env: dict):
        then_g, else_g = node.subgraphs
        return cf.cond(ins[0], self._runner(then_g), self._runner(else_g), ins[1:])

    def run_case(self, node: Node, ins: list, env: dict):
        gs = node.subgraphs
        return cf.case([self._runner(g) for g in gs[0:-1:2]], [self._runner(g) for g in gs[1::2] + gs[-1:]], ins,
                       truth=_first_truth, exclusive=node.attrs.exclusive)

    def run_foreach(self, node: Node, ins: list, env: dict):
        a = node.attrs
        (body,) = node.subgraphs
        nd, ns, nv = a.num_data, a.num_states, int(a.has_valid_length)
        data = [np.asarray(d) for d in ins[:nd]]
        outs, states = cf.foreach(self._runner(body), data, ins[nd:nd + ns], ins[nd + ns + nv:], body,
                                  valid_length=np.asarray(ins[nd + ns]) if nv else None)
        return outs + states

    def run_while_loop(self, node: Node, ins: list, env: dict):
        a = node.attrs
        cond_g, body = node.subgraphs
        nv = a.num_vars
        limit = ins[nv] if a.has_max_tensor else a.max_iterations
        caps = ins[nv + (1 if a.has_max_tensor else 0):]
        outs, loop_vars = cf.while_loop(self._runner(cond_g), self._runner(body), ins[:nv], caps, limit, body,
                                        truth=_first_truth, cond_in_body=a.cond_in_body)
        return outs + loop_vars


def _first_truth(res: list) -> bool:
    """A predicate subgraph's result (a one-value list) as a bool."""
    return bool(np.asarray(res[0]))


def run_reference(graph: Graph, *args):
    """Run `graph` with the numpy reference kernels; outputs nested like the traced function's."""
    from ..ir.tree import flatten_like, tree_flatten, tree_unflatten
    leaves = list(args)
    if graph.in_tree is not None and not flatten_like(graph.in_tree, list(args), leaves := []):
        leaves = tree_flatten(list(args))[0]
    kinds = [isinstance(v.type, ListType) for v in graph.inputs] + [False] * len(leaves)
    outs = Interpreter(graph).run(*[torch_to_numpy(a, f"input {i}") if is_torch_tensor(a) else
                                    a if kinds[i] and isinstance(a, (list, tuple)) else np.asarray(a)
                                    for i, a in enumerate(leaves)])
    return tree_unflatten(graph.out_tree, outs) if graph.out_tree is not None else outs
