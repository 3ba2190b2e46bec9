"""`dt.load`: an artifact (see `artifact.py` for its files and checks) -> a runnable CompiledModel.

Imports only the runtime and the IR (and TVM's runtime), never the frontend, partitioner or codegen:
a deployed artifact runs without them.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

from dyntvm.errors import ArtifactError

from ..native import execution_binding, execution_facts, shared_object_problem
from .artifact import KERNELS, folder_of, library_binding, read_folder
from .model import CompiledModel, virtual_machine
from .staging import remove_stale


def load(path: str, device: str | None = None) -> CompiledModel:
    """Load an artifact written by `model.save` / `dyntvm compile`.

    Args:
        path: the artifact folder or .tar file.
        device: "cpu" or "cuda"; default: the artifact's target.

    Raises:
        dt.ArtifactError: missing or corrupt files, hash or version mismatch, no GPU for a CUDA artifact.

    Example:
        >>> model = dt.load("lstm.dtvm")
        >>> hs, h = model(xs, h0, c0)
    """
    if isinstance(path, (str, os.PathLike)):
        remove_stale(path)               # what a killed `model.save` of this path left next to it
    with folder_of(path) as folder:
        return _load_folder(folder, path, device)


def _load_folder(folder: str, label: str, device) -> CompiledModel:
    manifest, graph = read_folder(folder, label)       # also: signature, regions, binding match graph.json
    files, target = manifest["files"], manifest["target"]
    device = device or target
    vm, lib = None, None
    if KERNELS in files:
        import tvm
        if device not in ("cpu", "cuda"):
            raise ArtifactError(f"{label}: unknown device {device!r} (expected cpu or cuda)")
        if device != target:
            raise ArtifactError(f"{label}: this is a {'CUDA' if target == 'cuda' else 'CPU'} artifact: its kernels "
                                f"run on {target}, not {device}; compile the model with --target {device}")
        info = manifest.get("info") if isinstance(manifest.get("info"), dict) else {}
        if device == "cuda":
            why = ensure_cuda_runtime()
            if not tvm.cuda(0).exist:
                raise ArtifactError(f"{label}: this is a CUDA artifact but no CUDA GPU is available here"
                                    + (f" ({why})" if why else "") + "; compile with --target cpu for this machine")
            check_gpu_arch(info.get("cuda_arch"), label)
        else:
            check_cpu_features(info.get("cpu_features"), label)
        with open(os.path.join(folder, KERNELS), "rb") as f:
            blob = f.read()
        if hashlib.sha256(blob).hexdigest() != files[KERNELS]:            # changed since read_folder
            raise ArtifactError(f"{label}: {KERNELS} does not match its sha256 in manifest.json (edited or corrupt)")
        # loaded from a private copy: dlopen hands back the library already loaded from the same path,
        # so an artifact saved again in place would otherwise run the kernels it had before
        private = _private_copy(blob, label)
        try:
            check_shared_object(private, label)
            try:
                lib = tvm.runtime.load_module(private)
                vm = virtual_machine(lib, device)
            except Exception as e:  # noqa: BLE001 - TVM raises many kinds; all mean "cannot load"
                raise ArtifactError(f"{label}: cannot load {KERNELS}: {e}") from e
        finally:
            with contextlib.suppress(OSError):
                os.remove(private)                 # the loaded library stays mapped
        got = library_binding(vm)
        if got != execution_binding(manifest["binding"], execution_facts(target, info)):
            raise ArtifactError(f"{label}: {KERNELS} was not built for this graph.json + params.npz + manifest.json "
                                f"({'it carries no binding' if got is None else 'its binding differs'}: another "
                                "model's kernels, or files edited after compiling: the graph, the weights, or "
                                "manifest.json's target, info.built_for, info.cpu_features, info.cuda_arch or "
                                "info.tuning.specialized); recompile the model")
    if vm is None and any(n.op == "region" for n in graph.walk()):
        raise ArtifactError(f"{label}: graph has compiled regions but {KERNELS} is not listed")
    try:
        info = manifest.get("info") if isinstance(manifest.get("info"), dict) else {}
        model = CompiledModel(graph, vm, target, lib, {**info, "loaded_from": label})
    except Exception as e:  # noqa: BLE001 - a region function missing from the library, most likely
        raise ArtifactError(f"{label}: graph.json does not match {KERNELS}: {e}") from e
    model.lib_path = None
    if lib is not None:
        model.lib_bytes = blob
    return model


def _private_copy(blob: bytes, label: str) -> str:
    """A new file in the temp folder holding `blob`; ArtifactError naming the folder when it cannot be written
    (a full disk), with nothing left behind."""
    try:
        fd, private = tempfile.mkstemp(prefix="dyntvm-kernels-", suffix=".so")
    except OSError as e:
        raise ArtifactError(f"{label}: cannot copy {KERNELS} into the temp folder {tempfile.gettempdir()} to load it "
                            f"({e.strerror or e}; $TMPDIR chooses where)") from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
    except OSError as e:
        os.remove(private)
        raise ArtifactError(f"{label}: cannot copy {KERNELS} into the temp folder {os.path.dirname(private)} to load "
                            f"it ({e.strerror or e}; $TMPDIR chooses where)") from e
    return private


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


def check_shared_object(path: str, label: str) -> None:
    """Refuse a kernels.so that cannot be a whole ELF shared object before it is handed to dlopen
    (`dyntvm.native.shared_object_problem`: a truncated one ends the process with SIGBUS)."""
    why = shared_object_problem(path)
    if why is not None:
        raise ArtifactError(f"{label}: {KERNELS} is not a loadable shared library: {why}")
