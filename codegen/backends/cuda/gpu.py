"""CUDA builds: Relax's GPU pipeline (fusion + dlight schedules), symbolic shapes included, with real
device code (a fatbin for the requested arch) on any machine that has `nvcc` — a GPU is needed only to run.

TVM compiles CUDA kernels to device code only when its CUDA runtime (`libtvm_runtime_cuda.so`) is loaded,
and that library needs the driver's `libcuda.so.1`. Without one, `tvm.compile` silently emits CUDA *source*
only (see ../shared/TVM_NOTES.md section 2). So:

* on a GPU host (TVM sees a CUDA device) the build runs in this process, for the local GPU's arch unless one
  is asked for;
* elsewhere it runs in a child process (`python -m dyntvm.codegen.backends.cuda.cuda_child WORKDIR`) whose `LD_LIBRARY_PATH`
  starts with a *stub* `libcuda.so.1`, built here once from `cuda_stub.c`'s recipe: it defines the driver
  functions TVM's CUDA runtime links against, each returning an error, and none is called while compiling.
  The stub never enters a process that runs kernels, and this process never loads it: it can still load
  TVM's real CUDA runtime later, on a GPU host.

Both ways compile inside ``with target:`` (nvcc reads the arch from the current target) with
``TVM_CUDA_COMPILE_MODE=nvcc`` (the default, NVRTC, needs the `cuda-bindings` package), and check that the
library holds a fatbin for the arch before it is used or cached.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from dyntvm.errors import CompileError

from ....native import export_library, shared_object_problem

DEFAULT_ARCH = "sm_90"                    # $DYNTVM_CUDA_ARCH overrides it (`default_arch`)
FATBIN_MAGIC = bytes.fromhex("50ed55ba")          # a fatbin's header (fatBinaryHeader.magic, little endian)
#: driver functions `libtvm_runtime_cuda.so` (TVM 0.27) links against; the stub also adds any other `cu*`
#: symbol that `nm` finds undefined in the installed library
DRIVER_SYMBOLS = ("cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString", "cuLaunchKernelEx",
                  "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload", "cuTensorMapEncodeTiled")
CUDA_HOMES = ("/usr/local/cuda",)         # where nvcc is looked for after PATH, $CUDA_HOME and $CUDA_PATH
_ARCH = re.compile(r"sm_[1-9]\d[a-z]?|sm_1\d\d[a-z]?")     # sm_50 ... sm_121a: what nvcc 13 may accept


def parse_arch(target: str) -> str | None:
    """The arch of a target string "cuda" (None: default) or "cuda:sm_XX"."""
    if target == "cuda":
        return None
    arch = target.split(":", 1)[1]
    if not _ARCH.fullmatch(arch):
        raise CompileError(f"compile: target {target!r}: the CUDA arch must look like sm_90 or sm_90a, got {arch!r}")
    return arch


def default_arch() -> str:
    """$DYNTVM_CUDA_ARCH (checked) or sm_90."""
    env = os.environ.get("DYNTVM_CUDA_ARCH", "").strip()
    if not env:
        return DEFAULT_ARCH
    if not _ARCH.fullmatch(env):
        raise CompileError(f"compile: DYNTVM_CUDA_ARCH must look like sm_90 or sm_90a, got {env!r}")
    return env


def gpu_present() -> bool:
    import tvm
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no CUDA runtime in this TVM
        return False


def gpu_name() -> str | None:
    """The local GPU's name (a tuning log records it, for information), None without one."""
    import tvm
    try:
        dev = tvm.cuda(0)
        return str(dev.device_name) if dev.exist else None
    except Exception:  # noqa: BLE001 - no CUDA runtime in this TVM
        return None


def cuda_target(arch: str | None = None):
    """The TVM target: `arch`, else the local GPU's, else `default_arch()` ($DYNTVM_CUDA_ARCH or sm_90)."""
    import tvm
    if arch is None and gpu_present():
        return tvm.target.Target.from_device(tvm.cuda(0))
    return tvm.target.Target({"kind": "cuda", "arch": arch or default_arch()})


def target_arch(target) -> str:
    return str(target.attrs.get("arch", "")) or default_arch()


def find_nvcc() -> str:
    """The nvcc a CUDA build uses (PATH, then $CUDA_HOME/bin, /usr/local/cuda/bin), or a CompileError."""
    found = shutil.which("nvcc")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) + CUDA_HOMES:
        if found is None and home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            found = os.path.join(home, "bin", "nvcc")
    if found is None:
        raise CompileError("compile: a CUDA build needs nvcc (the CUDA toolkit) on PATH or in $CUDA_HOME/bin, and "
                           "none was found; install the CUDA toolkit (no GPU or driver is needed to compile), or "
                           "compile with target='cpu'")
    return found


