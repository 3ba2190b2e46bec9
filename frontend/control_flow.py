"""Control-flow ops: `cond`, `case`, `foreach`, `while_loop`.

Eagerly (no trace active) they run the user's Python callables on numpy arrays through the shared
control-flow runner (`runtime/control_flow.py`), as the interpreter and the executor run graphs: that is
the reference semantics. Checks that need the user's Python structures (tree specs, the user's line)
stay here. While tracing, each Python callable is traced into a closed subgraph (captures explicit)
and one control-flow node is recorded.
"""
from __future__ import annotations

import numpy as np

from dyntvm.errors import TraceError

from ..ir import attrs as A
from ..ir.graph import Graph, Node, Value
from ..ir.shapes import ShapeError, unify_dims
from ..ir.tree import tree_flatten, tree_str, tree_unflatten
from ..ir.list_type import ListType, join_carried, same_kind
from ..ir.types import TensorType, dim_symbols, fresh_dim, is_symbol, is_unknown
from ..runtime import control_flow as runner
from ..runtime.control_flow import RuleError
from .list_values import ArrayList, TensorList
from .lists import constant_list
from .loop_types import _LIST_STEP, _check_carried, _stacked_type, _state_types_fixpoint
from .tracer import Builder, Tensor, as_array, current, finish_outputs, site, trace_error, tracing, user_source, wrap

_is_leaf = lambda x: isinstance(x, (Tensor, np.ndarray, np.generic, TensorList, ArrayList))   # a list is one value


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
        args = [wrap(b.new_input(t), b) for t in in_types]
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
    if isinstance(x, (Tensor, TensorList, ArrayList)):
        return x.type
    a = as_array(x)          # the dtype the leaf gets as a constant (Python float -> float32)
    return TensorType(a.shape, a.dtype.name)




def _is_seq(x) -> bool:
    """A Python nesting of values (a tuple or list), not a list value (`ArrayList`)."""
    return isinstance(x, (tuple, list)) and not isinstance(x, ArrayList)


def _step_output(api: str, x):
    if isinstance(x, ArrayList):
        raise trace_error(f"{api}: {_LIST_STEP}")
    return as_array(x)


def _eager_outputs(out):
    """Eager results with Python scalars as the arrays a traced run gives (1.5 -> float32)."""
    leaves, spec = tree_flatten(out, is_leaf=_is_leaf)
    return tree_unflatten(spec, [as_array(x) if isinstance(x, (bool, int, float)) else x for x in leaves])


def _rule(check, *args):
    """Run one of the runner's rules (a check or a whole eager loop); a broken rule is a TraceError at the
    user's line. The RuleError carries the same text, so it is dropped."""
    try:
        return check(*args)
    except RuleError as e:
        raise trace_error(str(e)) from None


def _pred_check(api: str, p, what="pred must be"):
    _rule(runner.check_predicate, api, what, _leaf_type(p))


def _traced_pred_check(api: str, what: str, sub: SubTrace):
    if sub.spec != "*":
        raise trace_error(runner.predicate_error(api, what, tree_str(sub.spec)))
    _rule(runner.check_predicate, api, what, sub.outputs[0].type)


def _flat_values(b: Builder, leaves) -> list:
    return [b.lift(x.value) if isinstance(x, (Tensor, TensorList)) else constant_list(b, x) if
            isinstance(x, ArrayList) else b.constant(as_array(x)) for x in leaves]


def _check_same(api, what, spec_a, types_a, spec_b, types_b, names=("first", "second"), allow_shape=True):
    if spec_a != spec_b:
        raise trace_error(f"{api}: {what} must have the same structure; {names[0]} is {tree_str(spec_a)} and "
                          f"{names[1]} is {tree_str(spec_b)}")
    for i, (x, y) in enumerate(zip(types_a, types_b)):
        if not same_kind(x, y):
            raise trace_error(f"{api}: {what} must have the same dtype and rank; output {i} is {x} in the "
                              f"{names[0]} and {y} in the {names[1]}")


