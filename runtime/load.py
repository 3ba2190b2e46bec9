"""`dt.load`: an artifact (see `artifact.py` for its files and checks) -> a runnable CompiledModel.

Imports only the runtime and the IR (and TVM's runtime), never the frontend, partitioner or codegen:
a deployed artifact runs without them.
"""
from __future__ import annotations

import os

from dyntvm.errors import ArtifactError

from .artifact import KERNELS, folder_of, read_folder
from .model import CompiledModel, virtual_machine


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
    with folder_of(path) as folder:
        return _load_folder(folder, path, device)


def _load_folder(folder: str, label: str, device) -> CompiledModel:
    manifest, graph = read_folder(folder, label)
    files, target = manifest["files"], manifest["target"]
    device = device or target
    vm, lib = None, None
    if KERNELS in files:
        import tvm
        if device == "cuda" and not tvm.cuda(0).exist:
            raise ArtifactError(f"{label}: this is a CUDA artifact but no CUDA GPU is available here; "
                                "compile with --target cpu for this machine")
        if device not in ("cpu", "cuda"):
            raise ArtifactError(f"{label}: unknown device {device!r} (expected cpu or cuda)")
        try:
            lib = tvm.runtime.load_module(os.path.join(folder, KERNELS))
            vm = virtual_machine(lib, device)
        except Exception as e:  # noqa: BLE001 - TVM raises many kinds; all mean "cannot load"
            raise ArtifactError(f"{label}: cannot load {KERNELS}: {e}") from e
    if vm is None and any(n.op == "region" for n in graph.walk()):
        raise ArtifactError(f"{label}: graph has compiled regions but {KERNELS} is not listed")
    try:
        info = manifest.get("info") if isinstance(manifest.get("info"), dict) else {}
        model = CompiledModel(graph, vm, target, lib, {**info, "loaded_from": label})
    except Exception as e:  # noqa: BLE001 - a region function missing from the library, most likely
        raise ArtifactError(f"{label}: graph.json does not match {KERNELS}: {e}") from e
    model.lib_path = None
    if lib is not None:
        with open(os.path.join(folder, KERNELS), "rb") as f:
            model.lib_bytes = f.read()
    return model
