"""On-disk compile cache: region structure + constants + target + versions + codegen source -> exported kernel
library."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import warnings
from typing import NamedTuple

import numpy as np

from ..ir.serialize import graph_to_dict
from ..native import export_library

_VERSION_SALT = "dyntvm-cache-3"     # 3: libraries carry the execution binding; entries are private
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


#: the switches kept in the code for A/B comparisons (module of this package, name): their values are part of the
#: cache key, so that a build with one flipped is not served the library built with it as committed
SWITCHES = (("te_conv", "PHASED_STRIDES"), ("te_conv", "STRIDED_LANES"), ("te_conv", "STRIDED_LANES_MAX_TAPS"),
            ("te_conv", "SPLIT_PHASES"), ("te_conv", "SPLIT_PHASES_MAX_CHANNELS"), ("te_conv", "SPLIT_SPV_PADDING"),
            ("te_conv", "SPLIT_ROWS"), ("te_conv", "GUARD_IN_CONDITION"),
            ("te_conv", "FLAT_POSITIONS"),
            ("te_conv", "FLAT_MIN_REDUCTION"), ("te_conv", "FLAT_POINTWISE"),
            ("te_conv", "FLAT_POINTWISE_MAX_CHANNELS"), ("te_conv", "POSITION_LANES"),
            ("te_conv", "POSITION_LANES_MAX_CHANNELS"), ("te_conv", "PADDED_POSITIONS"),
            ("te_conv", "PADDED_POSITIONS_MIN_CHANNELS"), ("te_conv", "PADDED_POSITIONS_MAX_CHANNELS"),
            ("te_conv", "STRIDED_POSITION_LANES"), ("te_conv", "STRIDED_POSITION_LANES_MAX_CHANNELS"),
            ("te_conv", "FLAT_ACC_REGISTERS_AVX2"), ("vm_program", "INLINE_REGIONS"),
            ("vm_program", "ELEMENT_ALIGNED_INPUTS"),
            ("vm_dynamic", "COUNT_RETURNED"), ("branch_storage", "REUSE_SHAPES"),
            ("backends.cpu.cpu_prepack", "PREPACK_WEIGHTS"), ("backends.cpu.cpu_schedule_conv", "BATCH_IN_PARALLEL"),
            ("backends.cpu.cpu_schedule_conv", "IMAGES_PER_CORE"),
            ("backends.cpu.cpu_schedule_conv", "SPV_EPILOGUE_VECTORS"),
            ("backends.cpu.cpu_schedule_conv", "OCV_EPILOGUE_TILE"), ("te_conv", "ROW_ACC_REGISTERS_AVX2"),
            ("backends.cpu.cpu_schedule_depthwise", "COPY_PER_CHANNEL_BLOCK"),
            ("backends.cpu.cpu_schedule_depthwise", "COPY_BLOCKS_MIN"), ("backends.cuda.gpu_fuse", "MERGE_ELEMENTWISE"),
            ("backends.cuda.gpu_gemv", "SMALL_M_GEMV"),
            ("backends.cpu.cpu_fast_math", "SOFTMAX_NONPOSITIVE_EXP"), ("backends.cpu.cpu_fast_math", "ROW_SUM_LANES"))


def switches_digest() -> str:
    """The values of `SWITCHES`, as text."""
    import importlib
    package = __name__.rsplit(".", 1)[0]
    return ",".join(f"{m}.{k}={getattr(importlib.import_module(f'{package}.{m}'), k)!r}" for m, k in SWITCHES)


def default_cache_dir() -> str:
    """$DYNTVM_CACHE_DIR, else this user's cache folder (platformdirs: ~/.cache/dyntvm on Linux)."""
    env = os.environ.get("DYNTVM_CACHE_DIR")
    if env:
        return env
    import platformdirs
    return platformdirs.user_cache_dir("dyntvm")


