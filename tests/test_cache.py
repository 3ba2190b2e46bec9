"""The compile cache heals itself: a bad entry is a miss (warned, removed, rebuilt); an unusable cache
folder means an uncached build (warned). A compile never fails or crashes because of the cache."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.build import stats
from dyntvm.codegen.cache import LIBRARY, SIDECAR, CacheWarning, file_digest

SPEC = dt.TensorSpec(("N", 4), name="x")


def model_fn(x):
    return F.tanh(x) * 2.0 + 1.0


X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
WANT = np.tanh(X) * 2 + 1


def entry(cache) -> str:
    """The one entry folder of a cache holding one model."""
    keys = os.listdir(cache)                                     # no temporary folder either
    assert len(keys) == 1, keys
    return os.path.join(cache, keys[0])


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("golden"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        dt.compile(model_fn, SPEC, cache_dir=d)
    return d


@pytest.fixture
def cache(golden, tmp_path):
    """A copy of a cache holding the model's entry. A copy, so that its library was never loaded by this
    process: a corrupted file must reach `dt.compile`, not a library the process has mapped already
    (changing a mapped file in place would crash the test itself)."""
    d = str(tmp_path / "cache")
    shutil.copytree(golden, d)
    return d


def compile_and_check(cache_dir, expect_warning: str | None, built: bool):
    before = stats.builds
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = dt.compile(model_fn, SPEC, cache_dir=cache_dir)
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    if expect_warning is None:
        assert messages == []
    else:
        assert len(messages) == 1 and expect_warning in messages[0], messages
    assert stats.builds == before + built
    np.testing.assert_allclose(model(X), WANT, rtol=1e-5, atol=1e-5)
    return model, messages


def assert_sound(cache_dir):
    """The entry is whole again: its sidecar describes its library, and the next compile is a hit."""
    folder = entry(cache_dir)
    with open(os.path.join(folder, SIDECAR)) as f:
        meta = json.load(f)
    assert (meta["sha256"], meta["size"]) == file_digest(os.path.join(folder, LIBRARY))
    model, _ = compile_and_check(cache_dir, None, built=False)
    assert model.info["cache"] == "hit"


def test_hit_and_sidecar(cache):
    folder = entry(cache)
    assert sorted(os.listdir(folder)) == [SIDECAR, LIBRARY]      # no temporary file left
    assert_sound(cache)


def garbage(path):
    with open(path, "wb") as f:
        f.write(b"\x7fELF not really a shared library" * 100)


def empty(path):
    open(path, "wb").close()


def folder(path):
    os.remove(path)
    os.mkdir(path)
    open(os.path.join(path, "x"), "w").close()


def flipped(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("corrupt, why", [(empty, "has 0 bytes"), (garbage, "bytes, kernels.json says"),
                                          (folder, "kernels.so is refused: it is not a regular file"),
                                          (flipped, "does not match its sha256")])
def test_bad_library_is_rebuilt(cache, corrupt, why):
    corrupt(os.path.join(entry(cache), LIBRARY))
    model, messages = compile_and_check(cache, why, built=True)
    assert "removed, rebuilding" in messages[0] and model.info["cache"] == "miss"
    assert_sound(cache)


def bad_sidecar(path):
    with open(path, "w") as f:
        f.write("[" * 100000)


def missing_sidecar(path):
    os.remove(path)


def other_sha(path):
    meta = json.load(open(path))
    meta["sha256"] = "0" * 64
    json.dump(meta, open(path, "w"))


@pytest.mark.parametrize("corrupt, why", [(bad_sidecar, "kernels.json is unreadable"),
                                          (missing_sidecar, "kernels.json is missing"),
                                          (other_sha, "does not match its sha256")])
def test_bad_sidecar_is_rebuilt(cache, corrupt, why):
    corrupt(os.path.join(entry(cache), SIDECAR))
    compile_and_check(cache, why, built=True)
    assert_sound(cache)


TRUNCATED = """
import sys, warnings, numpy as np, dyntvm as dt
from dyntvm import F
warnings.simplefilter("always")
model = dt.compile(lambda x: F.tanh(x) * 2.0 + 1.0, dt.TensorSpec(("N", 4), name="x"), cache_dir=sys.argv[1])
x = np.ones((2, 4), np.float32)
assert np.allclose(model(x), np.tanh(x) * 2 + 1)
print("cache", model.info["cache"])
"""


@pytest.mark.parametrize("sidecar_agrees", [False, True])
def test_truncated_library_is_rebuilt_not_mapped(tmp_path, sidecar_agrees):
    """dlopen of a truncated library dies with SIGBUS: the entry must be checked before it is loaded, also
    when its sidecar was rewritten to match the truncated file (found by the hostile review)."""
    cache = str(tmp_path / "cache")
    run = lambda: subprocess.run([sys.executable, "-c", TRUNCATED, cache], capture_output=True, text=True,
                                 timeout=600)
    r = run()
    assert r.returncode == 0 and "cache miss" in r.stdout, r.stdout + r.stderr
    lib = os.path.join(entry(cache), LIBRARY)
    data = open(lib, "rb").read()
    with open(lib, "wb") as f:
        f.write(data[:len(data) // 2])
    if sidecar_agrees:
        side = os.path.join(entry(cache), SIDECAR)
        meta = json.load(open(side))
        meta["sha256"], meta["size"] = hashlib.sha256(data[:len(data) // 2]).hexdigest(), len(data) // 2
        json.dump(meta, open(side, "w"))
    r = run()
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "cache miss" in r.stdout and "CacheWarning" in r.stderr and "truncated?" in r.stderr, r.stderr
    r = run()
    assert r.returncode == 0 and "cache hit" in r.stdout and "CacheWarning" not in r.stderr, r.stdout + r.stderr


def under_a_file(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    return str(tmp_path / "a_file" / "cache")


def dangling_symlink(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "link")
    return str(tmp_path / "link")


@pytest.mark.parametrize("make", [under_a_file, dangling_symlink])
def test_unusable_cache_dir_builds_uncached(tmp_path, make):
    cache_dir = make(tmp_path)
    model, messages = compile_and_check(cache_dir, "the kernels were built without the cache", built=True)
    assert model.info["cache"] == "miss" and model.lib_path is None
    model.save(str(tmp_path / "m.dtvm"))                       # the in-memory kernels are exported
    np.testing.assert_allclose(dt.load(str(tmp_path / "m.dtvm"))(X), WANT, rtol=1e-5, atol=1e-5)


def test_store_failure_leaves_no_entry(tmp_path, monkeypatch):
    """An export that fails half-way leaves no entry (and no temporary folder) behind."""
    from dyntvm.codegen import cache as cache_mod
    real = cache_mod.store

    def failing_store(cache_dir, key, executable, binding=None, tuned=None):
        class Broken:
            def export_library(self, path):
                with open(path, "wb") as f:
                    f.write(b"half")
                raise OSError("disk full")
        return real(cache_dir, key, Broken(), binding, tuned)
    monkeypatch.setattr(cache_mod, "store", failing_store)
    cache_dir = str(tmp_path / "cache")
    compile_and_check(cache_dir, "disk full", built=True)
    assert os.listdir(cache_dir) == []
    monkeypatch.undo()
    compile_and_check(cache_dir, None, built=True)              # a plain miss, no warning
    assert_sound(cache_dir)


class FakeExecutable:
    def __init__(self, data):
        self.data = data

    def export_library(self, path):
        with open(path, "wb") as f:
            f.write(self.data)


def test_store_is_one_rename(tmp_path):
    """Entries appear whole: a second store of a key keeps a sound entry and replaces a bad one."""
    from dyntvm.codegen import cache as c
    d = str(tmp_path)
    first = c.store(d, "k", FakeExecutable(b"A" * 10), "b1")
    assert c.lookup(d, "k", "b1") == first and first.size == 10
    assert c.store(d, "k", FakeExecutable(b"B" * 20), "b1") == first     # stored meanwhile: kept
    os.remove(os.path.join(d, "k", SIDECAR))
    second = c.store(d, "k", FakeExecutable(b"B" * 20), "b1")            # a bad entry is replaced
    assert second.size == 20 and c.lookup(d, "k", "b1") == second
    with pytest.warns(CacheWarning, match="was built for other regions"):
        assert c.lookup(d, "k", "b2") is None
    (tmp_path / "f").write_text("a file where an entry folder belongs")
    with pytest.warns(CacheWarning, match="kernels.so is missing or not a regular file"):
        assert c.lookup(d, "f") is None
    assert os.listdir(d) == []                                           # both removed, nothing left over


def test_entries_are_private(tmp_path):
    """The cache is one user's (test_cache_trust.py): entries are 0700 folders of 0600 files, whatever the umask."""
    from dyntvm.codegen import cache as c
    old = os.umask(0)
    try:
        entry_ = c.store(str(tmp_path / "cache"), "k", FakeExecutable(b"A" * 10), "b1")
    finally:
        os.umask(old)
    folder = os.path.dirname(entry_.path)
    assert [os.stat(p).st_mode & 0o777 for p in (os.path.dirname(folder), folder)] == [0o700, 0o700]
    assert {os.stat(os.path.join(folder, f)).st_mode & 0o777 for f in os.listdir(folder)} == {0o600}
    assert c.lookup(str(tmp_path / "cache"), "k", "b1") == entry_


