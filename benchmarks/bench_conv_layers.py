"""resnet18's convolution layers one by one (issue 24): each compiled as the model has it - input with symbolic
N, H, W, conv + bias + relu (+ the residual add where the block has one) in one kernel - against onnxruntime's
fused Conv (+ Relu / Add) at batch 1 (or --batch), 224 x 224 geometry, timed in the same process in alternating
blocks, in this thread's CPU time (--threads 1, the default, on both sides; else wall time), GFLOP/s next to
numpy's 2048^3 GEMM rate measured in the same process; results checked against onnxruntime first.

    .venv/bin/python benchmarks/bench_conv_layers.py [--batch 1] [--rounds 5] [--threads 1] [--only 3x3]
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    threads_from_argv(sys.argv if "--threads" in " ".join(sys.argv) else sys.argv + ["--threads", "1"], 1)

import argparse  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402

# (label, C, O, kernel, stride, pad, H = W of the input, residual add, how many in resnet18)
LAYERS = [
    ("stem 7x7/2 3->64 @224", 3, 64, 7, 2, 3, 224, False, 1),
    ("3x3 64->64 @56", 64, 64, 3, 1, 1, 56, False, 2),
    ("3x3 64->64 @56 +res", 64, 64, 3, 1, 1, 56, True, 2),
    ("3x3/2 64->128 @56", 64, 128, 3, 2, 1, 56, False, 1),
    ("1x1/2 64->128 @56", 64, 128, 1, 2, 0, 56, False, 1),
    ("3x3 128->128 @28 +res", 128, 128, 3, 1, 1, 28, True, 3),
    ("3x3/2 128->256 @28", 128, 256, 3, 2, 1, 28, False, 1),
    ("1x1/2 128->256 @28", 128, 256, 1, 2, 0, 28, False, 1),
    ("3x3 256->256 @14 +res", 256, 256, 3, 1, 1, 14, True, 3),
    ("3x3/2 256->512 @14", 256, 512, 3, 2, 1, 14, False, 1),
    ("1x1/2 256->512 @14", 256, 512, 1, 2, 0, 14, False, 1),
    ("3x3 512->512 @7 +res", 512, 512, 3, 1, 1, 7, True, 3),
]


def _ort(w, b, stride, pad, residual, x_shape, out_shape, threads):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride] * 2, pads=[pad] * 4)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, out_shape))
    nodes.append(helper.make_node("Relu", ["a" if residual else "c"], ["y"]))
    graph = helper.make_graph(nodes, "conv", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _cpu_times(runs: dict, rounds: int, block_s: float) -> dict:
    """{name: {"median_ms", "min_ms"}}: this thread's CPU time per call (both sides run on the calling thread with one
    thread), the median over `rounds` alternating blocks of about `block_s` seconds each: on a busy machine the
    wall time counts other processes' time slices, the thread's CPU time does not."""
    per = {s: [] for s in runs}
    for r in runs.values():
        r.fn()
    for _ in range(rounds):
        for name, r in runs.items():
            t0, c0, calls = time.perf_counter(), time.thread_time(), 0
            while time.perf_counter() - t0 < block_s or calls < 3:
                r.fn()
                calls += 1
            per[name].append((time.thread_time() - c0) / calls * 1e3)
    return {s: {"median_ms": float(np.median(v)), "min_ms": float(np.min(v))} for s, v in per.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default="", help="layers whose label contains this")
    parser.add_argument("--block", type=float, default=0.3, help="seconds per timing block")
    args = parser.parse_args(argv)
    import tvm
    from tvm import relax
    import dyntvm as dt
    from dyntvm import F
    from bench_peers import measure
    from bench_schedules import _region
    from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu, cpu_target
    rng = np.random.default_rng(0)
    big = rng.standard_normal((2048, 2048)).astype("float32")
    np.matmul(big, big)
    clock = time.thread_time if args.threads == 1 else time.perf_counter     # as the layers are timed
    t0 = clock()
    for _ in range(3):
        np.matmul(big, big)
    peak = 3 * 2 * 2048 ** 3 / (clock() - t0) / 1e9
    target = cpu_target()
    print(f"target {target}; threads {args.threads}; numpy 2048^3 GEMM {peak:.0f} GFLOP/s; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    total = {"dyntvm": 0.0, "onnxruntime": 0.0}
    for label, c, o, k, stride, pad, hw, residual, count in LAYERS:
        if args.only and args.only not in label:
            continue
        w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype("float32")
        b = rng.standard_normal(o).astype("float32")
        ho = (hw + 2 * pad - k) // stride + 1
        x = rng.standard_normal((args.batch, c, hw, hw)).astype("float32")
        r = rng.standard_normal((args.batch, o, ho, ho)).astype("float32")

        def layer(v, *res):
            y = F.conv(v, w, b, stride=stride, padding=pad)
            return F.relu(y + res[0] if res else y)
        specs = [dt.TensorSpec(("N", c, "H", "W"))] + ([dt.TensorSpec(("N", o, "H", "W"))] if residual else [])
        t0 = time.perf_counter()
        mod, fname = _region(layer, *specs)
        vm = relax.VirtualMachine(build_cpu(mod, target), tvm.cpu())
        compile_s = time.perf_counter() - t0
        targs = [tvm.runtime.tensor(x)] + ([tvm.runtime.tensor(r)] if residual else [])
        sess = _ort(w, b, stride, pad, residual, list(x.shape), list(r.shape), args.threads)
        feeds = {"x": x, **({"r": r} if residual else {})}
        want = sess.run(None, feeds)[0]
        got = vm[fname](*targs)
        got = (got if hasattr(got, "numpy") else got[0]).numpy()
        err = float(np.max(np.abs(got - want)))
        f = vm[fname]
        runs = {"dyntvm": types.SimpleNamespace(fn=lambda: f(*targs), args=()),
                "onnxruntime": types.SimpleNamespace(fn=lambda: sess.run(None, feeds), args=())}
        timing = (_cpu_times(runs, args.rounds, args.block) if args.threads == 1
                  else measure(runs, args.rounds, args.block, 0.1))
        flops = 2 * args.batch * o * c * k * k * ho * ho
        ms = {s: timing[s]["median_ms"] for s in runs}
        for s in runs:
            total[s] += ms[s] * count
        print(f"{label:24s} x{count} dyntvm {ms['dyntvm']:8.3f} ms {flops / ms['dyntvm'] / 1e6:6.1f} GF/s | ort "
              f"{ms['onnxruntime']:8.3f} ms {flops / ms['onnxruntime'] / 1e6:6.1f} GF/s | ratio "
              f"{ms['dyntvm'] / ms['onnxruntime']:5.2f} | err {err:.1e} | compile {compile_s:.1f} s", flush=True)
    print(f"sum over resnet18's convolutions (x count): dyntvm {total['dyntvm']:.2f} ms, onnxruntime "
          f"{total['onnxruntime']:.2f} ms, ratio {total['dyntvm'] / max(total['onnxruntime'], 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
