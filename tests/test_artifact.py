"""Artifacts: save -> dt.load gives the same results; every broken artifact is a clear dt.ArtifactError."""
import json
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.runtime.artifact import _sha256


def tiny(x):
    """A compiled region (tanh, mul, add, sum) around a dynamic-shape node (boolean_mask)."""
    y = F.tanh(x) * 2.0 + 1.0
    kept = F.boolean_mask(y, F.sum(x, axis=1) > 0)
    return kept, F.sum(y, axis=0)


def region_free(x, mask):
    return F.nonzero(mask), F.boolean_mask(x, mask)


SIZES = (0, 1, 5, 33)


def tiny_inputs(n, seed=0):
    return (np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32),)


def free_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3)).astype(np.float32), rng.random(n) < 0.5


MODELS = {"tiny": (tiny, (dt.TensorSpec(("N", 8), name="x"),), tiny_inputs),
          "region_free": (region_free, (dt.TensorSpec(("N", 3), name="x"), dt.TensorSpec(("N",), "bool", "mask")),
                          free_inputs)}


def leaves(tree):
    from dyntvm.ir.tree import tree_flatten
    return [np.asarray(a) for a in tree_flatten(tree)[0]]


def assert_same(got, want, exact=False):
    got, want = leaves(got), leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """name -> (model, artifact folder, artifact tar); one TVM build for the whole module."""
    cache = str(tmp_path_factory.mktemp("cache"))
    out = {}
    for name, (fn, specs, _) in MODELS.items():
        model = dt.compile(fn, *specs, cache_dir=cache)
        folder = str(tmp_path_factory.mktemp("art") / f"{name}.dtvm")
        tar = folder[:-len(".dtvm")] + ".tar"
        model.save(folder)
        model.save(tar)
        out[name] = (model, folder, tar)
    return out


@pytest.fixture
def art(compiled, tmp_path):
    """A private copy of the tiny model's artifact folder, to break."""
    dst = str(tmp_path / "copy.dtvm")
    shutil.copytree(compiled["tiny"][1], dst)
    return dst


def rehash(folder, fn):
    """Make the manifest agree with an edited file, so only the later checks can catch the edit."""
    mpath = os.path.join(folder, "manifest.json")
    with open(mpath) as f:
        manifest = json.load(f)
    manifest["files"][fn] = _sha256(os.path.join(folder, fn))
    with open(mpath, "w") as f:
        json.dump(manifest, f)


def edit_manifest(folder, **changes):
    mpath = os.path.join(folder, "manifest.json")
    with open(mpath) as f:
        manifest = json.load(f)
    manifest.update(changes)
    with open(mpath, "w") as f:
        json.dump(manifest, f)


# ---------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("form", ["folder", "tar"])
def test_save_load_same_results(compiled, name, form, tmp_path):
    model, folder, tar = compiled[name]
    fn, _, make = MODELS[name]
    loaded = dt.load(folder if form == "folder" else tar)
    loaded.save(str(tmp_path / "again.tar"))                    # a loaded model saves again
    again = dt.load(str(tmp_path / "again.tar"))
    assert loaded.regions == model.regions and loaded.target == "cpu"
    assert ("kernels.so" in json.load(open(os.path.join(folder, "manifest.json")))["files"]) == bool(model.regions)
    for n in SIZES:
        inputs = make(n, seed=n)
        before = model(*inputs)
        assert_same(loaded(*inputs), before, exact=True)         # the same kernels: the same bits
        assert_same(again(*inputs), before, exact=True)
        assert_same(before, fn(*inputs))                         # and both match eager numpy


def test_tiny_has_a_region(compiled):
    model = compiled["tiny"][0]
    assert model.regions and any(n.op == "boolean_mask" for n in model.graph.walk())


def test_manifest_contents(compiled):
    model, folder, _ = compiled["tiny"]
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["format_version"] == 1 and manifest["target"] == "cpu"
    assert manifest["tvm"] and manifest["dyntvm"] == dt.__version__
    assert manifest["signature"]["inputs"] == [{"name": "x", "shape": ["N", 8], "dtype": "float32"}]
    assert set(manifest["files"]) == {"graph.json", "params.npz", "kernels.so"}
    assert manifest["regions"] == model.regions
    assert "compile_time_s" in manifest["info"]
    assert "compile_time_s" in dt.load(folder).info and dt.load(folder).info["loaded_from"] == folder


def test_read_checks_without_loading_kernels(compiled):
    from dyntvm.runtime.artifact import read
    manifest, graph = read(compiled["tiny"][2])
    assert manifest["target"] == "cpu"
    assert [n.attrs.name for n in graph.walk() if n.op == "region"] == compiled["tiny"][0].regions


LOAD_ONLY_RUNTIME = """
import sys, numpy as np, dyntvm as dt
model = dt.load(sys.argv[1])
x = np.ones((4, 8), np.float32)
kept, total = model(x)
assert kept.shape == (4, 8) and total.shape == (8,), (kept.shape, total.shape)
bad = sorted(m for m in sys.modules if m.split(".")[:2] in (["dyntvm", "frontend"], ["dyntvm", "partition"],
                                                             ["dyntvm", "codegen"], ["dyntvm", "pipeline"]))
print("imported:", bad)
sys.exit(1 if bad else 0)
"""


