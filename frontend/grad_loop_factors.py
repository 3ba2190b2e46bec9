"""A reverse loop's weight gradients as one GEMM after the loop (memory="save_all").

The cotangent of a matrix a loop body multiplies by (the LSTM's ``h @ U``) is a sum over the steps of
``transpose(h_t) @ dg_t``: accumulated in the reverse loop, each step is a thin GEMM (inner size: the batch) and
a read-modify-write of the whole matrix. Instead the reverse body emits the two factors ``h_t`` and ``dg_t`` as
per-step outputs (stacked, like the step's activations), and after the loop one GEMM
``transpose(hs.reshape(-1, K)) @ dgs.reshape(-1, N)`` sums them all (what torch's LSTM backward does). Only
terms of that exact form are moved, found through the `add`s that sum a capture's cotangent.
"""
from __future__ import annotations

from ..ir.graph import Graph
from . import F
from .tracer import Tensor


def outer_product_terms(bb, g: Tensor):
    """Split `g` (a value of builder `bb`) into ``rest + sum(transpose(X) @ Q)``: returns (rest: a Tensor or
    None, [(X, Q)], the ids of the nodes that only built the moved terms: dead once `rest` is used instead)."""
    own = {id(n) for n in bb.nodes}
    rest, pairs, built = [], [], set()
    todo = [g.value]
    while todo:
        v = todo.pop()
        n = v.producer
        if n is None or id(n) not in own:
            rest.append(v)
        elif n.op == "add" and all(i.type == v.type for i in n.inputs):
            built.add(id(n))
            todo.extend(n.inputs)
        elif _outer_product(n):
            t = n.inputs[0].producer
            built.update((id(n), id(t)))
            pairs.append((Tensor(t.inputs[0], bb), Tensor(n.inputs[1], bb)))
        else:
            rest.append(v)
    if not pairs:
        return g, [], set()
    total = None
    for v in rest:
        total = Tensor(v, bb) if total is None else total + Tensor(v, bb)
    return total, pairs, built


def _outer_product(n) -> bool:
    """``matmul(transpose(X), Q)`` with X [R, K], Q [R, N] 2-d, K and N static (R: the rows, e.g. the batch)."""
    if n.op != "matmul" or len(n.inputs) != 2:
        return False
    p, q = n.inputs
    t = p.producer
    if t is None or t.op != "transpose" or t.attrs.axes not in (None, (1, 0)):
        return False
    x = t.inputs[0]
    return x.type.ndim == 2 and q.type.ndim == 2 and x.type.shape[0] == q.type.shape[0] and \
        all(isinstance(d, int) for d in (x.type.shape[1], q.type.shape[1]))


def prune(g: Graph, candidates: set) -> None:
    """Drop the nodes of `g` whose ids are in `candidates` and whose outputs nothing reads any more."""
    used = set(g.outputs)
    keep = []
    for n in reversed(g.nodes):
        if id(n) in candidates and not any(o in used for o in n.outputs):
            continue
        keep.append(n)
        used.update(n.inputs)
    g.nodes = keep[::-1]


def summed(Xs: Tensor, Qs: Tensor) -> Tensor:
    """sum over steps t of transpose(Xs[t]) @ Qs[t]: one GEMM over the steps' rows."""
    k, n = Xs.type.shape[-1], Qs.type.shape[-1]
    return F.matmul(F.transpose(F.reshape(Xs, (-1, k)), (1, 0)), F.reshape(Qs, (-1, n)))
