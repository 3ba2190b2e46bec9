"""`lint(graph)`: the single verifier. Topological order, ownership, unique names, types, closed subgraphs."""
from __future__ import annotations

import numpy as np

from dyntvm.errors import GraphError

from .dim_checks import recording_checks
from .list_type import ListType, value_dims
from .ops import CONTROL_FLOW, REGION, attr_symbols, get_op
from .shapes import ShapeError
from .types import TensorType, dim_symbols, is_symbol, is_unknown


def _same_kind(got, want) -> bool:
    """Same dtype and rank (lists: of their elements, and both lists)."""
    if isinstance(got, ListType) or isinstance(want, ListType):
        return isinstance(got, ListType) and isinstance(want, ListType) and _same_kind(got.elem, want.elem)
    return got.dtype == want.dtype and got.ndim == want.ndim


def _compatible(got: TensorType, want: TensorType) -> bool:
    if isinstance(got, ListType) or isinstance(want, ListType):
        return _same_kind(got, want)
    if got.dtype != want.dtype or got.ndim != want.ndim:
        return False
    # Unknown dims are fresh names each inference: dims that involve one agree with anything; the rest
    # (ints, symbols, expressions over symbols) must be equal.
    return all(a == b or _involves_unknown(a) or _involves_unknown(b) for a, b in zip(got.shape, want.shape))


def _involves_unknown(d) -> bool:
    return isinstance(d, str) and any(is_unknown(s) for s in dim_symbols(d))


def lint(graph, _path: str = "") -> None:
    where = _path or graph.name
    defined = set()
    names = set()
    symbols = set()          # plain-symbol dims of values defined so far: their sizes are known at run time
    atoms = set()            # expression dims of values defined so far: known as a whole (eval_dim)

    def define(v, what):
        dims = value_dims(v.type)
        symbols.update(d for d in dims if is_symbol(d))
        atoms.update(d for d in dims if isinstance(d, str) and not is_symbol(d))
        if v in defined:
            raise GraphError(f"lint({where}): {what} {v!r} is defined twice")
        if v.name:
            if v.name in names:
                raise GraphError(f"lint({where}): value name {v.name!r} is used twice")
            names.add(v.name)
        defined.add(v)

    for v in graph.inputs:
        define(v, "input")
    for i, n in enumerate(graph.nodes):
        label = f"node {i} ({n.op} {n.name})"
        try:
            opdef = get_op(n.op)
        except KeyError:
            raise GraphError(f"lint({where}): {label} has unregistered op {n.op!r}") from None
        if not isinstance(n.attrs, opdef.attrs):
            raise GraphError(f"lint({where}): {label} attrs are {type(n.attrs).__name__}, "
                             f"expected {opdef.attrs.__name__}")
        if opdef.num_inputs is not None and len(n.inputs) != opdef.num_inputs:
            raise GraphError(f"lint({where}): {label} has {len(n.inputs)} inputs, expected {opdef.num_inputs}")
        for v in n.inputs:
            if v not in defined:
                raise GraphError(f"lint({where}): {label} uses {v!r} before it is defined (or from outside "
                                 "this graph: subgraphs must capture outer values explicitly)")
        missing = attr_symbols(n.op, n.attrs, atoms) - symbols
        if missing:
            raise GraphError(f"lint({where}): {label} attrs use symbol(s) {sorted(missing)} that no input or "
                             "earlier value of this graph has as a dim (a subgraph must capture a value with them)")
        for j, v in enumerate(n.outputs):
            if v.producer is not n or v.index != j:
                raise GraphError(f"lint({where}): {label} output {j} does not point back to its node")
            define(v, "output")
        if opdef.kind in (CONTROL_FLOW, REGION):
            _lint_subgraphs(n, label, where)
        else:
            if n.subgraphs:
                raise GraphError(f"lint({where}): {label} is not control flow but has subgraphs")
            try:
                with recording_checks(n.checks):    # dims the tracer unified (checked at run time) stay unified
                    want = opdef.infer_type([v.type for v in n.inputs], n.attrs)
            except ShapeError as e:
                raise GraphError(f"lint({where}): {label} fails its type rule: {e}") from e
            if len(want) != len(n.outputs) or not all(_compatible(v.type, t) for v, t in zip(n.outputs, want)):
                raise GraphError(f"lint({where}): {label} output types {[str(v.type) for v in n.outputs]} do "
                                 f"not match its type rule {[str(t) for t in want]}")
    for v in graph.outputs:
        if v not in defined:
            raise GraphError(f"lint({where}): graph output {v!r} is not defined in this graph")


