"""Per-layer time of a torchvision CNN (issue 24), one thread: dyntvm's kernels against onnxruntime's nodes in
its own profile (`SessionOptions.enable_profiling`, one intra-op thread), interleaved in one process (a dyntvm
round, an onnxruntime round, ...). A "layer" is a convolution (or the classifier's matmul / Gemm) with the
element-wise and pooling work after it up to the next one, on both sides (onnxruntime fuses differently: its
SE block's Mul is a node after the excite conv, dyntvm fuses it into that conv; either way it lands in the same
layer). The convolutions pair up in execution order (their output shapes are checked). Both sides are wall time
(us) of the kernel / node alone, median over `--rounds`: dyntvm's kernels called through the VM's instrument hook
(as `profile_kernels.py`), so neither side counts its executor's own work. Rows ranked by the time lost
(dyntvm - onnxruntime). onnxruntime's profile costs it ~10-20 us a node (mobilenet_v3_small B1: its nodes sum to
~1.2x its unprofiled run), so small layers' ratios here understate the gap; the model-level ratio is the
reference.

    taskset -c 1 .venv/bin/python benchmarks/bench_layer_breakdown.py --model mobilenet_v3_small [--batch 8]
        [--rounds 20] [--ab MODULE.NAME[=VALUE][,...]]

`--ab`: dyntvm's side compiled with those switches of `codegen/cache.SWITCHES` set (as `bench_conv_models.py`).
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    threads_from_argv(sys.argv + ["--threads", "1"], 1)

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ANCHOR_ORT = ("Conv", "FusedConv", "NhwcFusedConv", "Gemm", "MatMul", "FusedGemm")


def _is_anchor_kernel(symbol: str) -> bool:
    return "dt_conv" in symbol or "matmul" in symbol or "dense" in symbol


def dyntvm_round(model, x) -> list:
    """[(symbol, output shape, us)] of one model call's kernels in execution order."""
    ex = model._thread_executor()
    vm = ex.vm
    calls = []

    def instrument(func, symbol, before, _ret, *call_args):
        symbol = str(symbol)
        if not before or type(func).__name__ == "Closure" or "." in symbol or symbol.startswith(
                ("shape_func", "compute_symbolic_expr")):
            return 0
        if any(a is None for a in call_args):
            return 0
        t0 = time.perf_counter()
        func(*call_args)
        calls.append((symbol, tuple(call_args[-1].shape) if hasattr(call_args[-1], "shape") else (),
                      (time.perf_counter() - t0) * 1e6,
                      [tuple(a.shape) for a in call_args if hasattr(a, "shape")]))
        return 1        # the VM skips its own call
    vm.set_instrument(instrument)
    try:
        model(x)
    finally:
        vm.set_instrument(None)
    return calls


def group(items: list, is_anchor) -> list:
    """[(anchor item, [items after it up to the next anchor])]; items before the first anchor join it."""
    groups, lead = [], []
    for it in items:
        if is_anchor(it):
            groups.append([it, lead + [it]])
            lead = []
        elif groups:
            groups[-1][1].append(it)
        else:
            lead.append(it)
    return groups


def _dyntvm_key(call) -> tuple:
    """(weight [O, Cg, *K] or None, output shape) of a dyntvm anchor kernel call (the weight packed
    [O / vb, Cg, *K, vb] or as given [O, Cg, *K]: the argument after the data)."""
    shapes = call[3]
    if "dt_conv" not in call[0] or len(shapes) < 2:
        return None, call[1]
    w = shapes[1]
    if len(w) == len(shapes[0]) + 1:
        w = (w[0] * w[-1],) + w[1:-1]
    return w, call[1]


def _ort_key(node) -> tuple:
    ins = node[4]
    return (ins[1] if node[1] != "Gemm" and len(ins) > 1 else None), node[2]


def _ort_label(node) -> str:
    ins, out = node[4], node[2]
    if node[1] in ("Gemm", "MatMul", "FusedGemm") or len(ins) < 2 or len(out) < 3:
        return f"{node[1]} -> {'x'.join(map(str, out))}"
    x, w = ins[0], ins[1]
    k = "x".join(map(str, w[2:]))
    stride = x[-1] // out[-1] if out[-1] else 1
    kind = "dw " if w[1] == 1 and w[0] == x[1] and x[1] > 1 else ""
    res = " +res" if len(ins) > 3 else ""
    return f"{kind}{k}{'/' + str(stride) if stride > 1 else ''} {x[1]}->{w[0]} @{x[-1]}{res}"


