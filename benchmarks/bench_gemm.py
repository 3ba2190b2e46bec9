"""GEMM / batched-matmul regions (issue 24 item 2): dyntvm vs numpy (OpenBLAS), interleaved in one process.

    .venv/bin/python benchmarks/bench_gemm.py [--rounds 7] [--threads 2] [--only 2048x512x512] [--clock cpu] [--before]
    .venv/bin/python benchmarks/bench_gemm.py --models [--rounds 7]   # transformer / lstm examples vs peers

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
import contextlib  # noqa: E402
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


@contextlib.contextmanager
def _before_issue24():
    """The schedule before issue 24 item 2, rebuilt in this process for an interleaved comparison: tiles sized
    for TVM's reported 512-bit vectors / 32 registers on every x86 (AVX2 too), no packed weight panels."""
    from dyntvm.codegen.backends.cpu import cpu_sched_helpers, cpu_schedule
    saved = cpu_sched_helpers._isa_vectors, cpu_schedule.PACK_MIN_ROWS
    cpu_sched_helpers._isa_vectors, cpu_schedule.PACK_MIN_ROWS = (lambda _t: (512, 32)), 1 << 62
    try:
        yield
    finally:
        cpu_sched_helpers._isa_vectors, cpu_schedule.PACK_MIN_ROWS = saved


def _compile(before, fn, *specs):
    with _before_issue24() if before else contextlib.nullcontext():
        return dt.compile(fn, *specs, use_cache=False)


def _cases(before):
    """[(label, compiled model, numpy fn, args, flops)]; `before`: compiled as `_before_issue24`. The same
    weights and inputs on every call."""
    global RNG
    RNG = np.random.default_rng(0)
    cases = []
    for m, k, n in [(128, 512, 512), (2048, 512, 512), (2048, 128, 384), (16, 256, 1024), (1, 512, 512),
                    (33, 100, 70)]:
        w = _rand(k, n)
        model = _compile(before, lambda a, w=w: F.matmul(a, w), dt.TensorSpec(("M", k)))
        cases.append((f"{m}x{k}x{n} (M sym)", model, lambda a, w=w: a @ w, [_rand(m, k)], 2 * m * k * n))
    # a projection with its bias + GELU epilogue (the transformer's FFN), M = B * S symbolic
    m, k, n = 2048, 128, 512
    w, b = _rand(k, n), _rand(n)
    model = _compile(before, lambda a: F.gelu(F.matmul(a, w) + b), dt.TensorSpec(("M", k)))
    # timed against numpy's tanh form of GELU (numpy has no vectorized erf); checked against the erf form
    gelu_tanh = lambda v: 0.5 * v * (1 + np.tanh(0.7978845608 * (v + 0.044715 * v ** 3)))  # noqa: E731
    cases.append((f"{m}x{k}x{n}+bias+gelu", model, lambda a: gelu_tanh(a @ w + b), [_rand(m, k)], 2 * m * k * n))
    CHECK[cases[-1][0]] = lambda a: _gelu_erf(a @ w + b)
    # batched matmul of two inputs (attention-like), batch symbolic
    bsz, m, k, n = 16, 128, 64, 128
    model = _compile(before, lambda a, c: F.matmul(a, c), dt.TensorSpec(("B", m, k)), dt.TensorSpec(("B", k, n)))
    cases.append((f"{bsz}x{m}x{k}x{n} batched", model, np.matmul, [_rand(bsz, m, k), _rand(bsz, k, n)],
                  2 * bsz * m * k * n))
    return cases


CLOCK = time.perf_counter


