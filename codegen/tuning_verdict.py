"""Whether a tuned schedule is kept: tuning that never makes the model slower.

A kernel timed alone can look faster tuned and still slow the model down (another kernel's data leaves the
cache, a parallel loop fights the next one, the machine was busy while one of the two was timed). So after
MetaSchedule finds a schedule, the *region* the kernel runs in is built twice in this process, every kernel
with our default schedule, and the same with the tuned kernel in place (`region_verdict`); on CUDA, or where
the region cannot be run on random inputs, the two kernels alone (`kernel_verdict`). The two are timed
interleaved, A B B A ..., each sample the mean time of the calls that fill `SAMPLE_MS`, so a load that comes and
goes hits both alike, until the difference is outside the noise (`decide`):

* **kept** when, after at least `MIN_ROUNDS` alternations, the tuned kernel was the faster one of its round
  in so many rounds that a fair coin would give that few losses with probability below `ALPHA` (a one-sided
  sign test on the rounds: each round's two samples are taken back to back, so a drift of the machine's
  speed cancels out), and the tuned median is at least `MIN_GAIN` below the default's;
* **rejected as slower** when the same test says the default was the faster one (and its median is lower);
* **rejected, no significant difference** when neither holds after `MAX_ROUNDS` alternations.

The test is repeated after every round, so its overall false-positive rate is above `ALPHA`: with equal
kernels under spiky noise ~2.5% are kept (`tests/test_tuning_verdict.py` counts it), which costs nothing; a
10% gain is found ~80% of the time, a 2x one always, after 7 rounds.

A rejected schedule stays in the database (it is what MetaSchedule found) but the manifest records
``use: "default"`` and why (``rejected``): `dt.compile` builds the default kernel.

`check_load` compares the load average with the cores before a tune: a busy machine makes every timing
noisier (more schedules rejected for no significant difference; a kernel-alone timing even wrong).
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import CompileError
from .backends import backend_of
from .tuning_task import TuningWarning, _random_args, random_tensor, workload_key

MIN_ROUNDS = 7          # alternations before any decision (6 of 6 won gives p = 1/64, above ALPHA)
MAX_ROUNDS = 40         # then "no significant difference"
ALPHA = 0.01            # the sign test's level at each check (equal timings: ~2.5% kept over the 40 checks)
MIN_GAIN = 0.02         # a kept schedule is at least 2% faster (median): less is not worth a specialization
SAMPLE_MS = 4           # each sample: as many calls as fill this (TVM's min_repeat_ms)
BUSY_LOAD = 0.5         # load average per core above which the machine counts as busy ($DYNTVM_TUNE_BUSY_LOAD)


@dataclass
class Verdict:
    use: str                    # "tuned" or "default"
    reason: str                 # why, in words (the manifest's ``rejected`` when not kept)
    compared: str               # "region <name>" or "kernel alone"
    rounds: int
    default_median_us: float
    tuned_median_us: float

    def record(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def sign_test(wins: int, losses: int) -> float:
    """One-sided sign test: the probability that a fair coin gives at least `wins` heads in ``wins + losses``
    tosses (ties are left out)."""
    n = wins + losses
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def decide(default: list, tuned: list) -> str | None:
    """"tuned", "default" (the tuned one clearly slower), or None while the difference is inside the noise:
    the rule of this module's docstring over the rounds so far (``default[i]``, ``tuned[i]``: round i)."""
    if min(len(default), len(tuned)) < MIN_ROUNDS:
        return None
    wins = sum(t < d for d, t in zip(default, tuned))
    losses = sum(t > d for d, t in zip(default, tuned))
    d50, t50 = float(np.median(default)), float(np.median(tuned))
    if sign_test(wins, losses) < ALPHA and t50 <= (1 - MIN_GAIN) * d50:
        return "tuned"
    if sign_test(losses, wins) < ALPHA and t50 > d50:
        return "default"
    return None


def interleaved(time_default, time_tuned, compared: str) -> Verdict:
    """Alternate the two timers (each returns the seconds of one call) until `decide` says, at most
    `MAX_ROUNDS` times; the order flips every round (A B, B A, ...) so neither always runs first."""
    samples = {"default": [], "tuned": []}
    timers = [("default", time_default), ("tuned", time_tuned)]
    use, rounds = None, 0
    while use is None and rounds < MAX_ROUNDS:
        for name, timer in (timers if rounds % 2 == 0 else timers[::-1]):
            samples[name].append(timer())
        rounds += 1
        use = decide(samples["default"], samples["tuned"])
    d50, t50 = (float(np.median(samples[k])) * 1e6 for k in ("default", "tuned"))
    times = f"{t50:.2f} us tuned, {d50:.2f} us default (medians of {rounds} alternations, {compared})"
    if use is None:
        use, reason = "default", f"no significant difference: {times}"
    else:
        reason = f"{'faster' if use == 'tuned' else 'slower'}: {times}"
    return Verdict(use, reason, compared, rounds, d50, t50)


