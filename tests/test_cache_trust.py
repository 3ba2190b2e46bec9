"""The compile cache is one user's: code another user could have planted there is never loaded.

An entry's sidecar is no proof (whoever plants a library writes its sidecar too), so the cache folder, each
entry folder and its files must belong to this user and be writable by no one else, and no symbolic link
inside the cache is followed. A planted library here writes a marker file when it is loaded (a constructor):
the marker must never appear. The other user is a real one: `nobody` plants files as itself (setpriv) where
it can, and files are chown'ed to it elsewhere (we run as root; without root those cases cannot be made and
are skipped, saying so).
"""
import hashlib
import json
import os
import pathlib
import pwd
import shutil
import subprocess
import tempfile
import warnings

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.build import stats
from dyntvm.codegen.cache import LIBRARY, SIDECAR, CacheWarning

SPEC = dt.TensorSpec(("N", 4), name="x")
X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
IS_ROOT = os.geteuid() == 0
OTHER = pwd.getpwnam("nobody")
needs_root = pytest.mark.skipif(not IS_ROOT, reason="making files of another user needs root (chown / setpriv)")


def model_fn(x):
    return F.tanh(x) * 2.0 + 1.0


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("golden") / "cache")
    dt.compile(model_fn, SPEC, cache_dir=d)
    return d


@pytest.fixture
def open_folder():
    """A folder the other user can reach (pytest's own temp folders are root's, mode 0700)."""
    d = tempfile.mkdtemp(prefix="dyntvm-trust-test-")
    os.chmod(d, 0o755)
    yield pathlib.Path(d)
    shutil.rmtree(d)


@pytest.fixture
def planted_library(open_folder):
    """(library path, marker path): a valid shared library that creates the marker when it is loaded."""
    d = open_folder / "planted"
    d.mkdir(mode=0o755)
    marker = str(d / "marker")
    (d / "plant.c").write_text('#include <stdio.h>\n__attribute__((constructor)) static void planted(void) '
                               '{ FILE *f = fopen(MARKER, "w"); if (f) { fputs("ran", f); fclose(f); } }\n')
    lib = str(d / "plant.so")
    subprocess.run(["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", lib, str(d / "plant.c")], check=True)
    os.chmod(lib, 0o644)
    return lib, marker


def plant_into(entry: str, lib: str):
    """Replace the entry's library by `lib`, with a sidecar that describes it (what an attacker writes)."""
    data = open(lib, "rb").read()
    with open(os.path.join(entry, LIBRARY), "wb") as f:
        f.write(data)
    with open(os.path.join(entry, SIDECAR)) as f:
        meta = json.load(f)
    meta["sha256"], meta["size"] = hashlib.sha256(data).hexdigest(), len(data)
    with open(os.path.join(entry, SIDECAR), "w") as f:
        json.dump(meta, f)


def chown_tree(path: str, uid: int, gid: int):
    for folder, dirs, files in os.walk(path):
        for name in [folder] + [os.path.join(folder, f) for f in files]:
            os.lchown(name, uid, gid)


def as_other_user(*cmd):
    """Run `cmd` as the user nobody (a real second user)."""
    subprocess.run(["setpriv", f"--reuid={OTHER.pw_uid}", f"--regid={OTHER.pw_gid}", "--clear-groups", *cmd],
                   check=True)


# ----------------------------------------------------------------------------- how the cache is attacked
def entry_of_other_user(cache, entry, lib):
    plant_into(entry, lib)
    chown_tree(entry, OTHER.pw_uid, OTHER.pw_gid)
    return "owned by uid"


def library_of_other_user(cache, entry, lib):
    plant_into(entry, lib)
    os.lchown(os.path.join(entry, LIBRARY), OTHER.pw_uid, OTHER.pw_gid)
    return "kernels.so is refused: it is owned by uid"


def group_writable_entry(cache, entry, lib):
    plant_into(entry, lib)
    os.chmod(entry, 0o775)
    return "writable by other users (mode 775)"


