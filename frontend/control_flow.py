"""Control-flow ops: `cond`, `case`, `foreach`, `while_loop`.

Eagerly (no trace active) they run Python control flow on numpy arrays: that is the reference
semantics. While tracing, each Python callable is traced into a closed subgraph (captures explicit)
and one control-flow node is recorded.
"""
from __future__ import annotations

import numpy as np

from ..ir import attrs as A
from ..ir.graph import Graph, Node, Value
from ..ir.shapes import ShapeError, unify_dims
from ..ir.tree import tree_flatten, tree_str, tree_unflatten
from ..ir.types import TensorType, dim_symbols, fresh_dim, join_types
from .tracer import Builder, Tensor, as_array, current, finish_outputs, trace_error, tracing, user_source

_is_leaf = lambda x: isinstance(x, (Tensor, np.ndarray, np.generic))


# ------------------------------------------------------------------------------------- helpers
class SubTrace:
    """A traced callable: its builder, own inputs, output values and output tree spec."""

    def __init__(self, builder, inputs, outputs, spec):
        self.builder, self.inputs, self.outputs, self.spec = builder, inputs, outputs, spec

    def graph(self, captures: list, name: str) -> Graph:
        """The closed subgraph; inputs = own inputs + one per capture in `captures` order."""
        b = self.builder
        extra = [b.capture_inputs.get(c) or Value(c.type, "") for c in captures]
        return Graph(list(self.inputs) + extra, list(b.nodes), list(self.outputs), name)


def trace_sub(fn, in_types: list, in_spec, api: str, call=None) -> SubTrace:
    parent = current()
    with Builder(parent) as b:
        args = [Tensor(b.new_input(t), b) for t in in_types]
        out = (call or (lambda f, a: f(*a)))(fn, tree_unflatten(in_spec, args) if in_spec is not None else args)
        values, spec = finish_outputs(b, out, api)
    return SubTrace(b, list(b.inputs), values, spec)


def union_captures(subs) -> list:
    seen, out = set(), []
    for s in subs:
        for c in s.builder.captures:
            if c not in seen:
                seen.add(c)
                out.append(c)
    return out


def _leaf_type(x) -> TensorType:
    if isinstance(x, Tensor):
        return x.type
    a = as_array(x)          # the dtype the leaf gets as a constant (Python float -> float32)
    return TensorType(a.shape, a.dtype.name)


def _eager_outputs(out):
    """Eager results with Python scalars as the arrays a traced run gives (1.5 -> float32)."""
    leaves, spec = tree_flatten(out, is_leaf=_is_leaf)
    return tree_unflatten(spec, [as_array(x) if isinstance(x, (bool, int, float)) else x for x in leaves])


def _pred_check(api: str, p, what="pred"):
    t = _leaf_type(p)
    if t.ndim != 0 or t.dtype != "bool":
        raise trace_error(f"{api}: {what} must be a 0-d bool tensor, got {t}; use e.g. F.greater(F.sum(x), 0)")


def _flat_values(b: Builder, leaves) -> list:
    return [b.lift(x.value) if isinstance(x, Tensor) else b.constant(as_array(x)) for x in leaves]


def _check_same(api, what, spec_a, types_a, spec_b, types_b, names=("first", "second"), allow_shape=True):
    if spec_a != spec_b:
        raise trace_error(f"{api}: {what} must have the same structure; {names[0]} is {tree_str(spec_a)} and "
                          f"{names[1]} is {tree_str(spec_b)}")
    for i, (x, y) in enumerate(zip(types_a, types_b)):
        if x.dtype != y.dtype or x.ndim != y.ndim:
            raise trace_error(f"{api}: {what} must have the same dtype and rank; output {i} is {x} in the "
                              f"{names[0]} and {y} in the {names[1]}")


def _emit(op, attrs, inputs, out_types, subgraphs) -> list:
    b = current()
    node = Node(op, tuple(b.lift(v) for v in inputs), attrs, tuple(Value(t) for t in out_types),
                tuple(subgraphs), source=user_source())
    return [Tensor(v, b) for v in b.add_node(node)]


