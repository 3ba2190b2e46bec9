"""Values with a static 0 dim are not computed: they become constants (or `full` nodes).

A value whose type has a static 0 dim (``float32[N, 0]``, ``int32[0, 3]``) holds no elements whatever
the inputs, so it needs no kernel. TVM handles such shapes badly: Relax reads a 0 in a reshape target
as "copy this input dim" (broadcast_to, expand_dims, stack, matmul and integer power legalize through
such reshapes), some legalizations index out of bounds, FoldConstant turns a fully static empty result
(``full_like`` of a [3, 0] input) into an empty constant that the saved kernel library cannot load back,
a mean over a static 0-length axis divides by zero at compile time, and so on. `fold_empty_values` runs on the
partitioner's private copy of the graph before regions are formed: each static node whose outputs all
have a static 0 dim is replaced, output by output, by a `constant` (all dims static) or a zero `full`
of the output's shape (symbolic dims: evaluated at run time, the partitioner gives its region a value
carrying the symbols). Their consumers, compiled or not, then read empty values of the right shape and
dtype.

Nodes that numpy may refuse to run on values (a take index out of range, an empty max/min/argmax/
argmin reduction) keep their own kernels and run-time checks, as do dynamic-shape and control-flow
nodes (bodies are rewritten recursively); and no node is replaced where that would leave such a node,
which the graph's outputs depended on, without a use (its check would be dropped with it).
"""
from __future__ import annotations

import numpy as np

from ..ir.attrs import ConstantAttrs, FullAttrs
from ..ir.graph import Graph, Node
from ..ir.ops import CONTROL_FLOW, STATIC

#: Static ops that raise on some values even where their result is empty: never replaced.
MAY_RAISE = frozenset({"take", "argmax", "argmin", "max", "min"})


def _take_in_range(n: Node) -> bool:
    """A take whose indices are a constant within a static axis: it cannot raise (TVM's passes fail on such a
    take of a statically empty tensor, found by the fuzzer: take([1, 0] tensor, 0, axis=0))."""
    if n.op != "take":
        return False
    idx, t = n.inputs[1].producer, n.inputs[0].type
    if idx is None or idx.op != "constant" or not t.ndim:
        return False
    size = t.shape[n.attrs.axis % t.ndim]
    value = np.asarray(idx.attrs.value)
    return isinstance(size, int) and (value.size == 0 or (int(value.min()) >= -size and int(value.max()) < size))


def is_static_empty(t) -> bool:
    """`t` (a TensorType) has a static 0 dim: no elements whatever the symbols are."""
    return any(isinstance(d, int) and d == 0 for d in t.shape)


def fold_empty_values(g: Graph) -> Graph:
    """Replace, in place, the nodes of `g` (and of its control-flow bodies) computing only values with a
    static 0 dim. Returns `g`."""
    for n in g.nodes:
        if n.opdef.kind == CONTROL_FLOW:
            for s in n.subgraphs:
                fold_empty_values(s)
    replace = _replaced(g)
    nodes = []
    for i, n in enumerate(g.nodes):
        if i not in replace:
            nodes.append(n)
            continue
        for v in n.outputs:
            t = v.type
            if all(isinstance(d, int) for d in t.shape):
                data = np.zeros(t.shape, t.dtype)
                data.flags.writeable = False
                m = Node("constant", (), ConstantAttrs(data), (v,), name=f"{n.name or n.op}_empty{v.index}",
                         source=n.source)
            else:
                m = Node("full", (), FullAttrs(tuple(t.shape), False if t.dtype == "bool" else 0, t.dtype), (v,),
                         name=f"{n.name or n.op}_empty{v.index}", source=n.source)
            v.producer, v.index = m, 0
            nodes.append(m)
    g.nodes = nodes
    return g


def _replaced(g: Graph) -> set:
    """Indices of the nodes to replace: the replaceable ones, but for those that would leave a live node of
    `MAY_RAISE` (and with it its check) without a use."""
    producer = {v: i for i, n in enumerate(g.nodes) for v in n.outputs}
    consumers: dict = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if v in producer:
                consumers.setdefault(producer[v], set()).add(i)

    def live(replaced) -> set:          # nodes the outputs depend on once `replaced` have no inputs
        seen, todo = set(), [producer[v] for v in g.outputs if v in producer]
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                if i not in replaced:
                    todo.extend(producer[v] for v in g.nodes[i].inputs if v in producer)
        return seen

    replace = {i for i, n in enumerate(g.nodes) if _replaceable(n)}
    if not replace:
        return replace
    raising = [i for i in live(set()) if g.nodes[i].op in MAY_RAISE]
    while True:
        alive = live(replace)
        lost = [i for i in raising if i not in alive]
        if not lost:
            return replace
        todo, seen = list(lost), set(lost)
        while todo:                      # keep everything downstream of a lost check
            i = todo.pop()
            replace.discard(i)
            for j in consumers.get(i, set()) - seen:
                seen.add(j)
                todo.append(j)


def _replaceable(n: Node) -> bool:
    if n.opdef.kind != STATIC or (n.op in MAY_RAISE and not _take_in_range(n)) or n.op == "constant" or \
            not n.outputs:
        return False
    if n.op == "full" and not all(isinstance(d, int) for d in n.outputs[0].type.shape):
        return False                   # already what it would become
    return all(is_static_empty(v.type) for v in n.outputs)
