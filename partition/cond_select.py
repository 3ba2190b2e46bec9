"""A `cond` of a loop body as a select: both branches computed, then ``where(pred, then, else)``.

Run by `loops.rewrite_loops` on every `foreach` / `while_loop` body before hoisting. A cond that picks between
two small static computations costs, per step, more than the computations themselves: in the executor a Python
step per branch, in the VM program about 65 instructions per row (the recursion, the row copies, the ``If`` and
the branch region's call). As a select, the body is one region (a compiled loop), and where the predicate and
the branches read only the step's rows, hoisting lifts them all out of the loop (branchy's per-row sub-networks
become two GEMMs over the batch and one ``where``), after which `drop_trivial_foreach` removes the loop.

A cond becomes a select only when that cannot change an answer:

* every node of both branches is a constant, an op that never raises on values (`loops._movable`: a lift
  rule, no run-time dim check) or moves elements by its static shapes (`SHAPE_OPS`: squeeze, reshape, ...),
  and no integer division or power (`ir.ops.RAISE_ON_INTEGERS`: the numpy
  reference raises on a zero divisor) nor a division by a computed value (`DIVIDING`: TVM's simplifier fails
  the build on a divisor it proves zero under the ``where``); nested conds of a branch are selected first, or the outer one stays;
* the branches' outputs have one static type each (same shape and dtype): ``where`` then gives exactly the
  taken branch's values, whatever the other branch computed on them (NaN, inf, overflow: values only,
  no error and no trap);
* the work of each branch per step (`_work`: multiply-adds of matmuls, elements of the other ops) is at
  most `SELECT_WORK`: the untaken branch's work is wasted, and below that bound it costs less than the
  per-step control flow it replaces (a cond link ~7 us in the VM, ~28 us in the executor).
"""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from ..ir import attrs as A
from ..ir.graph import Graph, Node, Value
from ..ir.ops import DIVIDING, RAISE_ON_INTEGERS
from ..ir.types import TensorType

#: ops that move or copy elements by their static shapes (a select's shapes are all static, `_work`): they raise
#: on no value (loop hoisting does not move them: on a symbolic dim some check its size when they run)
SHAPE_OPS = frozenset({"reshape", "squeeze", "transpose", "slice", "stack", "tile", "pad", "full", "full_like"})

#: most work (multiply-adds of a matmul, elements of another op) one branch may do per step to be selected
SELECT_WORK = 1 << 16


#: off while a model is partitioned for a backend without `selects_conds` (`off`). CUDA selects too: its wheres are
#: kernels of their own there (`codegen/backends/cuda/gpu_select.py`: TVM's CUDA codegen cannot print a vectorized
#: select with a vector condition)
_ON = contextvars.ContextVar("dyntvm_cond_select", default=True)


@contextlib.contextmanager
def off():
    """Conds stay conds while partitioning in this block."""
    token = _ON.set(False)
    try:
        yield
    finally:
        _ON.reset(token)


def select_conds(body: Graph, names: set, fresh, movable) -> bool:
    """Replace the selectable conds of loop body `body` (in place) by their branches' nodes and ``where``s
    (see the module doc); `fresh(names, base)` makes a new value name, `movable(node)` says an op never
    raises. Returns whether any was replaced."""
    if not _ON.get():
        return False
    nodes, changed = [], False
    for n in body.nodes:
        inlined = _as_select(n, names, fresh, movable) if n.op == "cond" else None
        if inlined is None:
            nodes.append(n)
        else:
            nodes += inlined
            changed = True
    body.nodes = nodes
    return changed


def _as_select(n: Node, names: set, fresh, movable):
    """The nodes computing cond `n`'s outputs as selects (its output values, now made by ``where`` nodes), or
    None where `n` stays a cond."""
    pred = n.inputs[0]
    if n.checks or not _static(pred.type) or pred.type.shape != () or pred.type.dtype != "bool":
        return None
    then_g, else_g = n.subgraphs
    for k, v in enumerate(n.outputs):
        t, e = then_g.outputs[k].type, else_g.outputs[k].type
        if not (_static(v.type) and _same(t, v.type) and _same(e, v.type)):
            return None
    out = []
    branch_outs = []
    for g in (then_g, else_g):
        env = dict(zip(g.inputs, n.inputs[1:]))
        got = _inline(g, env, names, fresh, movable, n.name)
        if got is None or _work(got) > SELECT_WORK:
            return None
        out += got
        branch_outs.append([env[v] for v in g.outputs])
    masks: dict = {}                     # rank -> the predicate expanded to that rank ([1] * rank)
    for k, v in enumerate(n.outputs):
        rank = v.type.ndim
        if rank not in masks:
            p = pred
            for r in range(1, rank + 1):            # ([1]*rank: lift_elementwise lifts a where of equal ranks)
                q = Value(TensorType((1,) * r, "bool"), fresh(names, f"{pred.name}_x{r}"))
                out.append(_node("expand_dims", (p,), A.AxisAttrs(0), q, n, f"{n.name}_mask{r}"))
                p = q
            masks[rank] = p
        out.append(_node("where", (masks[rank], branch_outs[0][k], branch_outs[1][k]), A.NoAttrs(), v, n,
                         f"{n.name}_select{k}"))
    return out


