"""The device types kernels run on: the one table the runtime maps an artifact's (or a model's) target through.

An artifact records the device type of its kernels (manifest.json ``target``: ``"cpu"``, ``"cuda"``; the codegen
backend's `Backend.device`). Everything the runtime does differently per device type reads `DEVICES`: the TVM
device values live on, whether kernels work on host memory (else every host crossing is an explicit copy,
`placement`), what `dt.load` checks before it loads the kernels. Runtime-only: TVM's runtime, never its
compiler, nor dyntvm's codegen. A new target adds its line here (and its backend, `codegen/backends`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dyntvm.errors import ArtifactError


@dataclass(frozen=True)
class DeviceType:
    name: str                   # as artifacts record it (manifest.json "target")
    label: str                  # in messages: "a CUDA artifact"
    tvm_name: str               # TVM's device name: tvm.device(tvm_name, 0)
    host: bool                  # kernels read and write host memory: no copies, and the VM program may run
    check: Callable             # check(info, label): ArtifactError where this machine cannot run the kernels

    def tvm_device(self):
        import tvm
        return tvm.device(self.tvm_name, 0)


def ensure_cuda_runtime() -> str | None:
    """Load TVM's CUDA runtime (`libtvm_runtime_cuda.so`) if it is not loaded yet. A runtime-only TVM (no
    compiler library, e.g. a `dyntvm bundle`) loads no device backend by itself, so without this a CUDA
    artifact would find no GPU even on a GPU host. Without a CUDA driver (or CUDA 13's libcudart) the
    library cannot load: returns why, for the caller's "no GPU" error."""
    from pathlib import Path

    from tvm.base import _LOADED_LIBS
    if "tvm_runtime_cuda" in _LOADED_LIBS:
        return None
    try:
        from tvm_ffi.libinfo import load_lib_ctypes
        folder = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(package="tvm", target_name="tvm_runtime_cuda",
                                                           extra_lib_paths=[folder], mode="RTLD_LOCAL")
    except (OSError, RuntimeError, ImportError, KeyError, AttributeError) as e:
        # e.g. libcuda.so.1 (the driver) or libcudart.so.13 (the CUDA 13 runtime) not found
        return f"TVM's CUDA runtime cannot load: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
    return None


def check_gpu_arch(arch, label: str) -> None:
    """The fatbin holds machine code for one arch (no PTX): refuse a GPU of another compute capability."""
    import tvm
    if not isinstance(arch, str) or not arch.startswith("sm_"):
        return
    here = "sm_" + str(tvm.cuda(0).compute_version).replace(".", "")
    if arch.rstrip("a") != here:
        raise ArtifactError(f"{label}: its kernels were built for {arch}, this GPU is {here}; compile the model "
                            f"with --target cuda:{here}")


def check_cpu_features(built_with, label: str) -> None:
    """Kernels built for one CPU use its ISA extensions (AVX-512, BMI2... `native.ISA_FEATURES`): refuse a CPU
    that lacks one of them (it would die of an illegal instruction). Runs before the library is loaded, so
    the list must be there (that it was not edited is checked after loading, by the library's binding)."""
    if not isinstance(built_with, list) or not all(isinstance(f, str) for f in built_with):
        raise ArtifactError(f"{label}: manifest.json is corrupt: info.cpu_features (the CPU features its kernels "
                            f"use) must be a list of feature names, got {built_with!r}")
    from ..native import cpu_features
    here = cpu_features()
    missing = sorted(set(built_with) - here) if here else []
    if missing:
        raise ArtifactError(f"{label}: its kernels use CPU instructions this CPU lacks ({', '.join(missing)}); "
                            "compile the model on (or for) this machine")


def _check_cpu(info: dict, label: str) -> None:
    check_cpu_features(info.get("cpu_features"), label)


def _check_cuda(info: dict, label: str) -> None:
    import tvm
    why = ensure_cuda_runtime()
    if not tvm.cuda(0).exist:
        raise ArtifactError(f"{label}: this is a CUDA artifact but no CUDA GPU is available here"
                            + (f" ({why})" if why else "") + "; compile with --target cpu for this machine")
    check_gpu_arch(info.get("cuda_arch"), label)


#: device type -> how the runtime runs kernels built for it
DEVICES: dict[str, DeviceType] = {
    "cpu": DeviceType("cpu", "CPU", "cpu", host=True, check=_check_cpu),
    "cuda": DeviceType("cuda", "CUDA", "cuda", host=False, check=_check_cuda),
}


def device_names() -> str:
    """The known device types for messages: cpu or cuda."""
    names = sorted(DEVICES)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def device_type(name: str) -> DeviceType:
    """The table's line for `name`; ArtifactError for a device type it lacks."""
    try:
        return DEVICES[name]
    except (KeyError, TypeError):
        raise ArtifactError(f"unknown device type {name!r} (expected {device_names()})") from None
