"""The child process of a CUDA build on a machine without a GPU (`gpu.py`): ``python -m
dyntvm.codegen.backends.cuda.cuda_child WORKDIR`` with the stub `libcuda.so.1` first on `LD_LIBRARY_PATH`. Reads the regions
(`job.json`, `params.npz`) from WORKDIR, builds them for the job's arch and exports `kernels.so` there.
Nothing imports this module: it is only run."""
from __future__ import annotations

import json
import os
import sys

from ....ir.serialize import graph_from_dict
from ....native import export_library
from ...build import build_executable, stats
from .gpu import cuda_target, gpu_present, set_switches


def main(work: str) -> None:
    import numpy as np

    with open(os.path.join(work, "job.json")) as f:
        job = json.load(f)
    with np.load(os.path.join(work, "params.npz")) as z:
        params = {k: z[k] for k in z.files}
    if not gpu_present() and not cuda_runtime_loaded():
        raise SystemExit("dyntvm: TVM's CUDA runtime did not load in the build process (the stub libcuda.so.1 "
                         "was not picked up?)")
    set_switches(job.get("switches", {}))          # the parent's A/B switches, e.g. one flipped by a test
    regions = [(name, graph_from_dict(d, params)) for name, d in job["regions"]]
    target = cuda_target(job["arch"])
    tuning = None
    if job.get("tuning"):                   # checked by the parent: its warnings were given there
        import warnings

        from ...tuning import load_log
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            log = load_log(job["tuning"]["log"], None, target)
        tuning = (log, {r: [(dict(c), n) for c, n in specs] for r, specs in job["tuning"]["table"].items()})
    loops = [_tuples(spec) for spec in job.get("loops", [])]        # JSON made the specs' tuples lists
    ex = build_executable(regions, "cuda", job["binding"], target, loops=loops, tuning=tuning)
    export_library(ex, os.path.join(work, "kernels.so"))       # a full disk: a message, not "LLVM ERROR"
    with open(os.path.join(work, "result.json"), "w") as f:
        json.dump({"tuned_kernels": stats.tuned_kernels,
                   "unscheduled": sorted(tuning[0].unscheduled) if tuning is not None else [],
                   "refused": tuning[0].refused if tuning is not None else {}}, f)


def _tuples(x):
    return tuple(_tuples(e) for e in x) if isinstance(x, list) else x


def cuda_runtime_loaded() -> bool:
    with open("/proc/self/maps") as f:
        return "libtvm_runtime_cuda" in f.read()


if __name__ == "__main__":
    main(sys.argv[1])