def _node(op: str, ins: tuple, attrs, out: Value, cond: Node, name: str) -> Node:
    m = Node(op, ins, attrs, (out,), source=cond.source, name=name)
    out.producer, out.index = m, 0
    return m


def _inline(g: Graph, env: dict, names: set, fresh, movable, prefix: str):
    """Copies of `g`'s nodes on the values `env` maps its inputs to (updated with its values), its conds
    selected; None where a node may raise or a cond cannot be selected."""
    out = []
    for n in g.nodes:
        if any(not isinstance(v.type, TensorType) for v in n.inputs + n.outputs):
            return None
        ins = tuple(env[v] for v in n.inputs)
        outs = tuple(Value(v.type, fresh(names, v.name + "_sel")) for v in n.outputs)
        m = Node(n.op, ins, n.attrs, outs, n.subgraphs, n.source, f"{prefix}_{n.name}", n.checks)
        for k, o in enumerate(outs):
            o.producer, o.index = m, k
        env.update(zip(n.outputs, outs))
        if n.op == "cond":
            inner = _as_select(m, names, fresh, movable)
            if inner is None:
                return None
            out += inner
        elif n.op == "constant" or (movable(n) and not _raises_on_integers(n) and not _divides_by_a_value(n)) \
                or (n.op in SHAPE_OPS and not n.checks):
            out.append(m)
        else:
            return None
    return out


def _divides_by_a_value(n: Node) -> bool:
    """A division whose divisor is computed (not a constant). Under the select's ``where``, TVM's simplifier
    folds a divisor it can prove zero (``x - x``) and then fails the build on the float division by the constant
    0 ("Divide by zero": an InternalError, the cond compiled before it was selected)."""
    if n.op not in DIVIDING:
        return False
    d = n.inputs[1].producer
    return d is None or d.op != "constant"


def _raises_on_integers(n: Node) -> bool:
    return n.op in RAISE_ON_INTEGERS and any(not np.issubdtype(np.dtype(v.type.dtype), np.floating)
                                             for v in n.inputs)


def _work(nodes: list) -> int:
    """Per step: multiply-adds of the matmuls, elements of the other ops' largest operand (more than
    `SELECT_WORK` where a shape is not static)."""
    total = 0
    for n in nodes:
        types = [v.type for v in n.inputs + n.outputs]
        if not all(_static(t) for t in types):
            return SELECT_WORK + 1
        size = max((int(np.prod(t.shape, dtype=np.int64)) for t in types), default=0)
        if n.op == "matmul" and n.inputs[0].type.ndim:
            size = int(np.prod(n.outputs[0].type.shape, dtype=np.int64)) * n.inputs[0].type.shape[-1]
        total += size if n.op != "constant" else 0
    return total


def _static(t) -> bool:
    return isinstance(t, TensorType) and all(isinstance(d, int) for d in t.shape)


def _same(a, b) -> bool:
    return isinstance(a, TensorType) and tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype


def drop_trivial_foreach(n: Node):
    """For a foreach whose body computes nothing (hoisting moved it all out; constants left unread): its per-step outputs are data
    rows (stacked: the data itself) and its new states the states it got (final: the initial ones). Returns
    {foreach output: the outer value equal to it}, or None where the loop stays (a body with nodes, a
    per-step output that is a state, data of lengths not known equal: the loop checks them)."""
    a, body = n.attrs, n.subgraphs[0]
    if n.op != "foreach" or getattr(a, "has_valid_length", False) or not a.num_data or \
            any(m.op != "constant" for m in body.nodes):
        return None
    nd, ns = a.num_data, a.num_states
    n_ys = len(body.outputs) - ns
    pos = {v: k for k, v in enumerate(body.inputs)}
    if len({n.inputs[k].type.shape[0] for k in range(nd)}) > 1:
        return None
    out = {}
    for j, (v, o) in enumerate(zip(body.outputs, n.outputs)):
        k = pos.get(v)
        if j < n_ys:
            if k is None or k >= nd:
                return None
        elif k != nd + j - n_ys:
            return None
        src = n.inputs[k]
        if not (isinstance(src.type, TensorType) and src.type == o.type):
            return None
        out[o] = src
    return out