# ----------------------------------------------------------------------------------------- cond
def cond(pred, then_fn, else_fn):
    """Run `then_fn()` if `pred` else `else_fn()`.

    Python equivalent::

        return then_fn() if pred else else_fn()

    `pred` is a 0-d bool tensor; branches take no arguments and capture what they use by closure.
    Both must return the same structure, dtypes and ranks; a dim that differs between branches becomes
    an unknown dim of the result.
    """
    if not tracing():
        _pred_check("cond", pred)
        return _eager_outputs(then_fn() if bool(np.asarray(pred)) else else_fn())
    _pred_check("cond", pred)
    subs = [trace_sub(f, [], None, "cond", call=lambda f, a: f()) for f in (then_fn, else_fn)]
    out_types = _join_branches("cond", subs, ("then branch", "else branch"))
    caps = union_captures(subs)
    b = current()
    pv = b.lift(pred.value) if isinstance(pred, Tensor) else b.constant(as_array(pred))
    outs = _emit("cond", A.CondAttrs(len(out_types)), [pv] + caps, out_types,
                 [subs[0].graph(caps, "then"), subs[1].graph(caps, "else")])
    return tree_unflatten(subs[0].spec, outs)


def _join_branches(api, subs, names) -> list:
    first = subs[0]
    types = [v.type for v in first.outputs]
    for s, nm in zip(subs[1:], names[1:]):
        other = [v.type for v in s.outputs]
        _check_same(api, "branches", first.spec, types, s.spec, other, (names[0], nm))
        types = [join_types(a, b) if a != b else a for a, b in zip(types, other)]
    return types


def case(cases, default):
    """First true predicate wins.

    Python equivalent::

        for pred, fn in cases:
            if (pred() if callable(pred) else pred):
                return fn()
        return default()

    Each `pred` is a 0-d bool tensor or a no-argument function returning one (evaluated lazily, in
    order). Output rules as for `cond`.
    """
    cases = list(cases)
    if not tracing():
        for i, (p, fn) in enumerate(cases):
            p = p() if callable(p) else p
            _pred_check("case", p, f"predicate {i}")
            if bool(np.asarray(p)):
                return _eager_outputs(fn())
        return _eager_outputs(default())
    subs, preds = [], []
    for i, (p, fn) in enumerate(cases):
        ps = trace_sub(p if callable(p) else (lambda p=p: p), [], None, "case", call=lambda f, a: f())
        if ps.spec != "*" or ps.outputs[0].type.ndim != 0 or ps.outputs[0].type.dtype != "bool":
            got = ps.outputs[0].type if ps.spec == "*" else tree_str(ps.spec)
            raise trace_error(f"case: predicate {i} must be a 0-d bool tensor, got {got}")
        preds.append(ps)
        subs.append(trace_sub(fn, [], None, "case", call=lambda f, a: f()))
    subs.append(trace_sub(default, [], None, "case", call=lambda f, a: f()))
    names = tuple(f"branch {i}" for i in range(len(cases))) + ("default",)
    out_types = _join_branches("case", subs, names)
    caps = union_captures(preds + subs)
    graphs = []
    for i, (ps, fs) in enumerate(zip(preds, subs)):
        graphs += [ps.graph(caps, f"pred{i}"), fs.graph(caps, f"branch{i}")]
    graphs.append(subs[-1].graph(caps, "default"))
    outs = _emit("case", A.CaseAttrs(len(cases), len(out_types)), caps, out_types, graphs)
    return tree_unflatten(subs[0].spec, outs)


# ----------------------------------------------------------------------------------- loops
def _state_types_fixpoint(api, body_trace, in_types, rule, slot):
    """Trace the body until loop-carried types are stable: dims that change become unknown dims.

    Returns the final trace, the carried types and the set of unknown dims made here (they vary
    between iterations)."""
    types, made = list(in_types), set()
    for _ in range(4):
        sub, new_types = body_trace(types)
        for i, (a, b) in enumerate(zip(types, new_types)):
            if a.dtype != b.dtype or a.ndim != b.ndim:
                raise trace_error(f"{api}: {rule}; {slot}[{i}] is {a} in and {b} out")
        joined = [join_types(a, b, made) for a, b in zip(types, new_types)]
        if joined == types:
            return sub, types, made
        made |= {d for t in joined for d in t.shape} - {d for t in types for d in t.shape}
        types = joined
    raise trace_error(f"{api}: {slot} types did not settle after 4 traces")  # pragma: no cover