def test_an_entry_that_cannot_be_removed_says_so(tmp_path, monkeypatch):
    from dyntvm.codegen import cache as c
    c.store(str(tmp_path), "k", FakeExecutable(b"A" * 10), "b1")
    monkeypatch.setattr(c.os, "rename", lambda *a: (_ for _ in ()).throw(PermissionError("no")))
    with pytest.warns(CacheWarning, match=r"it cannot be removed \(no permission\?\); rebuilding"):
        assert c.lookup(str(tmp_path), "k", "b2") is None


def test_each_switch_is_in_the_key(monkeypatch):
    """A switch kept for A/B (`cache.SWITCHES`) flipped in the process is a different key: a build with it is not
    served the library built with the committed value (review 39 found `FLAT_POSITIONS = False` a cache hit)."""
    import importlib

    from dyntvm.codegen import cache
    graph = dt.trace(model_fn, SPEC)
    base = cache.cache_key([("r", graph)], "llvm")
    keys = {base}
    for module, name in cache.SWITCHES:
        mod = importlib.import_module(f"dyntvm.codegen.{module}")
        value = getattr(mod, name)
        with monkeypatch.context() as m:
            m.setattr(mod, name, (not value) if isinstance(value, bool) else value + 1)
            keys.add(cache.cache_key([("r", graph)], "llvm"))
        assert cache.cache_key([("r", graph)], "llvm") == base, name      # restored: the key as before
    assert len(keys) == len(cache.SWITCHES) + 1
