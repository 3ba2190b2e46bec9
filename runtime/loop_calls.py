"""The executor's calls of compiled loops (`ir.compiled_loop`, built by `codegen/compiled_loops.py`): a foreach
or while_loop whose body codegen compiled into one loop function runs as one call of it (a while_loop: a few,
in growing chunks) instead of a region call per step. Used by `executor.Executor` when it builds a loop's step;
each returns None where the loop runs step by step instead (validating, profiling, a declined loop).

With a `DevicePlacement` (a GPU, or the CPU in tests) the library's device loop runs (`ir.compiled_loop`): its
arguments are moved to the device once per call (counted), its results stay there, and a while_loop reads
``(count, go)`` once per chunk of steps (`_device_chunk`)."""
from __future__ import annotations

import math
import warnings

import numpy as np
from tvm_ffi import Shape as ShapeTuple
from tvm_ffi._ffi_api import ArrayGetItem

from ..ir.compiled_loop import compiled_loop_name, foreach_loop_plan, while_loop_plan
from ..ir.graph import Node
from ..ir.types import eval_dim
from . import control_flow as cf
from .control_flow import bind_symbols
from .tensors import first_truth, to_numpy, to_tvm

_item = ArrayGetItem            # res[k] of a result tuple: one FFI call


def compiled_foreach(ex, n: Node, ins, outs, stepwise):
    """The foreach as one call of its compiled loop (`ir.compiled_loop`), if the library has one: no
    Python per step (on a device: the device loop, its arguments moved there once). None while validating
    or profiling (the step-by-step plan does those), or when codegen declined the loop. When the compiled
    loop fails, `stepwise` (the step-by-step run) runs it again to raise the error a step-by-step run raises
    (the iteration, the op and its line); should the steps succeed, their result is used, with a
    RuntimeWarning."""
    plan = foreach_loop_plan(n)
    fn = _loop_function(ex, plan)
    if fn is None:
        return None
    region, roles, _ = plan
    nd, ns = n.attrs.num_data, n.attrs.num_states
    arg_idx = [ins[k if r == "data" else nd + k if r == "state" else nd + ns + k] for r, k in roles]
    data_idx = ins[:nd]
    calls = ex.calls
    pick = _specialized_loop(ex, region, roles, fn)
    pl = ex.pl

    def args_of(slots):
        if pl is None:
            return [to_tvm(slots[i]) for i in arg_idx]
        args = []
        for i in arg_idx:                   # moved to the device once, kept in their slots (as a region's inputs)
            x = slots[i]
            if not pl.on_device(x):
                x = slots[i] = pl.to_device(x)
            args.append(x)
        return args

    def run(slots):
        steps = cf.data_length([slots[i].shape[0] for i in data_idx])
        if pl is not None and not steps:    # no step: nothing for the device to run
            stepwise(slots)
            return
        args = args_of(slots)
        try:
            res = (fn if pick is None else pick(args))(*args)
        except Exception as e:  # noqa: BLE001 - TVM raises many kinds: the step-by-step run names it
            _step_by_step(stepwise, slots, n, e)
            return
        calls[0] += 1
        for k, o in enumerate(outs):
            slots[o] = _item(res, k)
    return run


def _specialized_loop(ex, region, roles, fn):
    """``pick(args) -> function``: the compiled loop of the region's specialization for the sizes of `args`
    (a tuning log's, `Executor._specialized`; a data argument is the whole sequence, its row dims one axis
    further), else `fn`. None when the region has no specialization with a compiled loop."""
    specs = ex.specialized.get(region.attrs.name)
    if not specs:
        return None
    device = ex.pl is not None
    return pick_by_sizes(specs, region.subgraphs[0].inputs, lambda name: ex.vm[compiled_loop_name(name, device)],
                         fn, ex.calls, axis_shift=[role == "data" for role, _ in roles])


