"""A full disk is a clear error (or, for the compile cache, an uncached build with a CacheWarning), never the
end of the process (LLVM ends it with `LLVM ERROR: IO failure on output stream` when it cannot write an object
file) and never a temporary folder left behind. The disks are really full: small tmpfs mounts, filled up
(mounting needs root; elsewhere these tests are skipped, saying so). Each scenario runs in a child process, so
a regression fails the test instead of ending the test session."""
import json
import os
import shutil
import subprocess
import sys

import pytest

CHILD = """
import json, sys, warnings
import dyntvm as dt
from dyntvm import F
scenario, where, out = sys.argv[1], sys.argv[2], sys.argv[3]
spec = dt.TensorSpec(("N", 4), name="x")
result = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        if scenario in ("compile", "cuda_compile"):      # $TMPDIR is the full one
            target = "cuda" if scenario == "cuda_compile" else "cpu"
            result["cache"] = dt.compile(lambda x: F.tanh(x) * 3.0, spec, target=target, cache_dir=where).info["cache"]
        elif scenario == "full_cache":
            m = dt.compile(lambda x: F.tanh(x) * 3.0, spec, cache_dir=where)
            result["cache"], result["lib_path"] = m.info["cache"], m.lib_path
        else:                                            # save into a full folder
            m = dt.compile(lambda x: F.tanh(x) * 3.0, spec, use_cache=scenario == "save_cached", cache_dir=out)
            m.save(where + "/m.dtvm")
    except Exception as e:
        result["error"] = [type(e).__name__, str(e)]
result["warnings"] = [[w.category.__name__, str(w.message)] for w in caught]
print("RESULT " + json.dumps(result))
"""


@pytest.fixture
def full_folder(tmp_path):
    """make(free_kib): a 1 MiB tmpfs filled up to `free_kib` KiB left free, unmounted afterwards."""
    mounted = []

    def make(free_kib: int) -> str:
        d = tmp_path / f"disk{len(mounted)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs to fill up (needs root): {r.stderr.strip()}")
        mounted.append(d)
        os.mkdir(d / "private", 0o700)          # a cache folder must be this user's own (the mount is 1777)
        with open(d / "fill", "wb") as f:
            f.write(b"\0" * ((1024 - free_kib) * 1024))
        return str(d)
    yield make
    for d in mounted:
        subprocess.run(["umount", str(d)], check=True)


def run(scenario: str, where: str, out: str, **env) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, scenario, where, out], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=600)
    assert r.returncode == 0, f"the process ended (rc {r.returncode}): {r.stderr[-2000:]}"
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_a_nearly_full_tmpdir_does_not_end_the_compile(full_folder, tmp_path):
    """Found by the hostile review: $TMPDIR with a little space left (Python's own probe passes) ended the
    process while the kernel library's object file was written, and left the folder it was written in. The
    export now writes next to the library (the cache entry), so the temp dir is not used at all."""
    tmpdir = full_folder(32)
    result = run("compile", str(tmp_path / "cache"), "", TMPDIR=tmpdir)
    assert result.get("error") is None and result["cache"] == "miss", result
    assert sorted(os.listdir(tmpdir)) == ["fill", "private"]


def test_a_full_cache_folder_builds_uncached(full_folder):
    disk = full_folder(0)
    cache = os.path.join(disk, "private")
    result = run("full_cache", cache, "")
    assert result.get("error") is None and result["cache"] == "miss" and result["lib_path"] is None, result
    (warning,) = [w for w in result["warnings"] if w[0] == "CacheWarning"]
    assert f"cannot write to {cache}" in warning[1] and "the disk is full" in warning[1], warning
    assert "the kernels were built without the cache" in warning[1]
    assert os.listdir(cache) == [] and sorted(os.listdir(disk)) == ["fill", "private"]


@pytest.mark.parametrize("scenario", ["save_uncached", "save_cached"])
def test_saving_into_a_full_folder_is_an_artifact_error(full_folder, tmp_path, scenario):
    """An uncached model exports its kernels (LLVM writes an object file), a cached one copies them: either
    way a clear ArtifactError naming the folder, nothing left in it."""
    disk = full_folder(0)
    result = run(scenario, disk, str(tmp_path / "cache"))
    kind, message = result.get("error") or (None, "")
    assert kind == "ArtifactError" and f"cannot write the artifact in {disk}" in message, result
    assert "No space left on device" in message or "disk is full" in message, message
    assert sorted(os.listdir(disk)) == ["fill", "private"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None and not os.access("/usr/local/cuda/bin/nvcc", os.X_OK),
                    reason="CUDA builds need nvcc")
def test_a_full_tmpdir_is_a_clear_cuda_compile_error(full_folder, tmp_path):
    """A CUDA build needs its temporary folder (nvcc's files): a full one is a CompileError naming it."""
    tmpdir = full_folder(32)
    result = run("cuda_compile", str(tmp_path / "cache"), "", TMPDIR=tmpdir)
    kind, message = result.get("error") or (None, "")
    assert kind == "CompileError" and "No space left on device" in message, result
    assert f"the disk of the build folder {tmpdir}/" in message and "$TMPDIR chooses it" in message
    assert sorted(os.listdir(tmpdir)) == ["fill", "private"]