def _lint_subgraphs(n, label, where):
    a = n.attrs
    subs = n.subgraphs
    ins = [v.type for v in n.inputs]
    outs = [v.type for v in n.outputs]
    expect = {"cond": 2, "foreach": 1, "while_loop": 2}
    if n.op == "case":
        expect["case"] = 2 * a.num_cases + 1
    if n.op in expect and len(subs) != expect[n.op]:
        raise GraphError(f"lint({where}): {label} has {len(subs)} subgraphs, expected {expect[n.op]}")

    def check_io(g, in_types, out_types, what):
        got_in = [v.type for v in g.inputs]
        if len(got_in) != len(in_types) or not all(_compatible(x, y) for x, y in zip(got_in, in_types)):
            raise GraphError(f"lint({where}): {label} {what} inputs {[str(t) for t in got_in]} do not match "
                             f"{[str(t) for t in in_types]}")
        if out_types is not None:
            got = [v.type for v in g.outputs]
            if len(got) != len(out_types) or not all(_same_kind(x, y) for x, y in zip(got, out_types)):
                raise GraphError(f"lint({where}): {label} {what} outputs {[str(t) for t in got]} do not match "
                                 f"{[str(t) for t in out_types]}")
    for g in subs:
        lint(g, f"{where}/{n.name or n.op}/{g.name}")
    if n.op == "cond":
        if ins[0].ndim != 0 or ins[0].dtype != "bool":
            raise GraphError(f"lint({where}): {label} predicate must be 0-d bool, got {ins[0]}")
        for g in subs:
            check_io(g, ins[1:], outs, g.name)
    elif n.op == "case":
        for i, g in enumerate(subs):
            is_pred = i < 2 * a.num_cases and i % 2 == 0
            check_io(g, ins, [TensorType((), "bool")] if is_pred else outs, g.name)
    elif n.op == "foreach":
        nd, ns = a.num_data, a.num_states
        d = ins[:nd]
        body_in = [TensorType(t.shape[1:], t.dtype) for t in d] + ins[nd:]
        body_out = [TensorType(t.shape[1:], t.dtype) for t in outs[:a.num_outputs]] + outs[a.num_outputs:]
        if a.has_valid_length:
            body_in = _lint_valid_length(n, label, where, subs[0], ins, body_in)
        check_io(subs[0], body_in, body_out, "body")
    elif n.op == "while_loop":
        nv = a.num_vars
        carried = ins[:nv] + ins[nv + (1 if a.has_max_tensor else 0):]
        check_io(subs[0], carried, [TensorType((), "bool")], "cond")
        body_out = [TensorType(t.shape[1:], t.dtype) for t in outs[:a.num_outputs]] + outs[a.num_outputs:]
        check_io(subs[1], carried, body_out + [TensorType((), "bool")] * a.cond_in_body, "body")


def _lint_valid_length(n, label, where, body, ins, body_in) -> list:
    """foreach with valid_length: input nd + ns is a 1-d integer tensor, not passed to the body; the body runs on
    the active rows, so axis 0 of its data slices and states is one symbol of its own (the active batch)."""
    nd, ns = n.attrs.num_data, n.attrs.num_states
    vl = ins[nd + ns] if len(ins) > nd + ns else None
    if vl is None or vl.ndim != 1 or np.dtype(vl.dtype).kind not in "iu":
        raise GraphError(f"lint({where}): {label} valid_length must be a 1-d integer tensor, got {vl}")
    body_in = body_in[:nd + ns] + body_in[nd + ns + 1:]
    rows = body.inputs[0].type.shape[0] if body.inputs and body.inputs[0].type.ndim else None
    if not is_symbol(rows):
        raise GraphError(f"lint({where}): {label} with valid_length: axis 0 of the body's inputs must be a symbol "
                         f"(the active rows), got {body.inputs[0].type if body.inputs else 'no inputs'}")
    return [TensorType((rows,) + t.shape[1:], t.dtype) if i < nd + ns and t.ndim else t for i, t in enumerate(body_in)]
