"""Deployable artifacts: the files. Writes a model's artifact folder (or one .tar), reads and checks one.

Layout (DESIGN section 8): manifest.json (format version, dyntvm/TVM versions, target, signature,
regions, sha256 and size of every file, the kernel binding), graph.json (the partitioned graph),
params.npz (constants, loaded with allow_pickle=False), kernels.so (compiled regions, native code: load
only artifacts you trust). kernels.so is bound to graph.json + params.npz by `kernel_binding`, a digest
of the whole graph and its constants compiled into the library; `dt.load` compares the two.
Reading checks everything first and imports only the runtime (no frontend, partitioner or codegen); a
.tar is extracted only after its headers and manifest.json are checked. `save` never overwrites
anything but an empty folder or an earlier artifact.
`dt.load` (`runtime/load.py`) turns what `read_folder` returns, plus the kernels, into a CompiledModel;
this module knows no CompiledModel (it saves any object with graph, target, regions, info and lib).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib

import numpy as np

try:
    from lzma import LZMAError as _LZMAError
except ImportError:          # a Python built without lzma cannot open .tar.xz either
    _LZMAError = OSError

from dyntvm.errors import ArtifactError, GraphError

from ..ir.serialize import graph_from_json, graph_to_json
from ..native import LibraryWriteError, export_library
from .devices import DEVICES
from .staging import NEW, OLD, held, new_token, remove_stale, sibling

FORMAT_VERSION = 3        # 2: file sizes and the kernel binding in the manifest; 3: the library binding covers
                          # the manifest's execution facts (`dyntvm.native.execution_binding`)
KERNELS = "kernels.so"
LISTED = ("graph.json", "params.npz", KERNELS)          # what manifest.json may list under "files"
ARTIFACT_FILES = ("manifest.json",) + LISTED             # all an artifact folder or tar may hold
BINDING_FUNCTION = "dyntvm_binding"   # compiled into kernels.so (dyntvm.codegen.build.add_binding)
MAX_MANIFEST_BYTES = 16 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def max_artifact_bytes() -> int:
    """Largest total size of the listed files accepted from an artifact ($DYNTVM_MAX_ARTIFACT_BYTES,
    default 64 GiB): a small compressed .tar must not fill the disk when it is extracted."""
    try:
        return int(os.environ.get("DYNTVM_MAX_ARTIFACT_BYTES", 64 << 30))
    except ValueError:
        return 64 << 30


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


def region_names(graph) -> list:
    return [n.attrs.name for n in graph.walk() if n.op == "region"]


def library_binding(vm) -> str | None:
    """The kernel binding compiled into a library (hex), through its `BINDING_FUNCTION`; None if it has none."""
    try:
        fn = vm[BINDING_FUNCTION]
    except Exception:  # noqa: BLE001 - AttributeError from the VM: no such function
        return None
    try:
        return fn().numpy().tobytes().hex()
    except Exception:  # noqa: BLE001 - not our function (another signature or result)
        return None


def kernel_binding(graph) -> str:
    """sha256 (hex) of the compiled model `graph`: its whole structure (every node, region bodies included)
    and all its constant data, source lines left out.

    `dt.compile` compiles it into the kernel library (a function `BINDING_FUNCTION` returning its
    bytes), `save` records it in manifest.json, and reading an artifact recomputes it from graph.json
    + params.npz: another model's kernels.so, or a graph or weights edited after compiling (also weights
    used only outside compiled regions), do not match.
    """
    from ..ir.serialize import graph_to_dict
    h = hashlib.sha256(b"dyntvm-kernel-binding-2")
    d, params = graph_to_dict(graph)
    d.pop("dim_origins", None)      # messages, not what the kernels compute
    _strip_sources(d["graph"])
    h.update(json.dumps(d, sort_keys=True).encode())
    for k in sorted(params):
        a = np.asarray(params[k], order="C")
        h.update(f"|{k}:{a.dtype.str}:{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _strip_sources(g: dict):
    for n in g["nodes"]:
        n.pop("source", None)
        for s in n["subgraphs"]:
            _strip_sources(s)


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


# ------------------------------------------------------------------------------------------- writing
def _read_manifest_file(path: str) -> dict | None:
    """manifest.json at `path` as a dict, or None when it is not one (too big, unreadable, not JSON)."""
    try:
        if os.path.getsize(path) > MAX_MANIFEST_BYTES:
            return None
        with open(path, "rb") as f:
            obj = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _is_artifact_folder(path: str) -> bool:
    """A folder holding only artifact files, with a manifest.json that looks like ours."""
    names = set(os.listdir(path))
    if "manifest.json" not in names or not names <= set(ARTIFACT_FILES):
        return False
    manifest = _read_manifest_file(os.path.join(path, "manifest.json"))
    return manifest is not None and "format_version" in manifest and "files" in manifest


def _is_artifact_tar(path: str) -> bool:
    """A tar file whose members are all regular artifact files, manifest.json among them."""
    try:
        with tarfile.open(path, "r") as tar:
            names = []
            for m in tar:
                if m.name not in ARTIFACT_FILES or not m.isreg():
                    return False
                names.append(m.name)
    except (tarfile.TarError, OSError, EOFError, zlib.error, _LZMAError):
        return False
    return "manifest.json" in names


def check_destination(path: str) -> None:
    """Raise ArtifactError unless an artifact may be written at `path`: a folder that is absent,
    empty or an existing dyntvm artifact; a .tar file that is absent or an artifact tar. Anything
    else may be the user's data, which `save` must not overwrite."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArtifactError(f"an artifact path must be a string or path-like, got {type(path).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise ArtifactError(f"an artifact path must be a non-empty string, got {path!r}")
    hint = "choose another output path, or remove it first"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ArtifactError(f"{path}: cannot write an artifact there: {parent} is not a folder")
    if path.endswith(".tar"):
        if os.path.isdir(path):
            raise ArtifactError(f"{path}: refusing to write a .tar artifact over a folder; {hint}")
        if os.path.lexists(path) and not (os.path.isfile(path) and _is_artifact_tar(path)):
            raise ArtifactError(f"{path}: refusing to overwrite: it exists and is not a dyntvm artifact tar; "
                                f"{hint}")
        return
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ArtifactError(f"{path}: refusing to overwrite: it exists and is not a folder (an artifact is a "
                            f"folder, or a path ending in .tar); {hint}")
    if os.path.isdir(path):
        try:
            names = sorted(os.listdir(path))
        except OSError as e:
            raise ArtifactError(f"{path}: cannot write an artifact there: {e}") from e
        if names and not _is_artifact_folder(path):
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise ArtifactError(f"{path}: refusing to overwrite: the folder is neither empty nor a dyntvm "
                                f"artifact (it holds {shown}); {hint}")


