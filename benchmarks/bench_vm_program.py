"""A/B in one process: each model's plain call through the VM program vs the executor (the same library and
inputs), interleaved rounds; per-call microseconds (min and median of the rounds).

    python benchmarks/bench_vm_program.py [rounds [names]]   # branchy B1, B16, detection N200 / N1000, lstm T64 B1 / B16, transformer,
                                                     # decoder (a while_loop without a compiled loop)

Every model gets its program ($DYNTVM_VM_PROGRAM=always: by default a program with Python callbacks is not used).
"""
import os
import sys
import time

import numpy as np

os.environ["DYNTVM_VM_PROGRAM"] = "always"
import dyntvm as dt  # noqa: E402
from dyntvm import examples  # noqa: E402

rows = [r for r in [("branchy", {"B": 1}), ("branchy", {"B": 16}), ("detection", {"N": 200}),
        ("detection", {"N": 1000}), ("lstm", {"T": 64, "B": 1}),
        ("lstm", {"T": 64, "B": 16}), ("transformer", {"B": 1, "S": 128}), ("decoder", {"P": 3}),
        ("decoder", {"P": 3, "max_steps": 256})]
        if len(sys.argv) < 3 or r[0] in sys.argv[2].split(",")]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
for name, sizes in rows:
    ex = examples.get(name)
    m = dt.compile(ex.fn, *ex.specs)
    inputs = ex.make_inputs(np.random.default_rng(0), **sizes)
    m(*inputs)
    exe = m._threads.executor
    prog = exe.program
    assert prog is not None, m.vm_program_fallback

    t0 = time.perf_counter()
    m(*inputs)
    calls = max(20, min(2000, int(0.3 / max(time.perf_counter() - t0, 1e-6))))     # ~0.3 s per block

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
