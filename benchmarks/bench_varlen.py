"""Variable-length batches: an LSTM over a batch of sequences of different lengths, three ways.

    .venv/bin/python benchmarks/bench_varlen.py [--batch 16] [--steps 64] [--rounds 7] [--repeat 20] [--seed 0]

The bundled LSTM's weights (`examples/lstm.py`: input 128, hidden 256), a batch of B sequences padded to T
steps, lengths drawn uniformly from 1..T (seeded). Compiled with dyntvm, each:

  (a) padded:        plain `F.foreach` over all T steps for every row (the bundled example);
  (b) valid_length:  `F.foreach(..., valid_length=lengths)`: each step runs only the rows still active
                     (rows in the given, unsorted order: the active rows are gathered), and
                     (b') the same with the batch already sorted by length, descending (active rows: a prefix);
  (c) bucketing:     rows sorted by length and split into 4 buckets, each run padded to its own longest length
                     with model (a), results scattered back (the sort, gathers and scatters are timed too).

Measured interleaved in one process (a, b, b', c, a, b, ... for `--rounds` rounds), each a median over `--repeat`
calls; prints the median over rounds and the speed-up against (a). Checks (b), (b') and (c) against (a)'s rows up
to each row's length (outputs, and final h = (a)'s output at the row's last step). Not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
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
    base = statistics.median(times["(a) padded"])
    print(f"{'variant':<36} {'median ms':>10} {'speed-up vs (a)':>16}")
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"{k:<36} {m * 1e3:>10.3f} {base / m:>15.2f}x")
    print("correctness: (b), (b') and (c) equal (a) on every row up to its length; zeros past it")


if __name__ == "__main__":
    main()
