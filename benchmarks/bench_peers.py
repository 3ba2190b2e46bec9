#!/usr/bin/env python3
"""dyntvm against its peers (numpy, PyTorch eager, torch.compile, ONNX Runtime) on dynamic workloads.

    .venv/bin/python benchmarks/bench_peers.py [--quick] [--out benchmarks/results] [--only SUBSTR]
                                               [--systems numpy,torch,...] [--no-isolate]

Workloads (`benchmarks/peers/`): a. LSTM (foreach) B1 T64, B16 T64, B1 T256; b. greedy RNN decoding, 56
steps (while_loop); c. boolean mask N=2000 -> MLP; d. the bundled examples (decoder, detection, branchy and
transformer at batch 1 and 16; the lstm example is a.). Each system's version is written the way its
users would write it; peers that are not installed are reported as such and the rest still runs.

Per workload:
1. every system is built and its outputs are checked against the numpy implementation (allclose;
   tokens and indices exactly). Only systems that match are timed.
2. timing, interleaved in this one process: `--rounds` rounds; in each, every system runs one block of
   calls (`--block` seconds, at least 3 calls) after a `--pause` sleep, so the previous runtime's spinning
   worker threads (OpenBLAS, torch/OpenMP, ORT) go idle first; the order rotates between rounds. The
   reported time is the median over rounds of each block's median (the fastest call is kept too).
Every system gets `--threads` threads (2): OMP/OPENBLAS/MKL/TVM_NUM_THREADS, torch.set_num_threads,
ORT intra_op_num_threads.

Compile time and memory (unless --no-isolate, the default of --quick) come from one child process per
system that builds every workload after a warm-up compile of a trivial model (the compiler's start-up,
reported separately): the build time with cold caches (dt.compile into an empty dyntvm cache folder per
workload; torch.compile's first call with an empty inductor cache folder per workload and inductor's
in-memory caches cleared; ONNX graph building + ORT session creation), and the peak memory the build and 4 calls add: VmHWM (the kernel's peak RSS, reset through
/proc/self/clear_refs before each workload, after freeing the previous one and malloc_trim) minus the
RSS before the build. Compiler subprocesses (inductor's compile workers, gcc) are not counted. The timing
process then rebuilds with the caches warm. With --no-isolate the timing process's own (cold) builds
give the compile times and memory is not measured.

Writes OUT/peers.json, peers.md (the tables below, also printed) and peers.png (time relative to the
fastest system per workload, log scale); --quick writes peers_quick.*.
"""
from __future__ import annotations

import os
import sys


def _threads_from_argv(default: int = 2) -> int:
    """Thread count, fixed before numpy / torch / TVM are imported (their pools read it at import).

    Only when run as a script: importing this module (the test does) changes no environment variable.
    """
    if __name__ != "__main__":
        return default
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    return threads_from_argv(sys.argv, default)


THREADS = _threads_from_argv()

import argparse  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from peers import (GPU_SYSTEMS, LABELS, NO_COMPILE_STEP, REQUIRES, SYSTEMS, BuildContext,  # noqa: E402
                   NotApplicable, all_workloads)
from peers.common import as_tuple  # noqa: E402

OK, NA, MISSING, ERROR, MISMATCH, NONE = "ok", "n/a", "not installed", "error", "mismatch", "-"
PEER_NA_REASONS = {"torch_lstm": "the fused LSTM module exists for the LSTM rows only",
                   "ort_lstm": "the fused ONNX LSTM op exists for the LSTM rows only"}


# ------------------------------------------------------------------ environment

def missing_modules(system: str) -> list[str]:
    return [m for m in REQUIRES[system] if importlib.util.find_spec(m) is None]


def configure(threads: int, systems) -> None:
    """Thread counts and quiet logs for torch, if one of `systems` uses it (imported only then)."""
    if any("torch" in REQUIRES[s] for s in systems) and importlib.util.find_spec("torch") is not None:
        import logging

        import torch
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        torch._logging.set_logs(dynamo=logging.ERROR, inductor=logging.ERROR)
        import warnings
        warnings.filterwarnings("ignore", module="torch")


def versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("torch", "onnxruntime", "onnx", "tvm", "scipy"):
        if importlib.util.find_spec(mod) is None:
            out[mod] = MISSING
            continue
        try:
            from importlib.metadata import version
            out[mod] = version({"tvm": "apache-tvm"}.get(mod, mod))
        except Exception:                              # pragma: no cover
            out[mod] = "?"
    try:
        import dyntvm
        out["dyntvm"] = dyntvm.__version__
        rev = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        out["dyntvm_git"] = rev.stdout.strip()
    except Exception:                                  # pragma: no cover
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        out["numpy_blas"] = f"{blas.get('name')} {blas.get('version', '')}".strip()
    except Exception:                                  # pragma: no cover
        pass
    return out


def gpu_name(wanted: bool) -> str | None:
    """The CUDA GPU torch sees (None when --gpu is not given)."""
    if not wanted:
        return None
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:                                  # pragma: no cover
        pass
    return "none found"


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    have = set(line.split(":", 1)[1].split())
                    flags = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in have]
    except OSError:                                    # pragma: no cover
        pass
    if flags:
        cpu += f" ({', '.join(flags)})"
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "loadavg": list(os.getloadavg())}


# ------------------------------------------------------------------ memory (Linux)

def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:                                    # pragma: no cover
        pass
    return None


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                               # resets VmHWM to the current RSS
        return True
    except OSError:                                    # pragma: no cover
        return False


def release_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):                  # pragma: no cover
        pass


# ------------------------------------------------------------------ build + check

class BuildTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise BuildTimeout()


def check(ref: tuple, got: tuple, w) -> str | None:
    """None when `got` equals the numpy reference, else what differs."""
    if len(got) != len(ref):
        return f"{len(got)} outputs, expected {len(ref)}"
    for i, (r, g) in enumerate(zip(ref, got)):
        g = np.asarray(g)
        if g.shape != r.shape:
            return f"output {i}: shape {g.shape}, expected {r.shape}"
        if i in w.exact:
            if not np.array_equal(g, r):
                return f"output {i}: {int((g != r).sum())} of {r.size} values differ (compared exactly)"
        elif not np.allclose(g, r, rtol=w.rtol, atol=w.atol):
            return f"output {i}: max abs diff {float(np.max(np.abs(g.astype(np.float64) - r))):.3g}"
    return None


def build_checked(w, system: str, ctx: BuildContext, ref: tuple, limit_s: int = 0):
    """Build `system` for workload `w` and check its outputs. Returns (Prepared or None, result dict)."""
    if system not in w.builders:
        if system in w.na:
            return None, {"status": NA, "reason": w.na[system]}
        return None, {"status": NONE, "reason": PEER_NA_REASONS.get(system, "no variant for this workload")}
    miss = missing_modules(system)
    if miss:
        return None, {"status": MISSING, "reason": f"{', '.join(miss)} not installed"}
    old = None
    if limit_s and hasattr(signal, "SIGALRM"):
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(limit_s)
    t0 = time.perf_counter()
    try:
        p = w.builders[system](ctx)
        build_s = time.perf_counter() - t0
        out = p.fn(*p.args)
        got = p.to_numpy(out) if p.to_numpy else as_tuple(out)
    except NotApplicable as e:
        return None, {"status": NA, "reason": str(e)}
    except BuildTimeout:
        return None, {"status": ERROR, "reason": f"build + first call did not finish in {limit_s} s"}
    except Exception as e:                             # a failure to compile is a result, not a crash
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        return None, {"status": ERROR, "reason": msg[:300]}
    finally:
        if old is not None:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    res = {"status": OK, "build_s": p.compile_s if p.compile_s is not None else build_s}
    if p.info:
        res["info"] = p.info
    bad = check(ref, got, w)
    if bad:
        res.update(status=MISMATCH, reason=bad)
        return None, res
    return p, res


def forget(system: str) -> None:
    """Drop what a system keeps between workloads (torch.compile's caches of compiled frames)."""
    if system == "torch_compile" and "torch" in sys.modules:
        import torch._dynamo
        torch._dynamo.reset()
    release_memory()


