"""Checks on native libraries (kernel libraries) before they are loaded: used by `dt.load`
(`runtime/load.py`) and the compile cache (`codegen/cache.py`). Standard library only."""
from __future__ import annotations

import os
import struct
import sys


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


#: CPU flags (/proc/cpuinfo names) whose instructions compiled kernels may use
VECTOR_FEATURES = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16",
                   "avx512_vnni", "amx_tile")


def cpu_features() -> set:
    """The VECTOR_FEATURES this CPU has (empty where /proc/cpuinfo cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split()) & set(VECTOR_FEATURES)
    except OSError:
        pass
    return set()


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
