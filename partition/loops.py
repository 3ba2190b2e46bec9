"""Loop rewrites before partitioning: append-only while_loop vars as step outputs (`append_carry`), hoisting
out of loop bodies, and while_loop's condition in its body. Before hoisting, a small `cond` of a loop body
becomes a select (`cond_select.select_conds`); after it, a foreach whose body computes nothing is dropped
(`cond_select.drop_trivial_foreach`).

Both run on the partitioner's private copy of the graph (`partition.partition`), recursively (innermost
loops first, so what leaves an inner loop may leave the outer one too).

**Hoisting.** A node of a `foreach` body whose inputs are all data slices (the step's rows), captures,
constants or results of such nodes runs once over the whole sequence instead of once per step (unless the
loop's `hoist_rows` is False): its op's
lift rule (`OpDef.lift`) gives the attrs computing every step's result at once, stacked on a new axis 0
(the LSTM's ``x_t @ W`` becomes one GEMM ``xs @ W`` over all steps). The values the remaining body reads
become new data inputs of the loop, sliced per step like the others. A node of a `foreach` or
`while_loop` body that depends on captures and constants only (loop-invariant) moves out unchanged and
becomes a capture. Only ops with a lift rule move: they never raise on values, so running them when the
loop would not have run (zero steps) changes nothing but time.

**while_loop's condition in its body.** The condition is computed on the new loop vars at the end of the
body (``WhileAttrs.cond_in_body``: one more, bool output), so once partitioned the condition and the body
run as one region call per iteration instead of two; the condition graph still decides the first
iteration. Only where the condition is made of ops with lift rules or views (`VIEWS`: ops that cannot raise:
computing it after the last iteration, which eager mode would not do, then cannot fail).
"""
from __future__ import annotations

import dataclasses

from ..ir.dims import parse_dim
from ..ir.graph import Graph, Node, Value
from ..ir.ops import STATIC
from ..ir.types import TensorType
from .append_carry import append_only_carries
from .cond_select import drop_trivial_foreach, select_conds


def rewrite_loops(g: Graph) -> Graph:
    """Turn append-only while_loop vars into step outputs (`append_carry`), hoist out of every loop body of
    `g` (in place, whole tree) and move while_loop conditions into their bodies. Returns `g`."""
    names = _all_names(g)
    _rewrite(g, names, True)
    return g


def _rewrite(g: Graph, names: set, top: bool = False) -> None:
    for n in list(g.nodes):               # first: the nodes it adds after a loop are then rewritten below
        for s in n.subgraphs:
            _rewrite(s, names)
        if n.op == "while_loop":
            k = next(i for i, m in enumerate(g.nodes) if m is n)
            g.nodes[k:k] = append_only_carries(g, n, lambda base: _fresh(names, base), top)
    nodes, replace = [], {}                 # replace: outputs of the foreach loops dropped -> their values
    for n in g.nodes:
        _renamed(n, replace)
        if n.op == "foreach":
            select_conds(n.subgraphs[0], names, _fresh, _movable)
            nodes += _hoist_foreach(n, names)
            same = drop_trivial_foreach(n)
            if same is not None:
                replace.update(same)
                continue
        elif n.op == "while_loop":
            select_conds(n.subgraphs[1], names, _fresh, _movable)
            nodes += _hoist_while(n, names)
            _condition_into_body(n, names)
        nodes.append(n)
    g.nodes = nodes
    g.outputs = [replace.get(v, v) for v in g.outputs]


def _all_names(g: Graph) -> set:
    out = {v.name for v in g.values()}
    for n in g.walk():
        for s in n.subgraphs:
            out.update(v.name for v in s.values())
    return out


def _fresh(names: set, base: str) -> str:
    name, k = base, 0
    while name in names:
        k += 1
        name = f"{base}_{k}"
    names.add(name)
    return name


#: Ops without a lift rule that cannot raise either: a length read from a shape (``F.shape_of(x)[0] < limit``)
#: in a while_loop's condition. `squeeze` and `reshape` only where their sizes are static (`_view`): on a symbolic
#: dim they are checked when the kernel runs.
VIEWS = frozenset({"shape_of", "slice", "squeeze", "reshape", "expand_dims"})


def _view(n: Node) -> bool:
    if n.op not in VIEWS or n.checks:
        return False
    if n.op in ("squeeze", "reshape"):
        return all(isinstance(v.type, TensorType) and v.type.is_static for v in n.inputs + n.outputs)
    return True


def _movable(n: Node) -> bool:
    if n.op == "reshape" and not all(isinstance(v.type, TensorType) and v.type.is_static
                                     for v in n.inputs + n.outputs):
        return False        # sizes known only at run time may not fit (numpy raises): it must not run early
    return n.opdef.kind == STATIC and n.opdef.lift is not None and not n.checks   # (checks are per step)