def _emit(op, attrs, inputs, out_types, subgraphs) -> list:
    b = current()
    node = Node(op, tuple(b.lift(v) for v in inputs), attrs, tuple(Value(t) for t in out_types),
                tuple(subgraphs), source=user_source())
    return [wrap(v, b) for v in b.add_node(node)]


# ----------------------------------------------------------------------------------------- cond
def cond(pred, then_fn, else_fn):
    """Run `then_fn()` if `pred` else `else_fn()`.

    Python equivalent::

        return then_fn() if pred else else_fn()

    `pred` is a 0-d bool tensor; branches take no arguments and capture what they use by closure.
    Both must return the same structure, dtypes and ranks; a dim that differs between branches becomes
    an unknown dim of the result.
    """
    _pred_check("cond", pred)
    if not tracing():
        return _eager_outputs(runner.cond(pred, lambda _: then_fn(), lambda _: else_fn(), []))
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
        types = [join_carried(a, b) if a != b else a for a, b in zip(types, other)]
    return types


def ifelse(cond_fn, then_fn, else_fn, inputs):
    """Run `then_fn(inputs)` if `cond_fn(inputs)` else `else_fn(inputs)` (the seed's ``ifelse``).

    Python equivalent::

        return then_fn(inputs) if cond_fn(inputs) else else_fn(inputs)

    `inputs` is a tensor or a list of tensors, handed to each function as given; `cond_fn` returns a 0-d
    bool tensor (or is one). Output rules as for `cond`, which this is written with.
    """
    pred = cond_fn(inputs) if callable(cond_fn) else cond_fn
    return cond(pred, lambda: then_fn(inputs), lambda: else_fn(inputs))


def _case_pairs(cases) -> list:
    """`case`'s pred/fn pairs from a dict ``{pred: fn}`` (in insertion order) or a sequence of pairs."""
    if isinstance(cases, dict):
        bad = [k for k in cases if not callable(k)]
        if bad:     # equal values (two True predicates, eagerly) would have collapsed into one key already
            raise trace_error(f"case: the keys of a cases dict must be no-argument functions returning the predicate "
                              f"(got a {type(bad[0]).__name__}); pass predicate tensors as a list of (pred, fn) "
                              f"pairs")
    pairs = list(cases.items()) if isinstance(cases, dict) else cases
    if not isinstance(pairs, (list, tuple)):
        raise trace_error(f"case: cases must be a dict {{pred: fn}} or a list of (pred, fn) pairs, got "
                          f"{type(cases).__name__}")
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and callable(pair[1])):
            raise trace_error(f"case: cases[{i}] must be a (pred, fn) pair with a callable fn, got {pair!r}")
    return [tuple(p) for p in pairs]


def case(cases, default, exclusive=False):
    """The branch of the first true predicate, else `default()`.

    Python equivalent::

        if exclusive and sum(bool(pred()) for pred, _ in cases) > 1:
            raise error                      # every predicate runs; at most one may hold
        for pred, fn in cases:
            if (pred() if callable(pred) else pred):
                return fn()
        return default()

    `cases` is a list of ``(pred, fn)`` pairs, or a dict ``{pred: fn}`` (insertion order) whose keys are
    functions (as dict keys, two equal predicate values would collapse into one). Each `pred` is a 0-d bool
    tensor or a no-argument function returning one; without `exclusive` they run lazily, in order,
    up to the first that holds. With ``exclusive=True`` all run and more than one holding is an error (a
    `TraceError` eagerly, an `ExecutionError` from a graph). Output rules as for `cond`.
    """
    cases = _case_pairs(cases)
    if not isinstance(exclusive, bool):
        raise trace_error(f"case: exclusive must be a Python bool, got {exclusive!r}")
    if not tracing():
        def pred_run(i, p):
            def run(_):
                v = p() if callable(p) else p
                _pred_check("case", v, f"predicate {i} must be")
                return v
            return run
        branch_runs = [lambda _, fn=fn: fn() for _, fn in cases] + [lambda _: default()]
        pred_runs = [pred_run(i, p) for i, (p, _) in enumerate(cases)]
        return _eager_outputs(_rule(lambda: runner.case(pred_runs, branch_runs, [], exclusive=exclusive)))
    subs, preds = [], []
    for i, (p, fn) in enumerate(cases):
        ps = trace_sub(p if callable(p) else (lambda p=p: p), [], None, "case", call=lambda f, a: f())
        _traced_pred_check("case", f"predicate {i} must be", ps)
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
    outs = _emit("case", A.CaseAttrs(len(cases), len(out_types), exclusive), caps, out_types, graphs)
    return tree_unflatten(subs[0].spec, outs)


