"""The control-flow runner: how `cond`, `case`, `foreach` and `while_loop` run, written once.

Eager mode (`frontend/control_flow.py`), the reference interpreter and the compiled executor all call
these drivers. A backend gives callbacks that run a body, branch or predicate on a list of values
(``run(args) -> list``) and, where it differs from plain numpy, small hooks: ``truth`` reads a
predicate (cond's ``pred``, or what a predicate callback returned) as a bool, ``rows`` slices the rows
of one data tensor, ``to_array`` turns a step output into a numpy array and ``alloc`` makes foreach's
output buffers. The rules (data of one length, ``max_iterations``, per-step outputs keep one shape,
zero-iteration results shaped from the body's types, foreach's ``valid_length``: which rows each step runs) and
their error texts live here only; the frontend's trace-time checks raise the same texts.

A broken rule raises `RuleError`; the interpreter and the executor re-raise it, like any failure of a
node, as an `ExecutionError` naming the node, eager mode as a `TraceError` at the user's line.
"""
from __future__ import annotations

import math

import numpy as np

from dyntvm.errors import ExecutionError

from ..ir.graph import Graph
from ..ir.list_type import value_dims
from ..ir.types import TensorType, eval_dim

_CHUNK = 256            # while_loop: per-step outputs are copied into their buffers every _CHUNK steps,
_CHUNK_BYTES = 1 << 20  # or more often when _CHUNK steps would hold more than this many bytes
_GROW = 1.5             # while_loop: a full buffer grows to _GROW times its rows (in place when the OS can)


class RuleError(ValueError):
    """A control-flow rule broken by the values at hand (message: api, rule, what was got)."""


# ------------------------------------------------------------------------ rules and their texts
def predicate_error(api: str, what: str, got) -> str:
    """``what`` says who must give the predicate, e.g. "pred must be" or "cond_fn must return"."""
    return f"{api}: {what} a 0-d bool tensor, got {got}; use e.g. F.greater(F.sum(x), 0)"


def check_predicate(api: str, what: str, t: TensorType) -> None:
    if t.ndim != 0 or t.dtype != "bool":
        raise RuleError(predicate_error(api, what, t))


def data_length(lengths: list) -> int:
    """The common length (axis 0) of foreach's data tensors; lengths may be symbolic at trace time
    (pass them after unifying, see the frontend) or ints."""
    if any(n != lengths[0] for n in lengths[1:]):
        raise RuleError(f"foreach: data tensors must have the same length (axis 0); got lengths "
                        f"{', '.join(map(str, lengths))}")
    return lengths[0] if lengths else 0


def check_valid_length_types(data_types: list, state_types: list, vl_type: TensorType) -> list:
    """foreach with ``valid_length``: what the types must be; returns the batch dims that must agree, as
    (name, dim) pairs (axis 1 of each data tensor, axis 0 of each state, valid_length's size)."""
    if vl_type.ndim != 1 or np.dtype(vl_type.dtype).kind not in "iu":
        raise RuleError(f"foreach: valid_length must be a 1-d integer tensor (one length per batch row), got {vl_type}")
    for i, t in enumerate(data_types):
        if t.ndim < 2:
            raise RuleError(f"foreach: with valid_length, data[{i}] must be [steps, batch, ...] (axis 1 is the batch); "
                            f"got {t}")
    for i, t in enumerate(state_types):
        if t.ndim < 1:
            raise RuleError(f"foreach: with valid_length, states[{i}] must have the batch as axis 0; got {t}")
    return ([(f"data[{i}]", t.shape[1]) for i, t in enumerate(data_types)] +
            [(f"states[{i}]", t.shape[0]) for i, t in enumerate(state_types)] + [("valid_length", vl_type.shape[0])])


def batch_size(dims: list):
    """The batch of a foreach with ``valid_length``: `dims` from `check_valid_length_types` must agree (ints at
    run time; symbols unified first at trace time, see the frontend)."""
    if any(d != dims[0][1] for _, d in dims[1:]):
        raise RuleError("foreach: with valid_length, the batch (axis 1 of data, axis 0 of states, the size of "
                        "valid_length) must agree; got " + ", ".join(f"{w}: {d}" for w, d in dims))
    return dims[0][1]