def _write_files(model, folder: str) -> list:
    """graph.json, params.npz, kernels.so and manifest.json of `model` into `folder`."""
    text, params = graph_to_json(model.graph)
    with open(os.path.join(folder, "graph.json"), "w") as f:
        f.write(text)
    # np.asarray, not np.ascontiguousarray: the latter turns 0-d constants into shape (1,)
    np.savez(os.path.join(folder, "params.npz"), **{k: np.asarray(v, order="C") for k, v in params.items()})
    files = ["graph.json", "params.npz"]
    digests = {fn: _sha256(os.path.join(folder, fn)) for fn in files}
    if model.lib is not None or getattr(model, "lib_path", None) or getattr(model, "lib_bytes", None) is not None:
        # (lib None: CUDA kernels built without a GPU, kept as their bytes)
        src = getattr(model, "lib_path", None)
        blob = getattr(model, "lib_bytes", None)
        dst = os.path.join(folder, KERNELS)
        if blob is not None:           # read when compiled (or loaded): a cache entry may be gone since
            with open(dst, "wb") as f:
                f.write(blob)
        elif src:
            try:
                shutil.copyfile(src, dst)
            except OSError as e:
                raise ArtifactError(f"the model's kernel library {src} cannot be read ({e.strerror or e}); "
                                    "compile the model again") from None
        else:
            export_library(model.lib, dst)          # a full disk: an OSError, not the end of the process
        files.append(KERNELS)
        digests[KERNELS] = _sha256(dst)
        want = getattr(model, "lib_sha256", None)
        if want and digests[KERNELS] != want:
            raise ArtifactError(f"the model's kernel library {src} changed on disk after it was compiled "
                                "(compile cache edited or cleared?); compile the model again")
    manifest = {"format_version": FORMAT_VERSION, **_versions(), "target": model.target,
                "signature": signature(model.graph), "regions": model.regions,
                "info": _json_info(model.info), "files": digests,
                "sizes": {fn: os.path.getsize(os.path.join(folder, fn)) for fn in files}}
    if KERNELS in files:
        manifest["binding"] = kernel_binding(model.graph)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return ["manifest.json"] + files