# ----------------------------------------------------------------------------------- loops
def _check_structure(api, new_name, init_name, got, expected):
    if got != expected:
        raise trace_error(f"{api}: {new_name} must have the structure of {init_name}; got {tree_str(got)}, "
                          f"expected {tree_str(expected)}")


def foreach(body, data, init_states, valid_length=None):
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

    **Variable-length batches.** `valid_length` (an integer tensor or array of shape ``[B]``) gives each batch
    row its number of steps. The batch is axis 1 of every data tensor (``[T, B, ...]``) and axis 0 of every
    state and of every per-step output. Per row ``b``, it computes::

        states_b = [s[b:b+1] for s in init_states]
        for t in range(valid_length[b]):             # 0 <= valid_length[b] <= T
            out, states_b = body(data[t][b:b+1], states_b)
            outputs[t][b] = out[0]                   # outputs[t][b] = 0 for t >= valid_length[b]
        final_states[b] = states_b                   # the initial state when valid_length[b] == 0

    Each step runs the body once, on a batch of the rows still active (``valid_length > t``): the body must
    treat rows independently and gets a batch of any size (axis 0 of its data slices and states is a symbol of
    its own, so it compiles once). Values the body captures are not sliced. States keep their shape. No row is
    computed past its length: the whole batch runs while all rows are active, a prefix of it (views) when the
    lengths are sorted in descending order, other orders are sorted first (a gather of the data and states, a
    scatter of the results); steps past ``max(valid_length)`` do not run. A wrong size or a length outside
    ``[0, T]`` raises (`ExecutionError` when compiled).
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
    except ShapeError:       # symbols that cannot agree: the runner's rule and text
        _rule(runner.data_length, lengths)
    slice_types = [TensorType(t.shape[1:], t.dtype) for t in d_types]
    st_types = [_leaf_type(s) for s in st_leaves]
    rows = None               # with valid_length: the symbol of the active rows, axis 0 in the body
    if valid_length is not None:
        batch = _batch_dim(_rule(runner.check_valid_length_types, d_types, st_types, _leaf_type(valid_length)))

    def call(f, args):
        xs, states = args[:len(data_leaves)], args[len(data_leaves):]
        res = f(list(xs) if data_list else xs[0], tree_unflatten(st_spec, list(states)))
        if not (_is_seq(res) and len(res) == 2):
            raise trace_error("foreach: body must return a pair (outputs, new_states)")
        return tuple(res)

    if not tracing():
        return _foreach_eager(body, data_leaves, st_leaves, st_spec, call, slice_types, valid_length)
    if valid_length is not None:
        rows = _rows_symbol(batch)
        slice_types = [TensorType((rows,) + t.shape[2:], t.dtype) for t in d_types]
        st_types = [TensorType((rows,) + t.shape[1:], t.dtype) for t in st_types]

    def body_trace(state_types):
        try:
            sub = trace_sub(body, slice_types + state_types, None, "foreach", call=call)
        except TraceError as e:
            if rows is None or rows not in str(e):
                raise
            raise _with_rows_note(e, rows) from None
        _check_pair_spec("foreach", sub, st_spec, "new_states", "init_states")
        n_out = len(sub.outputs) - len(state_types)
        new_types = [v.type for v in sub.outputs[n_out:]]
        if rows is not None:
            _check_rows(rows, [v.type for v in sub.outputs[:n_out]], state_types, new_types)
        return sub, new_types

    sub, st_types, varying = _state_types_fixpoint("foreach", body_trace, st_types, _FOREACH_RULE, "states")
    n_out = len(sub.outputs) - len(st_types)
    caps = union_captures([sub])
    b = current()
    ins = _flat_values(b, data_leaves) + _flat_values(b, st_leaves)
    if rows is None:
        out_types = [_stacked_type(length, v.type, varying) for v in sub.outputs[:n_out]] + st_types
    else:                     # the body's active rows are the whole batch outside
        ins += _flat_values(b, [valid_length])
        out_types = [TensorType((length, batch) + v.type.shape[1:], v.type.dtype) for v in sub.outputs[:n_out]] + \
            [TensorType((batch,) + t.shape[1:], t.dtype) for t in st_types]
    outs = _emit("foreach", A.ForeachAttrs(len(data_leaves), len(st_leaves), n_out, rows is not None),
                 ins + caps, out_types, [sub.graph(caps, "body")])
    return _split_result(sub.spec, outs, n_out)


