"""What the tuner and the checks of a log share about one kernel: MetaSchedule's task for it, random inputs
to run it on, the target kind, and the warning a log that cannot be applied gives. (`tuning.py` tunes and
applies logs, `tuning_trust.py` checks them; both import this.)"""
from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx


class TuningWarning(UserWarning):
    """A tuning log that cannot be applied (corrupt, another model or target): the default kernels are used."""


def task_func(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """What MetaSchedule tunes for `func`: the same kernel with every ``Let`` expression inlined (our fast
    exp / tanh / sigmoid bind intermediate values with ``Let``, which MetaSchedule's analyses refuse: "Do not
    have a default for prim.Let"). One op's formula per block before scheduling, so the expansion stays small."""
    bound: dict = {}

    def let(e, m):
        bound[e.var.__chandle__()] = m.mutate(e.value)
        return m.mutate(e.body)
    body = tvm_ffi.structural_mutate(func.body, [(tirx.Let, let),
                                                 (tirx.Var, lambda v, m: bound.get(v.__chandle__(), v))])
    return func if body.same_as(func.body) else func.with_body(body)


def _as_main(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_attr("global_symbol", "main")


def _main_mod(func: tirx.PrimFunc) -> tvm.IRModule:
    return tvm.IRModule({"main": _as_main(func)})


def workload_key(func: tirx.PrimFunc) -> str:
    """A kernel's key in a tuning log: the structural hash of the PrimFunc (as ``main``)."""
    return f"{tvm_ffi.structural_hash(_as_main(func)) & (2 ** 64 - 1):016x}"


def random_tensor(shape: list, dtype: str, rng, dev, index_bound: int | None = None):
    """A tensor of random values on `dev`: 0 / 1 for integers and bools; in [0, index_bound) for the indices
    of an axis of `index_bound` elements (`index_bounds`; 0 for an empty axis, where no index is valid)."""
    if dtype == "bool":
        a = rng.integers(0, 2, shape).astype(bool)
    elif np.dtype(dtype).kind in "iu":
        a = rng.integers(0, 2 if index_bound is None else max(index_bound, 1), shape).astype(dtype)
    else:
        a = rng.standard_normal(shape).astype(dtype)
    return tvm.runtime.tensor(a, dev)


def index_bounds(func: tirx.PrimFunc) -> dict:
    """``{parameter position: n}`` for each integer parameter a kernel reads as an index into an axis of `n`
    elements (a take's or gather's indices, ``x[i, idx[j]]``), the smallest such axis where it indexes several.
    The kernel reads there unchecked (the region checks the indices in a kernel before it), so its timing
    inputs must be in range: a random 1 into an axis of one element read past the buffer (review 33 #18)."""
    params = list(func.params)
    bounds: dict = {}

    def indexed(access):
        target = access.buffer if isinstance(access, tirx.BufferStore) else access.source
        for axis, index in enumerate(access.indices):
            def as_index(load, n=target.shape[axis]):
                pos = next((k for k, p in enumerate(params) if p.same_as(load.source)), None)
                if pos is not None and isinstance(n, tirx.IntImm) and np.dtype(str(load.source.dtype)).kind in "iu":
                    bounds[pos] = min(bounds.get(pos, int(n)), int(n))
            tvm_ffi.structural_walk(index, [(_LOAD, as_index)])
    tvm_ffi.structural_walk(func.body, [((_LOAD, tirx.BufferStore), indexed)])
    return bounds


_LOAD = tvm.ir.TensorLoad        # what `tirx.BufferLoad` makes (the name is a function)


def _random_args(func: tirx.PrimFunc, dev, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)               # buffers (static shapes: `static_kernels`)
    bounds = index_bounds(func)
    return [random_tensor([int(d) for d in p.shape], str(p.dtype), rng, dev, bounds.get(k))
            for k, p in enumerate(func.params)]
