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
from .devices import DEVICES, device_names
from .model import CompiledModel, virtual_machine
from .staging import remove_stale


def load(path: str, device: str | None = None) -> CompiledModel:
    """Load an artifact written by `model.save` / `dyntvm compile`.

    Args:
        path: the artifact folder or .tar file.
        device: a device type of `devices.DEVICES` ("cpu", "cuda"); default: the artifact's target.

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
        if not isinstance(device, str) or device not in DEVICES:
            raise ArtifactError(f"{label}: unknown device {device!r} (expected {device_names()})")
        if device != target:
            raise ArtifactError(f"{label}: this is a {DEVICES[target].label} artifact: its kernels "
                                f"run on {target}, not {device}; compile the model with --target {device}")
        info = manifest.get("info") if isinstance(manifest.get("info"), dict) else {}
        DEVICES[device].check(info, label)          # this machine can run the kernels (before dlopen)
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


def check_shared_object(path: str, label: str) -> None:
    """Refuse a kernels.so that cannot be a whole ELF shared object before it is handed to dlopen
    (`dyntvm.native.shared_object_problem`: a truncated one ends the process with SIGBUS)."""
    why = shared_object_problem(path)
    if why is not None:
        raise ArtifactError(f"{label}: {KERNELS} is not a loadable shared library: {why}")