def check_device_code(path: str, arch: str) -> None:
    """Refuse a built library that holds CUDA source instead of a fatbin for `arch`."""
    with open(path, "rb") as f:
        blob = f.read()
    if FATBIN_MAGIC not in blob or arch.encode() not in blob:
        raise CompileError(f"compile: the CUDA build produced no device code for {arch} (TVM emitted CUDA source "
                           "only: its CUDA runtime or nvcc was not used); set DYNTVM_CUDA_DEBUG=1 to keep the build "
                           "folder")


def prepare_nvcc() -> None:
    """TVM compiles device code with nvcc (`TVM_CUDA_COMPILE_MODE`; its default, NVRTC, needs the
    `cuda-bindings` package), which it calls by name: put it on PATH."""
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    nvcc_dir = os.path.dirname(find_nvcc())
    if shutil.which("nvcc") is None:
        os.environ["PATH"] = nvcc_dir + os.pathsep + os.environ.get("PATH", "")


def fuse_passes(target) -> list:
    """Relax's CUDA pipeline up to its schedules: library dispatch, legalization and fusion (the kernels that
    dlight schedules, and what CUDA tuning tasks come from), with elementwise groups that FuseOps leaves apart
    merged before FuseTIR (`gpu_fuse`)."""
    from tvm.relax.backend.cuda import pipeline as cuda_pipeline
    from .gpu_fuse import merge_pass
    from .gpu_select import opaque_wheres
    legalize = cuda_pipeline.legalize_passes(target)
    if legalize[1].info.name != "AnnotateTIROpPattern":        # the wheres are marked after it (also under -O)
        raise RuntimeError(f"dyntvm: TVM's CUDA legalize passes changed: {[p.info.name for p in legalize]}")
    # legalize[-2:]: FuseTIR, then dlight's schedules (dyntvm's own `dlight_pass` replaces them)
    return (cuda_pipeline.library_dispatch_passes(target) + legalize[:2] + [opaque_wheres] + legalize[2:-2]
            + [merge_pass(), legalize[-2]])


def dlight_pass():
    """dlight's default GPU schedules, the rules of Relax's CUDA pipeline (kernels already scheduled kept), with
    `InnerReduction` before the fallback (the max / min / argmax reductions dlight's rules do not take) and, for
    reductions to one value, before `GeneralReduction` (`ReductionToOne`: that rule left their loops on the host),
    and first dyntvm's `ElementwiseGroup` (a merged multi-output elementwise kernel) and `SmallMMatmul` (a matmul
    over a one-var batch of rows)."""
    from tvm.s_tir import dlight as dl

    from .gpu_fuse import elementwise_group_rule
    from .gpu_gemv import small_m_rule
    from .gpu_reduction import InnerReduction, ReductionToOne
    return dl.ApplyDefaultSchedule(elementwise_group_rule(), small_m_rule(), dl.gpu.Matmul(), dl.gpu.GEMV(),
                                   dl.gpu.Reduction(), ReductionToOne(), dl.gpu.GeneralReduction(), InnerReduction(),
                                   dl.gpu.Fallback())


def default_schedule(func, target):
    """One fused kernel scheduled by dlight's default rules, as a build schedules it (tuning's baseline)."""
    import tvm
    with target:
        mod = dlight_pass()(tvm.IRModule({"main": func}))
    return mod["main"]


def tuned_pass(tuned):
    """A module pass giving each kernel for which ``tuned(func)`` returns a scheduled PrimFunc (a tuning log's
    winner) that schedule, marked scheduled so that dlight leaves it alone."""
    import tvm
    from tvm import tirx

    def apply(mod, _ctx):
        out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and not func.attrs.get("tirx.is_scheduled", False):
                new = tuned(func)
                if new is not None:
                    out[gvar] = new.with_attr("tirx.is_scheduled", True).with_attr(
                        "global_symbol", func.attrs.get("global_symbol", gvar.name_hint))
        return out
    return tvm.transform.module_pass(apply, opt_level=0, name="DyntvmTunedCUDASchedules")