def warm_up(system: str, cache_dir: str) -> float | None:
    """Compile a trivial model once, so later builds do not include the compiler's start-up."""
    if missing_modules(system):
        return None
    t0 = time.perf_counter()
    if system == "torch_compile":
        import torch
        f = torch.compile(lambda x: torch.tanh(x @ x) + 1)
        with torch.inference_mode():
            f(torch.ones(4, 4))
        torch._dynamo.reset()
    elif system in ("dyntvm", "dyntvm_onnx"):
        import dyntvm as dt
        from dyntvm import F
        dt.compile(lambda x: F.tanh(x) + 1.0, dt.TensorSpec(("N", 4)), cache_dir=cache_dir)(np.ones((2, 4), "float32"))
    elif system == "dyntvm_cuda":
        import dyntvm as dt
        from dyntvm import F
        from dyntvm.codegen.backends.cuda.gpu import gpu_present
        if not gpu_present():
            return None
        dt.compile(lambda x: F.tanh(x) + 1.0, dt.TensorSpec(("N", 4)), cache_dir=cache_dir,
                   target="cuda")(np.ones((2, 4), "float32"))
    elif system in ("torch_cuda", "torch_lstm_cuda"):
        import torch
        if not torch.cuda.is_available():
            return None
        (torch.ones(4, 4, device="cuda") @ torch.ones(4, 4, device="cuda")).cpu()
    elif system in ("ort", "ort_lstm"):
        import onnxruntime  # noqa: F401
    elif system in ("torch", "torch_lstm"):
        import torch
        with torch.inference_mode():
            torch.ones(4, 4) @ torch.ones(4, 4)
    else:
        return None
    return time.perf_counter() - t0


def context(cache_root: str, w, threads: int) -> BuildContext:
    """Cache folders of this workload: empty for its first (cold) build, warm for the next one."""
    d = os.path.join(cache_root, "dyntvm", w.key)
    os.makedirs(d, exist_ok=True)
    return BuildContext(cache_dir=d, threads=threads, torch_cache_dir=os.path.join(cache_root, "inductor", w.key))


# ------------------------------------------------------------------ child: cold build time + memory

def child_main(args) -> None:
    system = args.child
    configure(args.threads, [system])
    workloads = select(all_workloads(args.quick, gpu=args.gpu), args.only)
    out = {"system": system, "warmup_s": None, "base_rss_mb": None, "workloads": {}}

    def dump():
        with open(args.child_out, "w") as f:
            json.dump(out, f)
    out["warmup_s"] = warm_up(system, os.path.join(args.cache_root, "dyntvm", "_warmup"))
    release_memory()
    out["base_rss_mb"] = (_status_kb("VmRSS") or 0) / 1024
    dump()
    for w in workloads:
        if system not in w.builders:
            continue
        ref = w.reference()
        release_memory()
        can_reset = reset_peak()
        rss0 = _status_kb("VmRSS")
        p, res = build_checked(w, system, context(args.cache_root, w, args.threads), ref, args.build_limit)
        if p is not None:
            for _ in range(3):
                p.fn(*p.args)
        peak = _status_kb("VmHWM")
        if can_reset and rss0 is not None and peak is not None:
            res["peak_mb"] = (peak - rss0) / 1024
        out["workloads"][w.key] = res
        del p
        forget(system)
        dump()


