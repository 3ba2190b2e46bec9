"""Cost per node inside the VM program (issue 25: "well under 1 us per node"): chains of N cheap nodes on a
tiny tensor, timed as one call of the program (inputs made once, no Python around the call) and through the
executor, in one process, interleaved; the cost per node is the difference between N = LONG and N = 1, over
LONG - 1.

    python benchmarks/bench_vm_nodes.py [rounds] [--threads 1] [--thread-time]

``--thread-time``: the calling thread's CPU time instead of wall time (less noise on a busy machine; the VM
program runs its kernels on the calling thread at one thread).

Chains (x: float32[4]; each link depends on the previous one, so nothing merges):
* cond:  x = cond(sum(x) > 0, x + 1, x - 1): per link a predicate region, an ``If`` and a branch region;
* mask:  x = boolean_mask(x, x > -1e30): per link a region (the comparison), the count and fill kernels;
* view:  x = reshape(boolean_mask(...)) is a region-free view: per link a view op outside regions (with a mask).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thread_env import threads_from_argv  # noqa: E402

threads_from_argv(sys.argv, 1)
os.environ["DYNTVM_VM_PROGRAM"] = "always"

import numpy as np  # noqa: E402

import dyntvm as dt  # noqa: E402
from dyntvm import F  # noqa: E402
from dyntvm.runtime.tensors import to_tvm  # noqa: E402

LONG = 64


def cond_chain(n):
    def fn(x):
        for _ in range(n):
            x = F.cond(F.sum(x) > 0, lambda v=x: v + 1.0, lambda v=x: v - 1.0)
        return x
    return fn


def mask_chain(n):
    def fn(x):
        for _ in range(n):
            x = F.boolean_mask(x, x > -1e30)
        return x
    return fn


def view_chain(n):
    def fn(x):
        x = F.boolean_mask(x, x > -1e30)
        for k in range(n):
            x = F.expand_dims(x, 0) if k % 2 == 0 else F.squeeze(x, 0)
        return x
    return fn


CLOCK = time.thread_time if "--thread-time" in sys.argv else time.perf_counter


def timed(f, calls):
    t0 = CLOCK()
    for _ in range(calls):
        f()
    return (CLOCK() - t0) / calls * 1e6


def main():
    argv = sys.argv[1:]
    positional = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] != "--threads")]
    rounds = int(positional[0]) if positional else 7
    x = np.linspace(0.5, 2.0, 4).astype(np.float32)
    for name, chain in (("cond", cond_chain), ("mask", mask_chain), ("view", view_chain)):
        fns = {}
        for n in (1, LONG):
            m = dt.compile(chain(n), dt.TensorSpec(("N",)))
            assert m.vm_program, m.vm_program_fallback
            np.testing.assert_allclose(m(x), chain(n)(x), rtol=1e-6)
            prog = m._threads.executor.program
            t = [to_tvm(x)]
            ex = m._threads.executor
            fns[n] = (lambda p=prog.fn, t=t: p(*t)), m, ex, prog
        res = {("program", n): [] for n in fns} | {("executor", n): [] for n in fns}
        for _ in range(rounds):
            for n, (call, m, ex, prog) in fns.items():
                res[("program", n)].append(timed(call, 400))
                ex.program = None
                res[("executor", n)].append(timed(lambda m=m: m(x), 100))
                ex.program = prog
        med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
        for side in ("program", "executor"):
            per = (med[(side, LONG)] - med[(side, 1)]) / (LONG - 1)
            print(f"{name:5s} {side:8s} N=1 {med[(side, 1)]:8.1f} us  N={LONG} {med[(side, LONG)]:8.1f} us  "
                  f"per link {per:6.2f} us (median of {rounds} rounds)", flush=True)


if __name__ == "__main__":
    main()
