"""vjp rules of the control-flow ops: the backward of a control-flow node is a control-flow node.

* ``cond`` / ``case``: the same choice again, each branch replaced by its vjp graph (the taken branch's vjp runs).
* ``foreach``: the forward loop (in its place: it runs once) gets a body that also emits the states each step
  starts from (stacked like its outputs); then a `foreach` over the reversed steps runs each step's vjp,
  carrying the state cotangents and summing the captured values' cotangents.
* ``while_loop``: the same, with the loop vars of every iteration saved (a stack that grows with the iterations,
  as per-step outputs do) and the reverse pass a `foreach` over the saved stack: exactly as many steps as the
  forward ran, whatever decided that.

Memory (``memory=`` of `dt.grad`): ``"recompute"`` saves the carries only and recomputes each step's body in the
reverse pass, step by step (`ForeachAttrs.hoist_rows` False: not lifted over all steps); ``"save_all"`` saves
the float intermediates of the body its vjp reads (stacked) and does not recompute, where the body's values keep
one shape per step (else it falls back to recomputing), sums a weight's ``transpose(X_t) @ Q_t`` terms by one
GEMM after the reverse loop, and computes a per-step input's ``Q_t @ M`` terms (M loop-invariant) by one GEMM
over all steps' rows after it (`grad_loop_factors`).
"""
from __future__ import annotations

import dataclasses

from ..ir import attrs as A
from ..ir.graph import Node, Value
from ..ir.list_type import ListType, value_dims
from ..ir.types import TensorType, dim_symbols, fresh_dim
from . import F
from . import grad_loop_factors as factors
from .grad_engine import VjpCall, closed_graph, graph_vjp, is_float, replay, vjp
from .grad_rules import _flip
from .tracer import Tensor, trace_error


def _emit(b, node, op, attrs, inputs, out_types, subgraphs) -> list:
    new = Node(op, tuple(b.lift(v) for v in inputs), attrs, tuple(Value(t) for t in out_types), tuple(subgraphs),
               source=node.source)
    return [Tensor(v, b) for v in b.add_node(new)]


def _given(cots):
    """Positions of the outputs that have a cotangent, and those cotangents."""
    pos = [i for i, x in enumerate(cots) if x is not None]
    return pos, [cots[i] for i in pos]


def _copy_with_inputs(g, extra_types, name):
    """Graph `g` copied with unused inputs of `extra_types` appended (a predicate next to vjp branches)."""
    def build(bb, ins):
        env = dict(zip(g.inputs, ins))
        replay(bb, g.nodes, env)
        return [Tensor(env[v], bb) for v in g.outputs]
    return closed_graph([v.type for v in g.inputs] + list(extra_types), build, name)


def _branch_vjp(g, n_caps, cot_pos, cot_types, wrt, options, name):
    def build(bb, ins):
        caps, cots = ins[:n_caps], ins[n_caps:]
        return graph_vjp(bb, g, caps, {i: Tensor(v, bb) for i, v in zip(cot_pos, cots)}, wrt, options)[1]
    return closed_graph([v.type for v in g.inputs] + cot_types, build, name)


def _result(n_inputs, offset, wrt, outs):
    res = [None] * n_inputs
    for k, i in enumerate(wrt):
        res[offset + i] = (lambda o=outs[k]: o)
    return res


@vjp("cond")
def _cond(c):
    node, b = c.node, c.builder
    caps = list(node.inputs[1:])
    wrt = [i for i, v in enumerate(caps) if is_float(v)]
    cot_pos, cots = _given(c.cots)
    cot_types = [x.type for x in cots]
    graphs = [_branch_vjp(g, len(caps), cot_pos, cot_types, wrt, c.options, f"{g.name}_vjp") for g in node.subgraphs]
    outs = _emit(b, node, "cond", A.CondAttrs(len(wrt)), [node.inputs[0]] + caps + [x.value for x in cots],
                 [caps[i].type for i in wrt], graphs)
    return _result(len(node.inputs), 1, wrt, outs)


@vjp("case")
def _case(c):
    node, b = c.node, c.builder
    caps = list(node.inputs)
    wrt = [i for i, v in enumerate(caps) if is_float(v)]
    cot_pos, cots = _given(c.cots)
    cot_types = [x.type for x in cots]
    n = node.attrs.num_cases
    graphs = []
    for i, g in enumerate(node.subgraphs):
        is_pred = i < 2 * n and i % 2 == 0
        graphs.append(_copy_with_inputs(g, cot_types, g.name) if is_pred else
                      _branch_vjp(g, len(caps), cot_pos, cot_types, wrt, c.options, f"{g.name}_vjp"))
    outs = _emit(b, node, "case", A.CaseAttrs(n, len(wrt), node.attrs.exclusive), caps + [x.value for x in cots],
                 [caps[i].type for i in wrt], graphs)
    return _result(len(node.inputs), 0, wrt, outs)