def run_children(args, systems, cache_root) -> dict:
    results = {}
    for s in systems:
        if missing_modules(s):
            continue
        fd, path = tempfile.mkstemp(prefix=f"peers-{s}-", suffix=".json")
        os.close(fd)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", s, "--child-out", path,
               "--cache-root", cache_root, "--threads", str(args.threads), "--build-limit", str(args.build_limit)]
        if args.quick:
            cmd.append("--quick")
        if args.gpu:
            cmd.append("--gpu")
        if args.only:
            cmd += ["--only", args.only]
        t0 = time.perf_counter()
        log(f"[isolated] {LABELS[s]}: cold builds + memory in a child process ...")
        try:
            proc = subprocess.run(cmd, timeout=args.child_limit, capture_output=True, text=True)
            rc, tail = proc.returncode, (proc.stderr or "").strip().splitlines()[-3:]
        except subprocess.TimeoutExpired:
            rc, tail = "timeout", [f"child ran past {args.child_limit} s"]
        try:
            with open(path) as f:
                results[s] = json.load(f)
        except (OSError, ValueError):
            results[s] = {"system": s, "workloads": {}}
        os.unlink(path)
        results[s]["rc"] = rc
        if rc != 0:
            results[s]["failure"] = " | ".join(tail)
            log(f"    child exited with {rc}: {' | '.join(tail)}")
        log(f"    {time.perf_counter() - t0:.1f} s")
    return results


# ------------------------------------------------------------------ timing

def time_block(p, block_s: float, min_calls: int = 3, max_calls: int = 20000) -> list[float]:
    times = []
    end = time.perf_counter() + block_s
    fn, a = p.fn, p.args
    while len(times) < min_calls or (time.perf_counter() < end and len(times) < max_calls):
        t0 = time.perf_counter()
        fn(*a)
        times.append(time.perf_counter() - t0)
    return times