@pytest.mark.parametrize("form", ["folder", "tar"])
def test_load_imports_only_the_runtime(compiled, form):
    _, folder, tar = compiled["tiny"]
    r = subprocess.run([sys.executable, "-c", LOAD_ONLY_RUNTIME, folder if form == "folder" else tar],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "imported: []" in r.stdout


# ------------------------------------------------------------------------------------- bad artifacts
def test_missing_artifact(tmp_path):
    with pytest.raises(dt.ArtifactError, match=r"nope\.dtvm: no such artifact"):
        dt.load(str(tmp_path / "nope.dtvm"))


@pytest.mark.parametrize("fn, message", [("params.npz", r"params\.npz is missing"),
                                         ("kernels.so", r"kernels\.so is missing"),
                                         ("manifest.json", r"manifest\.json is missing \(not a dyntvm artifact\?\)")])
def test_missing_file(art, fn, message):
    os.remove(os.path.join(art, fn))
    with pytest.raises(dt.ArtifactError, match=message):
        dt.load(art)


def test_truncated_graph_json(art):
    path = os.path.join(art, "graph.json")
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text[:len(text) // 2])
    with pytest.raises(dt.ArtifactError, match=r"graph\.json does not match its sha256 in manifest\.json"):
        dt.load(art)
    rehash(art, "graph.json")                     # a consistent but truncated file: the parser catches it
    with pytest.raises(dt.ArtifactError, match=r"graph\.json is invalid: graph JSON does not parse"):
        dt.load(art)


def test_edited_graph_json(art):
    path = os.path.join(art, "graph.json")
    text = open(path).read()
    assert '"tanh"' in text
    with open(path, "w") as f:
        f.write(text.replace('"tanh"', '"sigmoid"'))
    with pytest.raises(dt.ArtifactError,
                       match=r"copy\.dtvm: graph\.json does not match its sha256 .*edited or corrupt"):
        dt.load(art)


def test_graph_json_with_unknown_op(art):
    path = os.path.join(art, "graph.json")
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text.replace('"boolean_mask"', '"no_such_op"'))
    rehash(art, "graph.json")
    with pytest.raises(dt.ArtifactError, match=r"graph\.json is invalid: .*no_such_op"):
        dt.load(art)


def test_edited_kernels(art):
    path = os.path.join(art, "kernels.so")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(dt.ArtifactError, match=r"kernels\.so does not match its sha256 in manifest\.json"):
        dt.load(art)


def test_garbage_kernels_with_matching_hash(art):
    with open(os.path.join(art, "kernels.so"), "wb") as f:
        f.write(b"not a shared library" * 10)
    rehash(art, "kernels.so")
    with pytest.raises(dt.ArtifactError, match=r"cannot load kernels\.so"):
        dt.load(art)


def test_pickled_params_refused(art):
    path = os.path.join(art, "params.npz")
    with np.load(path) as z:
        params = {k: z[k] for k in z.files}
    params["evil"] = np.array([{"a": 1}, None], dtype=object)   # stored with pickle
    np.savez(path, **params)
    rehash(art, "params.npz")                                   # only the pickle check is left
    with pytest.raises(dt.ArtifactError,
                       match=r"params\.npz is not a plain array archive .*pickled objects are refused"):
        dt.load(art)


def test_newer_format_version(art):
    edit_manifest(art, format_version=99)
    with pytest.raises(dt.ArtifactError, match=r"artifact format version 99 is newer than this dyntvm supports \(1\); "
                                               r"upgrade dyntvm"):
        dt.load(art)


def test_other_tvm_version(art):
    edit_manifest(art, tvm="0.1.0")
    with pytest.raises(dt.ArtifactError, match=r"built with tvm 0\.1\.0, but .* is installed; recompile"):
        dt.load(art)


def test_corrupt_manifest(art):
    with open(os.path.join(art, "manifest.json"), "w") as f:
        f.write('{"format_version": 1, "files": ')
    with pytest.raises(dt.ArtifactError, match=r"manifest\.json is corrupt"):
        dt.load(art)


def test_manifest_file_outside_artifact(art):
    edit_manifest(art, files={"../graph.json": "0" * 64})
    with pytest.raises(dt.ArtifactError, match=r"manifest lists a file outside the artifact: '\.\./graph\.json'"):
        dt.load(art)


def test_cuda_artifact_without_gpu(art):
    import tvm
    if tvm.cuda(0).exist:
        pytest.skip("this machine has a CUDA GPU")
    edit_manifest(art, target="cuda")          # file hashes stay correct: only the device check can refuse it
    with pytest.raises(dt.ArtifactError, match=r"this is a CUDA artifact but no CUDA GPU is available here; "
                                               r"compile with --target cpu"):
        dt.load(art)


def test_not_a_tar(tmp_path):
    path = tmp_path / "m.tar"
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(dt.ArtifactError, match=r"m\.tar: not a readable artifact tar"):
        dt.load(str(path))


def test_tar_with_path_outside(art, tmp_path):
    path = str(tmp_path / "evil.tar")
    with tarfile.open(path, "w") as tar:
        tar.add(os.path.join(art, "manifest.json"), arcname="manifest.json")
        tar.add(os.path.join(art, "graph.json"), arcname="../graph.json")
    with pytest.raises(dt.ArtifactError, match=r"unexpected member '\.\./graph\.json' in artifact tar"):
        dt.load(path)