def check_lengths(lens: np.ndarray, steps: int) -> None:
    """valid_length's values at run time: 0 <= length <= the number of steps."""
    bad = np.flatnonzero((lens < 0) | (lens > steps))
    if bad.size:
        raise RuleError(f"foreach: valid_length must be between 0 and the number of steps ({steps}); got "
                        f"{lens[bad[0]]} for row {bad[0]}")


def _limit_error(got) -> RuleError:
    return RuleError(f"while_loop: max_iterations must be an int or a 0-d integer tensor, got {got}")


def check_iteration_limit_type(t: TensorType) -> None:
    if t.ndim != 0 or np.dtype(t.dtype).kind not in "iu":
        raise _limit_error(t)


def iteration_limit(value, to_array=np.asarray):
    """``max_iterations`` (None, a Python int or a 0-d integer tensor) as an int or None."""
    if value is None:
        return None
    a = to_array(value)
    if a.ndim != 0 or a.dtype.kind not in "iu":
        raise _limit_error(repr(value) if isinstance(value, (int, float, str)) else _describe(a.dtype, a.shape))
    return int(a)


# ------------------------------------------------------------------------- stacking steps
# foreach knows its number of steps: per-step outputs go straight into buffers from the backend's `alloc`.
# while_loop does not: they are collected in lists and copied into one buffer per output every `_CHUNK` steps,
# grown geometrically with `ndarray.resize` (realloc: large buffers grow in place, untouched rows take no
# memory) and cut to the iterations run at the end, so memory stays near the result's size. Compiled, 100k
# steps of 16 floats (a 6.4 MB result) measured RSS +6.8 MB after the call, peak +10 MB; 1M steps: +64.4 MB,
# peak +73 MB (chunks concatenated at the end: +11.6 / +124.5 MB; a list of every step: +454 MB for 100k,
# each step's TVM tensor holding a 4 KB page). Copying a list of rows into a slice (`buf[a:b] = rows`)
# measured 210 ns per 16-float row, `np.array(rows)` 300, a row assignment per step 310, `np.stack` 660.
# Plain functions, not a class: a method call per step measured +0.3 us on a 7 us foreach step.
def _start(res: list, n_out: int, cap: int, to_array, alloc) -> tuple[list, list]:
    firsts = [to_array(r) for r in res[:n_out]]
    return [alloc((cap,) + r.shape, r.dtype) for r in firsts], [(r.shape, r.dtype) for r in firsts]


def _put(api: str, bufs: list, kinds: list, res: list, t: int, to_array) -> None:
    """Row `t` of each buffer from `res` (which may go on with the new states: zip stops at the buffers)."""
    for buf, r, (shape, dtype) in zip(bufs, res, kinds):
        r = to_array(r)
        if r.shape != shape or r.dtype != dtype:
            raise _changed(api, kinds, res, to_array)
        buf[t] = r


def _changed(api: str, kinds: list, res: list, to_array) -> RuleError:
    for k, ((shape, dtype), r) in enumerate(zip(kinds, res)):
        r = to_array(r)
        if r.shape != shape or r.dtype != dtype:
            return RuleError(f"{api}: step output {k} changed shape between iterations ({_describe(dtype, shape)} "
                             f"then {_describe(r.dtype, r.shape)}); per-step outputs are stacked and must keep one "
                             "shape" + ("" if r.dtype == dtype else " and dtype"))
    return RuleError(f"{api}: step outputs changed")  # pragma: no cover - only called after a change


def _append(api: str, accs: list, kinds: list, res: list, to_array) -> None:
    for acc, r, (shape, dtype) in zip(accs, res, kinds):
        r = to_array(r)
        if r.shape != shape or r.dtype != dtype:
            raise _changed(api, kinds, res, to_array)
        acc.append(r)