def _model_cases():
    """The examples whose speed issue 24 names: transformer B1 / B16 at S 128 vs onnxruntime, lstm B16 T64 vs
    torch.nn.LSTM, lstm B1 T256 vs onnxruntime's LSTM op; [(label, {variant: callable}, inputs)]: dyntvm
    after / before, (transformer) its matmul epilogues unfused, (lstm) its recurrent weight packed per call
    instead of once at compile time, the peer."""
    import torch
    from dyntvm import examples
    from peers import lstm as peer_lstm
    from peers import transformer as peer_tf
    from peers.common import ort_session
    torch.set_num_threads(THREADS)
    rows = []
    tf, lstm = examples.get("transformer"), examples.get("lstm")
    sess = ort_session(peer_tf.onnx_layer(), THREADS)
    tf_models = {v: _compile(v == "before", tf.fn, *tf.specs) for v in ("after", "before")}
    from dyntvm.codegen.converters import nn as conv_nn
    conv_nn.FLAT_EPILOGUES = False      # the matmul's epilogue after the reshape back: a kernel of its own
    try:
        tf_models["unfused-epi"] = _compile(False, tf.fn, *tf.specs)
    finally:
        conv_nn.FLAT_EPILOGUES = True
    for b in (1, 16):
        x, mask = tf.make_inputs(np.random.default_rng(0), B=b, S=128)
        ort = lambda x, mask: sess.run(None, {"x": x, "mask": mask})[0]  # noqa: E731
        np.testing.assert_allclose(np.asarray(tf_models["after"](x, mask)), ort(x, mask), rtol=1e-3, atol=1e-3)
        rows.append((f"transformer B{b} S128", {**tf_models, "onnxruntime": ort}, (x, mask)))
    lstm_models = {v: _compile(v == "before", lstm.fn, *lstm.specs) for v in ("after", "before")}
    from dyntvm.codegen.backends.cpu import cpu_prepack
    cpu_prepack.PREPACK_WEIGHTS = False     # U copied into its panels per call, as before it was packed once
    try:
        lstm_models["unpacked-U"] = _compile(False, lstm.fn, *lstm.specs)
    finally:
        cpu_prepack.PREPACK_WEIGHTS = True
    inputs = lstm.make_inputs(np.random.default_rng(0), T=64, B=16)
    nn_lstm, targs = peer_lstm.torch_nn_lstm(inputs)

    def torch_lstm(*_):
        with torch.inference_mode():
            return nn_lstm(*targs)
    got, want = lstm_models["after"](*inputs), torch_lstm()
    np.testing.assert_allclose(np.asarray(got[0]), want[0].numpy(), rtol=1e-3, atol=1e-4)
    rows.append(("lstm B16 T64", {**lstm_models, "torch nn.LSTM": torch_lstm}, inputs))
    # batch 1: a GEMV per step, against onnxruntime's fused LSTM op
    inputs = lstm.make_inputs(np.random.default_rng(0), T=256, B=1)
    lstm_sess = ort_session(peer_lstm.onnx_lstm_op(), THREADS)
    ort_lstm = lambda xs, h0, c0: lstm_sess.run(None, {"xs": xs, "h0": h0, "c0": c0})  # noqa: E731
    np.testing.assert_allclose(np.asarray(lstm_models["after"](*inputs)[0]), ort_lstm(*inputs)[0], rtol=1e-3,
                               atol=1e-4)
    rows.append(("lstm B1 T256", {**lstm_models, "onnxruntime LSTM": ort_lstm}, inputs))
    return rows


def _run_models(rounds):
    load0 = os.getloadavg()
    rows = _model_cases()
    times = {label: {v: [] for v in fns} for label, fns, _ in rows}
    for _ in range(rounds):
        for label, fns, inputs in rows:
            for v, fn in fns.items():
                fn(*inputs)
                times[label][v].append(_median_call(fn, inputs))
            time.sleep(0.1)
    print(f"# models: {THREADS} threads, {'cpu' if CLOCK is time.process_time else 'wall'} clock, {rounds} rounds "
          f"interleaved, load average before {load0[0]:.2f} after {os.getloadavg()[0]:.2f}; ms")
    for label, fns, _ in rows:
        med = {v: statistics.median(t) * 1e3 for v, t in times[label].items()}
        peer = [v for v in med if v not in ("after", "before", "unfused-epi", "unpacked-U")][0]
        print(f"{label:<22} " + "  ".join(f"{v} {t:.3f}" for v, t in med.items())
              + f"  after/{peer} {med['after'] / med[peer]:.2f}x  after/before {med['after'] / med['before']:.2f}x"
              + (f"  unpacked-U/{peer} {med['unpacked-U'] / med[peer]:.2f}x" if "unpacked-U" in med else ""))


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
    p.add_argument("--before", action="store_true", help="also time the schedule before issue 24 item 2")
    p.add_argument("--models", action="store_true",
                   help="instead: the transformer example vs onnxruntime, the lstm example vs torch.nn.LSTM, "
                        "each before and after")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: the process's CPU time (all its threads), less disturbed by other processes on a "
                        "loaded machine; meaningful with --threads 1 (spinning pool threads count as busy)")
    args = p.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.models:
        _run_models(args.rounds)
        return
    load0 = os.getloadavg()
    sel = [i for i, c in enumerate(_cases(False)) if args.only in c[0]]
    variants = {"after": _cases(False), **({"before": _cases(True)} if args.before else {})}
    variants = {k: [v[i] for i in sel] for k, v in variants.items()}
    cases = variants["after"]
    for vcases in variants.values():
        for label, model, ref, inputs, _ in vcases:
            want = CHECK.get(label, ref)(*inputs)
            np.testing.assert_allclose(np.asarray(model(*inputs)), want, rtol=2e-3,
                                       atol=2e-3 * np.abs(want).max(), err_msg=label)
    results = {c[0]: {k: [] for k in [*variants, "numpy"]} for c in cases}
    for _ in range(args.rounds):
        for i, (label, _, ref, inputs, _) in enumerate(cases):
            for name, vcases in variants.items():
                model = vcases[i][1]
                model(*inputs)
                results[label][name].append(_median_call(model, inputs))
            results[label]["numpy"].append(_median_call(ref, inputs))
            time.sleep(0.1)
    print(f"# {args.threads} threads, {args.clock} clock, {args.rounds} rounds interleaved, load average before "
          f"{load0[0]:.2f} after {os.getloadavg()[0]:.2f}; GFLOP/s (ms)")
    names = [*variants, "numpy"]
    print(f"{'case':<28} " + " ".join(f"{n:>17}" for n in names) + "  after/numpy time")
    for label, _, _, _, flops in cases:
        med = {n: statistics.median(results[label][n]) for n in names}
        print(f"{label:<28} " + " ".join(f"{flops / med[n] / 1e9:>7.1f} ({med[n] * 1e3:>7.3f})" for n in names)
              + f"  {med['after'] / med['numpy']:>6.2f}x")


if __name__ == "__main__":
    main()
