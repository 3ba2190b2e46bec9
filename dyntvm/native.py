"""Native kernel libraries, for both the compiler and the runtime: checks before one is loaded (`dt.load`,
`runtime/load.py`, and the compile cache, `codegen/cache.py`), writing one safely (`export_library`), and what
a library is bound to (the CPU features it may use, `execution_binding`). Standard library only."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import select
import signal
import struct
import sys
import time


def shared_object_problem(path: str) -> str | None:
    """Why `path` cannot be a whole ELF shared object, or None. Call it before handing a library to dlopen:
    the loader maps its segments from the file, and touching a segment past the end of a truncated file
    ends the process with SIGBUS (a matching sha256 recorded next to it does not prove the file is whole)."""
    if not sys.platform.startswith("linux"):     # ELF is Linux's format; elsewhere the loader decides
        return None
    try:
        _check_elf(path)
    except _Bad as e:
        return str(e)
    return None


#: ISA features compiled kernels may use: /proc/cpuinfo flag -> LLVM's name of the feature. Keyed on the
#: instructions, never on the CPU model: the host's model name decides LLVM's -mcpu, whose feature set
#: (scalar BMI1 / BMI2 / LZCNT / MOVBE included, which LLVM emits in every kernel library built here) is
#: what another CPU must have.
ISA_FEATURES = {
    "pni": "sse3", "ssse3": "ssse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "sse4a": "sse4a", "cx16": "cx16",
    "popcnt": "popcnt", "abm": "lzcnt", "bmi1": "bmi", "bmi2": "bmi2", "movbe": "movbe", "adx": "adx",
    "f16c": "f16c", "fma": "fma", "fma4": "fma4", "avx": "avx", "avx2": "avx2", "aes": "aes",
    "pclmulqdq": "pclmul", "sha_ni": "sha", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq", "gfni": "gfni",
    "avx_vnni": "avxvnni", "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
    "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512_vbmi2": "avx512vbmi2", "avx512_vnni": "avx512vnni", "avx512_bitalg": "avx512bitalg",
    "avx512_vpopcntdq": "avx512vpopcntdq", "avx512_bf16": "avx512bf16", "avx512_fp16": "avx512fp16",
    "amx_tile": "amx-tile", "amx_bf16": "amx-bf16", "amx_int8": "amx-int8",
}
CPUINFO = "/proc/cpuinfo"


def cpu_features() -> set:
    """The ISA_FEATURES this CPU has (empty where /proc/cpuinfo cannot be read)."""
    try:
        with open(CPUINFO) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split()) & set(ISA_FEATURES)
    except OSError:
        pass
    return set()


def execution_binding(graph_binding: str, execution: dict) -> str:
    """sha256 (hex) compiled into a kernel library: the model's graph binding (`kernel_binding`: structure
    and constants) plus every recorded fact that decides how the library's kernels are run or may run
    (`execution_facts`). `dt.load` recomputes it from manifest.json: an edited field does not match."""
    canon = json.dumps({"graph": graph_binding, **execution}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(b"dyntvm-library-binding-1|" + canon.encode()).hexdigest()


def execution_facts(target: str, info: dict) -> dict:
    """The part of a model's target and info (manifest.json's) that `execution_binding` covers: the CPU
    features and CUDA arch dt.load checks, the concrete target and the tuning specializations calls are
    routed to. Missing fields are None (removing one changes the digest too)."""
    tuning = info.get("tuning") if isinstance(info.get("tuning"), dict) else {}
    return {"target": target, "built_for": info.get("built_for"), "cpu_features": info.get("cpu_features"),
            "cuda_arch": info.get("cuda_arch"), "specialized": tuning.get("specialized")}


#: seconds an export may take (a library of thousands of kernels takes well under a minute)
EXPORT_TIMEOUT_S = 1800


class LibraryWriteError(OSError):
    """A kernel library could not be written (a full disk, most often); the message names the folder."""


def export_library(executable, path: str) -> None:
    """``executable.export_library(path)``, safe against a full disk: the object files and the linker's
    temporary files go to a private folder next to `path` (not $TMPDIR), and the export runs in a forked
    child, because LLVM ends the process (``LLVM ERROR: IO failure on output stream``) when it cannot write an
    object file. Raises LibraryWriteError naming the folder; leaves neither `path` nor a temporary file."""
    import shutil
    import tempfile
    folder = os.path.dirname(os.path.abspath(path))
    work = tempfile.mkdtemp(prefix=".dyntvm-export-", dir=folder)
    try:
        if not hasattr(os, "fork"):
            executable.export_library(path)
            return
        why = _export_in_child(executable, path, work)
        if why is not None:
            with contextlib.suppress(OSError):
                os.remove(path)
            lines = [ln.strip() for ln in why.strip().splitlines() if ln.strip()] or ["the export process failed"]
            full = next((ln for ln in lines if "No space left" in ln or "ENOSPC" in ln), None)
            raise LibraryWriteError(errno.ENOSPC if full else errno.EIO,
                                    f"cannot write the kernel library to {folder}: "
                                    + (f"the disk is full ({full})" if full else lines[-1]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _export_in_child(executable, path: str, work: str) -> str | None:
    """Export in a forked child whose temporary folder is `work`; None, or why it failed (its stderr)."""
    import tempfile
    import warnings
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():        # Python 3.12+ warns about fork in a threaded process: the child only
        warnings.simplefilter("ignore", DeprecationWarning)    # exports (LLVM and the linker), then exits
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.dup2(write_end, 2)              # LLVM's fatal message reaches the parent
            os.environ["TMPDIR"] = tempfile.tempdir = work
            executable.export_library(path)
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
            with contextlib.suppress(OSError):
                os.write(2, f"{type(e).__name__}: {e}".encode(errors="replace")[-4000:])
        finally:
            os._exit(code)
    os.close(write_end)
    said, deadline = b"", time.monotonic() + EXPORT_TIMEOUT_S
    with os.fdopen(read_end, "rb", buffering=0) as f:
        while time.monotonic() < deadline:
            if select.select([f], [], [], max(0.0, deadline - time.monotonic()))[0]:
                chunk = f.read(65536)
                if not chunk:
                    break                      # the child has exited
                said += chunk
        else:                                  # a lock another thread held at the fork, never released
            os.kill(pid, signal.SIGKILL)
            said += b"\nthe export process did not finish (stopped)"
    _, status = os.waitpid(pid, 0)
    if status == 0:
        return None
    return said.decode(errors="replace").strip() or f"the export process ended with status {status}"


class _Bad(Exception):
    pass


def _check_elf(path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 52 or head[:4] != b"\x7fELF":
            raise _Bad("no ELF header")
        cls, data = head[4], head[5]
        if cls not in (1, 2) or data not in (1, 2):
            raise _Bad("unknown ELF class or byte order")
        end = "<" if data == 1 else ">"
        if cls == 2:
            if len(head) < 64:
                raise _Bad("truncated ELF header")
            e_type, = struct.unpack_from(end + "H", head, 16)
            phoff, shoff = struct.unpack_from(end + "QQ", head, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 54)
            ph_fmt, ph_fields = end + "IIQQQQQQ", (0, 2, 5)       # p_type, p_offset, p_filesz
        else:
            e_type, = struct.unpack_from(end + "H", head, 16)
            phoff, shoff = struct.unpack_from(end + "II", head, 28)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 42)
            ph_fmt, ph_fields = end + "IIIIIIII", (0, 1, 4)
        if e_type != 3:                                          # ET_DYN
            raise _Bad("not a shared object")
        if phentsize < struct.calcsize(ph_fmt) or phoff + phnum * phentsize > size:
            raise _Bad(f"program headers past the end of the file ({size} bytes; truncated?)")
        if shnum and shoff + shnum * shentsize > size:
            raise _Bad(f"section headers past the end of the file ({size} bytes; truncated?)")
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            fields = struct.unpack(ph_fmt, f.read(struct.calcsize(ph_fmt)))
            p_type, p_offset, p_filesz = (fields[k] for k in ph_fields)
            if p_type == 1 and p_offset + p_filesz > size:     # PT_LOAD
                raise _Bad(f"a loadable segment ends at byte {p_offset + p_filesz}, past the end of the file "
                          f"({size} bytes; truncated?)")
