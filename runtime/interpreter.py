"""Reference interpreter: runs any Graph with numpy kernels. The oracle for every compiled result.

fx `Interpreter` style: `run` walks the nodes, `run_node` dispatches on the node's op kind, so a
subclass (the compiled executor) overrides one handler. Values are dropped after their last use.
"""
from __future__ import annotations

import numpy as np

from dyntvm.errors import GraphError, InputError
from ..ir.graph import Graph, Node
from ..ir.types import TensorType, eval_dim, is_symbol, shape_matches
from .kernels import run_kernel


def bind_symbols(t: TensorType, shape: tuple, env: dict) -> None:
    """Record the sizes of `t`'s plain-symbol dims seen in a concrete `shape`."""
    for d, s in zip(t.shape, shape):
        if is_symbol(d) and d not in env:
            env[d] = int(s)


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


def zero_length_stack(t: TensorType, env: dict, dtype=None) -> np.ndarray:
    """The stacked result of zero iterations of a step output of type `t`."""
    shape = []
    for d in t.shape:
        try:
            shape.append(eval_dim(d, env))
        except (KeyError, ValueError):
            shape.append(0)      # a data-dependent size never observed: any size is right for 0 rows
    return np.zeros((0, *shape), dtype=dtype or t.dtype)


class Interpreter:
    """Runs a graph on numpy arrays. ``Interpreter(graph).run(*arrays) -> list of arrays``."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._last = {}

    # -- graph walking -------------------------------------------------------------------------
    def run(self, *args):
        g = self.graph
        if len(args) != len(g.inputs):
            raise InputError(f"graph {g.name!r} takes {len(g.inputs)} inputs, got {len(args)}")
        env: dict = {}
        for i, (v, a) in enumerate(zip(g.inputs, args)):
            dtype = np.asarray(a).dtype.name
            if dtype != v.type.dtype or not shape_matches(v.type, np.shape(a), env):
                raise InputError(f"graph {g.name!r}: input {i} (%{v.name}) must be {v.type}, got "
                                 f"{dtype}{list(np.shape(a))}" + (f" (symbols so far: {env})" if env else ""))
        return self.run_graph(g, list(args))

    def run_graph(self, graph: Graph, args: list) -> list:
        if len(args) != len(graph.inputs):
            raise InputError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, got {len(args)}")
        env: dict = {}
        values = {}
        for v, a in zip(graph.inputs, args):
            values[v] = a
            bind_symbols(v.type, np.shape(a), env)
        last = self._last.get(id(graph))
        if last is None:
            last = self._last[id(graph)] = last_uses(graph)
        for i, node in enumerate(graph.nodes):
            ins = [values[v] for v in node.inputs]
            outs = self.run_node(node, ins, env)
            for v, o in zip(node.outputs, outs):
                self.check_output(node, v, o, env)
                values[v] = o
            for v in last.get(i, ()):
                values.pop(v, None)
        return [values[v] for v in graph.outputs]

    def run_node(self, node: Node, ins: list, env: dict):
        handler = getattr(self, "run_" + node.op, None)
        if handler is not None:
            return handler(node, ins, env)
        return self.run_kernel(node, ins, env)

    def run_kernel(self, node: Node, ins: list, env: dict):
        return run_kernel(node.op, node.attrs, [np.asarray(a) for a in ins], env)

    def check_output(self, node: Node, v, out, env: dict) -> None:
        """Bind `v`'s symbols to the sizes seen, and check that `out` has `v`'s type (a wrong type rule
        would otherwise go unnoticed here and break compiled code)."""
        dtype = np.asarray(out).dtype.name
        if dtype != v.type.dtype or not shape_matches(v.type, np.shape(out), env):
            raise GraphError(f"{node.op} node {node.name!r} produced {dtype}{list(np.shape(out))} for %{v.name}: "
                             f"{v.type} (symbols: {env})" + (f"\n    at {node.source}" if node.source else ""))

    def run_region(self, node: Node, ins: list, env: dict):
        return self.run_graph(node.subgraphs[0], ins)

    # -- control flow --------------------------------------------------------------------------
    def run_cond(self, node: Node, ins: list, env: dict):
        then_g, else_g = node.subgraphs
        return self.run_graph(then_g if bool(np.asarray(ins[0])) else else_g, ins[1:])

    def run_case(self, node: Node, ins: list, env: dict):
        n = node.attrs.num_cases
        for i in range(n):
            if bool(np.asarray(self.run_graph(node.subgraphs[2 * i], ins)[0])):
                return self.run_graph(node.subgraphs[2 * i + 1], ins)
        return self.run_graph(node.subgraphs[2 * n], ins)

    def run_foreach(self, node: Node, ins: list, env: dict):
        a = node.attrs
        (body,) = node.subgraphs
        data, states, caps = ins[:a.num_data], ins[a.num_data:a.num_data + a.num_states], \
            ins[a.num_data + a.num_states:]
        length = np.shape(data[0])[0] if data else 0
        if any(np.shape(d)[0] != length for d in data):
            raise ValueError(f"foreach: data tensors must have the same length (axis 0); got lengths "
                             f"{', '.join(str(np.shape(d)[0]) for d in data)}")
        steps = [[] for _ in range(a.num_outputs)]
        for t in range(length):
            res = self.run_graph(body, [d[t] for d in data] + list(states) + list(caps))
            for acc, r in zip(steps, res[:a.num_outputs]):
                acc.append(r)
            states = res[a.num_outputs:]
        shapes = [np.shape(d)[1:] for d in data] + [np.shape(x) for x in list(states) + list(caps)]
        return self._stack(body, steps, length, shapes) + list(states)

    def run_while_loop(self, node: Node, ins: list, env: dict):
        a = node.attrs
        cond_g, body = node.subgraphs
        nv = a.num_vars
        loop_vars = ins[:nv]
        limit = a.max_iterations
        caps = ins[nv + (1 if a.has_max_tensor else 0):]
        if a.has_max_tensor:
            limit = int(np.asarray(ins[nv]))
        steps = [[] for _ in range(a.num_outputs)]
        it = 0
        while (limit is None or it < limit) and bool(np.asarray(self.run_graph(cond_g, loop_vars + caps)[0])):
            res = self.run_graph(body, loop_vars + caps)
            for acc, r in zip(steps, res[:a.num_outputs]):
                acc.append(r)
            loop_vars = list(res[a.num_outputs:])
            it += 1
        return self._stack(body, steps, it, [np.shape(x) for x in loop_vars + caps]) + loop_vars

    def _stack(self, body: Graph, steps: list, length: int, body_shapes: list) -> list:
        return stack_steps(body, steps, length, body_shapes)


def stack_steps(body: Graph, steps: list, length: int, body_shapes: list) -> list:
    """Stack each per-step output list; zero steps give empty stacks shaped from `body`'s types
    (symbols bound from the shapes the body would have been called with)."""
    if length:
        out = []
        for k, acc in enumerate(steps):
            shapes = {np.shape(r) for r in acc}
            if len(shapes) > 1:
                raise ValueError(f"step output {k} changed shape between iterations ({sorted(shapes)}); "
                                 "per-step outputs are stacked and must keep one shape")
            out.append(np.stack(acc))
        return out
    env: dict = {}
    for v, shape in zip(body.inputs, body_shapes):
        bind_symbols(v.type, shape, env)
    return [zero_length_stack(v.type, env) for v in body.outputs[:len(steps)]]


def run_reference(graph: Graph, *args):
    """Run `graph` with the numpy reference kernels; outputs nested like the traced function's."""
    from ..ir.tree import tree_flatten, tree_unflatten
    leaves = tree_flatten(list(args))[0] if graph.in_tree is not None else list(args)
    outs = Interpreter(graph).run(*[np.asarray(a) for a in leaves])
    return tree_unflatten(graph.out_tree, outs) if graph.out_tree is not None else outs
