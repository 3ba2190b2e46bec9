"""Deployment with TVM's runtime only: `dt.load` and `dyntvm run` where TVM's compiler cannot load.

Two real conditions, each checked inside the subprocess (not just assumed): `TVM_USE_RUNTIME_LIB=1` with
the full install, and the `dyntvm bundle` folder run by a `python -S` that sees no site-packages (so no
full TVM at all: the bundle has no `libtvm_compiler.so`). In both, `libtvm_compiler.so` is not mapped
into the process and `import tvm.relax` fails, while the loaded artifact computes the eager results.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F


def model_fn(x):
    y = F.tanh(x) * 2.0 + 1.0
    kept = F.boolean_mask(y, F.sum(x, axis=1) > 0)
    return kept, F.exp(F.sum(y, axis=0) * 0.01)


SIZES = (0, 1, 5, 33)

CHECK = r"""
import os, sys, numpy as np
import dyntvm as dt
model = dt.load(sys.argv[1])
folder = sys.argv[2]
for n in {sizes}:
    x = np.load(os.path.join(folder, f"x{{n}}.npy"))
    for k, got in enumerate(model(x)):
        want = np.load(os.path.join(folder, f"want{{n}}_{{k}}.npy"))
        assert got.shape == want.shape and got.dtype == want.dtype, (n, k, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
maps = open("/proc/self/maps").read()
assert "libtvm_runtime" in maps, "TVM's runtime is not loaded?"
assert "libtvm_compiler" not in maps, "TVM's compiler library is loaded"
try:
    import tvm.relax
except (ImportError, AttributeError):
    pass
else:
    raise AssertionError("tvm.relax imported: the compiler is available")
print("runtime-only ok", sorted(m for m in sys.modules if m.startswith("dyntvm.")))
""".format(sizes=SIZES)


@pytest.fixture(scope="module")
def deploy(tmp_path_factory):
    """An artifact (folder and .tar), inputs and eager results, and a runtime-only bundle."""
    root = tmp_path_factory.mktemp("deploy")
    model = dt.compile(model_fn, dt.TensorSpec(("N", 8)))
    model.save(str(root / "m.dtvm"))
    model.save(str(root / "m.tar"))
    for n in SIZES:
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        np.save(root / f"x{n}.npy", x)
        for k, w in enumerate(model_fn(x)):
            np.save(root / f"want{n}_{k}.npy", w)
    r = subprocess.run([sys.executable, "-m", "dyntvm", "bundle", "-o", str(root / "rt.tar.gz")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    bundle = root / "rt"
    bundle.mkdir()
    subprocess.run(["tar", "xzf", str(root / "rt.tar.gz"), "-C", str(bundle)], check=True)
    # numpy alone next to the bundle: what a deployment machine brings itself (`pip install numpy`)
    deps = root / "numpy-only"
    deps.mkdir()
    site = os.path.dirname(os.path.dirname(np.__file__))
    for name in ("numpy", "numpy.libs"):
        if os.path.exists(os.path.join(site, name)):
            os.symlink(os.path.join(site, name), deps / name)
    return {"root": str(root), "bundle": str(bundle), "deps": str(deps), "tar_size": os.path.getsize(root / "rt.tar.gz")}


def _bundle_env(deploy):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM_"))}
    env["PYTHONPATH"] = deploy["bundle"] + os.pathsep + deploy["deps"]
    return env


def _runtime_lib_env():
    return {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}


@pytest.mark.parametrize("form", ["m.dtvm", "m.tar"])
@pytest.mark.parametrize("how", ["TVM_USE_RUNTIME_LIB", "bundle"])
def test_load_runs_with_the_tvm_runtime_only(deploy, how, form):
    art = os.path.join(deploy["root"], form)
    if how == "bundle":            # -S: no site-packages, so the full TVM of this venv is out of reach
        cmd, env = [sys.executable, "-S", "-c", CHECK, art, deploy["root"]], _bundle_env(deploy)
    else:
        cmd, env = [sys.executable, "-c", CHECK, art, deploy["root"]], _runtime_lib_env()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=deploy["root"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "runtime-only ok" in r.stdout
    if how == "bundle":
        assert "dyntvm.frontend" not in r.stdout and "dyntvm.codegen" not in r.stdout


@pytest.mark.parametrize("how", ["TVM_USE_RUNTIME_LIB", "bundle"])
def test_dyntvm_run_with_the_tvm_runtime_only(deploy, how, tmp_path):
    python = [sys.executable, "-S"] if how == "bundle" else [sys.executable]
    env = _bundle_env(deploy) if how == "bundle" else _runtime_lib_env()
    art = os.path.join(deploy["root"], "m.dtvm")
    r = subprocess.run(python + ["-m", "dyntvm", "run", art, "--input", f"x={deploy['root']}/x5.npy", "--repeat", "2",
                                 "--output", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env,
                       cwd=deploy["root"])      # not the repo: its dyntvm/ folder would shadow the bundle
    assert r.returncode == 0, r.stdout + r.stderr
    for k in range(2):
        np.testing.assert_allclose(np.load(tmp_path / f"output_{k}.npy"),
                                   np.load(os.path.join(deploy["root"], f"want5_{k}.npy")), rtol=1e-5, atol=1e-6)


def test_the_bundle_has_no_compiler_and_is_small(deploy):
    files = {os.path.relpath(os.path.join(d, f), deploy["bundle"]) for d, _, fs in os.walk(deploy["bundle"])
             for f in fs}
    assert "tvm/lib/libtvm_runtime.so" in files and "tvm/lib/libtvm_runtime_cuda.so" in files
    assert not any("libtvm_compiler" in f for f in files)
    assert not any(f.startswith(("dyntvm/frontend", "dyntvm/codegen", "dyntvm/partition")) for f in files)
    assert deploy["tar_size"] < 15e6                # ~6 MB today; the full TVM wheel is ~100 MB


def test_compiling_without_the_compiler_is_a_clear_error(deploy, tmp_path):
    r = subprocess.run([sys.executable, "-S", "-m", "dyntvm", "compile", "--example", "lstm", "-o",
                        str(tmp_path / "x")], capture_output=True, text=True, timeout=300, env=_bundle_env(deploy),
                       cwd=deploy["root"])
    assert r.returncode == 1
    assert "runtime-only dyntvm" in r.stderr and "dyntvm run" in r.stderr, r.stderr
    code = "import dyntvm as dt, numpy as np\nfrom dyntvm import F\n" \
           "dt.compile(lambda x: F.tanh(x), dt.TensorSpec(('N',)), use_cache=False)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=_runtime_lib_env())
    assert r.returncode == 1
    assert "CompileError: compile: TVM's compiler is not available" in r.stderr, r.stderr


CUDA_LOAD = r"""
import sys, dyntvm as dt
try:
    dt.load(sys.argv[1])
except dt.ArtifactError as e:
    print("ArtifactError:", e)
print("cuda runtime loaded:", "libtvm_runtime_cuda" in open("/proc/self/maps").read())
print("compiler loaded:", "libtvm_compiler" in open("/proc/self/maps").read())
"""


def test_a_runtime_only_load_of_a_cuda_artifact_loads_tvms_cuda_runtime(deploy, tmp_path):
    """A runtime-only TVM loads no device backend by itself: `dt.load` of a CUDA artifact loads TVM's CUDA
    runtime (here, without a driver, through the build's stub libcuda.so.1: it then finds no GPU and says so)."""
    from dyntvm.codegen.backends.cuda import gpu
    if gpu.gpu_present():
        pytest.skip("on a GPU host test_cuda.py runs CUDA artifacts for real")
    try:
        gpu.find_nvcc()
    except dt.CompileError:
        pytest.skip("CUDA builds need nvcc")
    dt.compile(model_fn, dt.TensorSpec(("N", 8)), target="cuda").save(str(tmp_path / "c.dtvm"))
    env = _bundle_env(deploy)
    env["LD_LIBRARY_PATH"] = gpu.stub_dir()
    r = subprocess.run([sys.executable, "-S", "-c", CUDA_LOAD, str(tmp_path / "c.dtvm")], capture_output=True,
                       text=True, timeout=300, env=env, cwd=deploy["root"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "this is a CUDA artifact but no CUDA GPU is available here" in r.stdout
    assert "cuda runtime loaded: True" in r.stdout and "compiler loaded: False" in r.stdout


# ------------------------------------------------------------------ found by the hostile review of issue 9
def test_the_python_compile_api_in_a_bundle_says_it_is_runtime_only(deploy):
    code = "import dyntvm as dt\ntry:\n    dt.compile\nexcept ImportError as e:\n    print('ImportError:', e)\n"
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=300,
                       env=_bundle_env(deploy), cwd=deploy["root"])
    assert "ImportError: dyntvm.compile is not in this runtime-only dyntvm" in r.stdout, r.stdout + r.stderr


def test_inspect_of_an_artifact_works_in_a_bundle(deploy):
    r = subprocess.run([sys.executable, "-S", "-m", "dyntvm", "inspect", os.path.join(deploy["root"], "m.dtvm")],
                       capture_output=True, text=True, timeout=300, env=_bundle_env(deploy), cwd=deploy["root"])
    assert r.returncode == 0 and "target cpu" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["out.tar", "out.zip", "out.TAR.GZ"])
def test_bundle_refuses_archive_names_it_would_not_write(tmp_path, name):
    from dyntvm.bundle import bundle
    with pytest.raises(dt.DyntvmError, match="write a folder, or a file ending in .tar.gz or .tgz"):
        bundle(str(tmp_path / name))
    assert os.listdir(tmp_path) == []


def test_an_artifact_for_other_cpu_features_or_device_is_refused(deploy, tmp_path):
    import json
    import shutil
    art = str(tmp_path / "m.dtvm")
    shutil.copytree(os.path.join(deploy["root"], "m.dtvm"), art)
    with pytest.raises(dt.ArtifactError, match=r"this is a CPU artifact: its kernels run on cpu, not cuda"):
        dt.load(art, device="cuda")
    manifest = json.load(open(os.path.join(art, "manifest.json")))
    assert "avx2" in manifest["info"]["cpu_features"] or not manifest["info"]["cpu_features"]
    manifest["info"]["cpu_features"].append("amx_tile_from_the_future")
    json.dump(manifest, open(os.path.join(art, "manifest.json"), "w"))
    with pytest.raises(dt.ArtifactError, match=r"uses? CPU instructions this CPU lacks \(amx_tile_from_the_future\)"):
        dt.load(art)