def _flush(bufs: list | None, accs: list, kinds: list, n: int) -> tuple[list, int]:
    """Copy the open lists of rows into rows `n`... of their buffers (made or grown here), empty the lists;
    returns the buffers and the new `n`."""
    k = len(accs[0]) if accs else 0
    if bufs is None:
        bufs = [np.empty((k, *shape), dtype) for shape, dtype in kinds]
    if not k:
        return bufs, n
    for buf, acc in zip(bufs, accs):
        if n + k > len(buf):
            buf.resize((max(int(len(buf) * _GROW), n + k), *buf.shape[1:]), refcheck=False)
        buf[n:n + k] = acc
        acc.clear()
    return bufs, n + k


def _describe(dtype, shape) -> str:
    return f"{np.dtype(dtype).name}{list(shape)}"


def _shape_of(x, to_array) -> tuple:
    """A carried value's shape: a list's ``(length,)`` (see `ir.list_type.value_shape`)."""
    return (len(x),) if isinstance(x, list) else np.shape(to_array(x))


def bind_symbols(t: TensorType, shape: tuple, env: dict) -> None:
    """Record the sizes of `t`'s symbolic dims seen in a concrete `shape`: symbols, and expression dims as a
    whole (`eval_dim` reads ``env["min(N, 2)"]`` where N itself is not known)."""
    for d, s in zip(value_dims(t), shape):      # a list binds its length (`value_shape` of a list)
        if isinstance(d, str) and d not in env:
            env[d] = int(s)


def zero_length_stack(t: TensorType, env: dict, steps: int = 0) -> np.ndarray:
    """The stacked result of zero iterations of a step output of type `t` (`steps` rows of zeros: foreach steps
    that no row of a `valid_length` reaches)."""
    shape = []
    for d in t.shape:
        try:
            shape.append(eval_dim(d, env))
        except (KeyError, ValueError):
            shape.append(0)      # a data-dependent size never observed: any size is right for rows of no value
    return np.zeros((steps, *shape), dtype=t.dtype)


def empty_steps(body: Graph, in_shapes: list, n_out: int, steps: int = 0) -> list:
    """Zero iterations: empty stacks (or `steps` rows of zeros) shaped from `body`'s output types, with its
    symbols bound from the shapes the body would have been called with."""
    env: dict = {}
    for v, shape in zip(body.inputs, in_shapes):
        bind_symbols(v.type, tuple(shape), env)
    return [zero_length_stack(v.type, env, steps) for v in body.outputs[:n_out]]


def _graph_of(body_types) -> Graph:
    return body_types() if callable(body_types) else body_types


def _truth(x) -> bool:
    return bool(np.asarray(x))


# -------------------------------------------------------------------------------------- drivers
def cond(pred, then_run, else_run, args: list, truth=_truth) -> list:
    """``then_run(args) if pred else else_run(args)``: only the taken branch runs."""
    return then_run(args) if truth(pred) else else_run(args)


def case(pred_runs: list, branch_runs: list, args: list, truth=_truth, exclusive: bool = False) -> list:
    """The branch of the first predicate that holds (predicates run lazily, in order); `branch_runs`
    has one more entry than `pred_runs`: the default. `exclusive`: every predicate runs first, and more
    than one holding breaks the rule."""
    if exclusive:
        held = [i for i, pred_run in enumerate(pred_runs) if truth(pred_run(args))]
        if len(held) > 1:
            raise RuleError(f"case: exclusive=True but predicates {', '.join(map(str, held))} all hold "
                            f"(at most one may)")
        return branch_runs[held[0] if held else -1](args)
    for pred_run, branch_run in zip(pred_runs, branch_runs):
        if truth(pred_run(args)):
            return branch_run(args)
    return branch_runs[-1](args)