def measure(prepared: dict, rounds: int, block_s: float, pause_s: float) -> dict:
    names = list(prepared)
    for s in names:                                    # warm-up: caches, lazy initialisation, JIT paths
        time_block(prepared[s], min(block_s, 0.1))
    times = {s: [] for s in names}
    block_medians = {s: [] for s in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for s in order:
            time.sleep(pause_s)
            t = time_block(prepared[s], block_s)
            times[s] += t
            block_medians[s].append(statistics.median(t) * 1e3)
    return {s: {"median_ms": statistics.median(block_medians[s]), "min_ms": min(times[s]) * 1e3,
                "calls": len(times[s]), "block_medians_ms": [round(x, 4) for x in block_medians[s]]}
            for s in names}


def select(workloads, only):
    if not only:
        return workloads
    keys = [o.strip() for o in only.split(",") if o.strip()]
    return [w for w in workloads if any(k in w.key for k in keys)]


def run(args) -> dict:
    t_start = time.perf_counter()
    every = SYSTEMS + (GPU_SYSTEMS if args.gpu else ())
    systems = [s for s, _ in every if not args.systems or s in args.systems.split(",")]
    workloads = select(all_workloads(args.quick, gpu=args.gpu), args.only)
    cache_root = tempfile.mkdtemp(prefix="bench-peers-")
    os.environ["DYNTVM_CACHE_DIR"] = os.path.join(cache_root, "dyntvm", "_default")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "inductor")
    isolate = args.isolate if args.isolate is not None else not args.quick
    report = {"machine": machine(), "versions": versions(), "threads": args.threads, "gpu": gpu_name(args.gpu),
              "settings": {"quick": args.quick, "rounds": args.rounds, "block_s": args.block,
                           "pause_s": args.pause, "isolated_builds": isolate},
              "systems": {s: {"label": LABELS[s], "installed": not missing_modules(s)} for s in systems},
              "workloads": []}
    log(f"# {report['machine']['cpu']}, {report['machine']['cores']} cores, load average "
        f"{' '.join(f'{x:.2f}' for x in report['machine']['loadavg'])}; "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    try:
        children = run_children(args, systems, cache_root) if isolate else {}
        for s, c in children.items():
            report["systems"][s].update({k: c.get(k) for k in ("warmup_s", "base_rss_mb", "rc", "failure")
                                         if c.get(k) is not None})
        configure(args.threads, systems)
        if not isolate:
            for s in systems:
                t = warm_up(s, os.path.join(cache_root, "dyntvm", "_warmup"))
                if t is not None:
                    report["systems"][s]["warmup_s"] = t
        for w in workloads:
            report["workloads"].append(run_workload(w, systems, children, cache_root, args))
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    report["machine"]["loadavg_end"] = list(os.getloadavg())
    report["total_s"] = time.perf_counter() - t_start
    return report


def run_workload(w, systems, children, cache_root, args) -> dict:
    log(f"[{w.group}] {w.label}")
    ref = w.reference()
    ctx = context(cache_root, w, args.threads)
    prepared, results = {}, {}
    for s in systems:
        p, res = build_checked(w, s, ctx, ref, args.build_limit)
        child = children.get(s, {}).get("workloads", {}).get(w.key)
        if child is not None:                          # cold build time and memory from the child
            res["warm_build_s"] = res.pop("build_s", None)
            for k in ("build_s", "peak_mb", "info"):
                if k in child:
                    res[k] = child[k]
            if child.get("status") not in (OK, res["status"]):
                res["isolated_status"] = child["status"]
                res["isolated_reason"] = child.get("reason")
        elif children.get(s, {}).get("failure") and res["status"] == OK:
            res["isolated_reason"] = "child process failed: " + children[s]["failure"]
        if s in NO_COMPILE_STEP:
            res.pop("build_s", None)
            res.pop("warm_build_s", None)
        results[s] = res
        if p is not None:
            prepared[s] = p
        if res["status"] not in (OK, NONE, MISSING):
            log(f"    {LABELS[s]}: {res['status']}: {res.get('reason', '')}")
    timing = measure(prepared, args.rounds, args.block, args.pause) if prepared else {}
    for s, t in timing.items():
        results[s].update(t)
    del prepared
    for s in systems:
        forget(s)
    row = {"key": w.key, "label": w.label, "group": w.group, "note": w.note, "results": results}
    peers = {s: r["median_ms"] for s, r in results.items() if not s.startswith("dyntvm") and "median_ms" in r}
    if peers:
        best = min(peers, key=peers.get)
        row["best_peer"] = best
        if "median_ms" in results.get("dyntvm", {}):
            row["dyntvm_over_best_peer"] = results["dyntvm"]["median_ms"] / peers[best]
    gpu_peers = {s: t for s, t in peers.items() if s.endswith("_cuda")}
    if gpu_peers and "median_ms" in results.get("dyntvm_cuda", {}):
        best = min(gpu_peers, key=gpu_peers.get)
        row["best_gpu_peer"] = best
        row["dyntvm_cuda_over_best_gpu_peer"] = results["dyntvm_cuda"]["median_ms"] / gpu_peers[best]
    log("    " + "  ".join(f"{LABELS[s]} {r['median_ms']:.3f} ms" for s, r in results.items() if "median_ms" in r)
        + (f"  -> dyntvm / best peer {row['dyntvm_over_best_peer']:.2f}" if "dyntvm_over_best_peer" in row else "")
        + (f"  dyntvm CUDA / best GPU peer {row['dyntvm_cuda_over_best_gpu_peer']:.2f}"
           if "dyntvm_cuda_over_best_gpu_peer" in row else ""))
    return row


# ------------------------------------------------------------------ report

def _fmt_ms(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _cell(res: dict, value: str, notes: list) -> str:
    st = res.get("status")
    if st == OK:
        return value
    if st == NONE:
        return "—"
    if st == MISSING:
        return "not installed"
    notes.append(f"{st}: {res.get('reason', '')}")
    return f"{st} [{len(notes)}]"


def _rows(report: dict, systems: list, cell) -> list[str]:
    """One table row per workload: ``cell(workload, system, that system's result)`` per system."""
    return [f"| {w['label']} | " + " | ".join(cell(w, s, w["results"].get(s, {"status": NONE})) for s in systems)
            + " |" for w in report["workloads"]]


def _value_cell(res: dict, key: str, fmt: str) -> str:
    """`res[key]` formatted; "—" where the system has no variant; else its status."""
    if res.get("status") == NONE:
        return "—"
    return fmt.format(res[key]) if res.get(key) is not None else res.get("status", "")


def markdown(report: dict) -> str:
    systems = [s for s in report["systems"]
               if any(w["results"].get(s, {}).get("status") not in (NONE, None) for w in report["workloads"])]
    m, v = report["machine"], report["versions"]
    gpu_line = f"GPU: {report['gpu']}; " if report.get("gpu") else ""
    lines = [f"Machine: {gpu_line}{m['cpu']}, {m['cores']} cores; load average {m['loadavg'][0]:.2f} at the start, "
             f"{m.get('loadavg_end', [0])[0]:.2f} at the end; {report['threads']} threads per system.",
             "Versions: " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".",
             f"Settings: {report['settings']['rounds']} rounds x {report['settings']['block_s']} s blocks per "
             f"system, {report['settings']['pause_s']} s pause before each block; median over rounds of the "
             "block medians. "
             f"Total run time {report.get('total_s', 0):.0f} s.", ""]
    notes: list[str] = []
    gpu_col = any("dyntvm_cuda_over_best_gpu_peer" in w for w in report["workloads"])
    head = ("| workload | " + " | ".join(LABELS[s] for s in systems) + " | dyntvm / best peer |"
            + (" dyntvm CUDA / best GPU peer |" if gpu_col else ""))
    lines += ["Run time, median ms per call (lower is better; **bold**: fastest):", "", head,
              "|---|" + "---:|" * (len(systems) + 1 + gpu_col)]
    for w in report["workloads"]:
        r = w["results"]
        fastest = min((r[s]["median_ms"] for s in systems if "median_ms" in r.get(s, {})), default=None)
        cells = []
        for s in systems:
            res = r.get(s, {"status": NONE})
            val = _fmt_ms(res["median_ms"]) if "median_ms" in res else ""
            if val and res["median_ms"] == fastest:
                val = f"**{val}**"
            cells.append(_cell(res, val, notes))
        ratio = w.get("dyntvm_over_best_peer")
        rtxt = f"{ratio:.2f} ({LABELS[w['best_peer']]})" if ratio is not None else "—"
        if gpu_col:
            g = w.get("dyntvm_cuda_over_best_gpu_peer")
            rtxt += f" | {g:.2f} ({LABELS[w['best_gpu_peer']]})" if g is not None else " | —"
        lines.append(f"| {w['label']} | " + " | ".join(cells) + f" | {rtxt} |")

    lines += ["", "Fastest call, ms (on a busy machine the closest to what the system does alone):", "",
              "| workload | " + " | ".join(LABELS[s] for s in systems) + " |", "|---|" + "---:|" * len(systems)]
    lines += _rows(report, systems, lambda w, s, res: _fmt_ms(res["min_ms"]) if "min_ms" in res else
                   "—" if res.get("status", NONE) == NONE else res["status"])

    build_systems = [s for s in systems if s not in NO_COMPILE_STEP]
    cold = report["settings"]["isolated_builds"]
    lines += ["", f"Build time, s ({'cold caches, in a child process per system' if cold else 'cold caches'}; "
              "torch.compile: the first call; ONNX Runtime: ONNX graph + session creation; dyntvm: `dt.compile`). "
              "Start-up of the compiler (a trivial model compiled first, not included): "
              + ", ".join(f"{LABELS[s]} {report['systems'][s]['warmup_s']:.1f} s" for s in build_systems
                          if report["systems"][s].get("warmup_s") is not None and s in ("torch_compile", "dyntvm", "dyntvm_onnx"))
              + ".", "",
              "| workload | " + " | ".join(LABELS[s] for s in build_systems) + " |",
              "|---|" + "---:|" * len(build_systems)]
    def build_cell(w, s, res):
        if res.get("isolated_status"):                 # the cold build failed where the timed one did not
            notes.append(f"{LABELS[s]}, {w['label']}, cold build: {res['isolated_status']}: "
                         f"{res.get('isolated_reason', '')}")
            return f"{res['isolated_status']} [{len(notes)}]"
        return _value_cell(res, "build_s", "{:.2f}")
    lines += _rows(report, build_systems, build_cell)

    if cold:
        lines += ["", "Peak memory added by the build and 4 calls, MB (VmHWM minus RSS before the build, in the "
                  "system's child process). RSS of that process after importing the library and the warm-up: "
                  + ", ".join(f"{LABELS[s]} {report['systems'][s]['base_rss_mb']:.0f} MB" for s in systems
                              if report["systems"][s].get("base_rss_mb") is not None) + ".", "",
                  "| workload | " + " | ".join(LABELS[s] for s in systems) + " |",
                  "|---|" + "---:|" * len(systems)]
        lines += _rows(report, systems, lambda w, s, res: _value_cell(res, "peak_mb", "{:.1f}"))

    tc = [(w, w["results"].get("torch_compile", {})) for w in report["workloads"]]
    tc = [(w, r) for w, r in tc if r.get("info")]
    if tc:
        lines += ["", "torch.compile (default settings) over the first 3 calls: graphs compiled, graph breaks, "
                  "and why (dynamo's messages, first line):", "",
                  "| workload | graphs | breaks | reasons |", "|---|---:|---:|---|"]
        for w, r in tc:
            i = r["info"]
            why = "; ".join(i.get("break_reasons", [])) or "—"
            if i.get("eager_fallback"):
                why += " (**no graph: the whole function runs eagerly**)"
            lines.append(f"| {w['label']} | {i.get('graphs', '?')} | {i.get('graph_breaks', '?')} | {why} |")
    if notes:
        lines += [""] + [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(lines) + "\n"


def chart(report: dict, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:                                # pragma: no cover
        return False
    rows = [w for w in report["workloads"] if any("median_ms" in r for r in w["results"].values())]
    systems = [s for s, _ in SYSTEMS + GPU_SYSTEMS if any("median_ms" in w["results"].get(s, {}) for w in rows)]
    if not rows or not systems:
        return False
    fig, ax = plt.subplots(figsize=(max(9, 1.3 * len(rows) + 2), 5.5))
    width = 0.8 / len(systems)
    colors = plt.get_cmap("tab10")
    for j, s in enumerate(systems):
        xs, ys = [], []
        for i, w in enumerate(rows):
            r = w["results"]
            best = min(x["median_ms"] for x in r.values() if "median_ms" in x)
            if "median_ms" in r.get(s, {}):
                xs.append(i + (j - (len(systems) - 1) / 2) * width)
                ys.append(r[s]["median_ms"] / best)
        ax.bar(xs, ys, width, label=LABELS[s], color=colors(j), bottom=0)
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.8)                           # the fastest (1.0) still shows as a short bar
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([w["label"] for w in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time / fastest system (log)")
    ax.axhline(1.0, color="black", linewidth=0.6)
    m = report["machine"]
    ax.set_title(f"bench_peers: median time per call relative to the fastest ({m['cpu']}, "
                 f"{report['threads']} threads)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", which="both", linewidth=0.3, alpha=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, fewer workloads and rounds (~2 min)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for peers.json / .md / .png")
    p.add_argument("--only", help="comma-separated substrings of workload keys (e.g. lstm,mask)")
    p.add_argument("--systems", help="comma-separated: " + ",".join(s for s, _ in SYSTEMS + GPU_SYSTEMS))
    p.add_argument("--gpu", action="store_true", help="add the CUDA systems (" + ", ".join(
        LABELS[s] for s, _ in GPU_SYSTEMS) + "); writes peers_gpu.*")
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--rounds", type=int)
    p.add_argument("--block", type=float, help="seconds per timing block")
    p.add_argument("--pause", type=float, default=0.4, help="sleep before each block (s)")
    p.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                   help="cold builds + memory in a child process per system (default unless --quick)")
    p.add_argument("--no-isolate", dest="isolate", action="store_false")
    p.add_argument("--build-limit", type=int, default=300, help="seconds allowed per build + first call")
    p.add_argument("--child-limit", type=int, default=900, help="seconds allowed per child process")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--cache-root", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.block = args.block or (0.08 if args.quick else 0.25)
    report = run(args)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "peers" + ("_gpu" if args.gpu else "") + ("_quick" if args.quick else ""))
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1)
    md = markdown(report)
    with open(stem + ".md", "w") as f:
        f.write(md)
    drew = chart(report, stem + ".png")
    print(md)
    log(f"wrote {stem}.json, {stem}.md" + (f", {stem}.png" if drew else "") + f" in {report['total_s']:.0f} s")


if __name__ == "__main__":
    main()
