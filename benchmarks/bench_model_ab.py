"""A torchvision model (random weights, ONNX export with symbolic B, H, W) compiled by this checkout, another
build of it saved as an artifact (`CompiledModel.save`: e.g. from a `git archive` of main), and onnxruntime,
timed in one process in alternating blocks: with one thread (the default) each call's thread CPU time
(`bench_conv_layers._cpu_times`: on a busy machine wall times count other processes' slices), with more the
wall time (`bench_peers.measure`; indicative only under load). Prints each one's ratio to onnxruntime.

    .venv/bin/python benchmarks/bench_model_ab.py [--model resnet18] [--batch 1] [--threads 1] [--rounds 5]
                                                  [--base base.dt] [--ab MODULE.NAME[=VALUE][,...]]
                                                  [--save-onnx DIR]

To make `--base` from another checkout: compile `dt.from_onnx(path)` there (the ONNX file `--save-onnx` writes)
and `model.save("base.dt")`.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    threads_from_argv(sys.argv, 1)

import argparse  # noqa: E402
import tempfile  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base", default=None, help="an artifact of another build of the same ONNX model")
    parser.add_argument("--ab", default=None, metavar="MODULE.NAME[=VALUE][,...]",
                        help="also this checkout compiled with these switches of codegen/cache.SWITCHES set (\"ab\")")
    parser.add_argument("--save-onnx", default=None, help="keep the exported ONNX file in this folder")
    args = parser.parse_args(argv)
    import dyntvm as dt
    from bench_conv_layers import _cpu_times
    from bench_conv_models import export
    from bench_onnx_models import ort_session
    from bench_peers import measure
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = export(args.model, args.save_onnx or tmp)
        session = ort_session(path, args.threads)
        x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype("float32")
        want = session.run(None, {"x": x})[0]
        models = {"branch": dt.compile(dt.from_onnx(path), use_cache=False)}
        if args.base:
            models["base"] = dt.load(args.base)
        if args.ab:
            from bench_conv_models import ab_switches
            ab = ab_switches(args.ab)
            committed = [(m, k, getattr(m, k)) for m, k, _ in ab]
            for m, k, v in ab:
                setattr(m, k, v)
            try:
                models["ab"] = dt.compile(dt.from_onnx(path), use_cache=False)
            finally:
                for m, k, v in committed:
                    setattr(m, k, v)
        runs = {"onnxruntime": types.SimpleNamespace(fn=lambda: session.run(None, {"x": x}), args=())}
        for name, m in models.items():
            err = float(np.max(np.abs(np.asarray(m(x)) - want)))
            print(f"{name}: max |dyntvm - onnxruntime| {err:.2e}", flush=True)
            runs[name] = types.SimpleNamespace(fn=lambda m=m: m(x), args=())
        block = 0.5 if args.batch == 1 else 1.5
        if args.threads == 1:
            ms = {k: v["median_ms"] for k, v in _cpu_times(runs, args.rounds, block).items()}
            how = "1 thread, thread CPU time"
        else:
            ms = {k: v["median_ms"] for k, v in measure(runs, args.rounds, block, 0.1).items()}
            how = f"{args.threads} threads, wall time"
        ort_ms = ms["onnxruntime"]
        print(f"{args.model} B{args.batch} ({how}; load {os.getloadavg()[0]:.1f}): onnxruntime {ort_ms:.2f} ms, "
              + ", ".join(f"{k} {ms[k]:.2f} ({ms[k] / ort_ms:.3f}x)" for k in models), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
