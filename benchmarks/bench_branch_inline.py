"""A/B in one process: the VM program with regions copied into its ``If`` branches (the default, made safe by
`codegen/branch_storage.py`) vs the same program with its branch regions called (`_Lowering._branch` patched to
a sequence that does not copy them: the code before), built with use_cache=False; plain numpy as the peer.
Interleaved blocks of the calling thread's CPU time (one thread); per-call microseconds, min and median over
rounds, and the ratios copied / called and each / numpy.

    python benchmarks/bench_branch_inline.py [rounds]

Rows: branchy B=1 and B=16 (a case of a cond in its default branch), a chain of 64 conds (per link: the
difference to a chain of one, over 63), each from the program called directly (`bench_vm_nodes.py`'s way).
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thread_env import threads_from_argv  # noqa: E402

threads_from_argv(sys.argv, 1)
os.environ["DYNTVM_VM_PROGRAM"] = "always"

import numpy as np  # noqa: E402

import dyntvm as dt  # noqa: E402
from dyntvm import examples  # noqa: E402
from dyntvm.codegen import vm_program  # noqa: E402
from dyntvm.codegen.vm_seq import _Seq  # noqa: E402
from dyntvm.examples.plain_numpy import BY_EXAMPLE  # noqa: E402
from dyntvm.runtime.tensors import to_tvm  # noqa: E402
from bench_vm_nodes import cond_chain  # noqa: E402  (the same chain of conds as there)

COPIED = vm_program._Lowering._branch


def _called(self, g, args, parent):         # the branch code before: its regions called
    seq = _Seq(self.bb)
    return seq, self.graph(seq, g, args)


def build(fn, specs, copied: bool):
    vm_program._Lowering._branch = COPIED if copied else _called
    try:
        m = dt.compile(fn, *specs, use_cache=False)
    finally:
        vm_program._Lowering._branch = COPIED
    assert m.vm_program, m.vm_program_fallback
    return m


def block(f, calls: int) -> float:
    t0 = time.thread_time()
    for _ in range(calls):
        f()
    return (time.thread_time() - t0) / calls * 1e6


def direct(m, inputs):
    prog, t = m._threads.executor.program, [to_tvm(a) for a in inputs]
    return lambda: prog.fn(*t)


def main():
    rounds = int(next((a for a in sys.argv[1:] if a.isdigit()), "15"))
    fns = {}
    for name, sizes in (("branchy", {"B": 1}), ("branchy", {"B": 16})):
        ex = examples.get(name)
        inputs = ex.make_inputs(np.random.default_rng(0), **sizes)
        ref = BY_EXAMPLE[name]
        key = f"{name} {sizes}"
        for copied in (False, True):
            m = build(ex.fn, ex.specs, copied)
            for g, w in zip(m(*inputs), ref(*inputs)):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
            fns[(key, "copied" if copied else "called")] = direct(m, inputs)
        fns[(key, "numpy")] = lambda ref=ref, inputs=inputs: ref(*inputs)
    x = np.linspace(0.5, 2.0, 4).astype(np.float32)
    for n in (1, 64):
        for copied in (False, True):
            m = build(cond_chain(n), [dt.TensorSpec(("N",))], copied)
            np.testing.assert_allclose(m(x), cond_chain(n)(x), rtol=1e-6)
            fns[(f"cond x{n}", "copied" if copied else "called")] = direct(m, [x])
    times = {k: [] for k in fns}
    for r in range(rounds):
        keys = list(fns)
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            times[k].append(block(fns[k], 200))
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    for key in ("branchy {'B': 1}", "branchy {'B': 16}"):
        a, b, p = (key, "called"), (key, "copied"), (key, "numpy")
        print(f"{key:18s} called {med[a]:7.2f} / {low[a]:7.2f} us  copied {med[b]:7.2f} / {low[b]:7.2f} us  "
              f"numpy {med[p]:7.2f} us  copied/called {med[b] / med[a]:.2f} (min {low[b] / low[a]:.2f})  "
              f"vs numpy: called {med[a] / med[p]:.2f}, copied {med[b] / med[p]:.2f}", flush=True)
    for way in ("called", "copied"):
        per = (med[("cond x64", way)] - med[("cond x1", way)]) / 63
        per_min = (low[("cond x64", way)] - low[("cond x1", way)]) / 63
        print(f"cond link {way:7s} {per:6.2f} us (from mins {per_min:6.2f} us; median / min of {rounds} rounds)",
              flush=True)


if __name__ == "__main__":
    main()
