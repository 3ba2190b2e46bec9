"""The kernels issue 11 names as weak under default rules (argmax, softmax over a leading axis, full reductions
of a symbolic 1-d input): each as a one-op model, tuned with `dt.tune` at a hinted size, against our default
schedule (both as the tuner times them: the kernel alone) and numpy on the same input.

    .venv/bin/python benchmarks/tune_reductions.py [--trials 32] [--n 1000000]

Prints a markdown table (microseconds: our default and the tuned kernel alone, numpy, a whole dyntvm model call
on a 64-byte aligned input and on numpy's own, which is staged through an aligned copy). Logs go to a temporary
folder.
Run on an idle machine: the tuner times our two-thread defaults against single candidates.
"""
import argparse
import json
import os
import tempfile
import time

import numpy as np


def median_us(fn, repeat=200):
    for _ in range(10):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--n", type=int, default=1_000_000, help="the 1-d size (softmax: N x 256 with N = n / 256)")
    args = ap.parse_args()
    import dyntvm as dt
    from dyntvm import F
    rows_n = max(1, args.n // 256)
    cases = [
        ("argmax, float32[N]", lambda x: F.argmax(x, axis=0), ("N",), (args.n,), lambda x: np.argmax(x, axis=0)),
        ("sum, float32[N]", lambda x: F.sum(x, axis=0), ("N",), (args.n,), lambda x: np.sum(x, axis=0)),
        ("max, float32[N]", lambda x: F.max(x, axis=0), ("N",), (args.n,), lambda x: np.max(x, axis=0)),
        ("softmax over axis 0, float32[N, 256]", lambda x: F.softmax(x, axis=0), ("N", 256), (rows_n, 256),
         lambda x: (lambda e: e / e.sum(axis=0))(np.exp(x - x.max(axis=0)))),
    ]
    root = tempfile.mkdtemp(prefix="dyntvm-tune-reductions-")
    timed = []
    for label, fn, shape, size, ref in cases:     # model calls first: after MetaSchedule ran in this process,
        fn.__name__ = "k" + str(len(timed))       # its worker processes and thread settings disturb the timing
        x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
        from dyntvm.runtime.tensors import aligned_empty
        xa = aligned_empty(x.shape, x.dtype)      # 64-byte aligned: no staging copy (numpy aligns to 16 only)
        xa[...] = x
        model = dt.compile(fn, dt.TensorSpec(shape), use_cache=False)
        np.testing.assert_allclose(np.asarray(model(x)), ref(x), rtol=1e-4, atol=1e-6)
        timed.append((median_us(lambda: ref(x)), median_us(lambda: model(xa)), median_us(lambda: model(x))))
    out = []
    for (label, fn, shape, size, ref), (t_np, t_model, t_mis) in zip(cases, timed):
        log = dt.tune(fn, dt.TensorSpec(shape), trials=args.trials, shape_hints={"N": [size[0]]},
                      log_dir=os.path.join(root, fn.__name__), progress=False)
        with open(os.path.join(log, "manifest.json")) as f:
            kernels = json.load(f)["kernels"]
        for k in kernels:
            out.append((label, k["name"], k.get("default_us"), k.get("tuned_us"), t_np, t_model, t_mis,
                        k.get("use") + (f" ({k['reason'][:60]})" if k.get("reason") else "")))
            print(out[-1], flush=True)
    print(f"\n| kernel (size {args.n}) | our default us | tuned us ({args.trials} trials) | default / tuned | "
          "used | numpy us | dyntvm model call us (aligned input / numpy's) |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for label, name, d, t, t_np, t_model, t_mis, use in out:
        ratio = f"{d / t:.2f}x" if d and t else "-"
        print(f"| {label} ({name}) | {d} | {t if t else '-'} | {ratio} | {use} | {t_np:.1f} | "
              f"{t_model:.1f} / {t_mis:.1f} |")

if __name__ == "__main__":
    main()
