"""Before/after in one run: the bundled examples and the foreach overhead under two revisions, interleaved.

    .venv/bin/python benchmarks/bench_ab.py --base REV [--rounds 3] [--repeat 20] [--threads N] [--thread-time]
                                            [--cases decoder,detection]

Checks out REV (any git revision) into a temporary worktree and measures, in alternating fresh processes
(base, this tree, base, this tree, ...), the compiled latency of every case in `bench_models.CASES` plus the
per-iteration overhead of a trivial foreach and while_loop. Each process imports dyntvm from its own source tree (this
venv's packages, dyntvm's code from the tree). Prints per case the median over rounds of each side's
median, and the ratio new / base (below 1 is faster). `--threads N`: every pool's thread count in the
children (default: the environment's). `--thread-time`: each call's thread CPU time instead of wall time (with
`--threads 1` the kernels run on the calling thread: the figure to trust on a busy machine). `--cases`: only the
`bench_models.CASES` of these example names (the loop overheads are always measured). Not a test: run it
before and after a change to the executor, codegen or schedules.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from thread_env import threads_from_argv  # noqa: E402

SUBPACKAGES = ("ir", "frontend", "partition", "codegen", "runtime", "examples")


def package_root(tree: str, into: str) -> str:
    """A folder whose `dyntvm/` maps the tree's layout (dyntvm.ir = tree/ir, ...) with symlinks."""
    pkg = os.path.join(into, "dyntvm")
    os.makedirs(pkg)
    for f in os.listdir(os.path.join(tree, "dyntvm")):
        os.symlink(os.path.join(tree, "dyntvm", f), os.path.join(pkg, f))
    for d in SUBPACKAGES:
        os.symlink(os.path.join(tree, d), os.path.join(pkg, d))
    return into


def child(root: str, repeat: int, thread_time: bool = False, cases: str | None = None) -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]   # not the venv's dyntvm
    sys.path.insert(0, root)
    sys.path.insert(0, HERE)
    import numpy as np

    import dyntvm as dt
    import bench_models
    from bench_models import CASES
    from dyntvm import F, examples
    assert os.path.realpath(dt.__file__).startswith(os.path.realpath(root)) or root in dt.__file__, dt.__file__
    clock = time.thread_time if thread_time else time.perf_counter

    def median_time(*a, **k):
        return bench_models.median_time(*a, clock=clock, **k)
    out = {}
    cache = tempfile.mkdtemp(prefix="dyntvm-ab-")
    for name, sizes in CASES:
        if cases and name not in cases.split(","):
            continue
        ex = examples.get(name)
        model = dt.compile(ex.fn, *ex.specs, cache_dir=cache)
        inputs = ex.make_inputs(np.random.default_rng(0), **sizes)
        out[f"{name} {sizes}"] = median_time(model, *inputs, repeat=repeat) * 1e3

    def scan(xs, s):
        return F.foreach(lambda x, st: (x, [st[0] + x]), xs, [s])
    model = dt.compile(scan, dt.TensorSpec(("T", 4)), dt.TensorSpec((4,)), cache_dir=cache)
    T = 1000
    xs, s = np.ones((T, 4), "float32"), np.zeros(4, "float32")
    out["foreach overhead (us/iteration)"] = median_time(model, xs, s, repeat=repeat) / T * 1e6

    def count(s, n):
        return F.while_loop(lambda i, st: i < n, lambda i, st: ([], [i + 1, st * 0.5 + 1.0]),
                            [F.zeros((), "int64"), s])
    model = dt.compile(count, dt.TensorSpec((4,)), dt.TensorSpec((), "int64"), cache_dir=cache)
    out["while_loop overhead (us/iteration)"] = median_time(model, s, np.int64(T), repeat=repeat) / T * 1e6
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", help="git revision to compare against")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--threads", type=int, help="thread count of every pool in the children")
    p.add_argument("--thread-time", action="store_true", help="thread CPU time per call instead of wall time")
    p.add_argument("--cases", help="comma-separated example names of bench_models.CASES (default: all)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.repeat, args.thread_time, args.cases)
    if args.threads:
        threads_from_argv(["--threads", str(args.threads)], args.threads)     # (inherited by the children)
    if not args.base:
        p.error("--base REV is required")
    tmp = tempfile.mkdtemp(prefix="dyntvm-ab-")
    base_tree = os.path.join(tmp, "tree")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", base_tree, args.base], check=True)
    try:
        roots = {"base": package_root(base_tree, os.path.join(tmp, "base")),
                 "new": package_root(ROOT, os.path.join(tmp, "new"))}
        results: dict = {"base": [], "new": []}
        for r in range(args.rounds):
            for side in ("base", "new"):
                cmd = [sys.executable, __file__, "--child", roots[side], "--repeat", str(args.repeat)]
                cmd += ["--thread-time"] if args.thread_time else []
                cmd += ["--cases", args.cases] if args.cases else []
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode:
                    sys.exit(f"{side} round {r} failed:\n{res.stderr[-3000:]}")
                results[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1}/{args.rounds} {side} done", file=sys.stderr)
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        print(f"| case | base {args.base} | new {head}{' +changes' if _dirty() else ''} | new / base |")
        print("|---|---:|---:|---:|")
        for case in results["base"][0]:
            b = statistics.median(x[case] for x in results["base"])
            n = statistics.median(x[case] for x in results["new"])
            unit = "" if "us/" in case else " ms"
            print(f"| {case} | {b:.3f}{unit} | {n:.3f}{unit} | {n / b:.2f} |")
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_tree])


def _dirty() -> bool:
    return bool(subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