def save(model, path: str) -> None:
    """Write `model` to `path` (a folder; a path ending in .tar gives one tar file).

    Refuses (ArtifactError) to write over anything but an empty folder or an existing artifact. The
    artifact is written next to `path` first and then renamed into place, so a failed save leaves
    what was there before; what a killed save left there is removed (`staging.remove_stale`).
    """
    check_destination(path)
    path = os.fspath(path)
    as_tar = path.endswith(".tar")
    if os.path.islink(path):         # replace what the link points to; the link stays
        path = os.path.realpath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    remove_stale(path)
    token = new_token()
    staging = sibling(path, NEW, token)
    try:
        os.mkdir(staging)
        _save_into(model, staging, path, token, as_tar)
    except OSError as e:                # a full disk, a read-only folder...: nothing is left behind
        raise ArtifactError(f"{path}: cannot write the artifact in {parent}: {e.strerror or e}"
                            + (f" ({e})" if isinstance(e, LibraryWriteError) else "")) from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _save_into(model, staging: str, path: str, token: str, as_tar: bool) -> None:
    """Write the artifact files into `staging`, then move them to `path` (a tar, or the folder itself)."""
    with held(staging):
        files = _write_files(model, staging)
        if as_tar:
            tmp_tar = staging + ".tar"
            try:
                with tarfile.open(tmp_tar, "w") as tar:
                    for fn in files:
                        tar.add(os.path.join(staging, fn), arcname=fn)
                os.replace(tmp_tar, path)
            finally:
                with contextlib.suppress(OSError):
                    os.remove(tmp_tar)
        else:
            _swap_in(staging, path, token)