def foreach(body, data: list, states: list, consts: list, body_types, *, rows=None, to_array=np.asarray,
            alloc=np.empty, valid_length=None) -> tuple[list, list]:
    """Loop over axis 0 of `data`; returns (stacked per-step outputs, final states).

    ``body(rows_t + states + consts) -> outputs + new_states`` (flat lists). `body_types` is the body's
    graph (or a function returning it), read only when there are zero steps. `data` are numpy arrays.
    With `valid_length` (an integer array on the host, one length per batch row), see `foreach_valid_length`.
    """
    if valid_length is not None:
        return foreach_valid_length(body, data, states, consts, body_types, valid_length, rows=rows,
                                    to_array=to_array, alloc=alloc)
    length = data_length([d.shape[0] for d in data])
    slices = [rows(d) for d in data] if rows is not None else data
    ns = len(states)
    bufs = None
    t = 0
    try:
        for t in range(length):
            res = body([s[t] for s in slices] + states + consts)
            if bufs is None:
                n_out = len(res) - ns
                bufs, kinds = _start(res, n_out, length, to_array, alloc)
            _put("foreach", bufs, kinds, res, t, to_array)
            states = res[n_out:]
    except ExecutionError as e:
        e.iteration = t
        raise
    if bufs is None:
        g = _graph_of(body_types)
        shapes = [d.shape[1:] for d in data] + [_shape_of(x, to_array) for x in states + consts]
        return empty_steps(g, shapes, len(g.outputs) - ns), states
    return bufs, states


def foreach_valid_length(body, data: list, states: list, consts: list, body_types, valid_length, *, rows=None,
                         to_array=np.asarray, alloc=np.empty) -> tuple[list, list]:
    """`foreach` over a batch of sequences of different lengths. The batch is axis 1 of each data tensor and
    axis 0 of each state and of each per-step output; row b runs steps ``0 .. valid_length[b] - 1``::

        for t in range(len(data)):
            active = valid_length > t                        # rows still running (fewer at every step)
            out, new = body(data[t][active], [s[active] for s in states])
            outputs[t][active], outputs[t][~active] = out, 0
            for s, n in zip(states, new): s[active] = n      # a finished row keeps its last state

    Step t runs the body once, on the rows still active: all rows running every step is the plain loop (no
    copies); with lengths sorted in descending order the active rows are a prefix of the batch (views); other
    orders are sorted so first (one gather of each data tensor and state, one scatter of each result back).
    Rows that finish are set aside once (their final states) and not passed again; steps no row reaches do not
    run.
    """
    length = data_length([d.shape[0] for d in data])
    lens = to_array(valid_length)
    dims = check_valid_length_types([_type_of(d) for d in data], [_type_of(x) for x in states], _type_of(lens))
    batch = batch_size(dims)
    check_lengths(lens, length)
    lens = lens.astype(np.int64, copy=False)
    init_shapes = [tuple(x.shape) for x in states]
    if batch and int(lens.min()) == length:          # every row runs every step: the plain loop, at no extra cost
        stacked, states = foreach(body, data, states, consts, body_types, rows=rows, to_array=to_array, alloc=alloc)
        for j, buf in enumerate(stacked if length else ()):
            if buf.ndim < 2 or buf.shape[1] != batch:
                raise _rows_error(j, buf[0], batch, 0)
        _check_state_shapes(states, init_shapes, batch, to_array)
        return stacked, states
    if batch < 2 or bool(np.all(lens[:-1] >= lens[1:])):
        return _foreach_prefixes(body, data, states, consts, body_types, lens, batch, length, init_shapes, rows,
                                 to_array, alloc)
    order = np.argsort(-lens, kind="stable")         # longest first: the active rows are a prefix
    data = [_gather(d[:int(lens.max())], order, alloc, axis=1) for d in data]     # the steps some row runs
    states = [_gather(to_array(x), order, alloc) for x in states]
    stacked, states = _foreach_prefixes(body, data, states, consts, body_types, lens[order], batch, length,
                                        init_shapes, rows, to_array, alloc)
    back = np.argsort(order)
    return ([_gather(x, back, alloc, axis=1) for x in stacked],
            [_gather(to_array(x), back, alloc) for x in states])


