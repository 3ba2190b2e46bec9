"""The control-flow runner: how `cond`, `case`, `foreach` and `while_loop` run, written once.

Eager mode (`frontend/control_flow.py`), the reference interpreter and the compiled executor all call
these drivers. A backend gives callbacks that run a body, branch or predicate on a list of values
(``run(args) -> list``) and, where it differs from plain numpy, small hooks: ``truth`` reads a
predicate (cond's ``pred``, or what a predicate callback returned) as a bool, ``rows`` slices the rows
of one data tensor, ``to_array`` turns a step output into a numpy array and ``alloc`` makes foreach's
output buffers. The rules (data of one length, ``max_iterations``, per-step outputs keep one shape,
zero-iteration results shaped from the body's types) and their error texts live here only; the
frontend's trace-time checks raise the same texts.

A broken rule raises `RuleError`; the interpreter and the executor re-raise it, like any failure of a
node, as an `ExecutionError` naming the node, eager mode as a `TraceError` at the user's line.
"""
from __future__ import annotations

import math

import numpy as np

from dyntvm.errors import ExecutionError

from ..ir.graph import Graph
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


def bind_symbols(t: TensorType, shape: tuple, env: dict) -> None:
    """Record the sizes of `t`'s symbolic dims seen in a concrete `shape`: symbols, and expression dims as a
    whole (`eval_dim` reads ``env["min(N, 2)"]`` where N itself is not known)."""
    for d, s in zip(t.shape, shape):
        if isinstance(d, str) and d not in env:
            env[d] = int(s)


def zero_length_stack(t: TensorType, env: dict) -> np.ndarray:
    """The stacked result of zero iterations of a step output of type `t`."""
    shape = []
    for d in t.shape:
        try:
            shape.append(eval_dim(d, env))
        except (KeyError, ValueError):
            shape.append(0)      # a data-dependent size never observed: any size is right for 0 rows
    return np.zeros((0, *shape), dtype=t.dtype)


def empty_steps(body: Graph, in_shapes: list, n_out: int) -> list:
    """Zero iterations: empty stacks shaped from `body`'s output types, with its symbols bound from the
    shapes the body would have been called with."""
    env: dict = {}
    for v, shape in zip(body.inputs, in_shapes):
        bind_symbols(v.type, tuple(shape), env)
    return [zero_length_stack(v.type, env) for v in body.outputs[:n_out]]


def _graph_of(body_types) -> Graph:
    return body_types() if callable(body_types) else body_types


def _truth(x) -> bool:
    return bool(np.asarray(x))


# -------------------------------------------------------------------------------------- drivers
def cond(pred, then_run, else_run, args: list, truth=_truth) -> list:
    """``then_run(args) if pred else else_run(args)``: only the taken branch runs."""
    return then_run(args) if truth(pred) else else_run(args)


def case(pred_runs: list, branch_runs: list, args: list, truth=_truth) -> list:
    """The branch of the first predicate that holds (predicates run lazily, in order); `branch_runs`
    has one more entry than `pred_runs`: the default."""
    for pred_run, branch_run in zip(pred_runs, branch_runs):
        if truth(pred_run(args)):
            return branch_run(args)
    return branch_runs[-1](args)


def foreach(body, data: list, states: list, consts: list, body_types, *, rows=None, to_array=np.asarray,
            alloc=np.empty) -> tuple[list, list]:
    """Loop over axis 0 of `data`; returns (stacked per-step outputs, final states).

    ``body(rows_t + states + consts) -> outputs + new_states`` (flat lists). `body_types` is the body's
    graph (or a function returning it), read only when there are zero steps. `data` are numpy arrays.
    """
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
        shapes = [d.shape[1:] for d in data] + [np.shape(to_array(x)) for x in states + consts]
        return empty_steps(g, shapes, len(g.outputs) - ns), states
    return bufs, states


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
        shapes = [np.shape(to_array(x)) for x in loop_vars + consts]
        return empty_steps(g, shapes, len(g.outputs) - nv), loop_vars
    if stack is not None:
        return stack(accs, kinds), loop_vars
    if bufs is None:                        # a short loop: one copy
        return [np.array(acc) for acc in accs], loop_vars
    bufs, n = _flush(bufs, accs, kinds, n)
    for buf in bufs:
        buf.resize((n, *buf.shape[1:]), refcheck=False)
    return bufs, loop_vars
