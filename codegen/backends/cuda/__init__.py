"""The CUDA backend: Relax's GPU pipeline with dlight's schedules, device code built with nvcc on any machine
(in a child process where there is no GPU: `gpu.py`, `cuda_child.py`)."""
from __future__ import annotations

import json

from dyntvm.errors import CompileError

from ..base import Backend


class CUDABackend(Backend):
    name = "cuda"
    device = "cuda"
    tvm_kinds = ("cuda",)
    forms = ("cuda", "cuda:sm_XX")
    device_checks = True
    selects_conds = True        # the selects' wheres are kernels of their own (`gpu_select`: nvcc and vector selects)

    def parse(self, target: str):
        """``cuda`` (the local GPU's arch, else the default) or ``cuda:sm_XX``: the arch, or None."""
        from .gpu import parse_arch
        return parse_arch(target)

    def concrete_target(self, target: str):
        from .gpu import cuda_target, parse_arch
        return cuda_target(parse_arch(target))

    def fuse_passes(self, tvm_target) -> list:
        from .gpu import fuse_passes
        return fuse_passes(tvm_target)

    def default_schedule(self, func, tvm_target, name: str = ""):
        from .gpu import default_schedule
        return default_schedule(func, tvm_target)

    def build(self, mod, tvm_target, loops=(), tuned=None, program=None):
        from .gpu import build_cuda
        return build_cuda(mod, tvm_target, tuned, loops)

    def build_library(self, regions, tvm_target, binding, build_executable, tuning=None, loops=()):
        from .gpu import build_cuda_library
        return build_cuda_library(regions, tvm_target, binding, build_executable, tuning, loops)

    def runnable_here(self) -> bool:
        from .gpu import gpu_present
        return gpu_present()

    def check_library(self, path: str, tvm_target) -> None:
        """The library must hold device code (a fatbin) for the target's arch, not CUDA source."""
        from .gpu import check_device_code, target_arch
        check_device_code(path, target_arch(tvm_target))

    def recorded_facts(self, tvm_target, desc: str) -> dict:
        """The arch of the device code: dt.load refuses a GPU of another compute capability."""
        try:
            return {"cuda_arch": json.loads(desc).get("arch")}
        except (ValueError, AttributeError):
            return {"cuda_arch": None}

    def loop_specs(self, graph) -> list:
        """Device loops only: a host loop would read the GPU's memory."""
        from ...compiled_loops import loop_specs
        return loop_specs(graph, "cuda")

    def tuning_device(self):
        import tvm
        return tvm.cuda(0)

    def tuning_target(self, target: str, tvm_target):
        """The local GPU's own target (with the limits MetaSchedule needs, max_threads_per_block...:
        "cuda:sm_90" alone has none): tuning measures every candidate on it, so it must be of the arch asked for."""
        from .gpu import cuda_target, find_nvcc, gpu_present, target_arch
        if not gpu_present():
            raise CompileError(f"tune: target {target!r} needs a GPU here: MetaSchedule times every candidate kernel "
                               "on it (CUDA builds need no GPU; tuning does). Tune on a GPU host and pass the log "
                               "folder to dt.compile(..., tuning_log=) / dyntvm compile --tuning-log anywhere")
        gpu = cuda_target()
        local = target_arch(gpu)
        if target_arch(tvm_target) != local:
            raise CompileError(f"tune: target {target!r}: tuning measures on the local GPU, which is {local}; tune "
                               f"for it with target='cuda' (or on a GPU of {target_arch(tvm_target)})")
        find_nvcc()
        return gpu

    def tuned_on(self) -> dict:
        from .gpu import gpu_name
        return {"gpu": gpu_name()}

    def prepare_tuning(self, tvm_target) -> int:
        """Candidates are built with nvcc, in the builder's worker processes."""
        import os

        from .gpu import prepare_nvcc
        prepare_nvcc()
        return os.cpu_count() or 1


BACKEND = CUDABackend()
