"""CUDA builds: Relax's GPU pipeline (fusion + dlight schedules), symbolic shapes included.

On a machine without a GPU TVM still builds, but only emits CUDA source unless a driver library is
present (see TVM_NOTES section 2); such an artifact is refused at load time on a machine without a GPU.
"""
from __future__ import annotations

import os

DEFAULT_ARCH = os.environ.get("DYNTVM_CUDA_ARCH", "sm_90")


def cuda_target(arch: str | None = None):
    import tvm
    if tvm.cuda(0).exist:
        return tvm.target.Target.from_device(tvm.cuda(0))
    return tvm.target.Target({"kind": "cuda", "arch": arch or DEFAULT_ARCH})


def build_cuda(mod, target=None):
    """Build `mod` for CUDA with dlight's default GPU schedules."""
    import tvm
    from tvm import relax
    target = target or cuda_target()
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    with target:
        return tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