def _stacked_type(lead, t: TensorType, varying: set) -> TensorType:
    """Type of per-step outputs of type `t` stacked on a new axis of size `lead`; a dim that refers to
    a loop-carried dim which varies between iterations is unknown outside the loop."""
    dims = tuple(fresh_dim() if isinstance(d, str) and dim_symbols(d) & varying else d for d in t.shape)
    return TensorType((lead,) + dims, t.dtype)


def foreach(body, data, init_states):
    """Loop over axis 0 of `data`, threading states.

    Python equivalent::

        outputs, states = [], init_states
        for i in range(len(data)):
            out, states = body(data[i], states)      # data[i]: [d[i] for d in data] for a list
            outputs.append(out)
        return stack(outputs), states

    `data` is a tensor or a list of tensors of equal length; `init_states` a (possibly empty) list
    of tensors. Per-step outputs are stacked on a new axis 0; zero-length data gives zero-length
    outputs and the initial states. States keep their dtype and rank.
    """
    data_list = isinstance(data, (list, tuple))
    data_leaves = list(data) if data_list else [data]
    st_leaves, st_spec = tree_flatten(init_states, is_leaf=_is_leaf)
    if not data_leaves:
        raise trace_error("foreach: data must be a tensor or a non-empty list of tensors")
    d_types = [_leaf_type(d) for d in data_leaves]
    for i, t in enumerate(d_types):
        if t.ndim == 0:
            raise trace_error(f"foreach: data[{i}] is 0-d ({t}); foreach iterates axis 0 of each data tensor")
    lengths = [t.shape[0] for t in d_types]
    length = lengths[0]
    try:                     # unknown dims may agree at run time; the interpreter checks
        for n in lengths[1:]:
            length = unify_dims(length, n, "foreach")
    except ShapeError:
        raise trace_error(f"foreach: data tensors must have the same length (axis 0); got lengths "
                          f"{', '.join(map(str, lengths))}") from None
    slice_types = [TensorType(t.shape[1:], t.dtype) for t in d_types]

    def call(f, args):
        xs, states = args[:len(data_leaves)], args[len(data_leaves):]
        res = f(list(xs) if data_list else xs[0], tree_unflatten(st_spec, list(states)))
        if not (isinstance(res, (tuple, list)) and len(res) == 2):
            raise trace_error("foreach: body must return a pair (outputs, new_states)")
        return tuple(res)

    if not tracing():
        return _foreach_eager(body, data_leaves, st_leaves, st_spec, call, slice_types)

    def body_trace(state_types):
        sub = trace_sub(body, slice_types + state_types, None, "foreach", call=call)
        _check_pair_spec("foreach", sub, st_spec, "new_states", "init_states")
        n_out = len(sub.outputs) - len(state_types)
        return sub, [v.type for v in sub.outputs[n_out:]]

    sub, st_types, varying = _state_types_fixpoint("foreach", body_trace, [_leaf_type(s) for s in st_leaves],
                                                   "body must return states of the same dtype and rank", "states")
    n_out = len(sub.outputs) - len(st_types)
    caps = union_captures([sub])
    b = current()
    ins = _flat_values(b, data_leaves) + _flat_values(b, st_leaves) + caps
    out_types = [_stacked_type(length, v.type, varying) for v in sub.outputs[:n_out]] + st_types
    outs = _emit("foreach", A.ForeachAttrs(len(data_leaves), len(st_leaves), n_out), ins, out_types,
                 [sub.graph(caps, "body")])
    return _split_result(sub.spec, outs, n_out)


def _check_pair_spec(api, sub, st_spec, new_name, init_name):
    spec = sub.spec
    if spec[1][1] != st_spec:
        raise trace_error(f"{api}: {new_name} must have the structure of {init_name}; got "
                          f"{tree_str(spec[1][1])}, expected {tree_str(st_spec)}")


def _split_result(spec, outs, n_out):
    outputs = tree_unflatten(spec[1][0], outs[:n_out])
    states = tree_unflatten(spec[1][1], outs[n_out:])
    return outputs, states