def build_cuda(mod, target=None, tuned=None, loops=()):
    """Build `mod` for CUDA in this process with dlight's default GPU schedules, or the tuned schedule where
    ``tuned(func)`` gives one (device code only when TVM's CUDA runtime is loaded: on a GPU host, or in the
    stub child). `loops`: the device loops to add once the kernels are scheduled (`compiled_loops`)."""
    import tvm
    from tvm.relax.backend.cuda import pipeline as cuda_pipeline
    target = target or cuda_target()
    prepare_nvcc()
    from ...launch_guard import with_launch_guards
    from ...compiled_loops import loop_pass
    from .gpu_gemv import mark_pass
    # the small-M marks after the tuned schedules: a mark is a PrimFunc attribute, which would change the
    # kernels' workload keys (their structural hash) that tuning logs are looked up by
    passes = (fuse_passes(target) + ([tuned_pass(tuned)] if tuned is not None else []) + [mark_pass(), dlight_pass()]
              + ([loop_pass(list(loops))] if loops else [])
              + cuda_pipeline.dataflow_lower_passes(target) + cuda_pipeline.finalize_passes(target))
    with target, with_launch_guards():
        return tvm.compile(mod, target=target, relax_pipeline=tvm.transform.Sequential(passes))


class _LibraryFile:
    """A built library file, exported like a TVM executable (`codegen.cache.store` calls export_library)."""

    def __init__(self, path: str):
        self.path = path

    def export_library(self, dst: str) -> None:
        shutil.copyfile(self.path, dst)


def build_cuda_library(regions: list, target, binding: str | None, build_executable, tuning=None, loops=()):
    """Build the regions for CUDA with device code (`build_executable`: `build.build_executable`; `tuning`:
    ``(TuningLog, specializations)`` to apply; `loops`: `compiled_loops.loop_specs`). Returns (library, path,
    kernels built with a tuned schedule): in this process on a GPU host (library: the executable, path None;
    the count None: `build_executable` counted them), else in the stub child `cuda_child.py` (library: a file
    wrapper, not loadable here)."""
    arch = target_arch(target)
    find_nvcc()
    if gpu_present():
        ex = build_executable(regions, "cuda", binding, target, loops=loops, tuning=tuning)
        tmp = tempfile.mkdtemp(prefix="dyntvm-cuda-")
        try:
            path = os.path.join(tmp, "kernels.so")
            export_library(ex, path)            # a full temp folder: LibraryWriteError (build turns it into a
            check_device_code(path, arch)       # CompileError), not the end of the process
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return ex, None, None
    return _build_in_child(regions, arch, binding, tuning, loops)


def _build_in_child(regions: list, arch: str, binding: str | None, tuning=None, loops=()):
    import numpy as np

    from ....ir.serialize import graph_to_dict
    work = tempfile.mkdtemp(prefix="dyntvm-cuda-")
    keep = bool(os.environ.get("DYNTVM_CUDA_DEBUG"))
    try:
        params: dict = {}
        graphs = [[name, graph_to_dict(g, params)[0]] for name, g in regions]
        job = {"regions": graphs, "arch": arch, "binding": binding, "loops": list(loops),
               "switches": switch_values()}
        if tuning is not None:          # the child reads the log again (checked here: same files, same target)
            log, table = tuning
            job["tuning"] = {"log": os.path.abspath(log.path),
                             "table": {r: [[combo, name] for combo, name in specs] for r, specs in table.items()}}
        with open(os.path.join(work, "job.json"), "w") as f:
            json.dump(job, f)
        np.savez(os.path.join(work, "params.npz"), **params)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = stub_dir() + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH")
                                               else "")
        env["TVM_CUDA_COMPILE_MODE"] = "nvcc"
        env["PATH"] = os.path.dirname(find_nvcc()) + os.pathsep + env.get("PATH", "")
        env.pop("TVM_USE_RUNTIME_LIB", None)
        r = _run_child([sys.executable, "-m", "dyntvm.codegen.backends.cuda.cuda_child", work], env)
        if r.returncode != 0:
            lines = (r.stderr or r.stdout).strip().splitlines()
            full = next((ln for ln in lines if "No space left" in ln), None)     # nvcc says it, then stops
            err = full or next((ln for ln in reversed(lines) if ln.strip()), f"exit status {r.returncode}")
            raise CompileError(f"compile: the CUDA build failed: {err.strip()}"
                               + (f" (the disk of the build folder {work} is full; $TMPDIR chooses it)" if full else "")
                               + ("" if keep else " (DYNTVM_CUDA_DEBUG=1 keeps the build folder)"))
        path = os.path.join(work, "kernels.so")
        check_device_code(path, arch)
        tuned = 0
        with contextlib.suppress(OSError, ValueError, TypeError), open(os.path.join(work, "result.json")) as f:
            result = json.load(f)
            tuned = int(result.get("tuned_kernels", 0))
            if tuning is not None:              # winners the child found no record of: warned by the caller
                tuning[0].unscheduled.update(str(k) for k in result.get("unscheduled", []))
                tuning[0].refused.update({str(k): str(v) for k, v in dict(result.get("refused", {})).items()})
        # the caller stores the file in the compile cache (or keeps it) before `work` is removed
        final = tempfile.NamedTemporaryFile(prefix="dyntvm-cuda-", suffix=".so", delete=False).name
        shutil.copyfile(path, final)
        return _LibraryFile(final), final, tuned
    finally:
        if keep:
            print(f"dyntvm: CUDA build folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def switch_values() -> dict:
    """The A/B switches (`codegen.cache.SWITCHES`) as this process has them: the build child sets the same."""
    import importlib

    from ...cache import SWITCHES
    package = __name__.rsplit(".", 3)[0]
    return {f"{m}.{k}": getattr(importlib.import_module(f"{package}.{m}"), k) for m, k in SWITCHES}


def set_switches(values: dict) -> None:
    """Set the switches `switch_values` gave (in the build child)."""
    import importlib
    package = __name__.rsplit(".", 3)[0]
    for name, value in values.items():
        module, key = name.rsplit(".", 1)
        setattr(importlib.import_module(f"{package}.{module}"), key, value)


def build_timeout() -> float:
    """Seconds a CUDA build may take ($DYNTVM_CUDA_BUILD_TIMEOUT, default 1800)."""
    try:
        return float(os.environ.get("DYNTVM_CUDA_BUILD_TIMEOUT", "") or 1800)
    except ValueError:
        raise CompileError("compile: DYNTVM_CUDA_BUILD_TIMEOUT must be a number of seconds") from None


def _run_child(cmd: list, env: dict):
    """Run the build child in its own process group: a timeout or an interrupt (Ctrl-C, SIGTERM turned into
    an exception by the caller) kills it and the nvcc it started, instead of leaving them running."""
    import signal
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=build_timeout())
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise CompileError(f"compile: the CUDA build took more than {build_timeout():.0f} s (nvcc hanging?); "
                           "stopped (DYNTVM_CUDA_BUILD_TIMEOUT sets the limit)") from None
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# ----------------------------------------------------------------------------------- the driver stub
def _driver_symbols() -> list:
    """DRIVER_SYMBOLS plus any other undefined `cu*` driver symbol of the installed TVM CUDA runtime."""
    import tvm
    names = set(DRIVER_SYMBOLS)
    lib = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
    nm = shutil.which("nm")
    if nm and os.path.exists(lib):
        r = subprocess.run([nm, "-D", "--undefined-only", lib], capture_output=True, text=True)
        names |= {m.group(1) for m in re.finditer(r"\bU (cu[A-Z]\w*)$", r.stdout, re.M)}
    return sorted(names)


