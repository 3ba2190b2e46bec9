"""mobilenet_v3_small's depthwise convolution layers one by one (issue 24): each compiled as the model has it -
input with symbolic N, H, W, the depthwise conv + bias (batch norm folded) + relu or hardswish in one kernel -
against onnxruntime's Conv (group = C) + Relu / HardSwish at batch 1 (or --batch), 224 x 224 geometry, timed in
the same process in alternating blocks in this thread's CPU time (one thread on both sides); results checked
against onnxruntime first. (`bench_conv_layers.py` does the same for resnet18's dense layers.)

    .venv/bin/python benchmarks/bench_dw_layers.py [--batch 1] [--rounds 5] [--only 5x5] [--ab MODULE.NAME[=VALUE]]
        [--kernel]

`--ab MODULE.NAME[=VALUE][,...]` (switches of `codegen/cache.SWITCHES`, as `bench_conv_models.py`'s: a bool named
without a value is flipped): each layer is also built with them set so (the "before" column, e.g. `--ab
te_conv.SPLIT_PHASES,te_conv.SPLIT_SPV_PADDING`), timed interleaved.
`--kernel`: dyntvm's side is its conv kernel alone (called with the arguments the VM passed it: without the VM's
per-call work, shape checks and allocation) and onnxruntime's the summed durations of its nodes in its own profile
(wall time, us).
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


def _ort(w, b, stride, pad, hs, x_shape, profile=False):
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
    if profile:
        import tempfile
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _kernel_call(vm, fname, targs):
    """A no-argument function calling `vm[fname]`'s conv kernel (its one fused ``dt_conv`` PrimFunc call) with the
    arguments the VM passed it."""
    found = []

    def instrument(func, symbol, before, _ret, *call_args):
        if before and "dt_conv" in str(symbol) and not found:
            found.append((func, call_args))
        return 0
    vm.set_instrument(instrument)
    try:
        vm[fname](*targs)
    finally:
        vm.set_instrument(None)
    func, call_args = found[0]
    return lambda: func(*call_args)


def _ort_node_us(sess_factory, x, calls: int = 200) -> float:
    """Median over `calls` runs (the last three quarters) of the summed node durations (us) in onnxruntime's own
    profile (a session made by `sess_factory(True)`, profiling on)."""
    import json
    sess = sess_factory(True)
    for _ in range(calls):
        sess.run(None, {"x": x})
    with open(sess.end_profiling()) as fh:
        events = json.load(fh)
    runs = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    sums = [sum(e["dur"] for e in nodes if lo <= e["ts"] <= hi) for lo, hi in runs]
    return float(np.median(sums[len(sums) // 4:]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)   # always 1
    parser.add_argument("--only", default="", help="layers whose label contains this")
    parser.add_argument("--block", type=float, default=0.2, help="seconds per timing block")
    parser.add_argument("--kernel", action="store_true", help="time the kernels alone (see the module's doc)")
    parser.add_argument("--ab", default="", help="MODULE.NAME[=VALUE][,...]: switches in dyntvm.codegen "
                        "(codegen/cache.SWITCHES), also built so (a bool without a value: flipped)")
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
    total = {"dyntvm": 0.0, "onnxruntime": 0.0, "before": 0.0}
    switches = []     # [(module, name, the "before" value)]
    if args.ab:
        from bench_conv_models import ab_switches
        switches = ab_switches(args.ab)
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
        vm_before = None
        if switches:
            values = [getattr(module, key) for module, key, _ in switches]
            for module, key, before in switches:
                setattr(module, key, before)
            try:
                # (the converters write the TE computes when the Relax module is made: both are redone flipped)
                mod_b, _ = _region(layer, dt.TensorSpec(("N", c, "H", "W")))
                vm_before = relax.VirtualMachine(build_cpu(mod_b, target), tvm.cpu())
            finally:
                for (module, key, _), value in zip(switches, values):
                    setattr(module, key, value)
        targs = [tvm.runtime.tensor(x)]
        sess = _ort(w, b, stride, pad, hs, list(x.shape))
        want = sess.run(None, {"x": x})[0]
        got = vm[fname](*targs)
        got = (got if hasattr(got, "numpy") else got[0]).numpy()
        err = float(np.max(np.abs(got - want)))
        f = vm[fname]
        runs = {"dyntvm": types.SimpleNamespace(fn=lambda: f(*targs), args=()),
                "onnxruntime": types.SimpleNamespace(fn=lambda: sess.run(None, {"x": x}), args=())}
        if args.kernel:
            runs["dyntvm"].fn = _kernel_call(vm, fname, targs)
            ort_us = _ort_node_us(lambda p: _ort(w, b, stride, pad, hs, list(x.shape), p), x)
            runs["onnxruntime"].fn = lambda: time.sleep(0)
        if vm_before is not None:
            fb = vm_before[fname]
            got_b = fb(*targs)
            err = max(err, float(np.max(np.abs((got_b if hasattr(got_b, "numpy") else got_b[0]).numpy() - want))))
            runs["before"] = types.SimpleNamespace(
                fn=_kernel_call(vm_before, fname, targs) if args.kernel else lambda: fb(*targs), args=())
        timing = _cpu_times(runs, args.rounds, args.block)
        ms = {s: timing[s]["median_ms"] for s in runs}
        if args.kernel:
            ms["onnxruntime"] = ort_us / 1e3
        for s in runs:
            total[s] += ms[s] * count
        gb = (x.nbytes + got.nbytes) / 1e9
        print(f"{label:24s} x{count} dyntvm {ms['dyntvm'] * 1e3:7.1f} us {gb / ms['dyntvm'] * 1e3:5.1f} GB/s | ort "
              f"{ms['onnxruntime'] * 1e3:7.1f} us {gb / ms['onnxruntime'] * 1e3:5.1f} GB/s | ratio "
              f"{ms['dyntvm'] / ms['onnxruntime']:5.2f} | err {err:.1e} | compile {compile_s:.1f} s"
              + (f" | before {ms['before'] * 1e3:7.1f} us ratio {ms['before'] / ms['onnxruntime']:5.2f}"
                 if "before" in ms else ""), flush=True)
    print(f"sum over mobilenet_v3_small's depthwise layers (x count): dyntvm {total['dyntvm']:.3f} ms, onnxruntime "
          f"{total['onnxruntime']:.3f} ms, ratio {total['dyntvm'] / max(total['onnxruntime'], 1e-9):.2f}"
          + (f"; before ({args.ab}) {total['before']:.3f} ms, ratio "
             f"{total['before'] / max(total['onnxruntime'], 1e-9):.2f}" if switches else ""))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    sys.exit(main())
