"""Artifacts: save -> dt.load gives the same results; every broken artifact is a clear dt.ArtifactError."""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.runtime.artifact import _sha256, kernel_binding


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
    """Make the manifest agree with an edited file (sha256 and size), so only the later checks can catch
    the edit."""
    mpath = os.path.join(folder, "manifest.json")
    with open(mpath) as f:
        manifest = json.load(f)
    manifest["files"][fn] = _sha256(os.path.join(folder, fn))
    if "sizes" in manifest:
        manifest["sizes"][fn] = os.path.getsize(os.path.join(folder, fn))
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
    assert manifest["format_version"] == 3 and manifest["target"] == "cpu"
    assert manifest["tvm"] and manifest["dyntvm"] == dt.__version__
    assert manifest["signature"]["inputs"] == [{"name": "x", "shape": ["N", 8], "dtype": "float32"}]
    assert set(manifest["files"]) == {"graph.json", "params.npz", "kernels.so"}
    assert manifest["sizes"] == {fn: os.path.getsize(os.path.join(folder, fn)) for fn in manifest["files"]}
    assert manifest["binding"] == kernel_binding(model.graph)
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
    with pytest.raises(dt.ArtifactError, match=r"graph\.json has \d+ bytes, manifest\.json says \d+ \(truncated"):
        dt.load(art)
    rehash(art, "graph.json")                     # a consistent but truncated file: the parser catches it
    with pytest.raises(dt.ArtifactError, match=r"graph\.json is invalid: graph JSON does not parse"):
        dt.load(art)