# ----------------------------------------------------------------------------------------- loops
def _check_carries(api, body, carried, outer_types):
    for k, (v, t) in enumerate(zip(carried, outer_types)):
        if isinstance(v.type, ListType):
            raise trace_error(f"grad: {api} carries a list (loop var {k}); gradients through list carries are not "
                              f"supported")
        if is_float(v) and v.type.shape != t.shape:
            raise trace_error(f"grad: {api} loop var {k} changes shape between iterations ({t} in, {v.type} in the "
                              f"body); gradients need carries of one shape")


def _saving_body(body, n_steps_out, carried_pos, keep):
    """The loop body also emitting, as extra per-step outputs, the carries each step starts from and the
    intermediates in `keep`."""
    def build(bb, ins):
        env = dict(zip(body.inputs, ins))
        replay(bb, body.nodes, env)
        outs = [Tensor(env[v], bb) for v in body.outputs]
        return outs[:n_steps_out] + [Tensor(ins[i], bb) for i in carried_pos] + [Tensor(env[v], bb) for v in keep] \
            + outs[n_steps_out:]
    return closed_graph([v.type for v in body.inputs], build, f"{body.name}_saving")


def _kept(c, body, n_out: int) -> list:
    """memory="save_all": the body's float intermediates to save per step (those whose shape is the same at
    every step: dims of the body's inputs); none for "recompute"."""
    if c.options.get("memory") != "save_all":
        return []
    known = {s for v in body.inputs for d in value_dims(v.type) if isinstance(d, str) for s in dim_symbols(d)}
    # not the body's outputs: a step output is stacked already (a compiled loop stacks a value once) and a new
    # carry is the next step's saved one; recomputing them from the saved intermediates is one elementwise op
    outs = set(body.outputs)
    keep = [v for n in body.nodes if n.op != "constant" for v in n.outputs
            if is_float(v) and v not in outs and all(isinstance(d, int) or dim_symbols(d) <= known
                                                     for d in v.type.shape)]
    if not keep:
        return keep
    # the outputs the reverse body gets cotangents for: the step outputs given one, every float new carry
    seeded = _given(c.cots[:n_out])[0] + [j for j in range(n_out, len(body.outputs)) if is_float(body.outputs[j])]
    return _read_by_vjp(c, body, keep, seeded)


def _read_by_vjp(c, body, keep: list, cot_pos: list) -> list:
    """The values of `keep` that the body's vjp reads (the outputs at `cot_pos` given cotangents, as in the reverse
    body, every float input differentiated). Saving the others costs a stack written every step
    and never read: the vjp of an `add`, a `split` or of `matmul`'s output reads none of them (the LSTM's
    pre-activations, 4 of its 5 [B, 4H] values)."""
    n_in = len(body.inputs)

    def build(bb, ins):
        kept = dict(zip(keep, ins[n_in:n_in + len(keep)]))
        seeds = {j: Tensor(v, bb) for j, v in zip(cot_pos, ins[n_in + len(keep):])}
        wrt = [i for i, v in enumerate(body.inputs) if is_float(v)]
        return graph_vjp(bb, body, list(ins[:n_in]), seeds, wrt, c.options, kept)[1]
    g = closed_graph([v.type for v in body.inputs] + [v.type for v in keep] +
                     [body.outputs[j].type for j in cot_pos], build, f"{body.name}_vjp_reads")
    read = set(g.outputs)
    for n in reversed(g.nodes):         # the live nodes' inputs (a recomputed value nothing reads is no read)
        if any(v in read for v in n.outputs):
            read.update(n.inputs)
    return [v for v, slot in zip(keep, g.inputs[n_in:n_in + len(keep)]) if slot in read]


