"""GEMM / batched-matmul regions (issue 24 item 2): dyntvm vs numpy (OpenBLAS), interleaved in one process.

    .venv/bin/python benchmarks/bench_gemm.py [--rounds 7] [--threads 2] [--only 2048x512x512] [--clock cpu]

Each case is one compiled region (`dt.compile` of a matmul with a constant weight and a symbolic row count M, as
a model's projection; or a batched matmul of two inputs). Per round: dyntvm, then numpy, then a pause (OpenBLAS's
worker threads keep spinning after a call and would slow the next TVM parallel kernel); the table prints the
median over rounds of each round's median call, as GFLOP/s, and the load average before and after. Every result
is checked against numpy first. Not a test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from thread_env import threads_from_argv  # noqa: E402

THREADS = threads_from_argv(sys.argv, 2)

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import dyntvm as dt  # noqa: E402
from dyntvm import F  # noqa: E402

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


CHECK = {}  # label -> the reference to check against where it differs from the timed numpy expression


def _gelu_erf(v):
    import math
    return (0.5 * v * (1 + np.frompyfunc(math.erf, 1, 1)(v / np.sqrt(2)).astype(np.float64))).astype("float32")


def _cases():
    """[(label, compiled model, numpy fn, args, flops)]."""
    cases = []
    for m, k, n in [(128, 512, 512), (2048, 512, 512), (2048, 128, 384), (16, 256, 1024), (1, 512, 512),
                    (33, 100, 70)]:
        w = _rand(k, n)
        model = dt.compile(lambda a, w=w: F.matmul(a, w), dt.TensorSpec(("M", k)), use_cache=False)
        cases.append((f"{m}x{k}x{n} (M sym)", model, lambda a, w=w: a @ w, [_rand(m, k)], 2 * m * k * n))
    # a projection with its bias + GELU epilogue (the transformer's FFN), M = B * S symbolic
    m, k, n = 2048, 128, 512
    w, b = _rand(k, n), _rand(n)
    model = dt.compile(lambda a: F.gelu(F.matmul(a, w) + b), dt.TensorSpec(("M", k)), use_cache=False)
    # timed against numpy's tanh form of GELU (numpy has no vectorized erf); checked against the erf form
    gelu_tanh = lambda v: 0.5 * v * (1 + np.tanh(0.7978845608 * (v + 0.044715 * v ** 3)))  # noqa: E731
    cases.append((f"{m}x{k}x{n}+bias+gelu", model, lambda a: gelu_tanh(a @ w + b), [_rand(m, k)], 2 * m * k * n))
    CHECK[cases[-1][0]] = lambda a: _gelu_erf(a @ w + b)
    # batched matmul of two inputs (attention-like), batch symbolic
    bsz, m, k, n = 16, 128, 64, 128
    model = dt.compile(lambda a, c: F.matmul(a, c), dt.TensorSpec(("B", m, k)), dt.TensorSpec(("B", k, n)),
                       use_cache=False)
    cases.append((f"{bsz}x{m}x{k}x{n} batched", model, np.matmul, [_rand(bsz, m, k), _rand(bsz, k, n)],
                  2 * bsz * m * k * n))
    return cases


CLOCK = time.perf_counter


def _median_call(fn, args, min_time=0.15, min_calls=5):
    times, t_end = [], time.perf_counter() + min_time
    while len(times) < min_calls or time.perf_counter() < t_end:
        t0 = CLOCK()
        fn(*args)
        times.append(CLOCK() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--only", default="", help="run only the cases whose label contains this")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: the process's CPU time (all its threads), less disturbed by other processes on a "
                        "loaded machine; meaningful with --threads 1 (spinning pool threads count as busy)")
    args = p.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    load0 = os.getloadavg()
    cases = [c for c in _cases() if args.only in c[0]]
    for label, model, ref, inputs, _ in cases:
        want = CHECK.get(label, ref)(*inputs)
        np.testing.assert_allclose(np.asarray(model(*inputs)), want, rtol=2e-3, atol=2e-3 * np.abs(want).max(),
                                   err_msg=label)
    results = {c[0]: ([], []) for c in cases}
    for _ in range(args.rounds):
        for label, model, ref, inputs, _ in cases:
            model(*inputs)
            results[label][0].append(_median_call(model, inputs))
            results[label][1].append(_median_call(ref, inputs))
            time.sleep(0.1)
    print(f"# {args.threads} threads, {args.clock} clock, {args.rounds} rounds interleaved, load average before "
          f"{load0[0]:.2f} after {os.getloadavg()[0]:.2f}")
    print(f"{'case':<28} {'dyntvm ms':>10} {'numpy ms':>10} {'dyntvm GF/s':>12} {'numpy GF/s':>11} {'ratio':>7}")
    for label, _, _, _, flops in cases:
        d, n = (statistics.median(t) for t in results[label])
        print(f"{label:<28} {d * 1e3:>10.4f} {n * 1e3:>10.4f} {flops / d / 1e9:>12.1f} {flops / n / 1e9:>11.1f} "
              f"{d / n:>6.2f}x")


if __name__ == "__main__":
    main()