def world_writable_library(cache, entry, lib):
    plant_into(entry, lib)
    os.chmod(os.path.join(entry, LIBRARY), 0o666)
    return "kernels.so is refused: it is writable by other users"


def symlinked_entry(cache, entry, lib):
    """The entry folder replaced by a link to a planted entry elsewhere (owned by this user, even)."""
    elsewhere = os.path.join(os.path.dirname(cache), "elsewhere")
    shutil.copytree(entry, elsewhere)
    plant_into(elsewhere, lib)
    shutil.rmtree(entry)
    os.symlink(elsewhere, entry)
    return "the entry is a symbolic link"


def symlinked_library(cache, entry, lib):
    plant_into(entry, lib)
    os.replace(os.path.join(entry, LIBRARY), os.path.join(entry, "real.so"))
    os.symlink("real.so", os.path.join(entry, LIBRARY))
    return "kernels.so is a symbolic link"


def compile_with_cache(cache: str):
    """``(model, CacheWarning messages)`` of compiling `model_fn` with the cache folder `cache`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = dt.compile(model_fn, SPEC, cache_dir=cache)
    return model, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


@pytest.mark.parametrize("attack", [
    pytest.param(entry_of_other_user, marks=needs_root), pytest.param(library_of_other_user, marks=needs_root),
    group_writable_entry, world_writable_library, symlinked_entry, symlinked_library])
def test_untrusted_entry_is_never_loaded(golden, planted_library, tmp_path, attack):
    cache = str(tmp_path / "cache")
    shutil.copytree(golden, cache, symlinks=True)
    (key,) = os.listdir(cache)
    lib, marker = planted_library
    why = attack(cache, os.path.join(cache, key), lib)
    before = stats.builds
    model, messages = compile_with_cache(cache)
    assert not os.path.exists(marker), "the planted library was loaded"
    assert len(messages) == 1 and why in messages[0] and "rebuilding" in messages[0], messages
    assert stats.builds == before + 1 and model.info["cache"] == "miss"
    np.testing.assert_allclose(model(X), np.tanh(X) * 2 + 1, rtol=1e-5, atol=1e-5)
    assert os.listdir(cache) == [key] and not os.path.islink(os.path.join(cache, key))     # replaced by our own
    st = os.lstat(os.path.join(cache, key, LIBRARY))
    assert st.st_uid == os.getuid() and st.st_mode & 0o077 == 0


def shared_world_writable(tmp_path, golden, lib):
    """A cache folder anyone may write to (like /tmp, made by someone else): the other user plants a whole
    entry, as itself."""
    cache = str(tmp_path / "shared")
    os.mkdir(cache)
    os.chmod(cache, 0o1777)
    os.chown(cache, OTHER.pw_uid, OTHER.pw_gid)
    (key,) = os.listdir(golden)
    staged = str(tmp_path / "staged")
    shutil.copytree(os.path.join(golden, key), staged)
    plant_into(staged, lib)
    for f in os.listdir(staged):
        os.chmod(os.path.join(staged, f), 0o644)
    os.chmod(staged, 0o755)
    as_other_user("cp", "-r", staged, os.path.join(cache, key))
    assert os.stat(os.path.join(cache, key)).st_uid == OTHER.pw_uid
    return cache, "owned by uid"


def shared_other_owner(tmp_path, golden, lib):
    """A cache folder of another user (DYNTVM_CACHE_DIR pointing at it), holding its planted entry."""
    cache = str(tmp_path / "theirs")
    shutil.copytree(golden, cache)
    (key,) = os.listdir(cache)
    plant_into(os.path.join(cache, key), lib)
    chown_tree(cache, OTHER.pw_uid, OTHER.pw_gid)
    return cache, "owned by uid"


@needs_root
@pytest.mark.parametrize("make", [shared_world_writable, shared_other_owner])
def test_untrusted_cache_folder_builds_uncached(golden, planted_library, open_folder, make):
    lib, marker = planted_library
    cache, why = make(open_folder, golden, lib)
    model, messages = compile_with_cache(cache)
    assert not os.path.exists(marker), "the planted library was loaded"
    assert len(messages) == 1 and why in messages[0] and "built without the cache" in messages[0], messages
    assert model.info["cache"] == "miss" and model.lib_path is None
    np.testing.assert_allclose(model(X), np.tanh(X) * 2 + 1, rtol=1e-5, atol=1e-5)


def test_default_cache_is_private(tmp_path, monkeypatch):
    """Without $DYNTVM_CACHE_DIR the cache is the user's own cache folder, created 0700."""
    monkeypatch.delenv("DYNTVM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from dyntvm.codegen.cache import default_cache_dir
    assert default_cache_dir() == str(tmp_path / "xdg" / "dyntvm")
    model = dt.compile(model_fn, SPEC)
    assert model.lib_path.startswith(str(tmp_path / "xdg" / "dyntvm") + os.sep)
    for folder in (default_cache_dir(), os.path.dirname(model.lib_path)):
        assert os.stat(folder).st_mode & 0o777 == 0o700


def test_not_a_tvm_module_is_discarded(golden, planted_library, tmp_path):
    """A valid shared library that is not a TVM executable (sidecar re-fixed): discarded and rebuilt once,
    not a raw AttributeError on every compile. (Owned by this user: it is loaded, so the marker may appear.)"""
    cache = str(tmp_path / "cache")
    shutil.copytree(golden, cache)
    (key,) = os.listdir(cache)
    plant_into(os.path.join(cache, key), planted_library[0])
    with pytest.warns(CacheWarning, match="a shared library but not a TVM Relax executable"):
        model = dt.compile(model_fn, SPEC, cache_dir=cache)
    assert model.info["cache"] == "miss"
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert dt.compile(model_fn, SPEC, cache_dir=cache).info["cache"] == "hit"


@pytest.mark.parametrize("plant", ["world_writable", "symlink"])
def test_a_planted_stub_cuda_driver_is_replaced(tmp_path, monkeypatch, planted_library, plant):
    """The stub libcuda.so.1 that CUDA builds without a GPU load (kept in the cache folder) is a cache file
    too: a planted one is rebuilt, never handed to the build process."""
    monkeypatch.setenv("DYNTVM_CACHE_DIR", str(tmp_path / "cache"))
    from dyntvm.codegen.backends.cuda.gpu import stub_dir
    folder = stub_dir()
    lib = os.path.join(folder, "libcuda.so.1")
    os.remove(lib)
    if plant == "symlink":
        os.symlink(planted_library[0], lib)
    else:
        shutil.copyfile(planted_library[0], lib)
        os.chmod(lib, 0o666)
    assert stub_dir() == folder
    st = os.lstat(lib)
    assert not os.path.islink(lib) and st.st_uid == os.getuid() and st.st_mode & 0o022 == 0
    assert open(lib, "rb").read() != open(planted_library[0], "rb").read()


def test_own_cache_folder_writable_by_others_is_made_private(golden, planted_library, tmp_path):
    """This user's cache folder made group-writable (umask 002, an older dyntvm) is made private again, with a
    warning; an entry planted meanwhile is still refused (it is not this user's: its folder mode says so
    here, a chown'ed one with root)."""
    cache = str(tmp_path / "cache")
    shutil.copytree(golden, cache)
    (key,) = os.listdir(cache)
    plant_into(os.path.join(cache, key), planted_library[0])
    os.chmod(os.path.join(cache, key), 0o777)
    os.chmod(cache, 0o775)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = dt.compile(model_fn, SPEC, cache_dir=cache)
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert not os.path.exists(planted_library[1]), "the planted library was loaded"
    assert len(messages) == 2 and "was writable by other users (mode 775); made private" in messages[0], messages
    assert "writable by other users (mode 777)" in messages[1] and "rebuilding" in messages[1]
    assert os.stat(cache).st_mode & 0o777 == 0o700 and model.info["cache"] == "miss"
