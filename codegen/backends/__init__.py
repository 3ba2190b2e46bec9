"""The compilation targets: one `Backend` (`base.py`) per folder, found through `BACKENDS`.

A target string is ``<name>`` or ``<name>:<options>`` (``cpu``, ``cuda``, ``cuda:sm_80``); `resolve` maps it to
its backend once (in `dt.compile` / `dt.tune`), and codegen uses the backend's hooks from there. Adding a target:
a folder ``backends/<name>/`` whose ``__init__.py`` defines ``BACKEND``, its line below, and its device type's
line in ``runtime/devices.py``.
"""
from __future__ import annotations

import importlib

from dyntvm.errors import CompileError

from .base import Backend

#: target name -> the module defining its ``BACKEND`` (imported on first use: the CUDA backend's modules stay
#: unloaded in a CPU compile), or a `Backend` itself (tests register one this way)
BACKENDS: dict = {
    "cpu": "dyntvm.codegen.backends.cpu",
    "cuda": "dyntvm.codegen.backends.cuda",
}


def get_backend(name: str) -> Backend:
    """The backend registered under `name` (a KeyError where none is)."""
    entry = BACKENDS[name]
    return importlib.import_module(entry).BACKEND if isinstance(entry, str) else entry


def target_forms() -> str:
    """Every form of target string the backends take, for messages: "cpu, cuda or cuda:sm_XX"."""
    forms = [f for name in BACKENDS for f in get_backend(name).forms]
    return ", ".join(forms[:-1]) + " or " + forms[-1] if len(forms) > 1 else forms[0]


def resolve(target) -> Backend:
    """The backend of a target string, checked (its options too); CompileError naming the known targets."""
    name = target.split(":", 1)[0] if isinstance(target, str) else None
    if name not in BACKENDS:
        raise CompileError(f"compile: unknown target {target!r}; expected {target_forms()} (e.g. cuda:sm_80)")
    backend = get_backend(name)
    backend.parse(target)
    return backend


def backend_of(tvm_target) -> Backend:
    """The backend building for a TVM target (by its kind: "llvm" -> the CPU backend)."""
    kind = str(tvm_target.kind.name)
    for name in BACKENDS:
        backend = get_backend(name)
        if kind in backend.tvm_kinds:
            return backend
    raise CompileError(f"compile: no dyntvm backend builds for TVM target kind {kind!r}")
