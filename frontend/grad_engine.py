"""Reverse mode over traced graphs: the vjp rule table, and backpropagation through a list of nodes.

The gradient of a program is itself a dyntvm program: every rule emits ordinary graph nodes (through the `F`
functions) into the builder being traced, so a gradient traces, partitions and compiles like any model, with the
forward's symbolic dims (one build for all sizes).

A rule is registered per op with ``@vjp("op", ...)`` (`grad_rules*.py`, `grad_control.py`); ops whose outputs
carry no gradient (integers, bools, constants, shapes) are listed with `no_gradient`. Every registered op is in
one of the two tables or in `NOT_DIFFERENTIABLE_YET` (tests/test_grad_rules.py checks that, so a new op without
a rule fails a test); differentiating through an op without a rule raises a `TraceError` naming it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.list_type import ListType
from ..ir.ops import get_op
from ..ir.types import TensorType
from .tracer import Builder, Tensor, trace_error

_RULES: dict[str, Callable] = {}
_NO_GRADIENT: set = set()

#: Registered ops that have no vjp rule yet: differentiating through one raises a TraceError naming it.
NOT_DIFFERENTIABLE_YET = frozenset({
    "conv", "max_pool", "avg_pool", "roi_align", "prod", "region", "unique",
    "list_append", "list_at", "list_concat", "list_empty", "list_erase", "list_insert", "list_length", "list_stack",
    "make_list", "split_to_list",
})


def vjp(*ops):
    """Register the decorated function as the vjp rule of `ops`: ``rule(c: VjpCall) -> list`` with one entry per
    input of the node: None (no gradient) or a no-argument function computing the input's cotangent (called only
    when that input needs one)."""
    def deco(fn):
        for op in ops:
            get_op(op)          # a typo is an error at import, not a silently missing rule
            if op in _RULES or op in _NO_GRADIENT:
                raise ValueError(f"vjp rule of {op!r} registered twice")
            _RULES[op] = fn
        return fn
    return deco


def no_gradient(*ops):
    """Ops whose outputs carry no gradient (integer, bool or constant results; piecewise-constant functions)."""
    for op in ops:
        get_op(op)
        _NO_GRADIENT.add(op)


def rule_table() -> tuple[dict, frozenset]:
    return dict(_RULES), frozenset(_NO_GRADIENT)


class VjpCall:
    """What a rule sees: the node, its inputs and outputs as traced tensors, and the output cotangents (None for
    an output no gradient flows into; `g` is output 0's, zeros where None)."""

    def __init__(self, node: Node, ins: list, outs: list, cots: list, builder: Builder, options: dict):
        self.node, self.attrs, self.ins, self.outs, self.cots = node, node.attrs, ins, outs, cots
        self.builder, self.options = builder, options

    @property
    def g(self):
        from . import F
        return self.cots[0] if self.cots[0] is not None else F.zeros_like(self.outs[0])

    def cot(self, i):
        from . import F
        return self.cots[i] if self.cots[i] is not None else F.zeros_like(self.outs[i])


def is_float(v: Value) -> bool:
    return isinstance(v.type, TensorType) and np.dtype(v.type.dtype).kind in "fc"


def sum_to(g: Tensor, t: TensorType) -> Tensor:
    """`g` summed over the axes numpy broadcasting added to a value of type `t` (leading axes, and axes where
    `t` has a 1), in `t`'s dtype."""
    from . import F
    lead = g.ndim - t.ndim
    if lead > 0:
        g = F.sum(g, axis=tuple(range(lead)))
    ones = tuple(i for i, (d, e) in enumerate(zip(t.shape, g.type.shape)) if d == 1 and e != 1)
    if ones:
        g = F.sum(g, axis=ones, keepdims=True)
    return F.cast(g, t.dtype) if g.dtype != np.dtype(t.dtype) else g


def conform(g: Tensor, v: Value) -> Tensor:
    """A cotangent of value `v` with exactly `v`'s type (broadcast axes summed, dtype cast, dims renamed)."""
    from . import F
    if g.type == v.type:
        return g
    g = sum_to(g, v.type)
    if g.type.shape != v.type.shape:     # the same sizes under other names: a reshape to v's own dims
        g = F.reshape(g, tuple(v.type.shape)) if all(isinstance(d, int) for d in v.type.shape) else \
            _reshape_like(g, v)
    return g


def _reshape_like(g, v):
    from . import F
    b = g.builder
    return F.reshape(g, F.shape_of(Tensor(v, b)))


def active_values(nodes: list, wrt) -> set:
    """The float values that depend on a value in `wrt` through `nodes` (those a gradient can reach)."""
    active = {v for v in wrt if is_float(v)}
    for n in nodes:
        if any(v in active for v in n.inputs):
            active.update(v for v in n.outputs if is_float(v))
    return active


def backprop(b: Builder, nodes: list, seeds: dict, wrt: list, options: dict | None = None) -> list:
    """Cotangents of the values `wrt` (None where no gradient reaches one), given cotangents `seeds`
    (value -> Tensor) of values computed by `nodes` (in order, already in builder `b`). Emits into `b`."""
    options = options or {}
    active = active_values(nodes, wrt)
    cot: dict = {}
    for v, g in seeds.items():
        if v in active or v in wrt:
            _accumulate(cot, v, g)
    for node in reversed(nodes):
        outs_c = [cot.get(v) for v in node.outputs]
        if all(c is None for c in outs_c) or not any(v in active for v in node.inputs):
            continue
        if node.op in _NO_GRADIENT:
            continue
        rule = _RULES.get(node.op)
        if rule is None:
            raise trace_error(f"grad: op {node.op!r} has no vjp rule, so gradients cannot flow through it "
                              f"(differentiate with respect to inputs it does not depend on, or compute it with "
                              f"other ops)", node.source)
        c = VjpCall(node, [Tensor(v, b) for v in node.inputs], [Tensor(v, b) for v in node.outputs], outs_c, b,
                    options)
        parts = rule(c)
        for v, part in zip(node.inputs, parts):
            if part is None or v not in active or isinstance(v.type, ListType):
                continue
            g = part()
            if g is not None:
                _accumulate(cot, v, conform(g, v))
    return [cot.get(v) for v in wrt]


def _accumulate(cot: dict, v: Value, g: Tensor) -> None:
    cot[v] = g if v not in cot else cot[v] + g


# ---------------------------------------------------------------------------- closed subgraphs
def replay(b: Builder, nodes: list, env: dict, saved: dict | None = None) -> list:
    """Re-emit `nodes` into builder `b` with their inputs mapped by `env` (old value -> new value, updated with
    the new outputs); returns the tape (a control-flow node keeps its subgraphs). A node whose outputs are all
    in `saved` (old value -> a value at hand, e.g. an intermediate a loop saved) is not recomputed: the tape
    gets a node that is not in the graph, linking the mapped inputs to the saved values for its vjp rule."""
    tape = []
    for n in nodes:
        ins = [env[v] for v in n.inputs]
        if saved and n.outputs and all(v in saved for v in n.outputs):
            outs = [saved[v] for v in n.outputs]
            tape.append(Node(n.op, tuple(ins), n.attrs, tuple(outs), n.subgraphs, source=n.source))
            env.update(zip(n.outputs, outs))
            continue
        start = len(b.nodes)
        if n.subgraphs:
            new = Node(n.op, tuple(ins), n.attrs, tuple(Value(v.type) for v in n.outputs), n.subgraphs,
                       source=n.source, checks=n.checks)
            outs = b.add_node(new)
        else:
            outs = b.emit(n.op, ins, n.attrs, source=n.source)
        tape.extend(b.nodes[start:])
        env.update(zip(n.outputs, outs))
    return tape


def closed_graph(in_types: list, build: Callable, name: str) -> Graph:
    """A closed graph: inputs of `in_types`, outputs ``build(builder, input values)`` (Tensors), traced in a
    builder of its own (a control-flow node passes it everything it reads)."""
    with Builder() as b:
        ins = [b.new_input(t) for t in in_types]
        outs = [b.lift(o.value) for o in build(b, ins)]
    return Graph(ins, list(b.nodes), outs, name)


def graph_vjp(b: Builder, g: Graph, ins: list, out_cots: dict, wrt: list, options: dict | None = None,
              saved: dict | None = None):
    """Replay closed graph `g` on values `ins` of builder `b`, then backpropagate cotangents `out_cots` (output
    position -> Tensor) to its inputs at positions `wrt`. Returns (the replayed outputs as Tensors, the
    cotangents: zeros where none reaches an input). `saved`: see `replay`."""
    from . import F
    env = dict(zip(g.inputs, ins))
    nodes = replay(b, g.nodes, env, saved)
    outs = [env[v] for v in g.outputs]
    seeds: dict = {}
    for i, c in out_cots.items():
        v = outs[i]
        seeds[v] = seeds[v] + c if v in seeds else c
    grads = backprop(b, nodes, seeds, [ins[i] for i in wrt], options)
    grads = [F.zeros_like(Tensor(ins[i], b)) if gr is None else gr for i, gr in zip(wrt, grads)]
    return [Tensor(v, b) for v in outs], grads
