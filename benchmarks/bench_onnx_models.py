"""Real models through ONNX: dyntvm against onnxruntime on every `ModelCase` of the test suites (`tests/zoo_*.py`).

    .venv/bin/python benchmarks/bench_onnx_models.py [--zoo small] [--models small_cnn,gru_step]
                                                     [--exporters torchscript] [--threads N] [--rounds 5]
                                                     [--out benchmarks/results]

Per (model, exporter): export (cached, `tests/model_exports.py`), import, compile once (no compile cache) and
compare with onnxruntime at every size of the case (`model_exports.run_case`: nodes, regions, compile time,
builds, the sizes tried, match); then, at one size (the case's last unless `--size-index`), the median latency
of the compiled model, of an onnxruntime session (CPUExecutionProvider, `intra_op_num_threads` = the
threads dyntvm's kernels use: the machine's cores unless `--threads`) and of the case's torch model in
eager mode (the same threads; a model torch cannot call so has the reason in its column), timed in the same
process in alternating blocks (`bench_peers.measure`), and the ratios to onnxruntime and to the best peer. A
case that does not import, compile or match has its reason in the match column and is not timed; an exporter
in the case's `cannot` is listed with its reason. Writes `onnx_models.md` (the table) and `onnx_models.json`
under `--out`. Not a test: the numbers depend on the machine; heavy suites (torchvision, Hugging Face) take
minutes per model: select with `--zoo` / `--models`.
"""
from __future__ import annotations

import os
import sys


if __name__ == "__main__":
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    threads_from_argv(sys.argv, os.cpu_count() or 1)

import argparse  # noqa: E402
import glob  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
for folder in (HERE, TESTS):          # bench_peers' timing; the suites import model_exports, torch_models
    if folder not in sys.path:
        sys.path.insert(0, folder)