# --------------------------------------------------------------------------------------- foreach
def _hoist_foreach(loop: Node, names: set) -> list:
    """Move the hoistable nodes of `loop`'s body before it; returns the moved nodes (now of the caller)."""
    a = loop.attrs
    body = loop.subgraphs[0]
    nd, ns = a.num_data, a.num_states
    if not nd:
        return []
    first_cap = nd + ns + a.has_valid_length        # valid_length (an input after the states) is not the body's
    # with valid_length the body's rows have a symbol of their own (the active rows): lifted, they are the batch
    rows = body.inputs[0].type.shape[0] if a.has_valid_length else None
    batch = loop.inputs[0].type.shape[1] if a.has_valid_length else None
    # body value -> (outer value, lifted?) for the values that can be computed outside
    outer: dict = {}
    for v, o in zip(body.inputs[:nd], loop.inputs[:nd]):
        outer[v] = (o, True)
    for v, o in zip(body.inputs[nd + ns:], loop.inputs[first_cap:]):
        outer[v] = (o, False)
    moved, kept = [], []
    for n in body.nodes:
        if n.op == "constant":
            outer[n.outputs[0]] = (None, False)         # copied out when a moved node reads it
            kept.append(n)
            continue
        if not _movable(n) or not all(v in outer for v in n.inputs):
            kept.append(n)
            continue
        lifted = [outer[v][1] for v in n.inputs]
        if any(lifted) and not a.hoist_rows:
            kept.append(n)
            continue
        attrs = n.attrs
        if any(lifted):
            attrs = n.opdef.lift(n.attrs, [v.type.ndim for v in n.inputs], lifted)
            if attrs is None:
                kept.append(n)
                continue
        up = any(lifted)
        if up:
            lengths = {outer[v][0].type.shape[0] for v, is_up in zip(n.inputs, lifted) if is_up}
            if len(lengths) > 1:        # sequences not known to have one length (the runner checks them)
                kept.append(n)
                continue
            (length,) = lengths
        shapes = [tuple(v.type.shape) for v in n.outputs]
        if rows is not None and up:
            if not _row_wise(n, rows):
                kept.append(n)
                continue
            shapes = [tuple(batch if d == rows else d for d in sh) for sh in shapes]
        _move_out(n, attrs, [((length,) if up else ()) + sh for sh in shapes], up, outer, moved, names)
    if not any(m.op != "constant" for m in moved):
        return []
    # the body keeps the nodes not moved; the moved values it still reads become new inputs
    new_data, new_caps, used = _rewire(body, kept, outer, names)
    data_in = [(v, o) for v, o in zip(body.inputs[:nd], loop.inputs[:nd]) if v in used] + new_data
    # a sequence the body no longer reads still gives the number of steps, and the check that all have one
    # length: it stays unless a kept one has the same length dim (then they agree by construction)
    for v, o in zip(body.inputs[:nd], loop.inputs[:nd]):
        if v not in used and o.type.shape[0] not in {d.type.shape[0] for _, d in data_in}:
            data_in.append((v, o))
    caps_in = [(v, o) for v, o in zip(body.inputs[nd + ns:], loop.inputs[first_cap:]) if v in used] + new_caps
    states = list(zip(body.inputs[nd:nd + ns], loop.inputs[nd:nd + ns]))
    body.inputs = [v for v, _ in data_in + states + caps_in]
    loop.inputs = tuple(o for _, o in data_in + states) + loop.inputs[nd + ns:first_cap] + \
        tuple(o for _, o in caps_in)
    loop.attrs = dataclasses.replace(a, num_data=len(data_in))
    return moved


def _rewire(body: Graph, kept: list, outer: dict, names: set) -> tuple[list, list, set]:
    """The body keeps the nodes not moved; the moved values they (or the body's outputs) still read become
    new inputs: (new data [(body input, outer value)] for lifted values, new captures likewise, the body values
    still read)."""
    used = _used(kept, body.outputs)
    new_data, new_caps, replace = [], [], {}
    for bv, (o, up) in outer.items():
        if o is None or bv not in used or bv in body.inputs or _is_constant(bv):
            continue
        v = Value(bv.type, _fresh(names, bv.name + ("_t" if up else "_c")))
        replace[bv] = v
        (new_data if up else new_caps).append((v, o))
    body.nodes = [_renamed(n, replace) for n in kept]
    body.outputs = [replace.get(v, v) for v in body.outputs]
    return new_data, new_caps, used


