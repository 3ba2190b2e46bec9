"""Benchmark: unscheduled Relax CPU pipeline vs codegen.cpu_schedule vs numpy.

Run from the repository root:

    .venv/bin/python benchmarks/bench_schedules.py [--quick]

Prints latency (and GFLOP/s where the FLOP count is meaningful) per case: the median of 5
time_evaluator repeats, best of --rounds rounds. The machine is shared, so every round first waits
for an idle CPU (--no-wait skips that) and warms up (an idle core runs ~2x slower for ~0.2 s).
TVM cases are all timed before numpy: OpenBLAS worker threads keep spinning after a numpy
matmul and slow the next TVM parallel kernels ~50x for a few hundred ms.
"""

from __future__ import annotations

import argparse
import os
import time

from dyntvm.codegen.cpu_schedule import build_cpu, cpu_target  # first: sets TVM_NUM_THREADS

import numpy as np  # noqa: E402  (after the import above, on purpose)
import tvm  # noqa: E402
from tvm import relax, tirx  # noqa: E402
from tvm.relax import op as R  # noqa: E402

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _func(bb, name, params, body_fn):
    with bb.function(name, params):
        with bb.dataflow():
            out = bb.emit_output(body_fn(*params))
        bb.emit_func_output(out)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def make_cases(quick: bool):
    """Returns [(label, module, fname, [numpy args], numpy_fn, flops)]."""
    cases = []

    for m, k, n in [(64, 256, 256), (16, 256, 1024), (256, 512, 512)]:
        bb = relax.BlockBuilder()
        a = relax.Var("a", relax.TensorType((m, k), "float32"))
        b = relax.Var("b", relax.TensorType((k, n), "float32"))
        _func(bb, "main", [a, b], R.matmul)
        args = [_rand(m, k), _rand(k, n)]
        cases.append((f"matmul {m}x{k}x{n}", bb.get(), "main", args, np.matmul, 2 * m * k * n))

    # GEMV with a symbolic M (the RNN batch) and a constant weight: one kernel for every M.
    w = _rand(256, 1024)
    bb = relax.BlockBuilder()
    mv = tirx.Var("M", "int64")
    x = relax.Var("x", relax.TensorType((mv, 256), "float32"))
    _func(bb, "main", [x], lambda x: R.matmul(x, relax.const(w, "float32")))
    gemv = bb.get()
    for m in (1, 16):
        cases.append((f"gemv Mx256x1024 M={m}", gemv, "main", [_rand(m, 256)],
                      lambda x: x @ w, 2 * m * 256 * 1024))

    # LSTM-cell-like fused region, hidden 256 (4 gates -> 1024 columns), symbolic batch.
    wx, wh, bias = _rand(256, 1024) * 0.05, _rand(256, 1024) * 0.05, _rand(1024)
    bb = relax.BlockBuilder()
    bv = tirx.Var("B", "int64")
    xx = relax.Var("x", relax.TensorType((bv, 256), "float32"))
    hh = relax.Var("h", relax.TensorType((bv, 256), "float32"))
    _func(bb, "cell", [xx, hh], lambda x, h: R.tanh(R.add(R.add(
        R.matmul(x, relax.const(wx, "float32")), R.matmul(h, relax.const(wh, "float32"))),
        relax.const(bias, "float32"))))
    cell = bb.get()
    for b in (1, 16):
        cases.append((f"lstm-cell tanh(xW+hU+b) B={b}", cell, "cell",
                      [_rand(b, 256), _rand(b, 256)],
                      lambda x, h: np.tanh(x @ wx + h @ wh + bias), 2 * b * 256 * 1024 * 2))

    # Row reductions over (n, 512), n symbolic.
    gamma, beta = _rand(512), _rand(512)
    bb = relax.BlockBuilder()
    nv = tirx.Var("n", "int64")
    y = relax.Var("y", relax.TensorType((nv, 512), "float32"))
    _func(bb, "softmax", [y], lambda y: R.nn.softmax(y, axis=-1))
    y2 = relax.Var("y", relax.TensorType((tirx.Var("n", "int64"), 512), "float32"))
    _func(bb, "layer_norm", [y2], lambda y: R.nn.layer_norm(
        y, relax.const(gamma, "float32"), relax.const(beta, "float32"), axes=[-1]))
    red = bb.get()

    def np_softmax(v):
        e = np.exp(v - v.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def np_layer_norm(v):
        mu = v.mean(-1, keepdims=True)
        return (v - mu) / np.sqrt(v.var(-1, keepdims=True) + 1e-5) * gamma + beta

    for n in ((1, 256) if quick else (1, 64, 1024)):
        cases.append((f"softmax ({n},512)", red, "softmax", [_rand(n, 512)], np_softmax, None))
        cases.append((f"layer_norm ({n},512)", red, "layer_norm", [_rand(n, 512)], np_layer_norm,
                      None))

    # A big elementwise chain with broadcasting (fused into one kernel).
    bb = relax.BlockBuilder()
    ev = relax.Var("e", relax.TensorType((tirx.Var("n", "int64"), 1024), "float32"))
    _func(bb, "main", [ev], lambda e: R.multiply(R.add(R.multiply(e, relax.const(bias, "float32")),
                                                       relax.const(1.0, "float32")),
                                                 R.maximum(e, relax.const(0.0, "float32"))))
    ew = bb.get()
    for n in (1, 1024):
        cases.append((f"elementwise (x*b+1)*relu(x) ({n},1024)", ew, "main", [_rand(n, 1024)],
                      lambda e: (e * bias + 1.0) * np.maximum(e, 0.0), None))
    return cases


def _cpu_idle_fraction(interval=0.5):
    def read():
        with open("/proc/stat", encoding="ascii") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        return vals[3] + vals[4], sum(vals)  # idle + iowait, total
    idle0, total0 = read()
    time.sleep(interval)
    idle1, total1 = read()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_idle(max_wait=600.0, need=0.9):
    """Blocks until the machine is ~idle (other processes skew every number on 2 cores)."""
    t0 = time.time()
    while time.time() - t0 < max_wait:
        if _cpu_idle_fraction() >= need:
            return True
        time.sleep(2.0)
    print(f"warning: machine still busy after {max_wait:.0f} s; timings are unreliable")
    return False


def time_vm(vm, fname, args, budget=0.25):
    """Median seconds per call via the VM's C++ time_evaluator, after a 0.3 s warm-up."""
    f = vm[fname]
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.3 or calls < 2:
        f(*args)
        calls += 1
    number = max(1, int(budget / 5 / ((time.perf_counter() - t0) / calls)))
    res = vm.time_evaluator(fname, tvm.cpu(), number=number, repeat=5)(*args)
    return float(np.median(res.results))


def time_np(fn, args, budget=0.25):
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.1 or calls < 2:
        fn(*args)
        calls += 1
    number = max(1, int(budget / 5 / ((time.perf_counter() - t0) / calls)))
    res = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(number):
            fn(*args)
        res.append((time.perf_counter() - t0) / number)
    return float(np.median(res))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter timing")
    parser.add_argument("--no-wait", action="store_true",
                        help="do not wait for an idle machine before each measurement")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many rounds")
    opts = parser.parse_args()
    budget = 0.1 if opts.quick else 0.25
    target = cpu_target()
    dev = tvm.cpu()
    print(f"target: {target}")
    print(f"TVM threads: {tvm.runtime.num_threads()}  numpy: {np.__version__}  "
          f"load average: {os.getloadavg()[0]:.2f} (numbers are only meaningful near 0)")

    cases = make_cases(opts.quick)
    refs = [np_fn(*args) for _, _, _, args, np_fn, _ in cases]  # numpy first: see module doc
    time.sleep(1.0)
    built: dict[int, tuple] = {}
    results = []
    for (label, mod, fname, args, _, flops), ref in zip(cases, refs):
        if id(mod) not in built:
            t0 = time.perf_counter()
            base_ex = tvm.compile(mod, target=target,
                                  relax_pipeline=relax.get_default_pipeline(target))
            t1 = time.perf_counter()
            ours_ex = build_cpu(mod, target)
            t2 = time.perf_counter()
            built[id(mod)] = (relax.VirtualMachine(base_ex, dev),
                              relax.VirtualMachine(ours_ex, dev), t1 - t0, t2 - t1)
        base_vm, ours_vm, _, _ = built[id(mod)]
        targs = [tvm.runtime.tensor(a, dev) for a in args]
        out = ours_vm[fname](*targs).numpy()
        ok = np.allclose(out, ref, rtol=1e-4, atol=1e-4)
        t_base = t_ours = float("inf")
        for _ in range(opts.rounds):
            if not opts.no_wait:
                wait_idle()
            t_base = min(t_base, time_vm(base_vm, fname, targs, budget))
            t_ours = min(t_ours, time_vm(ours_vm, fname, targs, budget))
        results.append([label, flops, t_base, t_ours, None, ok])
    time.sleep(1.0)  # let TVM's spinning workers go idle before OpenBLAS runs
    for row, (_, _, _, args, np_fn, _) in zip(results, cases):
        row[4] = float("inf")
        for _ in range(opts.rounds):
            if not opts.no_wait:
                wait_idle()
            row[4] = min(row[4], time_np(np_fn, args, budget))

    def fmt(t, flops):
        s = f"{t * 1e6:10.1f}"
        return s + (f" {flops / t / 1e9:7.1f}" if flops else " " * 8)

    print()
    print(f"{'case':40s} {'default us':>10s} {'GF/s':>7s} {'ours us':>10s} {'GF/s':>7s} "
          f"{'numpy us':>10s} {'GF/s':>7s} {'ours/np':>8s}  ok")
    for label, flops, t_base, t_ours, t_np, ok in results:
        print(f"{label:40s} {fmt(t_base, flops)} {fmt(t_ours, flops)} {fmt(t_np, flops)} "
              f"{t_np / t_ours:8.2f}  {'ok' if ok else 'MISMATCH'}")
    print()
    print("build seconds (default / ours):",
          ", ".join(f"{b:.2f}/{o:.2f}" for _, _, b, o in built.values()))


if __name__ == "__main__":
    main()