def pair(d_anchors: list, o_anchors: list) -> list:
    """[(dyntvm index, onnxruntime index)]: each onnxruntime anchor with the first unpaired dyntvm anchor of the
    same weight and output shapes (the two may order independent layers differently: resnet's downsample), then
    the rest by the weight's shape alone."""
    taken, out = set(), []
    for same_output in (True, False):   # then by the weight alone: the SE block's excite conv, whose multiply
        for j, node in enumerate(o_anchors):    # dyntvm fuses (its output [N, C, H, W], onnxruntime's [N, C, 1, 1])
            key = _ort_key(node)
            if any(jj == j for _, jj in out) or (not same_output and key[0] is None):
                continue
            for i, call in enumerate(d_anchors):
                if i in taken:
                    continue
                dk = _dyntvm_key(call)
                if (dk[1] == key[1] and (key[0] is None or dk[0] is None or dk[0] == key[0])) if same_output \
                        else dk[0] == key[0]:
                    taken.add(i)
                    out.append((i, j))
                    break
    return sorted(out)


def ort_rounds(events: list) -> list:
    """[[(node name, op, output shape, us)] per run] from onnxruntime's profile events."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    out = []
    for lo, hi in runs:
        rows = []
        for e in sorted((e for e in nodes if lo <= e["ts"] <= hi), key=lambda e: e["ts"]):
            a = e.get("args", {})
            shapes = [tuple(v) for o in a.get("output_type_shape", []) for v in o.values()]
            ins = [tuple(v) for o in a.get("input_type_shape", []) for v in o.values()]
            rows.append((e["name"][:-len("_kernel_time")], a.get("op_name", ""), shapes[0] if shapes else (),
                         float(e["dur"]), ins))
        out.append(rows)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)   # always 1
    parser.add_argument("--ab", default="", help="MODULE.NAME[=VALUE][,...] switches for dyntvm's side")
    parser.add_argument("--top", type=int, default=0, help="rows shown (0: all)")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    import dyntvm as dt
    from bench_conv_models import ab_switches, export
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = export(args.model, tmp)
        x = rng.standard_normal((args.batch, 3, 224, 224)).astype("float32")
        ab = ab_switches(args.ab) if args.ab else []
        committed = [(m, k, getattr(m, k)) for m, k, _ in ab]
        for m, k, v in ab:
            setattr(m, k, v)
        try:
            model = dt.compile(dt.from_onnx(path), use_cache=False)
        finally:
            for m, k, v in committed:
                setattr(m, k, v)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        want = sess.run(None, {"x": x})[0]
        err = float(np.max(np.abs(np.asarray(model(x)) - want)))
        print(f"{args.model} B{args.batch}: max |dyntvm - onnxruntime| {err:.2e}", flush=True)
        for _ in range(3):      # warm-up
            dyntvm_round(model, x)
            sess.run(None, {"x": x})
        dy = []
        for _ in range(args.rounds):
            dy.append(dyntvm_round(model, x))
            sess.run(None, {"x": x})
        with open(sess.end_profiling()) as fh:
            ortr = ort_rounds(json.load(fh))[-args.rounds:]
    dg = [group(r, lambda c: _is_anchor_kernel(c[0])) for r in dy]
    og = [group(r, lambda n: n[1] in ANCHOR_ORT) for r in ortr]
    pairs = pair([g[0] for g in dg[0]], [g[0] for g in og[0]])
    if len(pairs) != len(dg[0]) or len(pairs) != len(og[0]):
        print(f"layers: dyntvm {len(dg[0])}, onnxruntime {len(og[0])}, paired {len(pairs)}")
    rows = []
    for i, j in pairs:
        d_anchor, o_anchor = dg[0][i][0], og[0][j][0]
        d_us = float(np.median([sum(c[2] for c in g[i][1]) for g in dg]))
        o_us = float(np.median([sum(n[3] for n in g[j][1]) for g in og]))
        parts = o_anchor[0].lstrip("/").replace("features/features.", "f").replace("/block/block.", ".b").split("/")
        where = parts[0] if parts[0].startswith("f") else "/".join(parts[1:3])
        rows.append((d_us - o_us, d_us, o_us, f"{_ort_label(o_anchor)}  {where[:22]}", d_anchor[0]))
    d_total = float(np.median([sum(c[2] for c in r) for r in dy]))
    o_total = float(np.median([sum(n[3] for n in r) for r in ortr]))
    rows.sort(key=lambda r: -r[0])
    print(f"{'layer (onnxruntime node)':58s} {'dyntvm':>8s} {'ort':>8s} {'lost':>8s} {'ratio':>6s}  kernel")
    for lost, d_us, o_us, label, sym in rows[:args.top or None]:
        print(f"{label[:58]:58s} {d_us:8.1f} {o_us:8.1f} {lost:8.1f} {d_us / max(o_us, 1e-9):6.2f}  {sym[:40]}")
    print(f"all kernels / nodes: dyntvm {d_total:.1f} us, onnxruntime {o_total:.1f} us "
          f"({d_total / o_total:.2f}x), {args.rounds} interleaved rounds, one thread")
    return 0


if __name__ == "__main__":
    sys.exit(main())
