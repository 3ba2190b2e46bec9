"""A/B in one process: a plain model call through the VM program with the inputs passed as they are (kernels
built assuming element alignment, `vm_program.ELEMENT_ALIGNED_INPUTS`, the default) against the same model built
with TVM's 64-byte alignment (inputs not so aligned copied per call), beside the peers (plain numpy, ONNX
Runtime), interleaved in rounds; the calling thread's CPU time per call (`time.thread_time`).

    python benchmarks/bench_call_path.py [rounds] [--threads N] [--only detection,branchy]

The inputs start 16 bytes past a 64-byte boundary (numpy's own alignment is 16, so most arrays it allocates are
not 64-byte aligned). Prints per workload and system the median and min over rounds of the mean per call (us),
and each dyntvm build's ratio to the best peer.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thread_env import threads_from_argv  # noqa: E402

THREADS = threads_from_argv(sys.argv, 1)
os.environ["DYNTVM_VM_PROGRAM"] = "always"

import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from peers import BuildContext, branchy, detection  # noqa: E402


def _at16(a: np.ndarray) -> np.ndarray:
    raw = np.empty(a.nbytes + 128, np.uint8)
    off = (-raw.ctypes.data) % 64 + 16
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _builds(w, ctx):
    from dyntvm.codegen import vm_program
    out = {}
    for system in ("numpy", "ort"):
        try:
            out[system] = w.builders[system](ctx)
        except Exception as e:  # noqa: BLE001 - a peer not installed: left out
            print(f"  ({system}: {type(e).__name__}: {e})")
    for name, aligned in (("dyntvm", True), ("dyntvm_copy", False)):
        vm_program.ELEMENT_ALIGNED_INPUTS = aligned         # (part of the compile cache's key)
        try:
            out[name] = w.builders["dyntvm"](ctx)
        finally:
            vm_program.ELEMENT_ALIGNED_INPUTS = True
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = int(args[0]) if args and args[0].isdigit() else 9
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else ["detection", "branchy"]
    workloads = []
    if "detection" in only:
        workloads.append(detection.workload(200))
    if "branchy" in only:
        workloads += [w for w in branchy.workloads(False, False) if w.key.endswith(("_B1", "_B16"))]
    ctx = BuildContext(cache_dir=tempfile.mkdtemp(prefix="bench-call-path-"), threads=THREADS)
    for w in workloads:
        w.inputs = tuple(_at16(np.asarray(a)) for a in w.inputs)
        prepared = _builds(w, ctx)
        for p in prepared.values():               # (dyntvm's and numpy's arguments: the misaligned arrays)
            if p.args and all(isinstance(a, np.ndarray) for a in p.args):
                p.args = tuple(_at16(a) for a in p.args)
        one = prepared["numpy"]
        t0 = time.perf_counter()
        for _ in range(20):
            one.fn(*one.args)
        calls = max(50, min(5000, int(0.15 / max((time.perf_counter() - t0) / 20, 1e-7))))
        res = {s: [] for s in prepared}
        names = list(prepared)
        for r in range(rounds + 1):
            for s in names[r % len(names):] + names[:r % len(names)]:
                fn, a = prepared[s].fn, prepared[s].args
                t0 = time.thread_time()
                for _ in range(calls):
                    fn(*a)
                if r:                              # (round 0: warm-up)
                    res[s].append((time.thread_time() - t0) / calls * 1e6)
        med = {s: statistics.median(v) for s, v in res.items()}
        low = {s: min(v) for s, v in res.items()}
        peers = [s for s in med if not s.startswith("dyntvm")]
        best_med, best_min = min(med[s] for s in peers), min(low[s] for s in peers)
        print(f"{w.label} ({THREADS} thread{'s' if THREADS > 1 else ''}, {calls} calls x {rounds} rounds): "
              + ", ".join(f"{s} {med[s]:.1f} / {low[s]:.1f} us" for s in med)
              + "; dyntvm / best peer " + ", ".join(f"{s} {med[s] / best_med:.2f} / {low[s] / best_min:.2f}"
                                                    for s in med if s.startswith("dyntvm")), flush=True)


if __name__ == "__main__":
    main()
