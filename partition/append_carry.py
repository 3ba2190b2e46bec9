"""A while_loop var that only grows by appending becomes a step output and a counter.

The decoder's token list is the pattern: ``tokens = concat([tokens, nxt], axis=0)`` each iteration, the body
reading ``tokens`` only through ``shape_of(tokens)`` (its length) and the condition not at all or through its
shape too. Such a var changes shape every iteration, so its body is no compiled loop (`codegen.compiled_loops`
needs static states) and the loop runs step by step. Rewritten here (`append_only_carries`, on the partitioner's
private copy, before the other loop rewrites of `partition.loops`):

* the var becomes an ``int64[]`` counter, its length (``shape_of(init)[0]`` before the loop); ``shape_of`` of it
  in the body and the condition becomes ``[counter, *rest]`` (the other dims are static), its new value
  ``counter + k`` (k rows appended per iteration, a size fixed while the loop runs);
* the appended rows become one more per-step output of the loop (stacked ``[iterations, k, *rest]``);
* after the loop, the var's final value is ``concat([init, reshape(stacked, (iterations * k, *rest))])`` -
  the same rows in the same order, copied once instead of once per later iteration; its dim (a fresh unknown
  of the loop) is replaced by that expression wherever later nodes name it.

Only where the body reads the var through nothing but the one ``concat`` (axis 0, the var first) and
``shape_of``, the appended value's shape is fixed while the loop runs (its dims name only the loop inputs'
symbols), and the var's dim symbol appears in no other value of the loop. Values and errors are unchanged: the counter is the length the var had, and the rows are the same.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..ir.attrs import AxisAttrs, ConstantAttrs, NoAttrs, ShapeAttrs, SliceAttrs
from ..ir.dim_algebra import dim_binop, simplify_dim
from ..ir.dims import Call, Const, Neg, BinOp, Sym, parse_dim
from ..ir.graph import Graph, Node, Value
from ..ir.list_type import ListType
from ..ir.types import TensorType, fresh_dim, map_type_dims

__all__ = ["append_only_carries"]


def append_only_carries(g: Graph, loop: Node, fresh, top: bool) -> list:
    """Rewrite (in place) each append-only var of `loop` (a while_loop node of `g`); returns the nodes to put
    before the loop (each var's initial length). The nodes computing the final values are inserted into `g`
    right after the loop. `fresh(base)` gives an unused value name. `top`: `g` is the model's graph; in a body,
    a var whose dim reaches the body's outputs (the outer node's types) is left as it is."""
    before, after = [], []
    for j in range(loop.attrs.num_vars):
        plan = _plan(loop, j)
        if plan is not None and (top or not _reaches_outputs(g, plan[2])):
            _apply(g, loop, j, plan, fresh, before, after)
    if after:
        k = next(i for i, n in enumerate(g.nodes) if n is loop)
        g.nodes[k + 1:k + 1] = after
    return before


def _reaches_outputs(g: Graph, sym: str) -> bool:
    """Whether a type of `g`'s outputs names `sym` (the outer node's types would then name it too)."""
    return any(sym in _symbols(v.type) for v in g.outputs)


def _symbols(t) -> set:
    if not isinstance(t, TensorType):
        return {"?"}                # a list: never a loop-invariant size here
    return set().union(*(parse_dim(d).symbols for d in t.shape if isinstance(d, str)))


def _plan(loop: Node, j: int):
    """(concat node, appended value, dim symbol) when var `j` is append-only (see the module doc), else None."""
    a = loop.attrs
    cond, body = loop.subgraphs
    nv, no = a.num_vars, a.num_outputs
    var = body.inputs[j]
    t = var.type
    if not isinstance(t, TensorType) or t.ndim == 0 or not isinstance(t.shape[0], str) or \
            not all(isinstance(d, int) for d in t.shape[1:]):
        return None
    sym = t.shape[0]
    new = body.outputs[no + j]
    cat = new.producer
    if cat is None or cat.op != "concat" or len(cat.inputs) != 2 or cat.inputs[0] is not var or \
            cat.attrs.axis not in (0, -t.ndim):
        return None
    y = cat.inputs[1]
    outer = set().union(*(_symbols(v.type) for v in loop.inputs)) - {sym}     # fixed while the loop runs
    if not isinstance(y.type, TensorType) or not _symbols(y.type) <= outer or y.type.dtype != t.dtype or \
            y.type.ndim != t.ndim or y.type.shape[1:] != t.shape[1:] or y is var:
        return None
    for g, v in ((body, var), (cond, cond.inputs[j])):
        for n in g.nodes:
            if v in n.inputs and not (n.op == "shape_of" or n is cat):
                return None
        if v in g.outputs:
            return None
    if any(new in n.inputs for n in body.nodes) or list(body.outputs).count(new) != 1:
        return None
    if any(n.subgraphs and _mentions(n, sym) for n in body.nodes + cond.nodes):
        return None
    # the dim is the loop's own: named by this var's values only
    own = {id(var), id(cond.inputs[j]), id(loop.outputs[no + j]), id(new)}
    for v in list(loop.outputs) + list(body.inputs) + list(cond.inputs) + [o for n in body.nodes + cond.nodes
                                                                             for o in n.outputs]:
        if id(v) not in own and isinstance(v.type, TensorType) and any(
                isinstance(d, str) and sym in parse_dim(d).symbols for d in v.type.shape):
            return None
    if isinstance(loop.inputs[j].type, TensorType) and any(
            isinstance(d, str) and sym in parse_dim(d).symbols for d in loop.inputs[j].type.shape):
        return None
    return cat, y, sym


def _mentions(n: Node, sym: str) -> bool:
    for s in n.subgraphs:
        for v in list(s.inputs) + [o for m in s.nodes for o in m.outputs]:
            if isinstance(v.type, TensorType) and any(isinstance(d, str) and sym in parse_dim(d).symbols
                                                      for d in v.type.shape):
                return True
    return False


def _node(op, inputs, attrs, out_types, name, fresh, outputs=None) -> Node:
    outs = outputs or tuple(Value(t, fresh(name)) for t in out_types)
    n = Node(op, tuple(inputs), attrs, tuple(outs), name=fresh(name))
    for k, o in enumerate(outs):
        o.producer, o.index = n, k
    return n


def _const(value, fresh) -> Node:
    data = np.asarray(value)
    data.flags.writeable = False
    return _node("constant", (), ConstantAttrs(data), (TensorType(data.shape, data.dtype.name),), "append_k", fresh)


def _shape_from_counter(count: Value, rest: tuple, out: Value, fresh) -> list:
    """Nodes computing ``[count, *rest]`` (int64) into `out` (the Value a shape_of made)."""
    if not rest:
        return [_node("reshape", (count,), ShapeAttrs((1,)), None, "append_len", fresh, outputs=(out,))]
    one = _node("reshape", (count,), ShapeAttrs((1,)), (TensorType((1,), "int64"),), "append_len", fresh)
    tail = _const(np.array(rest, np.int64), fresh)
    cat = _node("concat", (one.outputs[0], tail.outputs[0]), AxisAttrs(0), None, "append_shape", fresh, outputs=(out,))
    return [one, tail, cat]


def _counter_in(g: Graph, old: Value, rest: tuple, fresh, skip=None) -> Value:
    """Replace input `old` of `g` by an int64[] counter; its shape_of nodes read the counter."""
    count = Value(TensorType((), "int64"), fresh(old.name + "_len"))
    g.inputs = [count if v is old else v for v in g.inputs]
    nodes = []
    for n in g.nodes:
        if n is skip:
            continue
        if n.op == "shape_of" and n.inputs[0] is old:
            nodes += _shape_from_counter(count, rest, n.outputs[0], fresh)
        else:
            nodes.append(n)
    g.nodes = nodes
    return count


def _apply(g: Graph, loop: Node, j: int, plan, fresh, before: list, after: list) -> None:
    cat, y, sym = plan
    a = loop.attrs
    cond, body = loop.subgraphs
    no = a.num_outputs
    rest = tuple(body.inputs[j].type.shape[1:])
    k = y.type.shape[0]
    init = loop.inputs[j]
    # before the loop: the initial length
    shape = _node("shape_of", (init,), NoAttrs(), (TensorType((init.type.ndim,), "int64"),), "append_shape0", fresh)
    first = _node("slice", shape.outputs, SliceAttrs((0,), (0,), (1,), (1,)), (TensorType((1,), "int64"),),
                  "append_len0", fresh)
    length = _node("reshape", first.outputs, ShapeAttrs(()), (TensorType((), "int64"),), "append_len0", fresh)
    before += [shape, first, length]
    # the body: a counter in, counter + k out, the appended rows a new step output
    count = _counter_in(body, body.inputs[j], rest, fresh, skip=cat)
    if isinstance(k, int):
        grow = [_const(np.int64(k), fresh)]
    else:                               # rows appended per step: a size fixed while the loop runs
        rows_of = _node("shape_of", (y,), NoAttrs(), (TensorType((y.type.ndim,), "int64"),), "append_k", fresh)
        head = _node("slice", rows_of.outputs, SliceAttrs((0,), (0,), (1,), (1,)), (TensorType((1,), "int64"),),
                     "append_k", fresh)
        grow = [rows_of, head, _node("reshape", head.outputs, ShapeAttrs(()), (TensorType((), "int64"),),
                                     "append_k", fresh)]
    bump = _node("add", (count, grow[-1].outputs[0]), NoAttrs(), (TensorType((), "int64"),), "append_next", fresh)
    body.nodes += grow + [bump]
    outs = list(body.outputs)
    outs[no + j] = bump.outputs[0]
    body.outputs = outs[:no] + [y] + outs[no:]
    _counter_in(cond, cond.inputs[j], rest, fresh)
    # the loop: the counter as var j, one more stacked output
    ins = list(loop.inputs)
    ins[j] = length.outputs[0]
    loop.inputs = tuple(ins)
    final = loop.outputs[no + j]
    iters = loop.outputs[0].type.shape[0] if no and isinstance(loop.outputs[0].type, TensorType) else \
        fresh_dim(origin="iterations of a while_loop")
    stacked = Value(TensorType((iters,) + tuple(y.type.shape), y.type.dtype), fresh(final.name + "_rows"))
    end_count = Value(TensorType((), "int64"), fresh(final.name + "_len"))
    louts = list(loop.outputs)
    louts[no + j] = end_count
    louts = louts[:no] + [stacked] + louts[no:]
    for i, v in enumerate(louts):
        v.producer, v.index = loop, i
    loop.outputs = tuple(louts)
    loop.attrs = dataclasses.replace(a, num_outputs=no + 1)
    # after the loop: the rows appended, in order, after the initial ones
    rows = dim_binop("*", iters, k)
    flat_t = TensorType((rows,) + rest, y.type.dtype)
    flat = _node("reshape", (stacked,), ShapeAttrs((rows,) + rest), (flat_t,), "append_rows", fresh)
    total = dim_binop("+", init.type.shape[0], rows)
    final.type = TensorType((total,) + rest, final.type.dtype)
    joined = _node("concat", (init, flat.outputs[0]), AxisAttrs(0), None, "append_all", fresh, outputs=(final,))
    after += [flat, joined]
    _substitute(g, sym, total, start=loop)


def _substitute(g: Graph, sym: str, dim, start: Node) -> None:
    """Replace symbol `sym` by `dim` in the types, dim attrs and checks of the nodes of `g` after `start` (their
    bodies included) and in `g`'s outputs' types."""
    repl = parse_dim(dim) if isinstance(dim, str) else Const(dim)

    def fn(d):
        e = parse_dim(d)
        if sym not in e.symbols:
            return d
        return simplify_dim(e.fold(Const, lambda s: repl if s == sym else Sym(s), BinOp,
                                   lambda f, args: Call(f, tuple(args)), Neg))

    def retype(v):
        if isinstance(v.type, TensorType):
            v.type = map_type_dims(v.type, fn)
        elif isinstance(v.type, ListType):
            v.type = ListType(map_type_dims(v.type.elem, fn),
                              fn(v.type.length) if isinstance(v.type.length, str) else v.type.length)

    def walk(nodes):
        for n in nodes:
            if n.opdef.dim_attrs:
                n.attrs = n.opdef.map_dim_attrs(n.attrs, fn)
            for v in n.outputs:
                retype(v)
            if n.checks:
                n.checks = tuple(c.renamed(fn) for c in n.checks)
            for s in n.subgraphs:
                for v in s.inputs:
                    retype(v)
                walk(s.nodes)
    k = next(i for i, n in enumerate(g.nodes) if n is start)
    walk(g.nodes[k + 1:])
    for v in g.outputs:
        retype(v)