def pick_by_sizes(specs: list, inputs: list, lookup, fn, hits: list, axis_shift=None):
    """``pick(args) -> function`` over a region's specializations ``[(sizes of its symbols, name)]``: the
    function ``lookup(name)`` for the sizes the args have (each symbol read at its first place in the types
    of `inputs`, one axis further where `axis_shift` says so), else `fn`; a pick counts in ``hits[1]``. None
    when a symbol is not found in the inputs or no specialization has a function."""
    syms = list(specs[0][0])
    where = {}
    for i, v in enumerate(inputs):
        for ax, d in enumerate(v.type.shape):
            if isinstance(d, str) and d in syms:
                where.setdefault(d, (i, ax + bool(axis_shift and axis_shift[i])))
    if len(where) != len(syms):
        return None
    locs = [where[s] for s in syms]
    table = {}
    for combo, name in specs:
        try:
            table[tuple(int(combo[s]) for s in syms)] = lookup(name)
        except Exception:  # noqa: BLE001 - not in the library (a declined loop): the generic function runs
            pass
    if not table:
        return None

    def pick(args):
        f = table.get(tuple(args[i].shape[ax] for i, ax in locs))
        if f is None:
            return fn
        hits[1] += 1
        return f
    return pick


def _step_by_step(stepwise, slots, n: Node, cause: Exception) -> None:
    """A compiled loop failed: `stepwise` runs the loop again, raising the error a step-by-step run raises
    (the iteration, the op and its line); should the steps succeed, their result stands, with a warning."""
    stepwise(slots)
    warnings.warn(f"dyntvm: the compiled loop of {n.op} node {n.name!r} failed ({type(cause).__name__}: "
                  f"{str(cause).strip()[:200]}) where its steps run; the result comes from the step-by-step run",
                  RuntimeWarning, stacklevel=3)


def _loop_function(ex, plan):
    """The compiled loop function of `plan`'s region, or None (see `compiled_foreach`)."""
    if ex.validate or ex.profiling or ex.vm is None or plan is None:
        return None
    try:
        return ex.vm[compiled_loop_name(plan[0].attrs.name, ex.pl is not None)]
    except Exception:  # noqa: BLE001 - no such function: codegen declined this loop (or an older library)
        return None


def compiled_while(ex, n: Node, ins, outs, stepwise, cond_run, caps_of):
    """The while_loop as calls of its compiled loop (`ir.compiled_loop`), if the library has one: the
    condition for the first iteration is a region call, then each call runs up to `cap` iterations in TIR
    and returns how many it ran and whether the condition still holds; the loop continues from the final
    vars with a larger `cap` (chunks of stacked rows, joined at the end). Failures as in `compiled_foreach`.
    With a device placement (`caps_of` then gives the vars and the captures, moved to the device) it is
    the device loop: chunks of `_device_chunk` steps, one read of ``(count, go, failed checks)`` each, the
    chunks joined on the device."""
    plan = while_loop_plan(n)
    fn = _loop_function(ex, plan)
    if fn is None:
        return None
    region, roles, _ = plan
    pick = _specialized_loop(ex, region, roles, fn)
    a = n.attrs
    nv, has_t = a.num_vars, a.has_max_tensor
    n_ys = len(outs) - nv
    body = n.subgraphs[1]
    calls, pl = ex.calls, ex.pl
    if pl is None:
        read, truth, capacity, join, kept = to_numpy, first_truth, _while_capacity, _join_chunks, n_ys

        def args_of(slots):
            return [to_tvm(slots[i]) for i in ins[:nv]] + caps_of(slots)
    else:   # the device loop keeps every step's states too: they count in the bytes of a call
        read, truth, capacity, join, kept = pl.to_host, pl.first_truth, _device_chunk, pl.join_rows, n_ys + nv
        args_of = caps_of
    row_types = [v.type for v in body.outputs[:kept]]

    def run(slots):
        limit = cf.iteration_limit(slots[ins[nv]] if has_t else a.max_iterations, read)
        args = args_of(slots)
        vars_, consts = args[:nv], args[nv:]
        if (limit is not None and limit <= 0) or not truth(cond_run(vars_ + consts)):
            stacked = cf.empty_steps(body, [tuple(x.shape) for x in vars_ + consts], n_ys)
            for o, r in zip(outs, stacked + vars_):
                slots[o] = r
            return
        row_bytes = _row_bytes(row_types, body.inputs, vars_ + consts)
        chunks, it, go = [], 0, True
        try:
            while go and (limit is None or it < limit):
                cap = capacity(it, limit, row_bytes)
                loop_args = [vars_[k] if r == "state" else consts[k] for r, k in roles]
                res = (fn if pick is None else pick(loop_args))(*loop_args, ShapeTuple([cap]))
                calls[0] += 1
                count, go, *bad = (int(x) for x in read(_item(res, n_ys + nv)))
                if any(bad):                    # a GPU's run-time check failed (`compiled_loops._DeviceChecks`)
                    raise ValueError(f"a run-time check failed on {bad[0]} value(s)")
                chunks.append(([_item(res, k) for k in range(n_ys)], count))
                vars_ = [_item(res, n_ys + k) for k in range(nv)]
                it += count
        except Exception as e:  # noqa: BLE001 - TVM raises many kinds: the step-by-step run names it
            _step_by_step(stepwise, slots, n, e)
            return
        stacked = [join([(ys[k], count) for ys, count in chunks]) for k in range(n_ys)]
        for o, r in zip(outs, stacked + vars_):
            slots[o] = r
    return run


