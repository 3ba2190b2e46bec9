"""The LSTM example's step kernel alone (issue 24): the merged `fused_contraction` (h @ U + x_t W + b, the gates, c
and h) of the compiled foreach body, timed by TVM's `time_evaluator` (no Python per call), against numpy's h @ U
(OpenBLAS sgemv / sgemm, the matmul without the gates), interleaved in one process, thread CPU time.

    .venv/bin/python benchmarks/bench_lstm_step.py [--batch 1,16] [--rounds 9] [--number 200]

One thread (TVM, OpenBLAS). Each result is checked against an independent numpy step first. Not a test: numbers
depend on the machine and its load (docs/performance.md, "Matmul": where the LSTM's step time goes).
"""
from __future__ import annotations

import os

os.environ["TVM_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def step_kernel():
    """(scheduled PrimFunc, target) of the lstm example's step kernel, captured while compiling the example."""
    import dyntvm as dt
    from dyntvm import examples
    from dyntvm.codegen.backends.cpu import cpu_schedule
    got = {}
    orig = cpu_schedule._schedule_func

    def capture(func, target, name=""):
        new = orig(func, target, name)
        if name.startswith("fused_contraction"):
            got["func"], got["target"] = new, target
        return new
    cpu_schedule._schedule_func = capture
    try:
        lstm = examples.get("lstm")
        dt.compile(lstm.fn, *lstm.specs, cache_dir=tempfile.mkdtemp(prefix="bench-lstm-step-"))
    finally:
        cpu_schedule._schedule_func = orig
    if "func" not in got:
        raise SystemExit("the lstm step was not merged into one contraction kernel")
    return got["func"], got["target"]


def reference(h, U, xw, b, c):
    """One LSTM step in numpy: (c', h')."""
    z = h @ U + xw + b
    i, f, g, o = np.split(z, 4, axis=-1)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    c2 = sig(f) * c + sig(i) * np.tanh(g)
    return c2, sig(o) * np.tanh(c2)


def main():
    import tvm
    from dyntvm.examples.lstm import U, b
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", default="1,16")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--number", type=int, default=200, help="kernel calls per timed block")
    args = p.parse_args()
    from dyntvm.codegen.backends.cpu.cpu_prepack import packed_value
    from dyntvm.codegen.backends.cpu.cpu_schedule_matmul import PREPACKED
    func, target = step_kernel()
    packed = dict(func.attrs.get(PREPACKED) or {})
    nr = int(packed[1]) if 1 in packed else None      # U (parameter 1) packed at compile time: its panels
    U_arg = U if nr is None else packed_value(U, nr)
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    dev = tvm.cpu(0)
    rng = np.random.default_rng(0)
    print(f"# lstm step kernel vs numpy h @ U, 1 thread, thread CPU time, {args.rounds} rounds; load "
          f"{os.getloadavg()[0]:.1f}; U {'packed at compile time, panels of %d columns' % nr if nr else 'as given'}")
    for B in (int(x) for x in args.batch.split(",")):
        h, xw, c = (rng.standard_normal(s).astype("float32") for s in ((B, 256), (B, 1024), (B, 256)))
        arrays = [tvm.runtime.tensor(x, dev) for x in (h, U_arg, xw, b, c, np.zeros((B, 256), "float32"),
                                                           np.zeros((B, 256), "float32"))]
        lib["main"](*arrays)
        want_c, want_h = reference(h, U, xw, b, c)
        np.testing.assert_allclose(arrays[-2].numpy(), want_c, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(arrays[-1].numpy(), want_h, rtol=1e-4, atol=1e-5)
        ev = lib.time_evaluator("main", dev, number=args.number, repeat=1)
        Uc = U.copy()
        kern, blas = [], []
        for _ in range(args.rounds):
            t0 = time.thread_time()
            ev(*arrays)
            kern.append((time.thread_time() - t0) / args.number)
            t0 = time.thread_time()
            for _ in range(args.number):
                h @ Uc
            blas.append((time.thread_time() - t0) / args.number)
        k, n = statistics.median(kern), statistics.median(blas)
        flop = 2 * B * 256 * 1024
        print(f"B{B}: step kernel {k * 1e6:.1f} us ({flop / k / 1e9:.1f} GFLOP/s of its matmul), numpy h @ U "
              f"{n * 1e6:.1f} us ({flop / n / 1e9:.1f} GFLOP/s); kernel / numpy {k / n:.2f}")


if __name__ == "__main__":
    main()
