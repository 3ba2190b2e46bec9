"""Compiled dyntvm vs eager numpy on every bundled example, plus executor and matmul measurements.

    .venv/bin/python benchmarks/bench_models.py [--quick]

Prints medians (ms) side by side and the speed-up (eager / compiled). Not a test: numbers depend on
the machine; record them in benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import dyntvm as dt
from dyntvm import F, examples


def median_time(fn, *args, repeat=20, min_time=0.2, clock=time.perf_counter):
    """Median seconds of a call of `fn(*args)` on `clock` (`time.thread_time`: the calling thread's CPU time, for
    a model run at one thread on a busy machine)."""
    fn(*args)                                  # warm up
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < repeat or time.perf_counter() < t_end:
        t0 = clock()
        fn(*args)
        times.append(clock() - t0)
        if len(times) > 2000:
            break
    return statistics.median(times)


def row(name, eager_s, comp_s, extra=""):
    print(f"{name:<34} {eager_s * 1e3:>10.3f} {comp_s * 1e3:>10.3f} {eager_s / comp_s:>8.2f}x  {extra}")


CASES = [("lstm", dict(T=64, B=1)), ("lstm", dict(T=64, B=16)), ("decoder", dict(P=3)),
         ("detection", dict(N=200)), ("detection", dict(N=1000)), ("branchy", dict(B=8)),
         ("transformer", dict(B=1, S=128)), ("transformer", dict(B=4, S=33))]


def bench_examples(quick):
    print(f"{'model (sizes)':<34} {'eager ms':>10} {'dyntvm ms':>10} {'speedup':>9}")
    compile_times = {}
    for name, sizes in CASES:
        ex = examples.get(name)
        t0 = time.perf_counter()
        model = dt.compile(ex.fn, *ex.specs, use_cache=False)
        compile_times.setdefault(name, time.perf_counter() - t0)
        inputs = ex.make_inputs(np.random.default_rng(0), **sizes)
        e = median_time(ex.fn, *inputs, repeat=5 if quick else 20)
        c = median_time(model, *inputs, repeat=5 if quick else 20)
        row(f"{name} {sizes}", e, c)
    print("compile time (s, no cache): " + ", ".join(f"{k} {v:.1f}" for k, v in compile_times.items()))


def bench_foreach_overhead():
    """Per-iteration executor overhead: a trivial body, long sequence."""
    def scan(xs, s):
        return F.foreach(lambda x, st: (x, [st[0] + x]), xs, [s])
    model = dt.compile(scan, dt.TensorSpec(("T", 4)), dt.TensorSpec((4,)))
    s = np.zeros(4, "float32")
    for T in (1000,):
        xs = np.ones((T, 4), "float32")
        c = median_time(model, xs, s, repeat=10)
        e = median_time(scan, xs, s, repeat=10)
        row(f"foreach trivial body T={T}", e, c, f"{c / T * 1e6:.2f} us/iteration compiled")


def bench_matmul():
    print(f"{'matmul region':<34} {'numpy GF/s':>10} {'dyntvm GF/s':>11} {'ratio':>8}")
    for m, k, n in [(64, 256, 256), (256, 512, 512), (16, 256, 1024), (1, 256, 1024)]:
        w = np.random.default_rng(0).standard_normal((k, n)).astype("float32")
        model = dt.compile(lambda a: F.matmul(a, w), dt.TensorSpec(("M", k)))
        a = np.random.default_rng(1).standard_normal((m, k)).astype("float32")
        np.testing.assert_allclose(model(a), a @ w, rtol=1e-3, atol=1e-3)
        flops = 2 * m * k * n
        e = median_time(np.matmul, a, w, repeat=50)
        c = median_time(model, a, repeat=50)
        print(f"{f'{m}x{k}x{n} (M symbolic)':<34} {flops / e / 1e9:>10.1f} {flops / c / 1e9:>11.1f} "
              f"{e / c:>7.2f}x")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    import os
    import platform
    print(f"# dyntvm {dt.__version__} on {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {sys.version.split()[0]}, numpy {np.__version__}")
    bench_examples(args.quick)
    bench_foreach_overhead()
    bench_matmul()


if __name__ == "__main__":
    main()
