"""Variable-length batches: an LSTM over a batch of sequences of different lengths, three ways.

    .venv/bin/python benchmarks/bench_varlen.py [--batch 16] [--steps 64] [--rounds 7] [--repeat 20] [--seed 0]
                                                [--overhead]

The bundled LSTM's weights (`examples/lstm.py`: input 128, hidden 256), a batch of B sequences padded to T
steps, lengths drawn uniformly from 1..T (seeded). Compiled with dyntvm, each:

  (a) padded:        plain `F.foreach` over all T steps for every row (the bundled example);
  (b) valid_length:  `F.foreach(..., valid_length=lengths)`: each step runs only the rows still active
                     (rows in the given, unsorted order: the active rows are gathered), and
                     (b') the same with the batch already sorted by length, descending (active rows: a prefix);
  (c) bucketing:     rows sorted by length and split into 4 buckets, each run padded to its own longest length
                     with model (a), results scattered back (the sort, gathers and scatters are timed too).

Measured interleaved in one process (a, b, b', c, a, b, ... for `--rounds` rounds), each a median over `--repeat`
calls; prints the median and the best (minimum) over rounds, each with the speed-up against (a)'s (the best is
the steadier number on a machine that other work loads). Checks (b), (b') and (c) against (a)'s rows up
to each row's length (outputs, and final h = (a)'s output at the row's last step). `--overhead` adds the
executor's cost per step of a trivial body with and without valid_length. Not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dyntvm as dt  # noqa: E402
from bench_models import median_time  # noqa: E402
from dyntvm import F  # noqa: E402
from dyntvm.examples import lstm as ex  # noqa: E402


def lstm_valid_length(xs, h0, c0, lengths):
    """The bundled LSTM, with a length per batch row."""
    def step(x, states):
        h, c = states
        i, f, g, o = F.split(F.matmul(x, ex.W) + F.matmul(h, ex.U) + ex.b, 4, axis=-1)
        c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
        h = F.sigmoid(o) * F.tanh(c)
        return h, [h, c]
    hs, (h, _c) = F.foreach(step, xs, [h0, c0], valid_length=lengths)
    return hs, h


def bucketed(padded, xs, h0, c0, lengths, buckets=4):
    """Sort rows by length, run each bucket padded to its own longest length, scatter back."""
    T, B = xs.shape[:2]
    order = np.argsort(-lengths, kind="stable")
    hs = np.zeros((T, B, ex.HIDDEN), np.float32)
    h = np.empty((B, ex.HIDDEN), np.float32)
    for rows in np.array_split(order, buckets):
        if not len(rows):
            continue
        n = int(lengths[rows].max())
        part_hs, _ = padded(np.ascontiguousarray(xs[:n, rows]), h0[rows], c0[rows])
        own = lengths[rows]
        mask = np.arange(n)[:, None] < own[None, :]          # zero the steps past each row's length
        hs[:n, rows] = part_hs * mask[:, :, None]
        h[rows] = part_hs[own - 1, np.arange(len(rows))] if n else h0[rows]
    return hs, h


def check(name, got, want_hs, lengths, h0):
    hs, h = got
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(hs[:n, b], want_hs[:n, b], rtol=1e-4, atol=1e-5, err_msg=f"{name} row {b}")
        assert not hs[n:, b].any(), f"{name}: row {b} has non-zero outputs past its length"
        np.testing.assert_allclose(h[b], want_hs[n - 1, b] if n else h0[b], rtol=1e-4, atol=1e-5,
                                   err_msg=f"{name} final h of row {b}")


def overhead(rounds: int) -> None:
    """Executor cost per step of a trivial body (T=1000, B=16): plain foreach vs valid_length, in us per step
    run (minimum over calls, interleaved)."""
    def scan(xs, s):
        return F.foreach(lambda x, st: (x, [st[0] + x]), xs, [s])

    def scan_vl(xs, s, n):
        return F.foreach(lambda x, st: (x, [st[0] + x]), xs, [s], valid_length=n)
    S = dt.TensorSpec
    plain = dt.compile(scan, S(("T", "B", 4)), S(("B", 4)))
    vl = dt.compile(scan_vl, S(("T", "B", 4)), S(("B", 4)), S(("B",), "int64"))
    T, B = 1000, 16
    xs, s = np.ones((T, B, 4), np.float32), np.zeros((B, 4), np.float32)
    rng = np.random.default_rng(0)
    some = rng.integers(T // 2, T + 1, B)
    some[0] = T
    cases = {"plain foreach": (plain, (xs, s), T), "valid_length, all T": (vl, (xs, s, np.full(B, T)), T),
             "valid_length, T/2..T sorted": (vl, (xs, s, np.sort(some)[::-1].copy()), T),
             "valid_length, T/2..T unsorted": (vl, (xs, s, some), T)}
    best = {k: float("inf") for k in cases}
    for _ in range(rounds):
        for k, (m, args, steps) in cases.items():
            for _ in range(5):
                t0 = time.perf_counter()
                m(*args)
                best[k] = min(best[k], (time.perf_counter() - t0) / steps)
    print("executor cost per step, trivial body, B=16 (us): " + ", ".join(f"{k} {v * 1e6:.2f}" for k, v in best.items()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overhead", action="store_true", help="also the executor cost per step of a trivial body")
    args = p.parse_args()
    B, T = args.batch, args.steps
    rng = np.random.default_rng(args.seed)
    xs, h0, c0 = ex.make_inputs(rng, T=T, B=B)
    h0 = rng.standard_normal(h0.shape).astype(np.float32) * 0.1
    lengths = rng.integers(1, T + 1, B).astype(np.int64)
    order = np.argsort(-lengths, kind="stable")
    xs_s, h0_s, c0_s, len_s = np.ascontiguousarray(xs[:, order]), h0[order], c0[order], lengths[order]

    padded = dt.compile(ex.lstm, *ex.EXAMPLE.specs)
    varlen = dt.compile(lstm_valid_length, *ex.EXAMPLE.specs, dt.TensorSpec(("B",), "int64", name="lengths"))
    cases = {
        "(a) padded": lambda: padded(xs, h0, c0),
        "(b) valid_length, unsorted rows": lambda: varlen(xs, h0, c0, lengths),
        "(b') valid_length, rows sorted": lambda: varlen(xs_s, h0_s, c0_s, len_s),
        "(c) bucketing, 4 buckets": lambda: bucketed(padded, xs, h0, c0, lengths),
    }
    want_hs = cases["(a) padded"]()[0]
    check("(b)", cases["(b) valid_length, unsorted rows"](), want_hs, lengths, h0)
    check("(b')", cases["(b') valid_length, rows sorted"](), want_hs[:, order], len_s, h0_s)
    check("(c)", cases["(c) bucketing, 4 buckets"](), want_hs, lengths, h0)

    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for k, fn in cases.items():
            times[k].append(median_time(fn, repeat=args.repeat, min_time=0.05))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"LSTM (input {ex.INPUT}, hidden {ex.HIDDEN}), B={B}, T={T}, lengths uniform in 1..{T} (seed {args.seed}): "
          f"mean {lengths.mean():.1f}, max {lengths.max()}; {int(lengths.sum())} of {B * T} row-steps are real; "
          f"load average {load:.1f}")
    base, base_min = statistics.median(times["(a) padded"]), min(times["(a) padded"])
    print(f"{'variant':<36} {'median ms':>10} {'speed-up':>9} {'best ms':>9} {'speed-up':>9}")
    for k, ts in times.items():
        m, b = statistics.median(ts), min(ts)
        print(f"{k:<36} {m * 1e3:>10.3f} {base / m:>8.2f}x {b * 1e3:>9.3f} {base_min / b:>8.2f}x")
    print("correctness: (b), (b') and (c) equal (a) on every row up to its length; zeros past it")
    if args.overhead:
        overhead(args.rounds)


if __name__ == "__main__":
    main()