def _foreach_eager(body, data_leaves, st_leaves, st_spec, call, slice_types):
    arrays = [as_array(d) for d in data_leaves]
    length = arrays[0].shape[0]
    if any(a.shape[0] != length for a in arrays):
        raise trace_error(f"foreach: data tensors must have the same length (axis 0); got lengths "
                          f"{', '.join(str(a.shape[0]) for a in arrays)}")
    states = [as_array(s) for s in st_leaves]
    steps, out_spec = [], None
    for t in range(length):
        outs, new_states = call(body, [a[t] for a in arrays] + states)
        out_leaves, out_spec = tree_flatten(outs, is_leaf=_is_leaf)
        ns_leaves, ns_spec = tree_flatten(new_states, is_leaf=_is_leaf)
        _check_eager_states("foreach", st_spec, ns_spec, states, ns_leaves, "new_states", "states")
        steps.append([as_array(o) for o in out_leaves])
        states = [as_array(s) for s in ns_leaves]
    if length == 0:
        out_spec, stacked = _abstract_outputs(body, slice_types + [_leaf_type(s) for s in states], call,
                                              len(states))
    else:
        stacked = _stack_steps("foreach", steps)
    return tree_unflatten(out_spec, stacked), tree_unflatten(st_spec, states)


def _check_eager_states(api, spec, new_spec, old, new, new_name, old_name):
    if spec != new_spec:
        raise trace_error(f"{api}: {new_name} must have the structure of the initial {old_name}; got "
                          f"{tree_str(new_spec)}, expected {tree_str(spec)}")
    for i, (a, b) in enumerate(zip(old, new)):
        ta, tb = _leaf_type(a), _leaf_type(b)
        if ta.dtype != tb.dtype or ta.ndim != tb.ndim:
            raise trace_error(f"{api}: body must return {old_name} of the same dtype and rank; {old_name}[{i}] is "
                              f"{ta} in and {tb} out")


def _stack_steps(api, steps):
    out = []
    for k in range(len(steps[0])):
        shapes = {s[k].shape for s in steps}
        if len(shapes) > 1:
            raise trace_error(f"{api}: step output {k} changed shape between iterations ({sorted(shapes)}); "
                              "per-step outputs are stacked and must keep one shape")
        out.append(np.stack([s[k] for s in steps]))
    return out


def _abstract_outputs(body, in_types, call, n_states):
    """Output spec and empty stacked outputs of a loop that ran zero times (traced, not executed).

    Dims of size 0 are traced as a symbol, as in a traced graph (so `x[0]` of a 0-length state traces);
    the output shapes are then evaluated like the interpreter does for a zero-iteration loop."""
    from ..runtime.interpreter import zero_length_stack
    from .tracer import trace as _trace_fn
    holder, zero = {}, "zero_len"

    def fn(*args):
        res = call(body, list(args))
        holder["spec"] = tree_flatten(res[0], is_leaf=_is_leaf)[1]
        return res[0]
    g = _trace_fn(fn, *[TensorType(tuple(zero if d == 0 else d for d in t.shape), t.dtype) for t in in_types])
    return holder["spec"], [zero_length_stack(v.type, {zero: 0}) for v in g.outputs]