def _reverse_scan(c, body, n_data, data_rev, n_carry, saved_rev, n_out, dys_rev, dys_pos, dcarry, caps, keep,
                  kept_rev):
    """A `foreach` over the reversed steps running the body's vjp. `body` inputs: `n_data` data slices,
    `n_carry` carries, the captures; outputs: `n_out` step outputs, new carries. `kept_rev`: the reversed
    stacks of the intermediates `keep` (not recomputed). Returns (cotangents of the data, stacked in forward
    order, of the carries' initial values, of the captures): float ones only."""
    b = c.builder
    wrt_data = [i for i in range(n_data) if is_float(body.inputs[i])]
    wrt_carry = [i for i in range(n_carry) if is_float(body.inputs[n_data + i])]
    wrt_caps = [i for i, v in enumerate(caps) if is_float(v)]
    slice_types = [v.type for v in body.inputs[:n_data + n_carry]] + [body.outputs[j].type for j in dys_pos] + \
        [v.type for v in keep]
    cap_types = [v.type for v in body.inputs[n_data + n_carry:]]
    save_all = c.options.get("memory") == "save_all"
    slices = data_rev + saved_rev + dys_rev + kept_rev      # the loop's per-step inputs, in the body's order
    nd, nc = len(wrt_data), len(wrt_carry)

    def make(acc_caps):
        """The reverse body, carrying the cotangents of the captures `acc_caps` as states. Also returns, per
        capture of `wrt_caps`, its terms moved out of the loop (each (X, Q) as ("in", slice) or ("out", j)),
        the factors stacked as per-step outputs (each value once: a compiled loop stacks a value once), and
        the captures whose cotangent was moved out whole (their state passes through unchanged)."""
        moved, stacked, dead, whole = [], [], set(), set()
        state_types = [body.inputs[n_data + i].type for i in wrt_carry] + [caps[i].type for i in acc_caps]

        def build(bb, ins):
            k = n_data + n_carry
            xs, dys = ins[:k], ins[k:k + len(dys_pos)]
            k += len(dys_pos)
            kept = dict(zip(keep, ins[k:k + len(keep)]))
            k += len(keep)
            dcar, dcap = ins[k:k + nc], dict(zip(acc_caps, ins[k + nc:k + nc + len(acc_caps)]))
            cap_in = ins[k + nc + len(acc_caps):]
            seeds = {j: Tensor(v, bb) for j, v in zip(dys_pos, dys)}
            for i, v in zip(wrt_carry, dcar):
                seeds[n_out + i] = Tensor(v, bb)
            wrt = wrt_data + [n_data + i for i in wrt_carry] + [n_data + n_carry + i for i in wrt_caps]
            _, grads = graph_vjp(bb, body, list(xs) + list(cap_in), seeds, wrt, c.options, kept)
            slot = {v: i for i, v in enumerate(ins[:len(slices)])}
            data_out = []
            for g in grads[:nd]:        # dx_t = dg_t @ M, M loop-invariant: one GEMM after the loop
                rest, terms, built = factors.invariant_product_terms(bb, g, cap_in) if save_all else (g, [], set())
                if rest is not None:
                    data_out.append(rest)
                data_moved.append((rest is not None, [(_factor_ref(q, slot, stacked), nodes, m, cap_in)
                                                      for q, nodes, m in terms]))
                dead.update(built)
            acc = []
            for i, g in zip(wrt_caps, grads[nd + nc:]):
                rest, pairs, built = factors.outer_product_terms(bb, g) if save_all else (g, [], set())
                if rest is None:
                    whole.add(i)
                if i in dcap:
                    acc.append(Tensor(dcap[i], bb) if rest is None else Tensor(dcap[i], bb) + rest)
                moved.append([tuple(_factor_ref(t, slot, stacked) for t in pair) for pair in pairs])
                dead.update(built)
            return data_out + stacked + grads[nd:nd + nc] + acc
        data_moved = []
        g = closed_graph(slice_types + state_types + cap_types, build, f"{body.name}_vjp")
        factors.prune(g, dead | factors.pure_nodes(g))
        return g, state_types, moved, stacked, whole, data_moved

    g, state_types, moved, stacked, whole, data_moved = make(wrt_caps)
    acc_caps = [i for i in wrt_caps if i not in whole]
    if whole:
        g, state_types, moved, stacked, _, data_moved = make(acc_caps)
    steps = (data_rev + saved_rev)[0].type.shape[0]
    inits = [dcarry[i] for i in wrt_carry] + [F.zeros_like(Tensor(caps[i], b)) for i in acc_caps]
    ns = len(stacked)
    kept_data = [i for i, (kept, _) in zip(wrt_data, data_moved) if kept]
    nk = len(kept_data)
    out_types = [TensorType(data_rev[i].type.shape, body.inputs[i].type.dtype) for i in kept_data] + \
        [TensorType((steps,) + t.type.shape, t.type.dtype) for t in stacked] + list(state_types)
    attrs = A.ForeachAttrs(len(slices), len(inits), nk + ns, hoist_rows=not c.options.get("memory") == "recompute")
    outs = _emit(b, c.node, "foreach", attrs, [x.value for x in slices] + [x.value for x in inits] + list(caps),
                 out_types, [g])
    acc_out = dict(zip(acc_caps, outs[nk + ns + nc:]))
    d_caps = {}
    for i, pairs in zip(wrt_caps, moved):
        d = acc_out.get(i)
        for refs in pairs:
            term = factors.summed(*[slices[j] if where == "in" else outs[nk + j] for where, j in refs])
            d = term if d is None else d + term
        d_caps[i] = d if d is not None else F.zeros_like(Tensor(caps[i], b))
    d_data, rest_out = {}, dict(zip(kept_data, outs[:nk]))
    for i, (_, terms) in zip(wrt_data, data_moved):     # reversed like the loop's steps, then flipped
        d = rest_out.get(i)
        for (where, j), nodes, m, cap_in in terms:
            qs = slices[j] if where == "in" else outs[nk + j]
            term = factors.stacked_product(b, qs, nodes, m, cap_in, list(caps), data_rev[i])
            d = term if d is None else d + term
        d_data[i] = _flip(d, 0)
    return d_data, dict(zip(wrt_carry, outs[nk + ns:nk + ns + nc])), d_caps


