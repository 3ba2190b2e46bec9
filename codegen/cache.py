"""On-disk compile cache: region structure + constants + target + versions + codegen source -> exported kernel
library."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile

import numpy as np

from ..ir.serialize import graph_to_dict

_VERSION_SALT = "dyntvm-cache-1"
_CODEGEN_DIR = os.path.dirname(os.path.abspath(__file__))
_code_digest: str | None = None


def codegen_digest() -> str:
    """sha256 of the code that decides what a region compiles to (codegen/, the IR it reads, the op
    registry): a changed converter or schedule must not be served kernels built by the old one, even
    at the same version number (a development checkout)."""
    global _code_digest
    if _code_digest is None:
        h = hashlib.sha256()
        ir_dir = os.path.join(os.path.dirname(_CODEGEN_DIR), "ir")
        for top in (_CODEGEN_DIR, ir_dir):
            for folder, dirs, files in sorted(os.walk(top)):
                dirs.sort()
                for f in sorted(files):
                    if f.endswith(".py"):
                        with open(os.path.join(folder, f), "rb") as fh:
                            h.update(f.encode() + b"\0" + fh.read())
        _code_digest = h.hexdigest()[:16]
    return _code_digest


def default_cache_dir() -> str:
    env = os.environ.get("DYNTVM_CACHE_DIR")
    if env:
        return env
    import platformdirs
    return platformdirs.user_cache_dir("dyntvm")


def cache_key(regions: list, target_desc: str, extra: str = "") -> str:
    """sha256 over each region's structure and constant bytes, the target and library versions."""
    import tvm

    import dyntvm
    h = hashlib.sha256()
    h.update(f"{_VERSION_SALT}|{dyntvm.__version__}|{codegen_digest()}|{tvm.__version__}|{target_desc}|{extra}"
             .encode())
    for name, g in regions:
        d, params = graph_to_dict(g)
        _strip_names(d["graph"])
        h.update(name.encode())
        h.update(json.dumps(d, sort_keys=True).encode())
        for k in sorted(params):
            a = np.ascontiguousarray(params[k])
            h.update(f"{k}:{a.dtype}:{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:32]


def _strip_names(g: dict):
    """Value names and source lines do not change the compiled code."""
    for n in g["nodes"]:
        n.pop("source", None)
        for s in n["subgraphs"]:
            _strip_names(s)


def lookup(cache_dir: str, key: str) -> str | None:
    path = os.path.join(cache_dir, key, "kernels.so")
    return path if os.path.exists(path) else None


def store(cache_dir: str, key: str, executable) -> str:
    """Export `executable` into the cache atomically; returns the library path."""
    folder = os.path.join(cache_dir, key)
    os.makedirs(folder, exist_ok=True)
    final = os.path.join(folder, "kernels.so")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    executable.export_library(tmp)
    os.replace(tmp, final)
    return final