def _batch_dim(dims: list):
    """The one batch dim of a foreach with valid_length (see `runner.check_valid_length_types`)."""
    batch = dims[0][1]
    try:                     # unknown dims may agree at run time; the runner checks
        for _, d in dims[1:]:
            batch = unify_dims(batch, d, "foreach")
    except ShapeError:       # dims that cannot agree: the runner's rule and text
        _rule(runner.batch_size, dims)
    return batch


def _rows_symbol(batch) -> str:
    """Axis 0 of a valid_length foreach body's data slices and states: the rows still active, a symbol of the body
    (so one compiled body serves every number of rows), named after the batch and unused in enclosing scopes."""
    base = f"{batch}_active" if is_symbol(batch) and not is_unknown(batch) else "active_rows"
    seen, b = set(), current()
    while b is not None:
        seen |= set(b.sym_values)
        b = b.parent
    name, i = base, 1
    while name in seen:
        i += 1
        name = f"{base}{i}"
    return name


def _with_rows_note(e: TraceError, rows: str) -> TraceError:
    """A trace error in a valid_length body that names its rows symbol: say what that symbol is."""
    head, at, tail = str(e).rpartition("\n    at ")
    if not at:
        head, tail = str(e), ""
    return TraceError(f"{head}\n    ({rows} is the batch of rows still active at a step of foreach with valid_length; "
                      f"values the body captures are not sliced){at}{tail}")


def _check_rows(rows: str, out_types: list, old_types: list, new_types: list) -> None:
    """A valid_length body works on rows: its per-step outputs have them as axis 0 (and only there), its states
    keep their shape (rows of finished sequences are set aside and scattered back)."""
    _check_carried("foreach", _FOREACH_RULE, "states", old_types, new_types)
    hint = " (values the body captures are not sliced: a captured [B, ...] tensor does not match the active rows)"
    for i, (a, b) in enumerate(zip(old_types, new_types)):
        if a != b:
            raise trace_error(f"foreach: with valid_length, new_states must keep the shape of init_states, with the "
                              f"active rows ({rows}) as axis 0; states[{i}] is {a} in and {b} out" +
                              (hint if b.shape[0] != rows else ""))
    for j, t in enumerate(out_types):
        if not t.ndim or t.shape[0] != rows or any(rows in dim_symbols(d) for d in t.shape[1:]):
            raise trace_error(f"foreach: with valid_length, per-step outputs must have the active rows ({rows}) as "
                              f"axis 0, and only there; output {j} is {t}" + (hint if t.ndim and t.shape[0] != rows
                                                                              else ""))


_FOREACH_RULE = "body must return states of the same dtype and rank"
_WHILE_RULE = "body_fn must return loop vars of the same dtype and rank"


def _check_pair_spec(api, sub, st_spec, new_name, init_name):
    _check_structure(api, new_name, init_name, sub.spec[1][1], st_spec)


def _split_result(spec, outs, n_out):
    outputs = tree_unflatten(spec[1][0], outs[:n_out])
    states = tree_unflatten(spec[1][1], outs[n_out:])
    return outputs, states