def _saving_forward(c, attrs, out_types, saving, n_steps_out) -> list:
    """The loop run again with its saving body: a node of `attrs`, outputs of `out_types` (the loop's step
    outputs, then the stacks, then its final carries). Where the loop's node is in the builder (a node of the
    tape, not one a saving loop stood in for), it takes that node's place, keeping its step outputs and final
    carries as its own, so the forward runs once; else it is a new node after it."""
    node, b = c.node, c.builder
    at = next((i for i in range(len(b.nodes) - 1, -1, -1) if b.nodes[i] is node), None)
    if at is None:
        return _emit(b, node, node.op, attrs, list(node.inputs), out_types, saving)
    n_stacks = len(out_types) - len(node.outputs)
    stacks = [b.own(Value(t)) for t in out_types[n_steps_out:n_steps_out + n_stacks]]
    outs = node.outputs[:n_steps_out] + tuple(stacks) + node.outputs[n_steps_out:]
    new = Node(node.op, node.inputs, attrs, outs, tuple(saving), source=node.source, name=node.name,
               checks=node.checks)
    for i, v in enumerate(outs):
        v.producer, v.index = new, i
    b.nodes[at] = new
    return [Tensor(v, b) for v in outs]


def _factor_ref(t, slot: dict, stacked: list):
    """Where the reverse loop's result has factor `t` stacked over the steps: one of its per-step inputs
    (``("in", i)``), else a per-step output (``("out", j)``, added to `stacked` once)."""
    if t.value in slot:
        return ("in", slot[t.value])
    at = next((j for j, s in enumerate(stacked) if s.value is t.value), None)
    if at is None:
        stacked.append(t)
        at = len(stacked) - 1
    return ("out", at)


@vjp("foreach")
def _foreach(c):
    node, b = c.node, c.builder
    a = node.attrs
    if a.has_valid_length:
        return _foreach_valid_length(c)
    nd, ns, no = a.num_data, a.num_states, a.num_outputs
    body = node.subgraphs[0]
    ins = list(node.inputs)
    data, states, caps = ins[:nd], ins[nd:nd + ns], ins[nd + ns:]
    _check_carries("foreach", body, body.inputs[nd:nd + ns], [v.type for v in states])
    length = data[0].type.shape[0]
    keep = _kept(c, body, no)
    saving = _saving_body(body, no, list(range(nd, nd + ns)), keep)
    out_types = [v.type for v in node.outputs[:no]] + \
        [TensorType((length,) + v.type.shape, v.type.dtype) for v in states + keep] + \
        [v.type for v in node.outputs[no:]]
    fwd = _saving_forward(c, dataclasses.replace(a, num_outputs=no + ns + len(keep)), out_types, [saving], no)
    saved, kept = fwd[no:no + ns], fwd[no + ns:no + ns + len(keep)]
    dys_pos, dys = _given(c.cots[:no])
    dcarry = [c.cot(no + k) if is_float(node.outputs[no + k]) else None for k in range(ns)]
    d_data, d_states, d_caps = _reverse_scan(
        c, body, nd, [_flip(Tensor(v, b), 0) for v in data], ns, [_flip(s, 0) for s in saved], no,
        [_flip(x, 0) for x in dys], dys_pos, dcarry, caps, keep, [_flip(x, 0) for x in kept])
    res = [None] * len(ins)
    for i, g in d_data.items():
        res[i] = (lambda g=g: g)
    for i, g in d_states.items():
        res[nd + i] = (lambda g=g: g)
    for i, g in d_caps.items():
        res[nd + ns + i] = (lambda g=g: g)
    return res