def stub_dir() -> str:
    """A folder holding the stub `libcuda.so.1` (built on first use, kept in the compile cache folder or this
    user's private folder in the temp dir). The build child loads it: like a cache entry, it is used only
    when this user owns it and no one else may write to it (`cache.private_folder`, `cache.open_private`).
    Raises CompileError when no C compiler is available."""
    from ...cache import RefusedFile, default_cache_dir, open_private, private_folder, uncached_dir
    symbols = _driver_symbols()
    source = "".join(f"int {s}(void) {{ return 999; }}\n" for s in symbols)   # 999: CUDA_ERROR_UNKNOWN
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    refused = []
    for base in (default_cache_dir, uncached_dir):
        try:
            folder = private_folder(os.path.join(private_folder(base()), f"cuda-stub-{digest}"))
            lib = os.path.join(folder, "libcuda.so.1")
            if os.path.lexists(lib):
                try:
                    open_private(lib, lib).close()
                    if shared_object_problem(lib) is None:
                        return folder
                except RefusedFile as e:
                    refused.append(str(e))
                os.remove(lib)                              # truncated, overwritten or refused: build it again
            cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
            if cc is None:
                raise CompileError("compile: a CUDA build on a machine without a GPU needs a C compiler (cc or gcc) "
                                   "to build dyntvm's stub CUDA driver library; none was found")
            tmp = tempfile.mkdtemp(dir=folder)
            with open(os.path.join(tmp, "stub.c"), "w") as f:
                f.write(source)
            r = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                                os.path.join(tmp, "libcuda.so.1"), os.path.join(tmp, "stub.c")],
                               capture_output=True, text=True)
            try:
                if r.returncode != 0:
                    why = (r.stderr or r.stdout).strip() or f"{cc} exited with status {r.returncode}"
                    raise CompileError(f"compile: building the stub CUDA driver library with {cc} failed: {why}")
                os.chmod(os.path.join(tmp, "libcuda.so.1"), 0o700)
                os.replace(os.path.join(tmp, "libcuda.so.1"), lib)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return folder
        except OSError as e:
            refused.append(str(e))
            continue
    raise CompileError("compile: no usable folder for the stub CUDA driver library (the cache folder and a private "
                       f"folder in the temp dir): {'; '.join(refused)}")
