"""CNNs end to end: torchvision resnet18 and mobilenet_v3_small (random weights, eval mode, TorchScript ONNX
export with symbolic B, H, W), dyntvm against onnxruntime at batch 1 (or --batch), 224 x 224, timed in the same
process in alternating blocks (`bench_peers.measure`); compile time (no compile cache) and the maximum
difference from onnxruntime; torch eager (and with `--torch-compile` torch.compile) on the same model and
threads are timed alongside. `--before` also compiles and times the convolutions as they were before issue 24
(Relax's conv2d under the generic schedule: `converters.window.TE_CONV = False`); `--expr-dims` also compiles
and times the model with the window outputs' expression dims (`converters.window_dims.PLAIN_SIZES = False`: the
kernels after a strided layer unfused, as before the plain dim vars). `--ab MODULE.NAME=VALUE[,...]` also compiles
and times the model with those A/B switches of `codegen/cache.SWITCHES` set (MODULE as there, e.g.
`backends.cpu.cpu_schedule_conv.BATCH_IN_PARALLEL=True`; a bool switch named without `=VALUE` is flipped, e.g.
`--ab te_conv.SPLIT_PHASES,te_conv.SPLIT_SPV_PADDING`), labelled "ab".

    .venv/bin/python benchmarks/bench_conv_models.py [--models resnet18,mobilenet_v3_small] [--batch 1]
                                                    [--before] [--expr-dims] [--rounds 7] [--torch-compile]
                                                    [--ab MODULE.NAME[=VALUE][,...]] [--no-torch]
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    threads_from_argv(sys.argv, os.cpu_count() or 1)

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def export(name: str, folder: str):
    import torch
    import torchvision_cpu      # the CUDA torchvision wheel needs its CPU ops defined first
    torchvision_cpu.load()
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    path = os.path.join(folder, f"{name}.onnx")
    torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), path, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "B", 2: "H", 3: "W"}})
    return path, model


def torch_runs(model, x, threads: int, want, compiled: bool) -> dict:
    """torch eager (and torch.compile) as their users run them: inference mode, `threads` intra-op threads;
    each checked against onnxruntime's result first."""
    import torch
    torch.set_num_threads(threads)
    xt = torch.from_numpy(x)
    variants = {"torch": model}
    if compiled:
        variants["torch.compile"] = torch.compile(model)
    runs = {}
    for label, fn in variants.items():
        def call(fn=fn):
            with torch.inference_mode():
                return fn(xt)
        err = float(np.max(np.abs(call().numpy() - want)))
        print(f"{label}: max |torch - onnxruntime| {err:.2e}", flush=True)
        runs[label] = types.SimpleNamespace(fn=call, args=())
    return runs


def ab_switches(specs: str) -> list:
    """[(module, name, value)] of `--ab MODULE.NAME[=VALUE][,...]`: switches listed in `codegen/cache.SWITCHES`,
    each value a Python literal (none: the committed bool flipped)."""
    import ast
    import importlib
    from dyntvm.codegen.cache import SWITCHES
    out = []
    for spec in specs.split(","):
        target, eq, text = spec.partition("=")
        module_name, _, key = target.rpartition(".")
        if (module_name, key) not in SWITCHES:
            raise SystemExit(f"--ab {spec}: not one of codegen/cache.SWITCHES: "
                             + ", ".join(f"{m}.{k}" for m, k in SWITCHES))
        module = importlib.import_module(f"dyntvm.codegen.{module_name}")
        out.append((module, key, ast.literal_eval(text) if eq else not getattr(module, key)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18,mobilenet_v3_small")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--before", action="store_true", help="also the convolutions before issue 24")
    parser.add_argument("--expr-dims", action="store_true", help="also the window outputs' expression dims")
    parser.add_argument("--ab", default=None, metavar="MODULE.NAME[=VALUE][,...]",
                        help="also the model compiled with these switches of codegen/cache.SWITCHES set (or flipped)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--torch-compile", action="store_true", help="also time torch.compile (inductor)")
    parser.add_argument("--no-torch", action="store_true", help="onnxruntime the only peer (faster A/B runs)")
    args = parser.parse_args(argv)
    import dyntvm as dt
    from bench_onnx_models import ort_session
    from bench_peers import measure
    from dyntvm.codegen.converters import window, window_dims
    import tvm
    threads = args.threads or tvm.runtime.num_threads()
    ab = ab_switches(args.ab) if args.ab else None
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path, torch_model = export(name, tmp)
            x = rng.standard_normal((args.batch, 3, 224, 224)).astype("float32")
            session = ort_session(path, threads)
            want = session.run(None, {"x": x})[0]
            runs = {"onnxruntime": types.SimpleNamespace(fn=lambda s=session: s.run(None, {"x": x}), args=())}
            if not args.no_torch:
                runs.update(torch_runs(torch_model, x, threads, want, args.torch_compile))
            for label, te_conv, plain in ((("before", False, True),) if args.before else ()) + \
                    ((("expr-dims", True, False),) if args.expr_dims else ()) + \
                    ((("ab", True, True),) if ab else ()) + (("dyntvm", True, True),):
                window.TE_CONV, window_dims.PLAIN_SIZES = te_conv, plain
                t0 = time.perf_counter()
                if label == "ab":
                    committed = [(module, key, getattr(module, key)) for module, key, _ in ab]
                    for module, key, value in ab:
                        setattr(module, key, value)
                    try:
                        model = dt.compile(dt.from_onnx(path), use_cache=False)
                    finally:
                        for module, key, value in committed:
                            setattr(module, key, value)
                else:
                    model = dt.compile(dt.from_onnx(path), use_cache=False)
                compile_s = time.perf_counter() - t0
                err = float(np.max(np.abs(np.asarray(model(x)) - want)))
                print(f"{name} {label}: compile {compile_s:.1f} s, max |dyntvm - onnxruntime| {err:.2e}", flush=True)
                runs[label] = types.SimpleNamespace(fn=lambda m=model: m(x), args=())
            window.TE_CONV, window_dims.PLAIN_SIZES = True, True
            timing = measure(runs, args.rounds, 0.5, 0.2)
            best = min((k for k in timing if k not in ("dyntvm", "before", "expr-dims", "ab")),
                       key=lambda k: timing[k]["median_ms"])
            best_ms = timing[best]["median_ms"]
            print(f"{name} B{args.batch} 224x224 (median ms; / best peer = {best}): " + ", ".join(
                f"{k} {v['median_ms']:.2f} ({v['median_ms'] / best_ms:.2f}x)" for k, v in timing.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