def _foreach_prefixes(body, data, states, consts, body_types, lens, batch, length, init_shapes, rows, to_array,
                      alloc) -> tuple[list, list]:
    """foreach_valid_length with `lens` sorted in descending order: the rows active at a step are a prefix."""
    steps = int(lens.max()) if batch else 0
    counts = (batch - np.cumsum(np.bincount(lens, minlength=steps + 1))[:steps]).tolist()   # rows with length > t
    slices = [rows(d[:steps]) for d in data] if rows is not None and steps else data
    ns = len(states)
    final = None                # final states (whole batch), made when the first rows finish
    k_prev, bufs, t = batch, None, 0
    try:
        for t, k in enumerate(counts):
            if k != k_prev:     # rows k.. finish: their states are final
                states, final = _retire(states, final, k, k_prev, init_shapes, to_array, alloc)
                k_prev = k
            res = body(([s[t] for s in slices] if k == batch else [s[t][:k] for s in slices]) + states + consts)
            if bufs is None:
                n_out = len(res) - ns
                bufs, kinds = _start_rows(res, n_out, length, batch, k, t, to_array, alloc)
            _put_rows(bufs, kinds, res, t, k, batch, to_array)
            states = res[n_out:]
    except ExecutionError as e:
        e.iteration = t
        raise
    if final is not None:                   # the rows still active finish after the last step
        states = _retire(states, final, 0, k_prev, init_shapes, to_array, alloc)[1]
    elif steps:                             # all rows ran every step: the body's states are the final ones
        _check_state_shapes(states, init_shapes, batch, to_array)
    if bufs is None:
        g = _graph_of(body_types)
        shapes = [d.shape[1:] for d in data] + [_shape_of(x, to_array) for x in states + consts]
        return empty_steps(g, shapes, len(g.outputs) - ns, length), states
    for buf in bufs:
        buf[steps:] = 0                     # steps no row reaches
    return bufs, states


def _type_of(x) -> TensorType:
    return TensorType(tuple(int(d) for d in x.shape), str(x.dtype))


def _gather(a: np.ndarray, idx: np.ndarray, alloc, axis: int = 0) -> np.ndarray:
    """Rows `idx` (in range) of `a` along `axis`, into a new buffer from `alloc` (aligned for compiled kernels).
    mode="clip": with ``out``, numpy's default mode="raise" copies through a temporary buffer (measured 3-9 ms
    instead of 0.18 ms for a float32[64, 64, 256] array)."""
    shape = a.shape[:axis] + (len(idx),) + a.shape[axis + 1:]
    return np.take(a, idx, axis=axis, out=alloc(shape, a.dtype), mode="clip")


def _check_state_shapes(arrays: list, init_shapes: list, k: int, to_array) -> list:
    arrays = [to_array(x) for x in arrays]
    for j, (a, shape) in enumerate(zip(arrays, init_shapes)):
        if a.shape != (k,) + shape[1:]:
            raise RuleError(f"foreach: with valid_length, states keep their shape with the active rows as axis 0 "
                            f"({k} rows here); states[{j}] is {_describe(a.dtype, a.shape)}, expected "
                            f"{_describe(a.dtype, (k,) + shape[1:])}")
    return arrays


def _retire(states, final, k, k_prev, init_shapes, to_array, alloc):
    """Rows k..k_prev-1 (of the `k_prev` in `states`) finish: their states go into `final` (made here the first
    time). Returns (the states of rows 0..k-1: views, final)."""
    arrays = _check_state_shapes(states, init_shapes, k_prev, to_array)
    if final is None:
        final = [alloc((init[0],) + a.shape[1:], a.dtype) for a, init in zip(arrays, init_shapes)]
    for f, a in zip(final, arrays):
        f[k:k_prev] = a[k:]
    return [a[:k] for a in arrays], final


def _start_rows(res: list, n_out: int, steps: int, batch: int, k: int, t: int, to_array, alloc) -> tuple[list, list]:
    kinds = []
    for j, r in enumerate(res[:n_out]):
        r = to_array(r)
        if r.ndim == 0:
            raise _rows_error(j, r, k, t)
        kinds.append((r.shape[1:], r.dtype))
    return [alloc((steps, batch) + rest, dtype) for rest, dtype in kinds], kinds


