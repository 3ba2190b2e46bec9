"""`dyntvm bundle`: the runtime-only install a deployment machine needs to run saved artifacts.

A compiled artifact runs with TVM's *runtime* alone: `dt.load` and `dyntvm run` import only dyntvm's IR
and runtime, and TVM's runtime VM (`tvm.runtime.vm`), never `tvm.relax` nor TVM's compiler library
(`libtvm_compiler.so`, ~250 MB of the ~300 MB `apache-tvm` wheel). This module copies what a deployment
needs into one folder (or a .tar.gz) that is put on `PYTHONPATH` on the target machine:

* `dyntvm/` with its `ir` and `runtime` packages (no frontend, partitioner, codegen or examples);
* `tvm/` without `libtvm_compiler.so`, C++ headers and sources (TVM then runs in runtime-only mode by
  itself); `libtvm_runtime_cuda.so` stays, so CUDA artifacts run on a GPU host;
* `tvm_ffi/` without headers and sources, and `typing_extensions.py` which it imports;
* with `cpp=True` (`dyntvm bundle --cpp`): the C++ runner's sources (`deploy/cpp/` of a source checkout) as
  `cpp/`, and tvm_ffi's headers, so that `sh cpp/build.sh run_model` builds it on the target (g++; no Python).

The target needs Linux x86-64, the same Python minor version as this one (`tvm_ffi` has a compiled
extension module) and numpy. `tests/test_deploy.py` runs `dt.load` and `dyntvm run` from such a bundle in
a Python that cannot see the full TVM (`python -S`), and checks the results.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tarfile
import tempfile

from dyntvm.errors import DyntvmError

#: dyntvm packages a deployment imports (`tests/test_layering.py` checks runtime imports no other stage)
DYNTVM_PACKAGES = {"dyntvm": "", "dyntvm.ir": "ir", "dyntvm.runtime": "runtime"}
DYNTVM_MODULES = ("__init__.py", "__main__.py", "errors.py", "native.py", "cli.py", "loader.py", "bundle.py")
PURE_DEPS = ("typing_extensions",)
#: paths left out of the TVM packages (relative to the package folder)
SKIP = {"tvm": {"lib/libtvm_compiler.so", "3rdparty", "src", "include", "cmake", "web", "lib64"},
        "tvm_ffi": {"src", "include", "3rdparty", "cython", "share"}}   # lib/libtvm_ffi_testing.so: tvm_ffi.core links it

README = """dyntvm runtime-only bundle (dyntvm {version}, TVM {tvm}, Python {py})

Runs dyntvm artifacts (`dyntvm compile ... -o model.dtvm`) without TVM's compiler. Needs Linux x86-64,
Python {py} and numpy. Usage:

    PYTHONPATH={name} python3 -m dyntvm run model.dtvm --random --dim T=16
    PYTHONPATH={name} python3 -c "import dyntvm as dt; model = dt.load('model.dtvm'); print(model)"
{cpp}"""
CPP_README = """
Made with --cpp: the C++ runner (no Python, no numpy), built with g++ from cpp/ and the headers here:

    sh {name}/cpp/build.sh run_model
    ./run_model model.dtvm out/ x.npy        # writes out/output_0.npy ...
"""


def package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DyntvmError(f"bundle: cannot find the installed package {name!r}")
    return list(spec.submodule_search_locations)[0]


def _copy_tree(src: str, dst: str, skip: set, only: tuple | None = None) -> None:
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        dirs[:] = [d for d in dirs if d != "__pycache__" and os.path.normpath(os.path.join(rel, d)) not in skip]
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            if os.path.normpath(os.path.join(rel, f)) in skip or (only is not None and f not in only):
                continue
            shutil.copy2(os.path.join(root, f), os.path.join(dst, rel, f))
        if only is not None:
            dirs[:] = []                     # `only`: the top folder's listed files, no subfolders


def cpp_sources() -> str:
    """deploy/cpp/ of the source checkout dyntvm runs from (not in a wheel)."""
    path = os.path.join(os.path.dirname(package_dir("dyntvm")), "deploy", "cpp")
    if not os.path.isfile(os.path.join(path, "build.sh")):
        raise DyntvmError(f"bundle --cpp: the C++ runner's sources are not at {path} (they ship in dyntvm's source "
                          "checkout, deploy/cpp/, not in an installed wheel)")
    return path


def bundle(out: str, cpp: bool = False) -> dict:
    """Write the runtime-only bundle to `out`: a new folder, or a `.tar.gz` file; `cpp`: with the C++ runner's
    sources and the headers it builds with.

    Returns {"path", "bytes" (of the files), "files"}.
    """
    import tvm
    import dyntvm
    as_tar = out.endswith((".tar.gz", ".tgz"))
    if not as_tar and out.lower().endswith((".tar", ".zip", ".gz", ".tgz", ".bz2", ".xz", ".whl")):
        raise DyntvmError(f"bundle: {out}: write a folder, or a file ending in .tar.gz or .tgz")
    if os.path.lexists(out):
        raise DyntvmError(f"bundle: {out} already exists; remove it or pick another name")
    cpp_src = cpp_sources() if cpp else None
    folder = tempfile.mkdtemp(prefix=".dyntvm-bundle-", dir=os.path.dirname(os.path.abspath(out))) if as_tar \
        else out
    try:
        if not as_tar:
            os.makedirs(folder)
        for pkg, sub in DYNTVM_PACKAGES.items():
            dst = os.path.join(folder, "dyntvm", sub) if sub else os.path.join(folder, "dyntvm")
            _copy_tree(package_dir(pkg), dst, set(), None if sub else DYNTVM_MODULES)
        for pkg, skip in SKIP.items():
            keep = {"include"} if cpp and pkg == "tvm_ffi" else set()     # the C++ runner's headers
            _copy_tree(package_dir(pkg), os.path.join(folder, pkg), skip - keep)
        if cpp_src is not None:
            _copy_tree(cpp_src, os.path.join(folder, "cpp"), set())
        for mod in PURE_DEPS:           # small pure-Python requirements of tvm_ffi
            spec = importlib.util.find_spec(mod)
            if spec is None or not spec.origin:
                raise DyntvmError(f"bundle: cannot find the installed module {mod!r}")
            shutil.copy2(spec.origin, os.path.join(folder, os.path.basename(spec.origin)))
        with open(os.path.join(folder, "README.txt"), "w") as f:
            f.write(README.format(version=dyntvm.__version__, tvm=tvm.__version__, name=os.path.basename(out),
                                  py=f"{sys.version_info.major}.{sys.version_info.minor}",
                                  cpp=CPP_README.format(name=os.path.basename(out)) if cpp else ""))
        files = [os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs]
        size = sum(os.path.getsize(p) for p in files)
        if as_tar:
            with tarfile.open(out, "w:gz") as t:
                for name in sorted(os.listdir(folder)):
                    t.add(os.path.join(folder, name), arcname=name)
            shutil.rmtree(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        if as_tar and os.path.exists(out):
            os.remove(out)
        raise
    return {"path": out, "bytes": size, "files": len(files)}
