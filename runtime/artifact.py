"""Deployable artifacts: the files. Writes a model's artifact folder (or one .tar), reads and checks one.

Layout (DESIGN section 8): manifest.json (format version, dyntvm/TVM versions, target, signature,
sha256 of every file), graph.json (the partitioned graph), params.npz (constants, loaded with
allow_pickle=False), kernels.so (compiled regions, native code: load only artifacts you trust).
Reading checks everything first and imports only the runtime (no frontend, partitioner or codegen).
`dt.load` (`runtime/load.py`) turns what `read_folder` returns, plus the kernels, into a CompiledModel;
this module knows no CompiledModel (it saves any object with graph, target, regions, info and lib).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import tempfile

import numpy as np

from dyntvm.errors import ArtifactError, GraphError

from ..ir.serialize import graph_from_json, graph_to_json

FORMAT_VERSION = 1
KERNELS = "kernels.so"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _versions() -> dict:
    import tvm

    import dyntvm
    return {"dyntvm": dyntvm.__version__, "tvm": tvm.__version__}


def signature(graph) -> dict:
    return {"inputs": [{"name": v.name, **v.type.to_json()} for v in graph.inputs],
            "outputs": [v.type.to_json() for v in graph.outputs]}


def _json_info(info: dict) -> dict:
    """The JSON-able part of a model's info (compile time, cache, tuning log...), kept in the manifest."""
    out = {}
    for k, v in info.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


def save(model, path: str) -> None:
    """Write `model` to `path` (a folder; a path ending in .tar gives one tar file)."""
    as_tar = path.endswith(".tar")
    folder = tempfile.mkdtemp(prefix="dyntvm-art-") if as_tar else path
    try:
        os.makedirs(folder, exist_ok=True)
        text, params = graph_to_json(model.graph)
        with open(os.path.join(folder, "graph.json"), "w") as f:
            f.write(text)
        # np.asarray, not np.ascontiguousarray: the latter turns 0-d constants into shape (1,)
        np.savez(os.path.join(folder, "params.npz"), **{k: np.asarray(v, order="C") for k, v in params.items()})
        files = ["graph.json", "params.npz"]
        if model.lib is not None:
            src = getattr(model, "lib_path", None)
            blob = getattr(model, "lib_bytes", None)
            dst = os.path.join(folder, KERNELS)
            if src:
                shutil.copyfile(src, dst)
            elif blob is not None:         # a loaded library cannot be exported again
                with open(dst, "wb") as f:
                    f.write(blob)
            else:
                model.lib.export_library(dst)
            files.append(KERNELS)
        manifest = {"format_version": FORMAT_VERSION, **_versions(), "target": model.target,
                    "signature": signature(model.graph), "regions": model.regions,
                    "info": _json_info(model.info),
                    "files": {fn: _sha256(os.path.join(folder, fn)) for fn in files}}
        with open(os.path.join(folder, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        if as_tar:
            with tarfile.open(path, "w") as tar:
                for fn in ["manifest.json"] + files:
                    tar.add(os.path.join(folder, fn), arcname=fn)
    finally:
        if as_tar:
            shutil.rmtree(folder, ignore_errors=True)


def _extract(path: str) -> str:
    folder = tempfile.mkdtemp(prefix="dyntvm-load-")
    try:
        with tarfile.open(path, "r") as tar:
            for m in tar.getmembers():
                if not m.isfile() or os.path.basename(m.name) != m.name:
                    raise ArtifactError(f"{path}: unexpected member {m.name!r} in artifact tar")
            tar.extractall(folder, filter="data")
    except tarfile.TarError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise ArtifactError(f"{path}: not a readable artifact tar: {e}") from e
    except ArtifactError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


@contextlib.contextmanager
def folder_of(path: str):
    """The artifact folder at `path` (a .tar is extracted to a temporary folder, removed afterwards)."""
    if not os.path.exists(path):
        raise ArtifactError(f"{path}: no such artifact")
    folder = _extract(path) if os.path.isfile(path) else path
    try:
        yield folder
    finally:
        if folder != path:
            shutil.rmtree(folder, ignore_errors=True)


def read(path: str) -> tuple[dict, object]:
    """(manifest, partitioned graph) of an artifact, checked like `load`, without loading its kernels.

    For `dyntvm inspect`: looking at an artifact runs none of its native code.
    """
    with folder_of(path) as folder:
        return read_folder(folder, path)


def read_folder(folder: str, label: str) -> tuple[dict, object]:
    """`read` of an artifact folder; `label` names the artifact in error messages."""
    mpath = os.path.join(folder, "manifest.json")
    if not os.path.exists(mpath):
        raise ArtifactError(f"{label}: manifest.json is missing (not a dyntvm artifact?)")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
        fmt = manifest["format_version"]
        files = dict(manifest["files"])
        if not isinstance(manifest["target"], str):
            raise ValueError(f"target must be a string, got {manifest['target']!r}")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{label}: manifest.json is corrupt: {e}") from e
    if not isinstance(fmt, int) or fmt > FORMAT_VERSION:
        raise ArtifactError(f"{label}: artifact format version {fmt} is newer than this dyntvm supports "
                            f"({FORMAT_VERSION}); upgrade dyntvm")
    have = _versions()
    for k in ("tvm", "dyntvm"):
        if manifest.get(k) != have[k]:
            raise ArtifactError(f"{label}: built with {k} {manifest.get(k)}, but {have[k]} is installed; "
                                "recompile the model with this version")
    for fn, digest in files.items():
        p = os.path.join(folder, fn)
        if os.path.basename(fn) != fn:
            raise ArtifactError(f"{label}: manifest lists a file outside the artifact: {fn!r}")
        if not os.path.exists(p):
            raise ArtifactError(f"{label}: {fn} is missing")
        if _sha256(p) != digest:
            raise ArtifactError(f"{label}: {fn} does not match its sha256 in manifest.json (edited or corrupt)")
    for need in ("graph.json", "params.npz"):
        if need not in files:
            raise ArtifactError(f"{label}: manifest.json does not list {need}")
    try:
        with np.load(os.path.join(folder, "params.npz"), allow_pickle=False) as z:
            params = {k: z[k] for k in z.files}
    except (ValueError, OSError) as e:
        raise ArtifactError(f"{label}: params.npz is not a plain array archive ({e}); pickled objects are "
                            "refused") from e
    try:
        with open(os.path.join(folder, "graph.json")) as f:
            graph = graph_from_json(f.read(), params)
        graph.lint()
    except (GraphError, KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError) as e:
        raise ArtifactError(f"{label}: graph.json is invalid: {e}") from e
    return manifest, graph
