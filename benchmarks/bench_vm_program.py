"""A/B in one process: each model's plain call through the VM program vs the executor (the same library and
inputs), interleaved rounds; per-call microseconds (min and median of the rounds).

    python benchmarks/bench_vm_program.py [rounds]       # branchy B1, B16, detection N200
"""
import sys, time
import numpy as np
import dyntvm as dt
from dyntvm import examples

rows = [("branchy", {"B": 1}), ("branchy", {"B": 16}), ("detection", {"N": 200})]
rounds, calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5, 2000
for name, sizes in rows:
    ex = examples.get(name)
    m = dt.compile(ex.fn, *ex.specs)
    inputs = ex.make_inputs(np.random.default_rng(0), **sizes)
    m(*inputs)
    exe = m._threads.executor
    prog = exe.program
    assert prog is not None, m.vm_program_fallback

    def per_call():
        t0 = time.perf_counter()
        for _ in range(calls):
            m(*inputs)
        return (time.perf_counter() - t0) / calls * 1e6
    res = {"vm program": [], "executor": []}
    for _ in range(rounds):
        exe.program = prog
        res["vm program"].append(per_call())
        exe.program = None
        res["executor"].append(per_call())
    exe.program = prog
    print(name, sizes, "  ".join(f"{k}: min {min(v):.1f} us, median {sorted(v)[len(v) // 2]:.1f} us"
                                 for k, v in res.items()), flush=True)