class _EagerBody:
    """An eager loop body for the runner: calls the user's function, checks the Python structures it
    returns (the step outputs keep one structure; carried values keep structure, dtype and rank) and
    hands back flat arrays; `types()` is the body traced, for a loop that runs zero times."""

    def __init__(self, api, fn, call, carry_spec, in_types, names):
        self.api, self.fn, self.call, self.carry_spec, self.in_types = api, fn, call, carry_spec, in_types
        self.n_in = len(in_types)
        self.names = names          # (new name, initial name, rule, slot) for messages
        self.out_spec = None

    def __call__(self, args):
        out, new = self.call(self.fn, args)
        out_leaves, out_spec = tree_flatten(out, is_leaf=_is_leaf)
        if self.out_spec is not None and out_spec != self.out_spec:
            raise trace_error(f"{self.api}: step outputs must keep one structure; got {tree_str(out_spec)} after "
                              f"{tree_str(self.out_spec)}")
        self.out_spec = out_spec
        new_leaves, new_spec = tree_flatten(new, is_leaf=_is_leaf)
        new_name, init_name, rule, slot = self.names
        _check_structure(self.api, new_name, init_name, new_spec, self.carry_spec)
        new_leaves = [x if isinstance(x, ArrayList) else as_array(x) for x in new_leaves]
        carried = args[self.n_in - len(new_leaves):self.n_in]
        if any(not same_kind(_leaf_type(a), _leaf_type(b)) for a, b in zip(carried, new_leaves)):
            _check_carried(self.api, rule, slot, [_leaf_type(a) for a in carried], [_leaf_type(b) for b in new_leaves])
        return [_step_output(self.api, x) for x in out_leaves] + new_leaves

    def types(self) -> Graph:
        """The body traced on the types it would have been called with (dims of size 0 traced as a symbol,
        as in a traced graph, so that `x[0]` of a 0-length state traces); sets the output spec."""
        from .tracer import trace as _trace_fn
        zero = "zero_len"

        def fn(*args):
            res = self.call(self.fn, list(args))
            self.out_spec = tree_flatten(res[0], is_leaf=_is_leaf)[1]
            return res
        return _trace_fn(fn, *[t if isinstance(t, ListType) else
                               TensorType(tuple(zero if d == 0 else d for d in t.shape), t.dtype)
                               for t in self.in_types])


def _foreach_eager(body, data_leaves, st_leaves, st_spec, call, slice_types, valid_length):
    data = [as_array(d) for d in data_leaves]
    states = [s if isinstance(s, ArrayList) else as_array(s) for s in st_leaves]
    step = _EagerBody("foreach", body, call, st_spec, slice_types + [_leaf_type(s) for s in states],
                      ("new_states", "init_states", _FOREACH_RULE, "states"))
    stacked, states = _rule(lambda: runner.foreach(step, data, states, [], step.types, valid_length=None if
                                                   valid_length is None else as_array(valid_length)))
    return tree_unflatten(step.out_spec, stacked), tree_unflatten(st_spec, states)