class UntrustedCacheError(PermissionError):
    """A cache folder, entry or file this user must not trust: another user's, writable by others, or a
    symbolic link. Code loaded from it could have been planted by someone else."""


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def ownership_problem(st: os.stat_result) -> str | None:
    """Why a file or folder with stat `st` may hold code planted by another user, or None."""
    uid = _uid()
    if uid is None:                      # no POSIX owners (Windows): nothing to check
        return None
    if st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022:
        return f"it is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_folder(path: str) -> str:
    """`path`, created (mode 0700) if absent; made private (with a CacheWarning) if it is this user's but others
    may write to it. Raises UntrustedCacheError when it is not a folder of this user (a symbolic link to one is
    followed: a user's ~/.cache may be one), OSError when it cannot be created."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == _uid() and st.st_mode & 0o022:
        # this user's own folder, made with umask 002 (or by an older dyntvm): made private again; what others
        # may have put in it meanwhile is refused entry by entry (`_check`: owner, mode, no links)
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
        warnings.warn(f"dyntvm compile cache: {path} was writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                      "made private (mode 700)", CacheWarning, stacklevel=2)
        st = os.stat(path)
    why = "it is not a folder" if not stat.S_ISDIR(st.st_mode) else ownership_problem(st)
    if why:
        raise UntrustedCacheError(f"{path} cannot be trusted: {why}; dyntvm loads native code from it")
    return path


def _uncached_path() -> str:
    return os.path.join(tempfile.gettempdir(), f"dyntvm-uncached-{_uid() or 0}")


def uncached_dir() -> str:
    """A private folder for libraries built with use_cache=False that cannot be loaded in this process
    (CUDA kernels on a machine without a GPU): the compiler reads the file into the model, then removes it
    (`is_uncached`). In the shared temp dir, so it is checked: another user may have made it first."""
    return private_folder(_uncached_path())


def is_uncached(path: str) -> bool:
    """Whether `path` is such a private file (not a cache entry)."""
    return os.path.dirname(os.path.abspath(path)) == _uncached_path()


def cache_key(regions: list, target_desc: str, extra: str = "") -> str:
    """sha256 over each region's structure and constant bytes, the target and library versions, the code
    (`codegen_digest`) and its switches (`SWITCHES`)."""
    import tvm

    import dyntvm
    h = hashlib.sha256()
    h.update(f"{_VERSION_SALT}|{dyntvm.__version__}|{codegen_digest()}|{switches_digest()}|{tvm.__version__}|"
             f"{target_desc}|{extra}".encode())
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


LIBRARY = "kernels.so"
SIDECAR = "kernels.json"      # {"sha256", "size", "binding", "tuned_kernels"} of LIBRARY

# An entry is a folder <cache_dir>/<key> holding LIBRARY and SIDECAR. It is written as a temporary
# folder and renamed into place in one step, so a reader sees no entry or a whole one; a bad one is
# renamed away before it is deleted. The sidecar is checked against the library's bytes before the
# library is loaded: a truncated or overwritten library never reaches dlopen.
# The cache is one user's: the cache folder, each entry folder and its files must be owned by this user
# and writable by no one else, and no symbolic link is followed inside the cache folder. Anyone who could
# write there could make this process run their code (a sidecar is no proof: its writer computes it).


class CacheWarning(UserWarning):
    """The compile cache had a bad entry (removed and rebuilt) or could not be used (built uncached)."""


def file_digest(path: str) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a file."""
    with open(path, "rb") as f:
        return _digest_of(f)


def _digest_of(f) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


class Entry(NamedTuple):
    """A sound cache entry: its library file and what that file's bytes are."""
    path: str
    sha256: str
    size: int
    tuned: int | None = None        # kernels built with a tuning log's schedule (None: not recorded)


class RefusedFile(Exception):
    """A cache file that must not be used (missing, a link, another user's...); the message says why."""