def load_zoos(names=None) -> dict:
    """{zoo name: CASES} of `tests/zoo_<name>.py`, imported by path (all of them, or those in `names`)."""
    zoos = {}
    for path in sorted(glob.glob(os.path.join(TESTS, "zoo_*.py"))):
        name = os.path.basename(path)[len("zoo_"):-len(".py")]
        if names and name not in names:
            continue
        spec = importlib.util.spec_from_file_location(f"zoo_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        if hasattr(module, "CASES"):            # (a zoo_ file without cases would be a helper)
            zoos[name] = list(module.CASES)
    if names and set(names) - set(zoos):
        found = sorted(os.path.basename(p)[len("zoo_"):-len(".py")] for p in glob.glob(os.path.join(TESTS, "zoo_*.py")))
        raise SystemExit(f"no tests/zoo_<name>.py for {', '.join(sorted(set(names) - set(zoos)))}; "
                         f"found: {', '.join(found) or 'none'}")
    return zoos


def onnx_nodes(path: str) -> int:
    from dyntvm.frontend.onnx_load import load, walk_nodes
    return sum(1 for _ in walk_nodes(load(path).graph))


def ort_session(path: str, threads: int):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def bench_case(case, exporter: str, args, cache_dir: str) -> dict:
    """One row: run_case's numbers and, if it matched, the latency of dyntvm and onnxruntime at one size."""
    from bench_peers import measure
    from model_exports import run_case

    row = {"model": case.name, "exporter": exporter}
    if exporter in case.cannot:
        row["match"] = f"cannot: {case.cannot[exporter]}"
        return row
    try:
        res = run_case(case, exporter, cache_dir)
    except Exception as e:  # noqa: BLE001 - export, import, compile or mismatch: the row says which, the rest runs
        row["match"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return row
    row.update(onnx_nodes=onnx_nodes(res.path), ir_nodes=res.nodes, regions=res.regions,
               compile_s=round(res.compile_s, 2), builds=res.builds, sizes=[str(s) for s in res.sizes],
               max_abs_err=max(res.max_abs_err), match="yes", onnx_mb=round(os.path.getsize(res.path) / 1e6, 3))
    size = case.sizes[args.size_index]
    session = ort_session(res.path, args.threads)
    names = [i.name for i in session.get_inputs()]
    feeds = case.inputs(np.random.default_rng(1), size)
    feeds = {n: feeds[n] for n in names}
    ordered = list(feeds.values())
    runs = {"onnxruntime": types.SimpleNamespace(fn=lambda: session.run(None, feeds), args=()),
            "dyntvm": types.SimpleNamespace(fn=lambda: res.compiled(*ordered), args=())}
    torch_run = _torch_eager(case, case.inputs(np.random.default_rng(1), size), args.threads)
    if isinstance(torch_run, str):
        row["torch"] = torch_run
    else:
        runs["torch"] = torch_run
    timing = measure(runs, args.rounds, args.block_s, args.pause_s)
    row.update(timed_size=str(size), ort_ms=timing["onnxruntime"]["median_ms"], dyntvm_ms=timing["dyntvm"]["median_ms"],
               ort_min_ms=timing["onnxruntime"]["min_ms"], dyntvm_min_ms=timing["dyntvm"]["min_ms"])
    if "torch" in timing:
        row["torch_ms"] = timing["torch"]["median_ms"]
    row["ratio"] = row["dyntvm_ms"] / row["ort_ms"]
    row["ratio_best"] = row["dyntvm_ms"] / min(row["ort_ms"], row.get("torch_ms", float("inf")))
    return row


def _torch_eager(case, feeds: dict, threads: int):
    """The case's torch model in eager mode, as its users call it (inference mode, `threads` threads), or why not."""
    import torch
    try:
        torch.set_num_threads(threads)
        model, _args, input_names, _axes = case.make()
        inputs = [torch.from_numpy(feeds[n]) for n in input_names]

        def call():
            with torch.inference_mode():
                return model(*inputs)
        call()
    except Exception as e:  # noqa: BLE001 - the column says why torch eager was not timed
        return f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
    return types.SimpleNamespace(fn=call, args=())


def _ms(x) -> str:
    return "" if x is None else f"{x:.3f}" if x < 10 else f"{x:.1f}"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores; load average {m['loadavg'][0]:.2f} at the start, "
             f"{m['loadavg_end'][0]:.2f} at the end; {report['threads']} threads for dyntvm and onnxruntime.",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".",
             f"Latency: median over {report['rounds']} rounds of {report['block_s']} s blocks, alternating; "
             f"total run time {report['total_s']:.0f} s.", "",
             "| model | exporter | ONNX nodes | regions | compile s | sizes compared | match | timed size | "
             "ORT ms | torch eager ms | dyntvm ms | dyntvm / ORT (lower: dyntvm faster) | dyntvm / best peer |",
             "|---|---|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        ok = r["match"] == "yes"
        match = f"yes (max err {r['max_abs_err']:.2g})" if ok else r["match"]
        lines.append(f"| {r['model']} | {r['exporter']} | {r.get('onnx_nodes', '')} | {r.get('regions', '')} | "
                     f"{r.get('compile_s', '')} | {' '.join(r.get('sizes', []))} | {match} | "
                     f"{r.get('timed_size', '')} | {_ms(r.get('ort_ms'))} | "
                     f"{_ms(r.get('torch_ms')) or r.get('torch', '')} | "
                     f"{_ms(r.get('dyntvm_ms'))} | {'%.2f' % r['ratio'] if 'ratio' in r else ''} | "
                     f"{'%.2f' % r['ratio_best'] if 'ratio_best' in r else ''} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zoo", help="comma-separated suites (tests/zoo_<name>.py), default all")
    p.add_argument("--models", help="comma-separated model names (ModelCase.name), default all")
    p.add_argument("--exporters", default="torchscript,dynamo", help="default both")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="default: the machine's cores")
    p.add_argument("--size-index", type=int, default=-1, help="which of a case's sizes is timed (default: last)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block-s", type=float, default=0.25, help="seconds per timed block")
    p.add_argument("--pause-s", type=float, default=0.2, help="pause before each block (idle the thread pools)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for onnx_models.md / .json")
    args = p.parse_args(argv)
    from bench_peers import machine, versions
    zoos = load_zoos(args.zoo.split(",") if args.zoo else None)
    wanted = set(args.models.split(",")) if args.models else None
    cases = [c for cases in zoos.values() for c in cases if wanted is None or c.name in wanted]
    if wanted and wanted - {c.name for c in cases}:
        raise SystemExit(f"no case named {', '.join(sorted(wanted - {c.name for c in cases}))}; cases: "
                         + ", ".join(c.name for cases in zoos.values() for c in cases))
    exporters = args.exporters.split(",")
    report = {"machine": machine(), "versions": versions(), "threads": args.threads, "rounds": args.rounds,
              "block_s": args.block_s, "rows": []}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dyntvm-bench-onnx-") as cache_dir:
        for case in cases:
            for exporter in (e for e in exporters if e in case.exporters):
                row = bench_case(case, exporter, args, cache_dir)
                report["rows"].append(row)
                print(f"{case.name} {exporter}: {row['match']}" + (
                    f"; ORT {_ms(row['ort_ms'])} ms, torch {_ms(row.get('torch_ms')) or row.get('torch')}, "
                    f"dyntvm {_ms(row['dyntvm_ms'])} ms ({row['ratio']:.2f} of ORT, "
                    f"{row['ratio_best']:.2f} of the best)"
                    if "ratio" in row else ""), flush=True)
    report["total_s"] = time.perf_counter() - start
    report["machine"]["loadavg_end"] = list(os.getloadavg())
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "onnx_models.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = markdown(report)
    with open(os.path.join(args.out, "onnx_models.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
