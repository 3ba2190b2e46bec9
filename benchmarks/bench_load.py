"""Cold-start cost of a deployed artifact: `import tvm` alone vs `dt.load(art)` + the first call.

Each measurement is a fresh Python process (so nothing is imported or cached in memory yet); the
numbers are medians over --runs processes. numpy is imported before the clock starts in both.
Target: load + first call within 0.5 s of `import tvm`.

    .venv/bin/python benchmarks/bench_load.py                     # compiles the detection example first
    .venv/bin/python benchmarks/bench_load.py --artifact m.dtvm --example detection
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

IMPORT_TVM = """
import time, json
import numpy                      # imported before the clock in both processes, so the two compare
t0 = time.perf_counter()
import tvm
print(json.dumps({"import_tvm": time.perf_counter() - t0}))
"""

LOAD_AND_CALL = """
import time, json, sys
t0 = time.perf_counter()
import numpy as np
t_np = time.perf_counter()
inputs = [np.load(p, allow_pickle=False) for p in sys.argv[2:]]
t1 = time.perf_counter()
import dyntvm as dt
model = dt.load(sys.argv[1])
t2 = time.perf_counter()
model(*inputs)
t3 = time.perf_counter()
model(*inputs)
t4 = time.perf_counter()
mods = [m for m in sys.modules if m.startswith(("dyntvm.frontend", "dyntvm.partition", "dyntvm.codegen", "dyntvm.pipeline"))]
print(json.dumps({"numpy_and_inputs": t1 - t0, "load": t2 - t1, "first_call": t3 - t2, "second_call": t4 - t3,
                  "total": t3 - t_np, "compiler_modules": mods}))
"""


def fresh(code: str, *args) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def make_artifact(example: str, folder: str) -> str:
    import dyntvm as dt
    from dyntvm import examples
    ex = examples.get(example)
    model = dt.compile(ex.fn, *ex.specs)
    path = os.path.join(folder, f"{example}.dtvm")
    model.save(path)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", help="artifact to load (default: compile --example into a temp folder)")
    p.add_argument("--example", default="detection", help="example whose inputs (and model) to use")
    p.add_argument("--runs", type=int, default=7, help="fresh processes per measurement (default 7)")
    args = p.parse_args()

    import numpy as np

    from dyntvm import examples
    with tempfile.TemporaryDirectory(prefix="dyntvm-bench-load-") as tmp:
        art = args.artifact or make_artifact(args.example, tmp)
        ex = examples.get(args.example)
        paths = []
        for i, a in enumerate(ex.make_inputs(np.random.default_rng(0), **ex.sizes)):
            paths.append(os.path.join(tmp, f"in{i}.npy"))
            np.save(paths[-1], a)
        fresh(IMPORT_TVM)                                   # warm the OS file cache once
        fresh(LOAD_AND_CALL, art, *paths)
        tvm_runs, load_runs = [], []
        for _ in range(args.runs):                          # interleaved, so machine load hits both alike
            tvm_runs.append(fresh(IMPORT_TVM)["import_tvm"])
            load_runs.append(fresh(LOAD_AND_CALL, art, *paths))

    med = {k: statistics.median(r[k] for r in load_runs)
           for k in ("numpy_and_inputs", "load", "first_call", "second_call", "total")}
    t_tvm = statistics.median(tvm_runs)
    beyond = med["load"] + med["first_call"] - t_tvm
    print(f"artifact: {art} (example {args.example}, sizes {ex.sizes}); medians of {args.runs} fresh processes")
    print(f"  import tvm alone              {t_tvm * 1e3:8.1f} ms   (after numpy)")
    print(f"  numpy + read inputs           {med['numpy_and_inputs'] * 1e3:8.1f} ms")
    print(f"  import dyntvm + dt.load(art)  {med['load'] * 1e3:8.1f} ms   (includes importing tvm)")
    print(f"  first call                    {med['first_call'] * 1e3:8.1f} ms")
    print(f"  second call                   {med['second_call'] * 1e3:8.1f} ms")
    print(f"  load + first call beyond `import tvm`: {beyond * 1e3:.1f} ms "
          f"({'within' if beyond < 0.5 else 'OVER'} the 500 ms target)")
    mods = sorted({m for r in load_runs for m in r["compiler_modules"]})
    print(f"  compiler modules imported by dt.load: {', '.join(mods) if mods else 'none'}")


if __name__ == "__main__":
    main()
