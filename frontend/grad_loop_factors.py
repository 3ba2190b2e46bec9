"""A reverse loop's GEMMs moved after the loop (memory="save_all").

The cotangent of a matrix a loop body multiplies by (the LSTM's ``h @ U``) is a sum over the steps of
``transpose(h_t) @ dg_t``: accumulated in the reverse loop, each step is a thin GEMM (inner size: the batch) and
a read-modify-write of the whole matrix. Instead the reverse body emits the two factors ``h_t`` and ``dg_t`` as
per-step outputs (stacked, like the step's activations), and after the loop one GEMM
``transpose(hs.reshape(-1, K)) @ dgs.reshape(-1, N)`` sums them all (what torch's LSTM backward does). Only
terms of that exact form are moved, found through the `add`s that sum a capture's cotangent.

Likewise a per-step data cotangent ``dx_t = dg_t @ M`` with M loop-invariant (the LSTM's ``dg_t @ W^T``) needs
no carry: the body emits ``dg_t`` (stacked once, shared with the weight terms) and one GEMM over all steps' rows
after the loop computes every ``dx_t`` (`invariant_product_terms`, `stacked_product`).
"""
from __future__ import annotations

from ..ir.graph import Graph
from . import F
from .grad_engine import replay
from .tracer import Tensor


def _split_sum(bb, g: Tensor, term):
    """Split `g` (a value of builder `bb`) into ``rest + sum(terms)`` through the `add`s of one type that build
    it: `term(node)` returns (a term, the ids of the nodes only it needs) for a node of that form, else None.
    Returns (rest: a Tensor or None, [terms], the ids of the nodes that only built the moved terms)."""
    own = {id(n) for n in bb.nodes}
    rest, terms, built = [], [], set()
    todo = [g.value]
    while todo:
        v = todo.pop()
        n = v.producer
        found = term(n) if n is not None and id(n) in own and n.op != "add" else None
        if n is None or id(n) not in own:
            rest.append(v)
        elif n.op == "add" and all(i.type == v.type for i in n.inputs):
            built.add(id(n))
            todo.extend(n.inputs)
        elif found is not None:
            terms.append(found[0])
            built.update(found[1])
        else:
            rest.append(v)
    if not terms:
        return g, [], set()
    total = None
    for v in rest:
        total = Tensor(v, bb) if total is None else total + Tensor(v, bb)
    return total, terms, built


def outer_product_terms(bb, g: Tensor):
    """Split `g` into ``rest + sum(transpose(X) @ Q)``: returns (rest: a Tensor or None, [(X, Q)], the ids of the
    nodes that only built the moved terms: dead once `rest` is used instead)."""
    def term(n):
        if not _outer_product(n):
            return None
        t = n.inputs[0].producer
        return (Tensor(t.inputs[0], bb), Tensor(n.inputs[1], bb)), {id(n), id(t)}
    return _split_sum(bb, g, term)


def invariant_product_terms(bb, g: Tensor, invariant_inputs: list):
    """Split `g` into ``rest + sum(Q @ M)``, Q 2-d and M a 2-d static matrix computed from `invariant_inputs`
    only (values of `bb`: the loop body's captures). Returns (rest or None, [(Q, M's nodes in order, M)], the
    ids of the nodes only the moved terms needed)."""
    known = set(invariant_inputs)
    own = {id(n) for n in bb.nodes}

    def invariant_nodes(v, acc):
        if v in known:
            return True
        n = v.producer
        if n is None or id(n) not in own or n.subgraphs or not all(invariant_nodes(i, acc) for i in n.inputs):
            return False
        if n not in acc:
            acc.append(n)
        return True

    def term(n):
        if n.op != "matmul" or len(n.inputs) != 2:
            return None
        q, m = n.inputs
        nodes = []
        if q.type.ndim != 2 or m.type.ndim != 2 or not all(isinstance(d, int) for d in m.type.shape) or \
                invariant_nodes(q, []) or not invariant_nodes(m, nodes):
            return None
        order = {id(x): i for i, x in enumerate(bb.nodes)}
        nodes.sort(key=lambda x: order[id(x)])
        return (Tensor(q, bb), nodes, m), {id(n)} | {id(x) for x in nodes}
    return _split_sum(bb, g, term)


def stacked_product(b, Qs: Tensor, nodes: list, m, invariant_inputs: list, outer: list, like: Tensor) -> Tensor:
    """The moved ``Q_t @ M`` of every step at once, in builder `b`: M rebuilt from `nodes` with the body's
    `invariant_inputs` mapped to the loop's `outer` inputs; the result has the shape of `like` (the stack of
    the data slices whose cotangent it is)."""
    env = dict(zip(invariant_inputs, outer))
    replay(b, nodes, env)
    M = Tensor(env[m], b)
    rows = F.matmul(F.reshape(Qs, (-1, Qs.type.shape[-1])), M)
    return F.reshape(rows, F.shape_of(like))


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


def pure_nodes(g: Graph) -> set:
    """Ids of the nodes of `g` that `prune` may drop once unread: no subgraph, no dim check, not an assert (the
    forward's nodes a reverse body replays but whose values it reads from the saved stacks instead)."""
    return {id(n) for n in g.nodes if not n.subgraphs and not n.checks and not n.op.startswith("assert")}


def summed(Xs: Tensor, Qs: Tensor) -> Tensor:
    """sum over steps t of transpose(Xs[t]) @ Qs[t]: one GEMM over the steps' rows."""
    k, n = Xs.type.shape[-1], Qs.type.shape[-1]
    return F.matmul(F.transpose(F.reshape(Xs, (-1, k)), (1, 0)), F.reshape(Qs, (-1, n)))