@vjp("while_loop")
def _while_loop(c):
    node, b = c.node, c.builder
    a = node.attrs
    nv, no = a.num_vars, a.num_outputs
    cond_g, body = node.subgraphs
    ins = list(node.inputs)
    lvars = ins[:nv]
    cap_at = nv + int(a.has_max_tensor)
    caps = ins[cap_at:]
    _check_carries("while_loop", body, body.inputs[:nv], [v.type for v in lvars])
    keep = _kept(c, body, no)
    saving = _saving_body(body, no, list(range(nv)), keep)
    n_iter = node.outputs[0].type.shape[0] if no else \
        fresh_dim(origin="the number of iterations of while_loop (saved for its gradient)")
    out_types = [TensorType((n_iter,) + v.type.shape[1:], v.type.dtype) for v in node.outputs[:no]] + \
        [TensorType((n_iter,) + v.type.shape, v.type.dtype) for v in list(body.inputs[:nv]) + keep] + \
        [v.type for v in node.outputs[no:]]
    fwd = _saving_forward(c, dataclasses.replace(a, num_outputs=no + nv + len(keep)), out_types, [cond_g, saving],
                          no)
    saved, kept = fwd[no:no + nv], fwd[no + nv:no + nv + len(keep)]
    dys_pos, dys = _given(c.cots[:no])
    dys = [F.reshape(x, F.shape_of(fwd[j])) for j, x in zip(dys_pos, dys)]     # on the saved run's count
    dcarry = [c.cot(no + k) if is_float(node.outputs[no + k]) else None for k in range(nv)]
    _, d_vars, d_caps = _reverse_scan(c, body, 0, [], nv, [_flip(s, 0) for s in saved], no,
                                      [_flip(x, 0) for x in dys], dys_pos, dcarry, caps, keep,
                                      [_flip(x, 0) for x in kept])
    res = [None] * len(ins)
    for i, g in d_vars.items():
        res[i] = (lambda g=g: g)
    for i, g in d_caps.items():
        res[cap_at + i] = (lambda g=g: g)
    return res


def _foreach_valid_length(c):
    """foreach with valid_length, differentiated as the equal loop over the whole batch whose body keeps a row's
    state and zeroes its output once the row is past its length (``t >= valid_length[b]``): the finished rows get
    no gradient from the steps they did not run. The masked node is only the rule's input, never emitted."""
    node, b = c.node, c.builder
    a = node.attrs
    nd, ns, no = a.num_data, a.num_states, a.num_outputs
    ins = list(node.inputs)
    data, states, vl, caps = ins[:nd], ins[nd:nd + ns], ins[nd + ns], ins[nd + ns + 1:]
    body = node.subgraphs[0]
    steps = F.arange(F.shape_of(Tensor(data[0], b))[0])
    active = F.less(F.expand_dims(steps, 1), F.expand_dims(F.cast(Tensor(vl, b), "int64"), 0))     # [T, B]

    def build(bb, vals):
        xs, m, sts, cap = vals[:nd], vals[nd], vals[nd + 1:nd + 1 + ns], vals[nd + 1 + ns:]
        env = dict(zip(body.inputs, list(xs) + list(sts) + list(cap)))
        replay(bb, body.nodes, env)
        outs = [Tensor(env[v], bb) for v in body.outputs]
        mask = Tensor(m, bb)

        def keep(new, old):
            mk = F.reshape(mask, (-1,) + (1,) * (new.ndim - 1)) if new.ndim > 1 else mask
            return F.where(mk, new, old)
        return [keep(o, F.zeros_like(o)) for o in outs[:no]] + \
            [keep(o, Tensor(s, bb)) for o, s in zip(outs[no:], sts)]
    in_types = [TensorType(v.type.shape[1:], v.type.dtype) for v in data] + [TensorType(active.type.shape[1:], "bool")] \
        + [v.type for v in states] + [v.type for v in caps]
    masked = Node("foreach", tuple(data) + (active.value,) + tuple(states) + tuple(caps), A.ForeachAttrs(nd + 1, ns, no),
                  node.outputs, (closed_graph(in_types, build, f"{body.name}_masked"),), source=node.source)
    grads = _foreach(VjpCall(masked, [Tensor(v, b) for v in masked.inputs], c.outs, c.cots, b, c.options))
    return grads[:nd] + grads[nd + 1:nd + 1 + ns] + [None] + grads[nd + 1 + ns:]
