"""Torch models exported to ONNX for the real-model tests, by either of torch's exporters, cached by what made them.

`export_onnx(make, key, exporter)` calls `make()` -> (model, args, input_names, dynamic_axes) only when no export
made from the same key, the same source of `make` and the same torch / torchvision / transformers versions is in
the cache folder (`$DYNTVM_TEST_EXPORTS`, else a private folder in the temp dir). `dynamic_axes` is
{input_name: {axis: dim_name}}; the dynamo exporter gets the same dims as `torch.export.Dim`s.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import os
import tempfile
import warnings

import torch


def _versions() -> str:
    out = []
    for dist in ("torch", "torchvision", "transformers", "onnx", "onnxscript"):
        try:
            out.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{dist}=-")
    return ",".join(out)


def cache_folder() -> str:
    folder = os.environ.get("DYNTVM_TEST_EXPORTS") or os.path.join(
        tempfile.gettempdir(), f"dyntvm-test-exports-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def export(model, args, path: str, names, axes, dynamo: bool) -> str:
    """`model` exported to `path` with the dims named in `axes` ({input: {axis: name}}) dynamic."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dims = {}
            shapes = tuple({ax: dims.setdefault(d, torch.export.Dim(d, min=1, max=4096)) for ax, d in axes.get(n, {}).items()}
                           for n in names)
            torch.onnx.export(model, args, path, dynamo=True, input_names=list(names), dynamic_shapes=shapes,
                              external_data=False, verbose=False)
        else:
            torch.onnx.export(model, args, path, dynamo=False, input_names=list(names), dynamic_axes=axes)
    return path


def export_onnx(make, key: str, exporter: str) -> str:
    """The path of `make()`'s model exported by `exporter` ("torchscript" or "dynamo"), from the cache when there."""
    assert exporter in ("torchscript", "dynamo"), exporter
    source = inspect.getsource(make) + inspect.getsource(export)
    digest = hashlib.sha256("\0".join([key, exporter, source, _versions()]).encode()).hexdigest()[:24]
    path = os.path.join(cache_folder(), f"{digest}.onnx")
    if os.path.exists(path):
        return path
    model, args, names, axes = make()
    staging = f"{path}.{os.getpid()}.part"
    try:
        export(model, args, staging, names, axes, dynamo=exporter == "dynamo")
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return path