def _timer(vm_or_lib, name: str, dev, args):
    evaluate = vm_or_lib.time_evaluator(name, dev, number=1, repeat=1, min_repeat_ms=SAMPLE_MS)
    evaluate(*args)                                         # warm up: first-touch of the buffers, the thread pool
    return lambda: float(evaluate(*args).mean)


def kernel_verdict(default, tuned, target) -> Verdict:
    """The default and tuned kernel (PrimFuncs) built in one library and timed alone, interleaved."""
    import tvm
    with target:
        lib = tvm.compile(tvm.IRModule({n: f.with_attr("global_symbol", n)
                                        for n, f in (("default", default), ("tuned", tuned))}), target=target).jit()
    dev = backend_of(target).tuning_device()
    args = _random_args(default, dev)
    return interleaved(_timer(lib, "default", dev, args), _timer(lib, "tuned", dev, args), "kernel alone")


def _region_args(func, dev) -> list | None:
    """Random inputs for a built region function of static tensor parameters; None when it has another kind."""
    import tvm
    from tvm import relax
    rng = np.random.default_rng(0)
    args = []
    for p in func.params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr) or \
                not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
            return None
        args.append(random_tensor([int(d) for d in ty.shape.values], str(ty.dtype), rng, dev))
    return args


def region_verdict(region: tuple, key: str, tuned, target) -> Verdict | None:
    """The region ``(name, graph)`` that calls kernel `key` built with every kernel's default schedule, and
    again with `tuned` in place of that kernel, both timed interleaved in this process (CPU). None when the
    region cannot be timed that way (a parameter that is not a static tensor, the kernel not found in it, a
    run that fails on random inputs): the caller compares the kernels alone."""
    from tvm import relax

    from .relax_builder import build_module
    name, graph = region
    mod = build_module([(name, graph)])
    placed = []

    def in_place(func):
        if workload_key(func) == key:
            placed.append(func)
            return tuned
        return None
    try:
        backend = backend_of(target)
        built = {"default": backend.build(mod, target), "tuned": backend.build(mod, target, tuned=in_place)}
    except Exception:  # noqa: BLE001 - a region that does not build with the tuned kernel: compare kernels
        return None
    if not placed:
        return None
    dev = backend_of(target).tuning_device()
    vms = {k: relax.VirtualMachine(ex, dev) for k, ex in built.items()}
    args = _region_args(mod[name], dev)
    if args is None:
        return None
    try:
        timers = [_timer(vms[k], name, dev, args) for k in ("default", "tuned")]
    except Exception:  # noqa: BLE001 - e.g. a run-time check failing on random inputs
        return None
    return interleaved(*timers, f"region {name}")


def keep_or_reject(key: str, default, tuned, target, region: tuple | None) -> Verdict:
    """The verdict on a tuned kernel: in its region where it can be (CPU), else the two kernels alone."""
    if region is not None and backend_of(target).region_timing:
        verdict = region_verdict(region, key, tuned, target)
        if verdict is not None:
            return verdict
    return kernel_verdict(default, tuned, target)


def busy_load(value=None) -> float:
    """The load average per core above which a tune warns: `value`, else $DYNTVM_TUNE_BUSY_LOAD, else
    `BUSY_LOAD`."""
    raw = value if value is not None else os.environ.get("DYNTVM_TUNE_BUSY_LOAD", BUSY_LOAD)
    try:
        limit = float(raw)
    except (TypeError, ValueError):
        raise CompileError(f"tune: the busy load must be a number (load average per core), got {raw!r}") from None
    if not limit > 0:
        raise CompileError(f"tune: the busy load must be > 0 (load average per core), got {raw!r}")
    return limit


def check_load(limit: float, refuse: bool) -> dict:
    """The 1-minute load average against `limit` x the cores: a TuningWarning when above (a CompileError
    when `refuse`). Returns what the manifest records."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):               # not on this OS: nothing to check
        return {"load": None}
    cores = os.cpu_count() or 1
    record = {"load": round(load, 2), "cores": cores, "busy_load": limit}
    if load > limit * cores:
        msg = (f"tune: the machine is busy: load average {load:.2f} on {cores} cores, above {limit:g} per core "
               "($DYNTVM_TUNE_BUSY_LOAD / busy_load=): timings are noisy, so fewer tuned schedules pass the in-place "
               "comparison; tune on an idle machine")
        if refuse:
            raise CompileError(msg + " (refused: refuse_busy=True / --refuse-busy)")
        warnings.warn("dyntvm " + msg, TuningWarning, stacklevel=3)
        record["busy"] = True
    return record