def while_loop(cond_fn, body_fn, loop_vars, max_iterations=None):
    """Loop while `cond_fn(*loop_vars)` holds.

    Python equivalent::

        outputs, vars, i = [], list(loop_vars), 0
        while (max_iterations is None or i < max_iterations) and cond_fn(*vars):
            out, vars = body_fn(*vars)
            outputs.append(out); i += 1
        return stack(outputs), vars       # stacked to the number of iterations run (no padding)

    Loop vars keep dtype and rank but may change shape between iterations (a growing sequence).
    `max_iterations` is an int or a 0-d integer tensor.
    """
    if not isinstance(loop_vars, (list, tuple)) or not loop_vars:
        raise trace_error("while_loop: loop_vars must be a non-empty list of tensors")
    lv_leaves, lv_spec = tree_flatten(list(loop_vars), is_leaf=_is_leaf)

    def call_body(f, args):
        res = f(*tree_unflatten(lv_spec, list(args[:len(lv_leaves)])))
        if not (isinstance(res, (tuple, list)) and len(res) == 2):
            raise trace_error("while_loop: body_fn must return a pair (step_outputs, new_loop_vars)")
        out, new = res
        if isinstance(new, tuple):
            new = list(new)
        if not isinstance(new, list):
            new = [new]
        return (out, new)

    def call_cond(f, args):
        return f(*tree_unflatten(lv_spec, list(args[:len(lv_leaves)])))

    if not tracing():
        return _while_eager(cond_fn, body_fn, lv_leaves, lv_spec, call_body, call_cond, max_iterations)

    def body_trace(types):
        sub = trace_sub(body_fn, types, None, "while_loop", call=call_body)
        _check_pair_spec("while_loop", sub, lv_spec, "body_fn's new loop vars", "loop_vars")
        n_out = len(sub.outputs) - len(types)
        return sub, [v.type for v in sub.outputs[n_out:]]

    sub, types, varying = _state_types_fixpoint("while_loop", body_trace, [_leaf_type(v) for v in lv_leaves],
                                                "body_fn must return loop vars of the same dtype and rank",
                                                "loop_vars")
    csub = trace_sub(cond_fn, types, None, "while_loop", call=call_cond)
    if csub.spec != "*" or csub.outputs[0].type.ndim != 0 or csub.outputs[0].type.dtype != "bool":
        got = csub.outputs[0].type if csub.spec == "*" else tree_str(csub.spec)
        raise trace_error(f"while_loop: cond_fn must return a 0-d bool tensor, got {got}")
    n_out = len(sub.outputs) - len(types)
    caps = union_captures([csub, sub])
    b = current()
    ins = _flat_values(b, lv_leaves)
    static_max, has_t = None, False
    if isinstance(max_iterations, Tensor):
        t = max_iterations.type
        if t.ndim != 0 or np.dtype(t.dtype).kind not in "iu":
            raise trace_error(f"while_loop: max_iterations must be an int or a 0-d integer tensor, got {t}")
        ins.append(b.lift(max_iterations.value))
        has_t = True
    elif max_iterations is not None:
        static_max = _static_int("while_loop", max_iterations)
    n_iter = fresh_dim()
    out_types = [_stacked_type(n_iter, v.type, varying) for v in sub.outputs[:n_out]] + types
    outs = _emit("while_loop", A.WhileAttrs(len(lv_leaves), n_out, static_max, has_t), ins + caps, out_types,
                 [csub.graph(caps, "cond"), sub.graph(caps, "body")])
    outputs = tree_unflatten(sub.spec[1][0], outs[:n_out])
    return outputs, tree_unflatten(lv_spec, outs[n_out:])


def _static_int(api, v) -> int:
    a = np.asarray(v)
    if a.ndim != 0 or a.dtype.kind not in "iu":
        raise trace_error(f"{api}: max_iterations must be an int or a 0-d integer tensor, got {v!r}")
    return int(a)


def _while_eager(cond_fn, body_fn, lv_leaves, lv_spec, call_body, call_cond, max_iterations):
    limit = None if max_iterations is None else _static_int("while_loop", max_iterations)
    vars_ = [as_array(v) for v in lv_leaves]
    steps, out_spec, it = [], None, 0
    while limit is None or it < limit:
        c = call_cond(cond_fn, vars_)
        _pred_check("while_loop", c, "cond_fn's result")
        if not bool(np.asarray(c)):
            break
        out, new = call_body(body_fn, vars_)
        out_leaves, out_spec = tree_flatten(out, is_leaf=_is_leaf)
        new_leaves, new_spec = tree_flatten(new, is_leaf=_is_leaf)
        if new_spec != lv_spec:
            raise trace_error(f"while_loop: body_fn's new loop vars must have the structure of loop_vars; got "
                              f"{tree_str(new_spec)}, expected {tree_str(lv_spec)}")
        for i, (a, b) in enumerate(zip(vars_, new_leaves)):
            ta, tb = _leaf_type(a), _leaf_type(b)
            if ta.dtype != tb.dtype or ta.ndim != tb.ndim:
                raise trace_error(f"while_loop: body_fn must return loop vars of the same dtype and rank; "
                                  f"loop_vars[{i}] is {ta} in and {tb} out")
        steps.append([as_array(o) for o in out_leaves])
        vars_ = [as_array(v) for v in new_leaves]
        it += 1
    if it == 0:
        out_spec, stacked = _abstract_outputs(body_fn, [_leaf_type(v) for v in vars_],
                                              lambda f, a: call_body(f, a), len(vars_))
    else:
        stacked = _stack_steps("while_loop", steps)
    return tree_unflatten(out_spec, stacked), tree_unflatten(lv_spec, vars_)
