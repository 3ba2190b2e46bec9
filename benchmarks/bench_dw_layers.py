"""mobilenet_v3_small's depthwise convolution layers one by one (issue 24): each compiled as the model has it -
input with symbolic N, H, W, the depthwise conv + bias (batch norm folded) + relu or hardswish in one kernel -
against onnxruntime's Conv (group = C) + Relu / HardSwish at batch 1 (or --batch), 224 x 224 geometry, timed in
the same process in alternating blocks in this thread's CPU time (one thread on both sides); results checked
against onnxruntime first. (`bench_conv_layers.py` does the same for resnet18's dense layers.)

    .venv/bin/python benchmarks/bench_dw_layers.py [--batch 1] [--rounds 5] [--only 5x5]
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    threads_from_argv(sys.argv + ["--threads", "1"], 1)

import argparse  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402

# (label, C, kernel, stride, H = W of the input, hardswish (else relu), how many in mobilenet_v3_small)
LAYERS = [
    ("dw3x3/2 16 @112 relu", 16, 3, 2, 112, False, 1),
    ("dw3x3/2 72 @56 relu", 72, 3, 2, 56, False, 1),
    ("dw3x3 88 @28 relu", 88, 3, 1, 28, False, 1),
    ("dw5x5/2 96 @28 hs", 96, 5, 2, 28, True, 1),
    ("dw5x5 240 @14 hs", 240, 5, 1, 14, True, 2),
    ("dw5x5 120 @14 hs", 120, 5, 1, 14, True, 1),
    ("dw5x5 144 @14 hs", 144, 5, 1, 14, True, 1),
    ("dw5x5/2 288 @14 hs", 288, 5, 2, 14, True, 1),
    ("dw5x5 576 @7 hs", 576, 5, 1, 7, True, 2),
]


def _ort(w, b, stride, pad, hs, x_shape):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    c = x_shape[1]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride] * 2, pads=[pad] * 4, group=c),
             helper.make_node("HardSwish" if hs else "Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)   # always 1
    parser.add_argument("--only", default="", help="layers whose label contains this")
    parser.add_argument("--block", type=float, default=0.2, help="seconds per timing block")
    args = parser.parse_args(argv)
    import tvm
    from tvm import relax
    import dyntvm as dt
    from dyntvm import F
    from bench_conv_layers import _cpu_times
    from bench_schedules import _region
    from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu, cpu_target
    rng = np.random.default_rng(0)
    target = cpu_target()
    print(f"target {target}; one thread; load {os.getloadavg()[0]:.2f}", flush=True)
    total = {"dyntvm": 0.0, "onnxruntime": 0.0}
    for label, c, k, stride, hw, hs, count in LAYERS:
        if args.only and args.only not in label:
            continue
        pad = k // 2
        w = (rng.standard_normal((c, 1, k, k)) / k).astype("float32")
        b = rng.standard_normal(c).astype("float32")
        x = rng.standard_normal((args.batch, c, hw, hw)).astype("float32")

        def layer(v):
            y = F.conv(v, w, b, stride=stride, padding=pad, groups=c)
            if not hs:
                return F.relu(y)
            return y * F.minimum(F.maximum(y * np.float32(1 / 6) + np.float32(0.5), np.float32(0)), np.float32(1))
        t0 = time.perf_counter()
        mod, fname = _region(layer, dt.TensorSpec(("N", c, "H", "W")))
        vm = relax.VirtualMachine(build_cpu(mod, target), tvm.cpu())
        compile_s = time.perf_counter() - t0
        targs = [tvm.runtime.tensor(x)]
        sess = _ort(w, b, stride, pad, hs, list(x.shape))
        want = sess.run(None, {"x": x})[0]
        got = vm[fname](*targs)
        got = (got if hasattr(got, "numpy") else got[0]).numpy()
        err = float(np.max(np.abs(got - want)))
        f = vm[fname]
        runs = {"dyntvm": types.SimpleNamespace(fn=lambda: f(*targs), args=()),
                "onnxruntime": types.SimpleNamespace(fn=lambda: sess.run(None, {"x": x}), args=())}
        timing = _cpu_times(runs, args.rounds, args.block)
        ms = {s: timing[s]["median_ms"] for s in runs}
        for s in runs:
            total[s] += ms[s] * count
        gb = (x.nbytes + got.nbytes) / 1e9
        print(f"{label:24s} x{count} dyntvm {ms['dyntvm'] * 1e3:7.1f} us {gb / ms['dyntvm'] * 1e3:5.1f} GB/s | ort "
              f"{ms['onnxruntime'] * 1e3:7.1f} us {gb / ms['onnxruntime'] * 1e3:5.1f} GB/s | ratio "
              f"{ms['dyntvm'] / ms['onnxruntime']:5.2f} | err {err:.1e} | compile {compile_s:.1f} s", flush=True)
    print(f"sum over mobilenet_v3_small's depthwise layers (x count): dyntvm {total['dyntvm']:.3f} ms, onnxruntime "
          f"{total['onnxruntime']:.3f} ms, ratio {total['dyntvm'] / max(total['onnxruntime'], 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    sys.exit(main())
