"""Tune the bundled examples for this CPU (or the local GPU) into the shipped `tuning_logs/` (what
`tuning_logs/README.md` lists), then time each example with its log against the default kernels.

    .venv/bin/python benchmarks/tune_examples.py [--target cpu|cuda] [--trials 32] [--only lstm,decoder]
                                                 [--measure-only]

Each example's hints are its benchmark sizes (`HINTS`). Tuning resumes: a kernel already in a log is not
tuned again. The timing compiles every example twice in this process (no compile cache), with and without its
log, and alternates calls of the two in rounds (medians); it prints a markdown table for benchmarks/README.md.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# example -> (symbol hints for dt.tune, the sizes make_inputs takes for the timing)
HINTS = {
    "lstm": ({"T": [64], "B": [1, 16]}, [{"T": 64, "B": 1}, {"T": 64, "B": 16}]),
    "decoder": ({"P": [3]}, [{"P": 3}]),
    "detection": ({"N": [200]}, [{"N": 200}]),
    "branchy": ({"B": [1, 16]}, [{"B": 1}, {"B": 16}]),
    "transformer": ({"B": [1], "S": [128]}, [{"B": 1, "S": 128}]),
}


def median_time(fn, repeat):
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--only", default=",".join(HINTS))
    ap.add_argument("--measure-only", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--target", default="cpu", help="cpu, or cuda (tunes on the local GPU; defaults: dlight's)")
    args = ap.parse_args()
    import dyntvm as dt
    from dyntvm import examples
    from dyntvm.codegen.build import concrete_target
    from dyntvm.codegen.tuning import target_key
    from dyntvm.ir.tree import tree_flatten
    logs = os.path.join(ROOT, "tuning_logs")
    os.environ["DYNTVM_TUNING_LOGS"] = logs
    key = target_key(concrete_target(args.target))
    rows = []
    for name in args.only.split(","):
        ex = examples.get(name)
        hints, sizes = HINTS[name]
        log = os.path.join(logs, ex.fn.__name__, key)
        if args.measure_only and not os.path.isdir(log):    # a log in another folder that matches this machine
            from dyntvm.pipeline import _shipped_log
            found = _shipped_log(os.path.join(logs, ex.fn.__name__), None, concrete_target(args.target))
            log = found.path if found is not None else log
        if not args.measure_only:
            t0 = time.perf_counter()
            dt.tune(ex.fn, *ex.specs, target=args.target, trials=args.trials, shape_hints=hints, log_dir=log)
            print(f"{name}: tuned in {time.perf_counter() - t0:.0f} s", flush=True)
        with open(os.path.join(log, "manifest.json")) as f:
            manifest = json.load(f)
        tune_s = sum(k.get("seconds", 0) for k in manifest["kernels"])
        for k in manifest["kernels"]:
            print(f"  {k.get('name', '?'):<44} default {k.get('default_us', '-'):>9} us  tuned "
                  f"{k.get('tuned_us', '-'):>9} us  {k.get('use', k.get('status'))}")
        ratios = [k["default_us"] / k["tuned_us"] for k in manifest["kernels"] if k.get("tuned_us")]
        if ratios:
            print(f"  {name}: tuned / default speedup per kernel: geomean {np.exp(np.mean(np.log(ratios))):.2f}, "
                  f"best {max(ratios):.2f}, worst {min(ratios):.2f} ({len(ratios)} kernels)", flush=True)
        won = sum(k.get("use") == "tuned" for k in manifest["kernels"])
        if not manifest["kernels"]:
            print(f"{name}: nothing tuned (specializations that do not build: {manifest.get('not_specialized')}); "
                  "its log is removed")
            import shutil
            shutil.rmtree(log)
            continue
        tuned = dt.compile(ex.fn, *ex.specs, target=args.target, use_cache=False)
        assert "tuning" in tuned.info, f"{name}: the shipped log was not picked up"
        os.environ["DYNTVM_TUNING_LOGS"] = os.path.join(ROOT, "no-such-folder")
        default = dt.compile(ex.fn, *ex.specs, target=args.target, use_cache=False)
        os.environ["DYNTVM_TUNING_LOGS"] = logs
        for sz in sizes:
            inputs = ex.make_inputs(np.random.default_rng(0), **sz)
            want = ex.fn(*inputs)
            for m in (tuned, default):
                for a, b in zip(tree_flatten(m(*inputs))[0], tree_flatten(want)[0]):
                    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-3)
            t_d, t_t = [], []
            before = tuned.specialized_calls
            for _ in range(args.rounds):
                t_d.append(median_time(lambda: default(*inputs), 20))
                t_t.append(median_time(lambda: tuned(*inputs), 20))
            spec_calls = tuned.specialized_calls - before
            d, t = float(np.median(t_d)), float(np.median(t_t))
            rows.append((name, sz, len(manifest["kernels"]), won, tune_s, d, t, spec_calls > 0))
            print(f"{name} {sz}: default {d * 1e3:.3f} ms, tuned log {t * 1e3:.3f} ms ({t / d:.2f}); "
                  f"{won}/{len(manifest['kernels'])} kernels tuned won; tuning {tune_s:.0f} s", flush=True)
    print("\n| example (sizes) | kernels tuned / won | tuning s | default ms | with the log ms | log / default |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, sz, n, won, tune_s, d, t, spec in rows:
        label = ", ".join(f"{k}={v}" for k, v in sz.items())
        print(f"| {name} ({label}) | {n} / {won} | {tune_s:.0f} | {d * 1e3:.3f} | {t * 1e3:.3f} | {t / d:.2f} |")


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