def _put_rows(bufs: list, kinds: list, res: list, t: int, k: int, batch: int, to_array) -> None:
    """Row t of each output buffer: the body's rows (the first `k`), zeros for the others."""
    for j, (buf, r, (rest, dtype)) in enumerate(zip(bufs, res, kinds)):
        r = to_array(r)
        if r.shape[1:] != rest or r.dtype != dtype or r.shape[:1] != (k,):
            if r.ndim == 0 or r.shape[0] != k:
                raise _rows_error(j, r, k, t)
            raise RuleError(f"foreach: step output {j} changed shape between iterations (rows of "
                            f"{_describe(dtype, rest)} then of {_describe(r.dtype, r.shape[1:])}); per-step outputs "
                            "are stacked and must keep one shape" + ("" if r.dtype == dtype else " and dtype"))
        if k == batch:
            buf[t] = r
        else:
            buf[t, :k] = r
            buf[t, k:] = 0


def _rows_error(j: int, r: np.ndarray, k: int, t: int) -> RuleError:
    return RuleError(f"foreach: with valid_length, step output {j} must have the active rows as axis 0 ({k} at step "
                     f"{t}); got {_describe(r.dtype, r.shape)}")


def while_loop(cond_run, body, loop_vars: list, consts: list, max_iterations, body_types, *, truth=_truth,
               to_array=np.asarray, stack=None, cond_in_body: bool = False) -> tuple[list, list]:
    """Loop while ``cond_run(vars + consts)`` holds, at most `max_iterations` times (None, an int or a
    0-d integer array on the host); returns (per-step outputs stacked to the iterations run, final vars).

    ``body(vars + consts) -> step_outputs + new_vars``; `body_types` as for `foreach`. `stack` (values on a
    device, `placement.DevicePlacement.stack_rows`): ``stack(lists of step outputs, kinds)`` stacks them at
    the end instead of numpy buffers. `cond_in_body`: the body returns one more value, the condition on its
    new vars (``[pred]`` is what `truth` reads): `cond_run` only decides the first iteration.
    """
    limit = iteration_limit(max_iterations, to_array if stack is None else np.asarray)
    nv = len(loop_vars) + cond_in_body      # the body's trailing outputs that are not step outputs
    accs = bufs = None
    it = n = 0              # iterations run; rows already in `bufs`
    go = None               # the condition the body computed (cond_in_body), from the second iteration on
    try:
        while (limit is None or it < limit) and (truth(cond_run(loop_vars + consts)) if go is None else go):
            res = body(loop_vars + consts)
            if cond_in_body:
                go = truth(res[-1:])
                res = res[:-1]
            if accs is None:
                n_out = len(res) - len(loop_vars)
                kinds = [(r.shape, r.dtype) for r in map(to_array, res[:n_out])]
                step_bytes = 0 if stack else sum(np.dtype(dtype).itemsize * math.prod(shape) for shape, dtype in kinds)
                every = max(1, min(_CHUNK, _CHUNK_BYTES // max(1, step_bytes))) if stack is None else 0
                accs = [[] for _ in range(n_out)]
            _append("while_loop", accs, kinds, res, to_array)
            loop_vars = res[n_out:]
            it += 1
            if every and not it % every:
                bufs, n = _flush(bufs, accs, kinds, n)
    except ExecutionError as e:
        e.iteration = it
        raise
    if accs is None:
        g = _graph_of(body_types)
        shapes = [_shape_of(x, to_array) for x in loop_vars + consts]
        return empty_steps(g, shapes, len(g.outputs) - nv), loop_vars
    if stack is not None:
        return stack(accs, kinds), loop_vars
    if bufs is None:                        # a short loop: one copy
        return [np.array(acc) for acc in accs], loop_vars
    bufs, n = _flush(bufs, accs, kinds, n)
    for buf in bufs:
        buf.resize((n, *buf.shape[1:]), refcheck=False)
    return bufs, loop_vars