def _move_out(n: Node, attrs, shapes: list, lifted: bool, outer: dict, moved: list, names: set) -> None:
    """The copy of body node `n` outside the loop (outputs of `shapes`, lifted or not), appended to `moved`;
    `outer` then maps its body outputs to the new values."""
    ins = [_outer_value(v, outer, moved, names) for v in n.inputs]
    outs = tuple(Value(TensorType(sh, v.type.dtype), _fresh(names, v.name + ("_all" if lifted else "_inv")))
                 for v, sh in zip(n.outputs, shapes))
    m = Node(n.op, tuple(ins), attrs, outs, name=n.name, source=n.source)
    for k, o in enumerate(outs):
        o.producer, o.index = m, k
        outer[n.outputs[k]] = (o, lifted)
    moved.append(m)


def _row_wise(n: Node, rows: str) -> bool:
    """With valid_length, a lifted node must compute each batch row from that row alone, keeping the rows as
    axis 0 (the runner gathers the active rows of its result per step): no op along axis 0, no expression of
    the active rows."""
    if any(not v.type.ndim or v.type.shape[0] != rows or
           any(isinstance(d, str) and d != rows and rows in parse_dim(d).symbols for d in v.type.shape)
           for v in n.outputs):
        return False
    if not hasattr(n.attrs, "axis"):           # elementwise ops, matmul (rows @ weights), cast
        return True
    axis, rank = n.attrs.axis, n.inputs[0].type.ndim
    axes = range(rank) if axis is None else axis if isinstance(axis, tuple) else (axis,)
    return all(x % rank != 0 for x in axes)


def _outer_value(v: Value, outer: dict, moved: list, names: set) -> Value:
    """The outer value standing for body value `v`; a body constant is copied out on first use."""
    o, up = outer[v]
    if o is None:
        c = v.producer
        o = Value(v.type, _fresh(names, v.name + "_out"))
        m = Node("constant", (), c.attrs, (o,), name=c.name + "_out", source=c.source)
        o.producer, o.index = m, 0
        moved.append(m)
        outer[v] = (o, up)
    return o


def _is_constant(v: Value) -> bool:
    return v.producer is not None and v.producer.op == "constant"


def _used(nodes: list, outputs: list) -> set:
    out = set(outputs)
    for n in nodes:
        out.update(n.inputs)
    return out


def _renamed(n: Node, replace: dict) -> Node:
    if any(v in replace for v in n.inputs):
        n.inputs = tuple(replace.get(v, v) for v in n.inputs)
    return n


# ------------------------------------------------------------------------------------ while_loop
def _hoist_while(loop: Node, names: set) -> list:
    """Move loop-invariant nodes (captures and constants only) of the body before the loop."""
    a = loop.attrs
    cond, body = loop.subgraphs
    nv = a.num_vars
    first_cap = nv + (1 if a.has_max_tensor else 0)
    outer: dict = {v: (o, False) for v, o in zip(body.inputs[nv:], loop.inputs[first_cap:])}
    moved, kept = [], []
    for n in body.nodes:
        if n.op == "constant":
            outer[n.outputs[0]] = (None, False)
            kept.append(n)
            continue
        if not _movable(n) or not all(v in outer for v in n.inputs):
            kept.append(n)
            continue
        _move_out(n, n.attrs, [tuple(v.type.shape) for v in n.outputs], False, outer, moved, names)
    if not any(m.op != "constant" for m in moved):
        return []
    _, new_caps, _ = _rewire(body, kept, outer, names)
    # captures are shared by the condition and the body: both get the new ones (the condition ignores them)
    body.inputs = body.inputs + [v for v, _ in new_caps]
    cond.inputs = cond.inputs + [Value(v.type, _fresh(names, v.name + "_unused")) for v, _ in new_caps]
    loop.inputs = loop.inputs + tuple(o for _, o in new_caps)
    return moved


def _condition_into_body(loop: Node, names: set) -> None:
    """Append the condition, computed on the new loop vars, to the body's outputs (see the module doc)."""
    a = loop.attrs
    if a.cond_in_body:
        return
    cond, body = loop.subgraphs
    if not all(n.op == "constant" or _movable(n) or _view(n) for n in cond.nodes):
        return
    nv = a.num_vars
    new_vars = body.outputs[len(body.outputs) - nv:]
    env = dict(zip(cond.inputs, list(new_vars) + list(body.inputs[nv:])))
    for n in cond.nodes:
        outs = tuple(Value(v.type, _fresh(names, v.name + "_next")) for v in n.outputs)
        m = Node(n.op, tuple(env[v] for v in n.inputs), n.attrs, outs, name=n.name + "_next", source=n.source,
                 checks=n.checks)
        for k, o in enumerate(outs):
            o.producer, o.index = m, k
            env[n.outputs[k]] = o
        body.nodes.append(m)
    body.outputs = list(body.outputs) + [env[cond.outputs[0]]]
    loop.attrs = dataclasses.replace(a, cond_in_body=True)