def while_loop(cond_fn, body_fn, loop_vars, max_iterations=None):
    """Loop while `cond_fn(*loop_vars)` holds.

    Python equivalent::

        outputs, vars, i = [], list(loop_vars), 0
        while (max_iterations is None or i < max_iterations) and cond_fn(*vars):
            out, vars = body_fn(*vars)
            outputs.append(out); i += 1
        return stack(outputs), vars       # stacked to the number of iterations run (no padding)

    `body_fn` returns either the pair ``(step_outputs, new_loop_vars)`` as above, or only the new loop vars
    (shaped like `loop_vars`; a bare tensor for one var): then ``while_loop`` returns only the final loop vars,
    ``vars`` above (the loop vars themselves when no iteration runs). A pair whose second item has the
    structure of `loop_vars` is read as the first form.

    Loop vars keep dtype and rank but may change shape between iterations (a growing sequence).
    `max_iterations` is an int or a 0-d integer tensor.
    """
    if not isinstance(loop_vars, (list, tuple)) or not loop_vars:
        raise trace_error("while_loop: loop_vars must be a non-empty list of tensors")
    lv_leaves, lv_spec = tree_flatten(list(loop_vars), is_leaf=_is_leaf)
    form = {}           # "kind": "a pair" or "new loop vars", what body_fn returns (fixed by its first call)

    def call_body(f, args):
        res = _body_form(f(*tree_unflatten(lv_spec, list(args[:len(lv_leaves)]))), lv_spec)
        if res is None:
            raise trace_error("while_loop: body_fn must return a pair (step_outputs, new_loop_vars) or only the "
                              f"new loop vars (structure {tree_str(lv_spec)})")
        kind, out, new = res
        if form.setdefault("kind", kind) != kind:
            raise trace_error(f"while_loop: body_fn must return one form; it returned {form['kind']} then {kind}")
        return (out, new)

    def call_cond(f, args):
        return f(*tree_unflatten(lv_spec, list(args[:len(lv_leaves)])))

    if not tracing():
        return _while_eager(cond_fn, body_fn, lv_leaves, lv_spec, call_body, call_cond, max_iterations, form)

    def body_trace(types):
        sub = trace_sub(body_fn, types, None, "while_loop", call=call_body)
        _check_pair_spec("while_loop", sub, lv_spec, "body_fn's new loop vars", "loop_vars")
        n_out = len(sub.outputs) - len(types)
        return sub, [v.type for v in sub.outputs[n_out:]]

    sub, types, varying = _state_types_fixpoint("while_loop", body_trace, [_leaf_type(v) for v in lv_leaves],
                                                _WHILE_RULE, "loop_vars")
    csub = trace_sub(cond_fn, types, None, "while_loop", call=call_cond)
    _traced_pred_check("while_loop", "cond_fn must return", csub)
    n_out = len(sub.outputs) - len(types)
    caps = union_captures([csub, sub])
    b = current()
    ins = _flat_values(b, lv_leaves)
    static_max, has_t = None, False
    if isinstance(max_iterations, Tensor):
        _rule(runner.check_iteration_limit_type, max_iterations.type)
        ins.append(b.lift(max_iterations.value))
        has_t = True
    else:
        static_max = _rule(runner.iteration_limit, max_iterations)
    n_iter = fresh_dim(origin=f"the number of iterations of while_loop at {site(user_source())}")
    out_types = [_stacked_type(n_iter, v.type, varying) for v in sub.outputs[:n_out]] + types
    outs = _emit("while_loop", A.WhileAttrs(len(lv_leaves), n_out, static_max, has_t), ins + caps, out_types,
                 [csub.graph(caps, "cond"), sub.graph(caps, "body")])
    final_vars = tree_unflatten(lv_spec, outs[n_out:])
    if form["kind"] == "new loop vars":
        return final_vars
    return tree_unflatten(sub.spec[1][0], outs[:n_out]), final_vars


def _body_form(res, lv_spec):
    """(form, step outputs, new loop vars as a list) of what a while_loop body returned, or None."""
    def as_vars(x):
        x = list(x) if _is_seq(x) else [x]
        return x if tree_flatten(x, is_leaf=_is_leaf)[1] == lv_spec else None
    if _is_seq(res) and len(res) == 2 and (as_vars(res[1]) is not None or as_vars(res) is None):
        new = res[1]        # a pair (new vars of another structure are refused by the caller's checks)
        return "a pair", res[0], list(new) if _is_seq(new) else [new]
    new = as_vars(res)
    return None if new is None else ("new loop vars", [], new)


def _while_eager(cond_fn, body_fn, lv_leaves, lv_spec, call_body, call_cond, max_iterations, form):
    loop_vars = [v if isinstance(v, ArrayList) else as_array(v) for v in lv_leaves]

    def cond_run(args):
        c = call_cond(cond_fn, args)
        _pred_check("while_loop", c, "cond_fn must return")
        return c
    step = _EagerBody("while_loop", body_fn, call_body, lv_spec, [_leaf_type(v) for v in loop_vars],
                      ("body_fn's new loop vars", "loop_vars", _WHILE_RULE, "loop_vars"))
    stacked, loop_vars = _rule(runner.while_loop, cond_run, step, loop_vars, [], max_iterations, step.types)
    if form["kind"] == "new loop vars":
        return tree_unflatten(lv_spec, loop_vars)
    return tree_unflatten(step.out_spec, stacked), tree_unflatten(lv_spec, loop_vars)