def test_edited_graph_json(art):
    path = os.path.join(art, "graph.json")
    text = open(path).read()
    assert '"tanh"' in text
    with open(path, "w") as f:
        f.write(text.replace('"tanh"', '"relu"'))                # same size: the sha256 tells
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
    with pytest.raises(dt.ArtifactError, match=r"kernels\.so is not a loadable shared library: no ELF header"):
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
    with pytest.raises(dt.ArtifactError, match=r"artifact format version 99 is newer than this dyntvm supports \(3\); "
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
    with pytest.raises(dt.ArtifactError, match=r"this is a CUDA artifact but no CUDA GPU is available here"
                                               r"( \(TVM's CUDA runtime cannot load: .*\))?; compile with --target cpu"):
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
    with pytest.raises(dt.ArtifactError, match=r"unexpected member '\.\./graph\.json' \(file\) in artifact tar"):
        dt.load(path)


# ------------------------------------------------------------------ kernels.so bound to graph + params
def tiny_other_weights(x):
    """`tiny` with another constant: the same regions, names and types, other weights."""
    y = F.tanh(x) * 3.0 + 1.0
    kept = F.boolean_mask(y, F.sum(x, axis=1) > 0)
    return kept, F.sum(y, axis=0)


@pytest.fixture(scope="module")
def other_art(compiled, tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("cache_other"))
    model = dt.compile(dt.trace(tiny_other_weights, *MODELS["tiny"][1], name="tiny"), cache_dir=cache)
    assert model.regions == compiled["tiny"][0].regions          # same region names
    folder = str(tmp_path_factory.mktemp("other") / "other.dtvm")
    model.save(folder)
    return folder


def test_other_models_kernels_are_refused(art, other_art):
    shutil.copyfile(os.path.join(other_art, "kernels.so"), os.path.join(art, "kernels.so"))
    rehash(art, "kernels.so")                      # hashes re-fixed: only the binding can tell
    with pytest.raises(dt.ArtifactError, match=r"copy\.dtvm: kernels\.so was not built for this graph\.json \+ "
                                               r"params\.npz \+ manifest\.json \(its binding differs"):
        dt.load(art)


def test_edited_region_weights_are_refused(art):
    """A region constant changed in params.npz (rehashed): the manifest's binding, then the library's."""
    path = os.path.join(art, "params.npz")
    with np.load(path) as z:
        params = {k: z[k] for k in z.files}
    twos = [k for k, v in params.items() if v.shape == () and v == 2.0]
    assert twos
    params[twos[0]] = np.array(5.0, params[twos[0]].dtype)
    np.savez(path, **params)
    rehash(art, "params.npz")
    with pytest.raises(dt.ArtifactError, match=r"kernels\.so was built for another graph or other weights than "
                                               r"graph\.json"):
        dt.load(art)
    with open(os.path.join(art, "graph.json")) as f:
        from dyntvm.ir.serialize import graph_from_json
        graph = graph_from_json(f.read(), params)
    edit_manifest(art, binding=kernel_binding(graph))       # the manifest re-fixed too: the library refuses
    with pytest.raises(dt.ArtifactError, match=r"kernels\.so was not built for this graph\.json \+ params\.npz"):
        dt.load(art)


def test_edited_weights_outside_regions_are_refused(tmp_path):
    """Found by the hostile review: a constant used only by a dynamic-shape node (a boolean_mask's mask) was
    not covered by the binding, so an edited params.npz (rehashed) loaded and computed something else."""
    w, mask = np.eye(4, dtype=np.float32), np.array([1, 0, 1, 0], bool)
    model = dt.compile(lambda x: F.boolean_mask(F.matmul(w, x), mask) * 2.0, dt.TensorSpec((4, "N")))
    art = str(tmp_path / "m.dtvm")
    model.save(art)
    path = os.path.join(art, "params.npz")
    with np.load(path) as z:
        params = {k: z[k] for k in z.files}
    key = next(k for k, v in params.items() if v.dtype == bool)
    params[key] = ~params[key]
    np.savez(path, **params)
    rehash(art, "params.npz")
    with pytest.raises(dt.ArtifactError, match=r"kernels\.so was built for another graph or other weights"):
        dt.load(art)


def test_library_without_binding_is_refused(compiled, art):
    from dyntvm.codegen.build import build_executable, collect_regions
    ex = build_executable(collect_regions(compiled["tiny"][0].graph), "cpu")      # no binding function
    ex.export_library(os.path.join(art, "kernels.so"))
    rehash(art, "kernels.so")
    with pytest.raises(dt.ArtifactError, match=r"kernels\.so was not built for this graph\.json \+ params\.npz "
                                               r"\+ manifest\.json "
                                               r"\(it carries no binding"):
        dt.load(art)


def test_library_binding_matches(compiled):
    from dyntvm.codegen.build import BINDING_FUNCTION as codegen_name
    from dyntvm.runtime.artifact import BINDING_FUNCTION as runtime_name
    from dyntvm.runtime.load import library_binding
    assert codegen_name == runtime_name
    from dyntvm.native import execution_binding, execution_facts
    model = compiled["tiny"][0]
    want = execution_binding(kernel_binding(model.graph), execution_facts("cpu", model.info))
    assert library_binding(model.vm) == want
    assert library_binding(dt.load(compiled["tiny"][2]).vm) == want


def _edit_info(info: dict, path: str, value):
    """Set (value not None) or delete the dotted `path` in manifest info."""
    *outer, last = path.split(".")
    for k in outer:
        info = info.setdefault(k, {})
    if value is None:
        del info[last]
    else:
        info[last] = value(info.get(last)) if callable(value) else value


BOUND = r"kernels\.so was not built for this graph\.json \+ params\.npz \+ manifest\.json \(its binding differs"


@pytest.mark.parametrize("field, value, message", [
    ("cpu_features", lambda old: old[:-1], BOUND),                 # the CPU check would miss a feature
    ("cpu_features", lambda old: [], BOUND),
    ("cpu_features", None, r"info\.cpu_features \(the CPU features its kernels use\) must be a list"),
    ("cpu_features", "avx2", r"info\.cpu_features \(the CPU features its kernels use\) must be a list"),
    ("built_for", "llvm -mcpu=x86-64", BOUND),
    ("tuning.specialized", {"tiny_r0": [[{"N": 3}, "tiny_r0"]]}, BOUND),   # calls would be routed elsewhere
    ("cuda_arch", "sm_80", BOUND),
])
def test_manifest_execution_fields_are_bound(compiled, art, field, value, message):
    """Found by the hostile review (issue 21): manifest.json's info fields that decide how the kernels run
    were covered by no digest. Each edit is refused; the library's binding covers them."""
    assert compiled["tiny"][0].info["cpu_features"]            # this CPU has some: dropping one is an edit
    with open(os.path.join(art, "manifest.json")) as f:
        manifest = json.load(f)
    _edit_info(manifest["info"], field, value)
    with open(os.path.join(art, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(dt.ArtifactError, match=message):
        dt.load(art)


def test_cpu_features_include_scalar_isa_extensions(compiled):
    """Found by the hostile review: LLVM emits BMI1 / BMI2 for -mcpu=<this CPU> (every kernel library built
    here uses them), but only vector features were recorded, so dt.load let a CPU without them run the kernels.
    What is recorded is what LLVM enables for the target and this CPU has (feature names, never a CPU model)."""
    import tvm.target.codegen

    from dyntvm.codegen.build import concrete_target
    from dyntvm.native import ISA_FEATURES, cpu_features
    recorded = set(compiled["tiny"][0].info["cpu_features"])
    llvm = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(concrete_target("cpu"))}
    assert recorded == {f for f in cpu_features() if ISA_FEATURES[f] in llvm}
    assert {"bmi1", "bmi2"} & cpu_features() <= recorded


def test_a_cpu_without_bmi2_is_refused(tmp_path, monkeypatch):
    from dyntvm import native
    from dyntvm.runtime.devices import check_cpu_features
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    (tmp_path / "cpuinfo").write_text("flags\t: " + " ".join(f for f in flags if f != "bmi2") + "\n")
    monkeypatch.setattr(native, "CPUINFO", str(tmp_path / "cpuinfo"))
    with pytest.raises(dt.ArtifactError, match=r"its kernels use CPU instructions this CPU lacks \(bmi2\)"):
        check_cpu_features(["avx2", "bmi1", "bmi2"], "m.dtvm")


def test_manifest_informative_fields_are_free(art):
    """Fields that change nothing at run time (compile time, cache hit or miss) may differ."""
    with open(os.path.join(art, "manifest.json")) as f:
        manifest = json.load(f)
    manifest["info"].update(compile_time_s=123.0, cache="hit")
    with open(os.path.join(art, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    assert dt.load(art).info["compile_time_s"] == 123.0


@pytest.mark.parametrize("field, value, message", [
    ("signature", {"inputs": [{"name": "x", "shape": ["N", 9], "dtype": "float32"}], "outputs": []},
     r"manifest\.json's signature does not match graph\.json"),
    ("regions", ["evil_r0"], r"manifest\.json's regions \['evil_r0'\] are not graph\.json's"),
    ("binding", "0" * 64, r"kernels\.so was built for another graph"),
])
def test_manifest_must_describe_graph_json(art, field, value, message):
    from dyntvm.runtime.artifact import read
    edit_manifest(art, **{field: value})
    with pytest.raises(dt.ArtifactError, match=message):
        read(art)                                  # what `dyntvm inspect` shows is checked too
    with pytest.raises(dt.ArtifactError, match=message):
        dt.load(art)


# ----------------------------------------------------------------------- malformed manifests and files
@pytest.mark.parametrize("files", [{"..": "0" * 64}, {".": "0" * 64}, {"": "0" * 64}, {"kernels.so/": "0" * 64},
                                   {"manifest.json": "0" * 64}, {"/etc/passwd": "0" * 64}])
def test_manifest_files_outside_the_artifact(art, files):
    edit_manifest(art, files=files, sizes={k: 1 for k in files})
    with pytest.raises(dt.ArtifactError, match=r"manifest lists a file outside the artifact"):
        dt.load(art)


@pytest.mark.parametrize("changes, message", [
    ({"format_version": -5}, r"format_version must be a positive integer, got -5"),
    ({"format_version": True}, r"format_version must be a positive integer, got True"),
    ({"format_version": 0}, r"format_version must be a positive integer"),
    ({"format_version": 1.5}, r"format_version must be a positive integer"),
    ({"format_version": "2"}, r"format_version must be a positive integer, got '2'"),
    ({"format_version": 1}, r"artifact format version 1 is older than this dyntvm reads \(3\); recompile"),
    ({"target": "tpu"}, r"target must be \"cpu\" or \"cuda\", got 'tpu'"),
    ({"target": ["cpu"]}, r"target must be \"cpu\" or \"cuda\", got \['cpu'\]"),
    ({"target": {}}, r"target must be \"cpu\" or \"cuda\", got \{\}"),
    ({"files": ["graph.json"]}, r"files and sizes must be JSON objects"),
    ({"sizes": {"graph.json": 1}}, r"the size of params\.npz is not a byte count"),
    ({"binding": None}, r"binding \(the digest kernels\.so was built for\) is missing"),
    ({"info": [1]}, r"info must be a JSON object"),
])
def test_bad_manifest_fields(art, changes, message):
    edit_manifest(art, **changes)
    with pytest.raises(dt.ArtifactError, match=message):
        dt.load(art)


@pytest.mark.parametrize("text", ["[" * 100000 + "]" * 100000, '{"a":' * 100000 + "1" + "}" * 100000, "[]",
                                  "\xff\xfe", ""])
def test_unparseable_manifest(art, text):
    with open(os.path.join(art, "manifest.json"), "w", encoding="latin-1") as f:
        f.write(text)
    with pytest.raises(dt.ArtifactError, match=r"copy\.dtvm: manifest\.json is corrupt"):
        dt.load(art)


@pytest.mark.parametrize("keep", [0, 0.5, 0.99])
def test_truncated_params_with_matching_hash(art, keep):
    path = os.path.join(art, "params.npz")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:int(len(data) * keep)])
    with pytest.raises(dt.ArtifactError, match=r"params\.npz has \d+ bytes, manifest\.json says"):
        dt.load(art)
    rehash(art, "params.npz")
    with pytest.raises(dt.ArtifactError, match=r"copy\.dtvm: params\.npz is corrupt"):
        dt.load(art)


TRUNCATED_LIBRARY = """
import sys, dyntvm as dt
try:
    dt.load(sys.argv[1])
except dt.ArtifactError as e:
    print("ArtifactError:", e)
"""


def test_truncated_kernels_with_matching_hash_is_refused_before_dlopen(art):
    """Mapping a truncated shared object ends the process with SIGBUS: the ELF check must come first."""
    path = os.path.join(art, "kernels.so")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    rehash(art, "kernels.so")
    r = subprocess.run([sys.executable, "-c", TRUNCATED_LIBRARY, art], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "ArtifactError: " in r.stdout and "kernels.so is not a loadable shared library" in r.stdout, r.stdout


# ------------------------------------------------------------------------------------------ tar files
@pytest.fixture
def tmpdir_for_loads(tmp_path, monkeypatch):
    """Temporary folders of `dt.load` go here, so a test can see what is left behind."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def make_tar(path, art, members, mode="w", first=(), skip=()):
    """A tar with `first` (name, TarInfo-or-bytes) members, then the artifact's files (but those named in
    `first` or `skip`), then `members`."""
    with tarfile.open(path, mode) as tar:
        def add(name, what):
            if isinstance(what, tarfile.TarInfo):
                what.name = name
                tar.addfile(what)
            else:
                info = tarfile.TarInfo(name)
                info.size = len(what)
                tar.addfile(info, io.BytesIO(what))
        for name, what in first:
            add(name, what)
        for fn in ("manifest.json", "graph.json", "params.npz", "kernels.so"):
            if fn not in skip and fn not in dict(first):
                add(fn, open(os.path.join(art, fn), "rb").read())
        for name, what in members:
            add(name, what)
    return str(path)


def special(kind, target="graph.json"):
    info = tarfile.TarInfo()
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize("name, member, message", [
    ("graph.json", special(tarfile.SYMTYPE, "/etc/passwd"), r"unexpected member 'graph\.json' \(symlink\)"),
    ("kernels.so", special(tarfile.LNKTYPE, "params.npz"), r"unexpected member 'kernels\.so' \(hard link\)"),
    ("kernels.so", special(tarfile.CHRTYPE), r"unexpected member 'kernels\.so' \(device\)"),
    ("params.npz", special(tarfile.FIFOTYPE), r"unexpected member 'params\.npz' \(fifo\)"),
    ("params.npz", special(tarfile.DIRTYPE), r"unexpected member 'params\.npz' \(folder\)"),
    ("/tmp/evil.txt", b"x", r"unexpected member '/tmp/evil\.txt' \(file\)"),
    ("./graph.json", b"x", r"unexpected member '\./graph\.json'"),
    ("sub/params.npz", b"x", r"unexpected member 'sub/params\.npz'"),
    ("notes.txt", b"hello", r"unexpected member 'notes\.txt'"),
    ("manifest.json", b"{}", r"member 'manifest\.json' appears twice"),
])
def test_tar_members_refused(art, tmp_path, tmpdir_for_loads, name, member, message):
    path = make_tar(tmp_path / "evil.tar", art, [(name, member)])
    for reader in (dt.load, artifact_read):
        with pytest.raises(dt.ArtifactError, match=message):
            reader(path)
        assert os.listdir(tmpdir_for_loads) == []                  # nothing extracted, nothing left


def artifact_read(path):
    from dyntvm.runtime.artifact import read
    return read(path)


def test_tar_member_size_must_match_manifest(art, tmp_path, tmpdir_for_loads):
    path = make_tar(tmp_path / "m.tar", art, [("graph.json", b"{}")], skip=("graph.json",))
    with pytest.raises(dt.ArtifactError, match=r"graph\.json has 2 bytes, manifest\.json says \d+"):
        dt.load(path)
    path = make_tar(tmp_path / "n.tar", art, [], first=[("graph.json", b"{}")])       # before the manifest
    with pytest.raises(dt.ArtifactError, match=r"graph\.json has 2 bytes, manifest\.json says \d+"):
        dt.load(path)
    assert os.listdir(tmpdir_for_loads) == []


def test_rejected_tars_leave_no_temporary_folder(compiled, art, tmp_path, tmpdir_for_loads):
    tar = compiled["tiny"][2]
    data = open(tar, "rb").read()
    gz = str(tmp_path / "m.tar.gz")
    make_tar(gz, art, [], mode="w:gz")
    gz_data = open(gz, "rb").read()
    cases = {"garbage.tar": b"garbage" * 100, "empty.tar": b"", "truncated.tar": data[:len(data) // 2],
             "truncated_gz.tar": gz_data[:len(gz_data) // 2], "bad_gz.tar": gz_data[:20] + b"\0" * 200}
    text = open(os.path.join(art, "graph.json")).read()
    with open(os.path.join(art, "graph.json"), "w") as f:
        f.write(text.replace('"tanh"', '"tanX"'))               # a hash mismatch found after extracting
    cases["edited.tar"] = open(make_tar(tmp_path / "edited.tar", art, []), "rb").read()
    for name, blob in cases.items():
        path = tmp_path / name
        path.write_bytes(blob)
        for reader in (dt.load, artifact_read):
            with pytest.raises(dt.ArtifactError) as info:
                reader(str(path))
            assert str(path) in str(info.value)
            assert os.listdir(tmpdir_for_loads) == [], (name, os.listdir(tmpdir_for_loads))
    with pytest.raises(dt.ArtifactError, match=r"truncated_gz\.tar: not a readable artifact tar: EOFError"):
        dt.load(str(tmp_path / "truncated_gz.tar"))
    assert dt.load(gz).regions                                   # the whole gzip tar loads
    assert os.listdir(tmpdir_for_loads) == []


class Zeros(io.RawIOBase):
    """`n` zero bytes, read without holding them in memory."""

    def __init__(self, n):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


BIG = 300 << 20


@pytest.fixture(scope="module")
def bomb_tars(compiled, tmp_path_factory):
    """gzip tars with a 300 MB member of zeros (about 300 KB compressed): unlisted after the manifest,
    unknown before it, and listed but with another size than the manifest's."""
    art = compiled["tiny"][1]
    d = tmp_path_factory.mktemp("bombs")
    out = {}
    for case in ("unlisted", "before_manifest", "wrong_size"):
        path = str(d / f"{case}.tar")
        with tarfile.open(path, "w:gz", compresslevel=1) as tar:
            def add_big(name):
                info = tarfile.TarInfo(name)
                info.size = BIG
                tar.addfile(info, io.BufferedReader(Zeros(BIG), 1 << 20))
            if case == "before_manifest":
                add_big("zeros.bin")
            for fn in ("manifest.json", "graph.json", "params.npz", "kernels.so"):
                if case == "wrong_size" and fn == "params.npz":
                    add_big(fn)
                else:
                    tar.add(os.path.join(art, fn), arcname=fn)
            if case == "unlisted":
                add_big("zeros.bin")
        assert os.path.getsize(path) < 5 << 20
        out[case] = path
    return out


def written_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts written bytes with /proc/self/io")
@pytest.mark.parametrize("case, message", [("unlisted", r"unexpected member 'zeros\.bin'"),
                                           ("before_manifest", r"unexpected member 'zeros\.bin'"),
                                           ("wrong_size", rf"params\.npz has {BIG} bytes, manifest\.json says")])
def test_tar_bomb_is_refused_before_extracting(bomb_tars, tmpdir_for_loads, case, message):
    for reader in (dt.load, artifact_read):                    # dt.load and `dyntvm inspect`
        before = written_bytes()
        with pytest.raises(dt.ArtifactError, match=message):
            reader(bomb_tars[case])
        assert written_bytes() - before < (16 << 20)           # nowhere near the 300 MB member
        assert os.listdir(tmpdir_for_loads) == []


def test_artifact_size_cap(art, monkeypatch):
    monkeypatch.setenv("DYNTVM_MAX_ARTIFACT_BYTES", "1000")
    with pytest.raises(dt.ArtifactError, match=r"the artifact's files hold \d+ bytes, more than the 1000 accepted "
                                               r"\(set DYNTVM_MAX_ARTIFACT_BYTES"):
        dt.load(art)


# ------------------------------------------------------------------ saving never destroys user data
def folder_state(path):
    return {f: open(os.path.join(path, f), "rb").read() for f in sorted(os.listdir(path))}


@pytest.mark.parametrize("existing", [
    {"graph.json": b"my graph", "params.npz": b"my params", "manifest.json": b"my manifest",
     "kernels.so": b"my kernels"},
    {"notes.txt": b"my notes"},
    {"manifest.json": b'{"format_version": 2, "files": {}}', "notes.txt": b"an artifact plus a user file"},
])
def test_save_refuses_a_folder_that_is_not_an_artifact(compiled, tmp_path, existing):
    model = compiled["tiny"][0]
    out = tmp_path / "out"
    out.mkdir()
    for fn, data in existing.items():
        (out / fn).write_bytes(data)
    with pytest.raises(dt.ArtifactError, match=r"out: refusing to overwrite: the folder is neither empty nor a "
                                               r"dyntvm artifact \(it holds "):
        model.save(str(out))
    assert folder_state(out) == existing
    assert os.listdir(tmp_path) == ["out"]                     # no staging folder left


def test_save_refuses_files(compiled, tmp_path):
    model = compiled["tiny"][0]
    f = tmp_path / "model"
    f.write_bytes(b"user data")
    with pytest.raises(dt.ArtifactError, match=r"model: refusing to overwrite: it exists and is not a folder"):
        model.save(str(f))
    t = tmp_path / "backup.tar"
    with tarfile.open(t, "w") as tar:
        tar.add(__file__, arcname="test_artifact.py")
    before = t.read_bytes()
    with pytest.raises(dt.ArtifactError, match=r"backup\.tar: refusing to overwrite: it exists and is not a dyntvm "
                                               r"artifact tar"):
        model.save(str(t))
    d = tmp_path / "dir.tar"
    d.mkdir()
    with pytest.raises(dt.ArtifactError, match=r"dir\.tar: refusing to write a \.tar artifact over a folder"):
        model.save(str(d))
    assert f.read_bytes() == b"user data" and t.read_bytes() == before and os.listdir(d) == []
    assert sorted(os.listdir(tmp_path)) == ["backup.tar", "dir.tar", "model"]


def test_save_refuses_bad_paths_before_writing(compiled, tmp_path):
    """Found by the hostile review: raw FileExistsError / FileNotFoundError / TypeError."""
    model = compiled["tiny"][0]
    (tmp_path / "userfile").write_bytes(b"user data")
    for path, message in ((str(tmp_path / "userfile" / "sub"), r"sub: cannot write an artifact there: .*userfile is "
                                                               r"not a folder"),
                          (str(tmp_path / "userfile" / "a" / "b.tar"), r"userfile is not a folder"),
                          ("", r"an artifact path must be a non-empty string, got ''"),
                          (None, r"an artifact path must be a string or path-like, got NoneType")):
        with pytest.raises(dt.ArtifactError, match=message):
            model.save(path)
    assert sorted(os.listdir(tmp_path)) == ["userfile"]



def test_save_over_an_artifact_replaces_it(compiled, tmp_path):
    tiny, free = compiled["tiny"][0], compiled["region_free"][0]
    for out in (tmp_path / "m.dtvm", tmp_path / "m.tar"):
        tiny.save(str(out))
        free.save(str(out))                                    # an artifact is replaced
        assert dt.load(str(out)).regions == []
        tiny.save(str(out))
        assert dt.load(str(out)).regions == tiny.regions
    empty = tmp_path / "empty"
    empty.mkdir()
    tiny.save(str(empty))                                      # an empty folder is fine
    assert dt.load(str(empty)).regions == tiny.regions
    assert sorted(os.listdir(tmp_path)) == ["empty", "m.dtvm", "m.tar"]


def test_failed_save_keeps_the_old_artifact(compiled, tmp_path, monkeypatch):
    tiny, free = compiled["tiny"][0], compiled["region_free"][0]
    for out in (tmp_path / "m.dtvm", tmp_path / "m.tar"):
        tiny.save(str(out))
        before = folder_state(out) if out.is_dir() else out.read_bytes()

        def boom(*a, **k):
            raise OSError("disk full")
        with monkeypatch.context() as m:
            m.setattr(np, "savez", boom)
            with pytest.raises(dt.ArtifactError, match=f"cannot write the artifact in {tmp_path}: disk full"):
                free.save(str(out))
        assert (folder_state(out) if out.is_dir() else out.read_bytes()) == before
    assert sorted(os.listdir(tmp_path)) == ["m.dtvm", "m.tar"]


def test_save_writes_the_library_compiled_not_the_cache_file(tmp_path):
    """save writes the library bytes the model was compiled with: neither a cache file changed on disk after
    compiling, nor a cleared compile cache (found by the hostile review: a raw FileNotFoundError) matter."""
    cache = tmp_path / "cache"
    model = dt.compile(tiny, *MODELS["tiny"][1], cache_dir=str(cache))
    data = bytearray(open(model.lib_path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(model.lib_path + ".new", "wb") as f:             # a new file: the mapped one stays intact
        f.write(data)
    os.replace(model.lib_path + ".new", model.lib_path)
    model.save(str(tmp_path / "m.dtvm"))
    shutil.rmtree(cache)
    model.save(str(tmp_path / "m2.tar"))
    x = tiny_inputs(5)[0]
    for art in ("m.dtvm", "m2.tar"):
        for got, want in zip(dt.load(str(tmp_path / art))(x), model(x)):
            np.testing.assert_array_equal(got, want)


def test_saved_again_in_place_loads_the_new_kernels(tmp_path):
    """Saving another model over an artifact that this process has loaded, then loading it again, runs the
    new kernels (dlopen of the same path would hand back the library loaded before)."""
    spec = dt.TensorSpec(("N", 4))
    cache = str(tmp_path / "cache")
    first = dt.compile(dt.trace(lambda x: F.tanh(x) * 2.0, spec, name="m"), cache_dir=cache)
    second = dt.compile(dt.trace(lambda x: F.tanh(x) * 3.0, spec, name="m"), cache_dir=cache)
    out = str(tmp_path / "m.dtvm")
    x = np.ones((2, 4), np.float32)
    first.save(out)
    loaded_first = dt.load(out)
    second.save(out)
    np.testing.assert_allclose(dt.load(out)(x), np.tanh(x) * 3, rtol=1e-6)
    np.testing.assert_allclose(loaded_first(x), np.tanh(x) * 2, rtol=1e-6)