def _swap_in(staging: str, path: str, token: str) -> None:
    """Move the folder `staging` to `path` (absent, an empty folder, or an old artifact)."""
    if not os.path.lexists(path) or not os.listdir(path):
        os.replace(staging, path)           # rename(2) replaces an empty folder atomically
        return
    old = sibling(path, OLD, token)
    with held(path):                        # the old artifact's folder, renamed to `old` below
        os.rename(path, old)
        try:
            os.rename(staging, path)
        except BaseException:
            os.rename(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------- reading
def parse_manifest(data: bytes, label: str) -> dict:
    """Check manifest.json's bytes; return the manifest. Every field `dt.load` relies on is checked
    here, so later code may index it freely."""
    def corrupt(why):
        return ArtifactError(f"{label}: manifest.json is corrupt: {why}")
    if len(data) > MAX_MANIFEST_BYTES:
        raise corrupt(f"{len(data)} bytes (at most {MAX_MANIFEST_BYTES})")
    try:
        manifest = json.loads(data)
    except RecursionError:
        raise corrupt("nested too deeply") from None
    except ValueError as e:                      # JSONDecodeError and UnicodeDecodeError
        raise corrupt(e) from e
    if not isinstance(manifest, dict):
        raise corrupt(f"expected a JSON object, got {type(manifest).__name__}")
    if "format_version" not in manifest:
        raise corrupt("no format_version")
    fmt = manifest["format_version"]
    if type(fmt) is not int or fmt < 1:
        raise corrupt(f"format_version must be a positive integer, got {fmt!r}")
    if fmt > FORMAT_VERSION:
        raise ArtifactError(f"{label}: artifact format version {fmt} is newer than this dyntvm supports "
                            f"({FORMAT_VERSION}); upgrade dyntvm")
    if fmt < FORMAT_VERSION:
        raise ArtifactError(f"{label}: artifact format version {fmt} is older than this dyntvm reads "
                            f"({FORMAT_VERSION}); recompile the model with this version")
    have = _versions()
    for k in ("tvm", "dyntvm"):
        if manifest.get(k) != have[k]:
            raise ArtifactError(f"{label}: built with {k} {manifest.get(k)}, but {have[k]} is installed; "
                                "recompile the model with this version")
    if not isinstance(manifest.get("target"), str) or manifest["target"] not in DEVICES:
        raise corrupt(f"target must be {' or '.join(json.dumps(n) for n in DEVICES)}, got {manifest.get('target')!r}")
    files, sizes = manifest.get("files"), manifest.get("sizes")
    if not isinstance(files, dict) or not isinstance(sizes, dict):
        raise corrupt("files and sizes must be JSON objects")
    for fn, digest in files.items():
        if fn not in LISTED:
            raise ArtifactError(f"{label}: manifest lists a file outside the artifact: {fn!r} "
                                f"(an artifact holds only {', '.join(LISTED)})")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise corrupt(f"the sha256 of {fn} is not 64 hex digits: {digest!r}")
        size = sizes.get(fn)
        if type(size) is not int or size < 0:
            raise corrupt(f"the size of {fn} is not a byte count: {size!r}")
    if set(sizes) != set(files):
        raise corrupt("sizes and files list different files")
    for need in ("graph.json", "params.npz"):
        if need not in files:
            raise ArtifactError(f"{label}: manifest.json does not list {need}")
    total, cap = sum(sizes.values()), max_artifact_bytes()
    if total > cap:
        raise ArtifactError(f"{label}: the artifact's files hold {total} bytes, more than the {cap} accepted "
                            "(set DYNTVM_MAX_ARTIFACT_BYTES to allow more)")
    sig, regions = manifest.get("signature"), manifest.get("regions")
    if not isinstance(sig, dict) or not isinstance(regions, list):
        raise corrupt("signature must be a JSON object and regions a list")
    if KERNELS in files and not (isinstance(manifest.get("binding"), str) and _HEX64.match(manifest["binding"])):
        raise corrupt(f"binding (the digest {KERNELS} was built for) is missing or not 64 hex digits")
    if not isinstance(manifest.get("info", {}), dict):
        raise corrupt("info must be a JSON object")
    return manifest


def _extract(path: str) -> str:
    """Extract the artifact tar at `path` into a new temporary folder (removed again on any error).

    Reads member headers and manifest.json before writing anything: only regular files named like
    artifact files are accepted (no links, devices, folders or paths), each listed in the manifest
    with its size, so no more than the manifest's sizes (capped by `max_artifact_bytes`) is written.
    """
    try:
        folder = tempfile.mkdtemp(prefix="dyntvm-load-")
    except OSError as e:
        raise ArtifactError(f"{path}: cannot extract the artifact tar into the temp folder {tempfile.gettempdir()} "
                            f"({e.strerror or e}; $TMPDIR chooses where)") from e
    try:
        _extract_into(path, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _member_kind(m: tarfile.TarInfo) -> str:
    return ("symlink" if m.issym() else "hard link" if m.islnk() else "folder" if m.isdir() else
            "device" if m.ischr() or m.isblk() else "fifo" if m.isfifo() else "sparse file" if m.issparse()
            else "file" if m.isreg() else "special member")


def _extract_into(path: str, folder: str) -> None:
    cap = max_artifact_bytes()
    try:
        with tarfile.open(path, "r") as tar:
            members: dict = {}
            manifest = None
            for m in tar:                # headers; a member's data is skipped over, never written
                if m.name not in ARTIFACT_FILES or not m.isreg() or m.issparse():
                    raise ArtifactError(f"{path}: unexpected member {m.name!r} ({_member_kind(m)}) in artifact "
                                        f"tar; an artifact tar holds only the files {', '.join(ARTIFACT_FILES)}")
                if m.name in members:
                    raise ArtifactError(f"{path}: member {m.name!r} appears twice in artifact tar")
                limit = MAX_MANIFEST_BYTES if m.name == "manifest.json" else cap
                if m.size > limit:
                    raise ArtifactError(f"{path}: member {m.name!r} has {m.size} bytes, more than the {limit} "
                                        "accepted")
                members[m.name] = m
                if m.name == "manifest.json":
                    data = tar.extractfile(m).read()
                    manifest = parse_manifest(data, path)
                    with open(os.path.join(folder, "manifest.json"), "wb") as f:
                        f.write(data)
                    for seen in members.values():
                        _check_listed(seen, manifest, path)
                elif manifest is not None:
                    _check_listed(m, manifest, path)
            if manifest is None:
                raise ArtifactError(f"{path}: manifest.json is missing (not a dyntvm artifact?)")
            for name, m in members.items():
                if name != "manifest.json":
                    _copy_member(tar, m, os.path.join(folder, name))
    except (tarfile.TarError, EOFError, zlib.error, _LZMAError, OSError) as e:
        raise ArtifactError(f"{path}: not a readable artifact tar: {type(e).__name__}: {e}") from e


def _check_listed(m: tarfile.TarInfo, manifest: dict, path: str) -> None:
    if m.name == "manifest.json":
        return
    if m.name not in manifest["files"]:
        raise ArtifactError(f"{path}: member {m.name!r} is not listed in manifest.json")
    if m.size != manifest["sizes"][m.name]:
        raise ArtifactError(f"{path}: {m.name} has {m.size} bytes, manifest.json says {manifest['sizes'][m.name]} "
                            "(truncated or edited)")


def _copy_member(tar: tarfile.TarFile, m: tarfile.TarInfo, dst: str) -> None:
    """Write member `m` (a checked regular file) to `dst`: at most m.size bytes, a new file."""
    src = tar.extractfile(m)
    left = m.size
    try:
        out = open(dst, "xb")
    except OSError as e:
        raise _extract_failed(dst, e) from e
    with out:
        while left > 0:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                raise ArtifactError(f"{dst}: the tar ends inside {m.name}")
            try:
                out.write(chunk)
            except OSError as e:
                raise _extract_failed(dst, e) from e
            left -= len(chunk)


def _extract_failed(dst: str, e: OSError) -> ArtifactError:
    return ArtifactError(f"cannot extract the artifact tar into the temp folder {os.path.dirname(dst)} "
                         f"({e.strerror or e}; $TMPDIR chooses where)")


@contextlib.contextmanager
def folder_of(path: str):
    """The artifact folder at `path` (a .tar is extracted to a temporary folder, removed afterwards)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ArtifactError(f"{path}: no such artifact")
    if os.path.isdir(path):
        yield path
        return
    if not os.path.isfile(path):
        raise ArtifactError(f"{path}: not an artifact folder or .tar file")
    folder = _extract(path)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read(path: str) -> tuple[dict, object]:
    """(manifest, partitioned graph) of an artifact, checked like `load`, without loading its kernels.

    For `dyntvm inspect`: looking at an artifact runs none of its native code.
    """
    with folder_of(path) as folder:
        return read_folder(folder, path)


def read_folder(folder: str, label: str) -> tuple[dict, object]:
    """`read` of an artifact folder; `label` names the artifact in error messages.

    Checks the manifest, each listed file's size and sha256, params.npz (plain arrays only), graph.json,
    and that the manifest's signature, regions and kernel binding are those of graph.json + params.npz.
    """
    mpath = os.path.join(folder, "manifest.json")
    if not os.path.exists(mpath):
        raise ArtifactError(f"{label}: manifest.json is missing (not a dyntvm artifact?)")
    try:
        if not os.path.isfile(mpath):
            raise ArtifactError(f"{label}: manifest.json is not a file")
        if os.path.getsize(mpath) > MAX_MANIFEST_BYTES:
            raise ArtifactError(f"{label}: manifest.json is corrupt: more than {MAX_MANIFEST_BYTES} bytes")
        with open(mpath, "rb") as f:
            manifest = parse_manifest(f.read(), label)
        files = manifest["files"]
        for fn, digest in files.items():
            p = os.path.join(folder, fn)
            if not os.path.exists(p):
                raise ArtifactError(f"{label}: {fn} is missing")
            if not os.path.isfile(p):
                raise ArtifactError(f"{label}: {fn} is not a file")
            size = os.path.getsize(p)
            if size != manifest["sizes"][fn]:
                raise ArtifactError(f"{label}: {fn} has {size} bytes, manifest.json says {manifest['sizes'][fn]} "
                                    "(truncated or edited)")
            if _sha256(p) != digest:
                raise ArtifactError(f"{label}: {fn} does not match its sha256 in manifest.json (edited or corrupt)")
    except OSError as e:
        raise ArtifactError(f"{label}: cannot read the artifact: {e}") from e
    params = _read_params(os.path.join(folder, "params.npz"), label)
    try:
        with open(os.path.join(folder, "graph.json"), "rb") as f:
            graph = graph_from_json(f.read().decode(), params)
        graph.lint()
    except (GraphError, KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise ArtifactError(f"{label}: graph.json is invalid: {e}") from e
    except RecursionError:
        raise ArtifactError(f"{label}: graph.json is invalid: nested too deeply") from None
    except Exception as e:  # noqa: BLE001 - untrusted input: whatever else breaks, it is not a valid graph
        raise ArtifactError(f"{label}: graph.json is invalid: {type(e).__name__}: {e}") from e
    _check_against_graph(manifest, graph, label)
    return manifest, graph


def _read_params(path: str, label: str) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise ValueError("a single .npy array, not an .npz archive")
            return {k: z[k] for k in z.files}
    except ValueError as e:
        if "pickle" in str(e):
            raise ArtifactError(f"{label}: params.npz is not a plain array archive ({e}); pickled objects are "
                                "refused") from e
        raise ArtifactError(f"{label}: params.npz is corrupt: {e}") from e
    except Exception as e:  # noqa: BLE001 - BadZipFile, EOFError, zlib.error, OSError...: all corrupt
        raise ArtifactError(f"{label}: params.npz is corrupt: {type(e).__name__}: {e}") from e


def _check_against_graph(manifest: dict, graph, label: str) -> None:
    """The manifest's signature, regions and kernel binding must be those of graph.json + params.npz."""
    if manifest["signature"] != json.loads(json.dumps(signature(graph))):
        raise ArtifactError(f"{label}: manifest.json's signature does not match graph.json (edited?)")
    regions = region_names(graph)
    if manifest["regions"] != regions:
        raise ArtifactError(f"{label}: manifest.json's regions {manifest['regions']} are not graph.json's "
                            f"{regions} (edited?)")
    if KERNELS in manifest["files"]:
        if not regions:
            raise ArtifactError(f"{label}: manifest.json lists {KERNELS} but graph.json has no compiled region")
        if manifest["binding"] != kernel_binding(graph):
            raise ArtifactError(f"{label}: {KERNELS} was built for another graph or other weights than "
                                "graph.json + params.npz (manifest.json's binding differs; mixed or edited files?)")
    elif regions:
        raise ArtifactError(f"{label}: graph has compiled regions but {KERNELS} is not listed")
