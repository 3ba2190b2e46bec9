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


def random_tensor(shape: list, dtype: str, rng, dev):
    """A tensor of random values on `dev`: 0 / 1 for integers and bools (valid indices for gathers)."""
    if dtype == "bool":
        a = rng.integers(0, 2, shape).astype(bool)
    elif np.dtype(dtype).kind in "iu":
        a = rng.integers(0, 2, shape).astype(dtype)
    else:
        a = rng.standard_normal(shape).astype(dtype)
    return tvm.runtime.tensor(a, dev)


def _random_args(func: tirx.PrimFunc, dev, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)               # buffers (static shapes: `static_kernels`)
    return [random_tensor([int(d) for d in p.shape], str(p.dtype), rng, dev) for p in func.params]
