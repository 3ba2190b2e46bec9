"""Compile time vs graph size: generated models of about 10 to 3000 IR nodes, a realistic mix of
elementwise chains (fast tanh / sigmoid, NaN-exact maximum), matmuls, reductions (softmax, layer_norm,
mean) and a `foreach` loop, over symbolic batch dims.

    .venv/bin/python benchmarks/bench_compile.py [--sizes 10,100,300,1000,3000] [--chains 1,2,4,8]
                                                 [--timeout 300] [--tree DIR]

Prints, per size, the node count, regions and the `dt.compile` wall time without the
compile cache (in a process that already compiled one model: TVM's one-time start-up is not counted);
then the compile time of elementwise chains `h = op(h)` on float32[N, 16] by depth. Each compile runs
in a child process with a time limit (`--timeout`), so a size that does not finish is reported as such.
`--tree DIR` compiles with dyntvm's code from another source tree (e.g. an older checkout: before/after).
Not a test: numbers depend on the machine; record them in benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
dt = F = None   # dyntvm, imported by `_import_dyntvm` (from --tree if given)
D = 32          # feature width of the generated models


def _block(h, k):
    """One of five layer kinds (~15-30 nodes each), picked by k; weights seeded by k."""
    rng = np.random.default_rng(k)

    def _w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    kind = k % 5
    if kind == 0:          # gated MLP
        a = F.tanh(F.matmul(h, _w(D, D)) + _w(D)[None, :] * 0.1)
        g = F.sigmoid(F.matmul(h, _w(D, D)))
        return h + a * g
    if kind == 1:          # deep elementwise chain (what made compile time exponential)
        for _ in range(4):
            h = F.maximum(F.tanh(h) * 0.9, h * 0.5)
        return h
    if kind == 2:          # attention-like: softmax over a matmul, residual, layer_norm
        s = F.softmax(F.matmul(h, F.transpose(h, (1, 0))) * 0.1, axis=-1)
        return F.layer_norm(h + F.matmul(s, h), np.ones(D, np.float32), np.zeros(D, np.float32))
    if kind == 3:          # reductions and broadcasting
        m = F.mean(h, axis=0, keepdims=True)
        v = F.mean((h - m) * (h - m), axis=0, keepdims=True)
        return F.sigmoid((h - m) / F.sqrt(v + 1e-5))
    # a recurrent cell over the rows (foreach)
    w, u = _w(D, D), _w(D, D)

    def step(x, st):
        hn = F.tanh(F.matmul(F.reshape(x, (1, D)), w) + F.matmul(st[0], u))
        return F.reshape(hn, (D,)), [hn]
    ys, _ = F.foreach(step, h, [F.zeros((1, D))])
    return ys


def make_model(n_blocks: int):
    def model(x):
        h = x
        for k in range(n_blocks):
            h = _block(h, k)
        return F.sum(h, axis=-1)
    return model


def graph_nodes(g) -> int:
    return sum(1 for _ in g.walk())


def blocks_for(target_nodes: int) -> int:
    """The number of blocks whose model has about `target_nodes` IR nodes."""
    spec = dt.TensorSpec(("N", D))
    per_block = (graph_nodes(dt.trace(make_model(10), spec)) - graph_nodes(dt.trace(make_model(0), spec))) / 10
    return max(1, round((target_nodes - graph_nodes(dt.trace(make_model(0), spec))) / per_block))


def chain_model(op: str, depth: int):
    fns = {"tanh": F.tanh, "sigmoid": F.sigmoid}

    def model(x):
        h = x
        for i in range(depth):
            if op == "maximum":
                h = F.maximum(h * 0.9, x)
            elif op == "mixed":          # 3 ops per step: tanh, NaN-exact maximum, sigmoid
                h = F.sigmoid(F.maximum(F.tanh(h) * 0.9, x))
            else:
                h = fns[op](h)
        return h
    return model


def _import_dyntvm(tree: str | None) -> None:
    global dt, F
    if tree:
        import tempfile
        sys.path.insert(0, HERE)
        from bench_ab import package_root
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, package_root(os.path.abspath(tree), tempfile.mkdtemp(prefix="dyntvm-bench-")))
    import dyntvm
    if tree:
        assert "dyntvm-bench-" in dyntvm.__file__, dyntvm.__file__
    dt, F = dyntvm, dyntvm.F


def child(kind: str, arg: str) -> None:
    dt.compile(lambda x: x * 2.0, dt.TensorSpec(("N", 4)), use_cache=False)     # TVM start-up, not counted
    from dyntvm.codegen.build import stats
    stats.builds = 0
    if kind == "graph":
        model, spec = make_model(int(arg)), dt.TensorSpec(("N", D))
    else:
        op, depth = arg.split(":")
        model, spec = chain_model(op, int(depth)), dt.TensorSpec(("N", 16))
    g = dt.trace(model, spec)
    t0 = time.perf_counter()
    m = dt.compile(model, spec, use_cache=False)
    secs = time.perf_counter() - t0
    x = np.random.default_rng(0).standard_normal((7, spec.shape[1])).astype(np.float32)
    # each region against the numpy reference on its own inputs (float32 rounding differences grow through
    # a deep random graph: end to end only loosely)
    np.testing.assert_allclose(m(x, validate=True), model(x), rtol=5e-3, atol=1e-4)
    regions = sum(1 for n in m.graph.walk() if n.op == "region")
    print(json.dumps({"nodes": graph_nodes(g), "regions": regions, "secs": secs, "builds": stats.builds}))


def run_child(kind: str, arg: str, timeout: float, tree: str | None) -> dict | None:
    cmd = [sys.executable, __file__, "--child", kind, arg] + (["--tree", tree] if tree else [])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if res.returncode:
        sys.exit(f"{kind} {arg} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="10,100,300,1000,3000")
    p.add_argument("--chains", default="1,2,3,4,5,6,7,8,9")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--tree", help="dyntvm source tree to compile with (default: this one)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    _import_dyntvm(args.tree)
    if args.child:
        return child(*args.child)
    print(f"| target nodes | IR nodes | regions | compile s |")
    print("|---:|---:|---:|---:|")
    for size in [int(s) for s in args.sizes.split(",") if s]:
        r = run_child("graph", str(blocks_for(size)), args.timeout, args.tree)
        print(f"| {size} | " + (f"{r['nodes']} | {r['regions']} | {r['secs']:.2f} |" if r else
                                f"? | ? | > {args.timeout:.0f} (did not finish) |"), flush=True)
    depths = [int(d) for d in args.chains.split(",") if d]
    if not depths:
        return
    print(f"\n| chain on float32[N,16] | " + " | ".join(f"depth {d}" for d in depths) + " |")
    print("|---|" + "---:|" * len(depths))
    for op in ("tanh", "sigmoid", "maximum", "mixed"):
        cells = []
        for d in depths:
            r = run_child("chain", f"{op}:{d}", args.timeout, args.tree)
            cells.append(f"{r['secs']:.2f} s" if r else f"> {args.timeout:.0f} s")
        print(f"| {op} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