def _join_chunks(chunks: list) -> np.ndarray:
    """The first `count` rows of each ``(chunk, count)``, one after the other (one chunk: a view)."""
    if len(chunks) == 1:
        return _first_rows(*chunks[0])
    return np.concatenate([_first_rows(y, count) for y, count in chunks])


def _first_rows(y, count: int) -> np.ndarray:
    """The first `count` rows of a chunk's stacked output `y` ([cap, ...]). Rows of no elements (a dim 0) are made
    here: their chunk has _WHILE_UNSTACKED rows (nothing to allocate), a shape numpy need not view."""
    shape = tuple(y.shape)
    if 0 in shape[1:]:
        return np.empty((count,) + shape[1:], str(y.dtype))
    return to_numpy(y)[:count]


_WHILE_FIRST = 256              # a compiled while_loop's first call runs at most this many iterations
_WHILE_BYTES = 16 << 20         # and never allocates more than this for one call's stacked rows (at least a row)
_WHILE_UNSTACKED = 1 << 24      # iterations per call of a loop that stacks nothing (Python sees Ctrl-C between calls)


def _while_capacity(done: int, limit, row_bytes: int | None) -> int:
    """Rows for the next call of a compiled while_loop: _WHILE_FIRST, then as many as have run (the buffers
    double), within `limit` and _WHILE_BYTES (rows of unknown size: 16 at first; nothing stacked:
    _WHILE_UNSTACKED)."""
    if row_bytes == 0:                      # nothing stacked: long calls, Ctrl-C still seen between them
        cap = _WHILE_UNSTACKED
    else:
        cap = max(_WHILE_FIRST, done) if row_bytes is not None else max(16, done)
    if row_bytes:
        cap = min(cap, max(1, _WHILE_BYTES // row_bytes))
    return cap if limit is None else max(1, min(cap, limit - done))


def _row_bytes(types: list, inputs: list, args: list) -> int | None:
    """Bytes of one iteration's per-step outputs (`types`, over the symbols the body's `inputs` bind from the
    shapes of `args`); None when a dim is not known before the body runs."""
    env: dict = {}
    try:
        for v, x in zip(inputs, args):
            bind_symbols(v.type, tuple(x.shape), env)
        return sum(math.prod(eval_dim(d, env) for d in t.shape) * np.dtype(t.dtype).itemsize for t in types)
    except (KeyError, ValueError, TypeError):
        return None


# A device while_loop runs speculatively: a call of `cap` steps runs them all, those after the condition failed
# wasted (their kernels still launch), and the caller learns (count, go) by reading them to the host, which
# waits for the device to finish. Chunks of 1, 2, 4, 8, then 16 steps: the steps wasted past the end are fewer
# than the steps run (and at most 15), the reads about log2(steps) + steps / 16. A fixed large chunk would
# waste up to that many steps on a short loop (a greedy decode of a few tokens), a chunk of 1 is a read per
# step (what the step-by-step loop does). `max_iterations` is known on the host: no chunk runs past it.
_DEVICE_CHUNK_MAX = 16


def _device_chunk(done: int, limit, row_bytes: int | None) -> int:
    """Steps for the next call of a device while_loop (see above), within `limit` and _WHILE_BYTES of
    stacked rows and kept states per call."""
    cap = min(_DEVICE_CHUNK_MAX, done + 1)
    if row_bytes:
        cap = min(cap, max(1, _WHILE_BYTES // row_bytes))
    return cap if limit is None else max(1, min(cap, limit - done))