def open_private(path: str, what: str):
    """`path` opened for reading in binary mode when it is a regular file of this user that no one else may
    write to, not a symbolic link (O_NOFOLLOW); raises RefusedFile (why) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise RefusedFile(f"{what} is missing") from None
    except OSError as e:
        if os.path.islink(path):
            raise RefusedFile(f"{what} is a symbolic link") from None
        raise RefusedFile(f"{what} cannot be opened ({type(e).__name__}: {e})") from None
    try:
        st = os.fstat(fd)
        why = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else ownership_problem(st)
        if why:
            raise RefusedFile(f"{what} is refused: {why}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check(folder: str, binding: str | None) -> Entry | str:
    """The Entry in `folder` when it is sound, else why it is not. Reads the whole library and
    compares it with the sidecar (mapping a truncated shared object ends the process with SIGBUS)."""
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):
        return "the entry is a symbolic link (never followed in the cache)"
    if not stat.S_ISDIR(st.st_mode):
        return f"{LIBRARY} is missing or not a regular file (the entry is not a folder)"
    why = ownership_problem(st)
    if why:
        return f"the entry folder is refused: {why}"
    lib, side = os.path.join(folder, LIBRARY), os.path.join(folder, SIDECAR)
    try:
        with open_private(side, SIDECAR) as f:
            meta = json.loads(f.read(1 << 16))
        sha, size, bound = meta["sha256"], meta["size"], meta.get("binding")
        with open_private(lib, LIBRARY) as f:
            have_sha, have_size = _digest_of(f)
    except RefusedFile as e:
        return str(e)
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        return f"{SIDECAR} is unreadable ({type(e).__name__}: {e})"
    if have_size != size:
        return f"{LIBRARY} has {have_size} bytes, {SIDECAR} says {size!r} (truncated?)"
    if have_sha != sha:
        return f"{LIBRARY} does not match its sha256 (corrupt or overwritten)"
    if bound != binding:
        return f"{LIBRARY} was built for other regions"
    tuned = meta.get("tuned_kernels")
    ok = isinstance(tuned, int) and not isinstance(tuned, bool) and 0 <= tuned < 1 << 31
    return Entry(lib, sha, size, tuned if ok else None)


def lookup(cache_dir: str, key: str, binding: str | None = None) -> Entry | None:
    """The verified entry `key`, or None (a miss). A bad entry (truncated, corrupt, a missing or wrong
    sidecar, a directory in the library's place, another user's entry or file, a symbolic link...) is a miss
    too: it is removed with a CacheWarning, and the caller rebuilds. Raises OSError only when the cache folder
    itself cannot be read, UntrustedCacheError (an OSError) when it is not this user's own."""
    folder = os.path.join(cache_dir, key)
    if not os.path.lexists(folder):
        return None
    private_folder(cache_dir)            # an entry of a cache folder others may write to is never trusted
    try:
        found = _check(folder, binding)
    except OSError as e:
        found = f"cannot be read ({type(e).__name__}: {e})"
    if isinstance(found, Entry):
        return found
    discard(cache_dir, key, found)
    return None


def discard(cache_dir: str, key: str, why: str) -> None:
    """Warn about a bad entry and remove it (the caller rebuilds)."""
    removed = remove_entry(cache_dir, key)
    warnings.warn(f"dyntvm compile cache: entry {os.path.join(cache_dir, key)} is bad: {why}; "
                  + ("removed, rebuilding" if removed else "it cannot be removed (no permission?); rebuilding"),
                  CacheWarning, stacklevel=3)


def remove_entry(cache_dir: str, key: str) -> bool:
    """Remove entry `key` (renamed away first, so no reader sees half of it); False if it cannot be (errors
    are not raised). An entry that cannot be deleted after the rename (another user's) is renamed back."""
    folder = os.path.join(cache_dir, key)
    trash = os.path.join(cache_dir, f".{key}.trash-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        os.rename(folder, trash)
    except OSError:
        return False
    if os.path.isdir(trash) and not os.path.islink(trash):
        shutil.rmtree(trash, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(trash)
    if os.path.lexists(trash):
        with contextlib.suppress(OSError):
            os.rename(trash, folder)
        return False
    return True


def store(cache_dir: str, key: str, executable, binding: str | None = None, tuned: int | None = None) -> Entry:
    """Export `executable` as entry `key`; returns it. Raises OSError when the cache cannot be written.

    Library and sidecar are written into a temporary folder that is then renamed to `key`. If another
    process stored the same key meanwhile, its entry is kept when it is sound (else replaced).
    """
    private_folder(cache_dir)
    tmp = tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=cache_dir)       # mode 0700
    try:
        lib = os.path.join(tmp, LIBRARY)
        export_library(executable, lib)       # a full disk: LibraryWriteError, an OSError
        os.chmod(lib, 0o600)        # whatever the umask: `_check` refuses a file others may write
        sha, size = file_digest(lib)
        with open(os.open(os.path.join(tmp, SIDECAR), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump({"sha256": sha, "size": size, "binding": binding,
                       **({"tuned_kernels": tuned} if tuned is not None else {})}, f)
        folder = os.path.join(cache_dir, key)
        for attempt in (0, 1):
            try:
                os.rename(tmp, folder)
                return Entry(os.path.join(folder, LIBRARY), sha, size, tuned)
            except OSError:
                if attempt or not os.path.lexists(folder):
                    raise
            found = _check(folder, binding)          # stored meanwhile by another process?
            if isinstance(found, Entry):
                return found
            remove_entry(cache_dir, key)
        raise AssertionError("unreachable")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
