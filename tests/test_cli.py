"""The `dyntvm` command line, run as real subprocesses (compile in one process, run in another).

Two TVM builds for the whole module: the detection example and a small model file; everything else
reuses them (a shared compile cache in a temporary folder keeps the tests hermetic).
"""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from dyntvm import examples
from dyntvm.errors import InputError
from dyntvm.loader import parse_input_spec, parse_sizes

MODEL_FILE = '''
import numpy as np
from dyntvm import F

W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)

def model(xs, mask):
    """A region (matmul, tanh) after a dynamic-shape node (boolean_mask)."""
    return F.tanh(F.matmul(F.boolean_mask(xs, mask), W)), F.nonzero(mask)

def no_region(x):
    return F.nonzero(x)
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = dict(os.environ)
    e["DYNTVM_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    return e


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


def dyntvm(env, *args, cwd=None, ok=True):
    r = subprocess.run([sys.executable, "-m", "dyntvm.cli", *map(str, args)], capture_output=True, text=True,
                       env=env, cwd=cwd, timeout=900)
    if ok:
        assert r.returncode == 0, f"dyntvm {' '.join(map(str, args))} failed:\n{r.stdout}\n{r.stderr}"
    return r


def leaves(tree):
    from dyntvm.ir.tree import tree_flatten
    return [np.asarray(a) for a in tree_flatten(tree)[0]]


def assert_outputs(folder, want):
    for i, b in enumerate(want):
        a = np.load(os.path.join(folder, f"output_{i}.npy"))
        assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    assert not os.path.exists(os.path.join(folder, f"output_{len(want)}.npy"))


@pytest.fixture(scope="module")
def detection_art(env, work):
    out = work / "detection.dtvm"
    r = dyntvm(env, "compile", "--example", "detection", "-o", out)
    assert "compiling example detection for cpu" in r.stdout
    assert "region detection_r0" in r.stdout and "dynamic-shape node" in r.stdout
    assert "compile" in r.stdout.splitlines()[-1] and f"wrote {out}" in r.stdout
    return out


@pytest.fixture(scope="module")
def model_file(work):
    path = work / "my_model.py"
    path.write_text(MODEL_FILE)
    return path


@pytest.mark.parametrize("n", [0, 1, 64])
def test_compile_then_run_in_fresh_process_matches_eager(env, work, detection_art, n):
    ex = examples.get("detection")
    inputs = ex.make_inputs(np.random.default_rng(n), N=n, keep_fraction=0.5)
    args = []
    for spec, a in zip(ex.specs, inputs):
        np.save(work / f"{spec.name}_{n}.npy", a)
        args += ["--input", f"{spec.name}={work / f'{spec.name}_{n}.npy'}"]
    out = work / f"out_{n}"
    r = dyntvm(env, "run", detection_art, *args, "--repeat", "3", "--output", f"{out}/")   # as the README writes it
    assert f"to {out}/output_<i>.npy" in r.stdout          # one slash, not out//output_<i>.npy
    assert "input scores: float32[%d,16] (file)" % n in r.stdout
    assert "output 0: float32[" in r.stdout and "median of 3 runs" in r.stdout
    assert_outputs(out, leaves(ex.fn(*inputs)))


def test_run_random_inputs(env, detection_art):
    r = dyntvm(env, "run", detection_art, "--random", "--dim", "N=10", "--repeat", "1")
    assert "input boxes: float32[10,4] (random)" in r.stdout and "output 6: int64[" in r.stdout


def test_python_file_to_tar_artifact(env, work, model_file):
    art = work / "m.tar"
    r = dyntvm(env, "compile", f"{model_file}:model", "--input", "mask:N:bool", "--input", "xs:N,4:float32",
               "-o", art)
    assert "CompiledModel 'model' target=cpu: 1 region(s)" in r.stdout
    rng = np.random.default_rng(1)
    xs, mask = rng.standard_normal((9, 4)).astype(np.float32), rng.random(9) < 0.5
    np.save(work / "xs.npy", xs)
    np.save(work / "mask.npy", mask)
    out = work / "m_out"
    dyntvm(env, "run", art, "--input", f"xs={work / 'xs.npy'}", "--input", f"mask={work / 'mask.npy'}",
           "--output", out, "--repeat", "1")
    sys.path.insert(0, str(work))
    try:
        import my_model
    finally:
        sys.path.remove(str(work))
    assert_outputs(out, leaves(my_model.model(xs, mask)))


def test_saved_graph_json(env, work):
    import dyntvm as dt
    from dyntvm import F
    from dyntvm.ir.serialize import save_graph
    graph = dt.trace(lambda x: F.unique(x), dt.TensorSpec(("N",), "int64", name="x"))
    save_graph(graph, str(work / "g.json"))
    dyntvm(env, "compile", work / "g.json", "-o", work / "g.dtvm")     # no static region: no TVM build
    r = dyntvm(env, "run", work / "g.dtvm", "--random", "--dim", "N=20", "--output", work / "g_out")
    assert "output 0: int64[" in r.stdout
    assert np.all(np.diff(np.load(work / "g_out" / "output_0.npy")) > 0)


def test_compile_never_overwrites_user_files(env, work, detection_art):
    """-o into a folder that is not an artifact: refused before compiling, the user's files untouched."""
    import shutil
    mine = work / "my_project"
    mine.mkdir()
    files = {"graph.json": "my graph", "params.npz": "my params", "manifest.json": "my manifest",
             "kernels.so": "my kernels"}
    for fn, text in files.items():
        (mine / fn).write_text(text)
    (work / "notes.tar").write_text("my notes")
    for out in (mine, work / "notes.tar"):
        r = dyntvm(env, "compile", "--example", "detection", "-o", out, ok=False)
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"dyntvm compile: error: {out}: refusing to overwrite"), r.stderr
        assert "compiling" not in r.stdout                        # checked before compiling
    assert {fn: (mine / fn).read_text() for fn in files} == files and sorted(os.listdir(mine)) == sorted(files)
    assert (work / "notes.tar").read_text() == "my notes"
    again = work / "again.dtvm"                                   # an existing artifact is replaced
    shutil.copytree(detection_art, again)
    (again / "graph.json").write_text("{}")                       # (even a broken one)
    dyntvm(env, "compile", "--example", "detection", "-o", again)
    dyntvm(env, "run", again, "--random", "--dim", "N=5", "--repeat", "1")


def test_a_tuning_log_that_does_not_apply_is_not_pretended(env, work, model_file):
    """An empty folder (no manifest), and a model without compiled regions: a warning, and the artifact records
    no tuning (test_tuning.py applies real logs)."""
    logs = work / "logs"
    logs.mkdir()
    r = dyntvm(env, "compile", f"{model_file}:model", "--input", "xs:N,4:float32", "--input", "mask:N:bool",
               "-o", work / "t.dtvm", "--tuning-log", logs)
    assert "not applied" in r.stderr and "manifest.json is missing or corrupt" in r.stderr
    assert "tuning:" not in r.stdout
    r = dyntvm(env, "inspect", work / "t.dtvm")
    assert "tuning" not in r.stdout
    r = dyntvm(env, "compile", f"{model_file}:no_region", "--input", "x:N:float32", "-o", work / "u.dtvm",
               "--tuning-log", logs)
    assert "not applied" in r.stderr and "no compiled region" in r.stderr


def check_svg(path, *texts):
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    body = open(path).read()
    for t in texts:
        assert t in body, t


def test_inspect_model_svg(env, work):
    svg = work / "branchy.svg"
    r = dyntvm(env, "inspect", "--example", "branchy", "--svg", svg)
    assert "model example branchy (partitioned, not compiled)" in r.stdout
    assert "control-flow node" in r.stdout and "region branchy_r0" in r.stdout and f"wrote {svg}" in r.stdout
    check_svg(svg, "branchy_r0", "compiled region", "dynamic-shape op", "control flow", "subgraph")


def test_inspect_artifact_svg(env, work, detection_art):
    svg = work / "detection.svg"
    r = dyntvm(env, "inspect", detection_art, "--svg", svg)
    assert f"artifact {detection_art}: target cpu" in r.stdout
    assert "input scores: float32[N,16]" in r.stdout and "region detection_r0" in r.stdout
    check_svg(svg, "detection_r0", "boolean_mask", "topk")


def test_inspect_refuses_a_png_before_printing(env, work, detection_art):
    """Found by the new-user review: `--svg m.png` printed the whole graph, then refused the path."""
    r = dyntvm(env, "inspect", detection_art, "--svg", work / "d.png", ok=False)
    assert r.returncode == 1 and r.stdout == "" and "--svg writes SVG" in r.stderr and "rsvg-convert" in r.stderr


def test_demo(env):
    r = dyntvm(env, "demo", "--example", "detection", "--repeat", "2")    # the compile cache makes it quick
    assert "compiled matches eager: True" in r.stdout
    assert "compiled matches plain numpy: True" in r.stdout
    # the baseline is the example in plain numpy (examples/plain_numpy.py), dyntvm's eager mode shown apart
    assert "latency (median of 2): plain numpy" in r.stdout and "dyntvm eager mode" in r.stdout
    assert "than plain numpy" in r.stdout


@pytest.mark.parametrize("cmd", [None, "compile", "run", "inspect", "demo"])
def test_help(env, cmd):
    r = dyntvm(env, *([cmd] if cmd else []), "--help")
    assert r.stdout.startswith("usage: dyntvm") and r.stderr == ""
    if cmd is None:
        assert all(c in r.stdout for c in ("compile", "run", "inspect", "demo"))


@pytest.mark.parametrize("args, message", [
    (["run", "{work}/nothing.dtvm"], "dyntvm run: error: {work}/nothing.dtvm: no such artifact"),
    (["run", "{art}"], "dyntvm run: error: no --input for scores, boxes (give NAME=FILE.npy, or --random)"),
    (["run", "{art}", "--random"], "dyntvm run: error: input 'scores' is float32[N,16]: dim N needs a size"),
    (["run", "{art}", "--input", "bogus={work}/xs.npy"], "dyntvm run: error: --input 'bogus="),
    (["run", "{art}", "--random", "--dim", "N"], "dyntvm run: error: --dim 'N': expected SYMBOL=SIZE"),
    (["compile", "--example", "nope", "-o", "{work}/x.dtvm"], "dyntvm compile: error: unknown example 'nope'"),
    (["compile", "{model}:missing", "-o", "{work}/x.dtvm"], "dyntvm compile: error: {model} has no 'missing'"),
    (["compile", "{model}:model", "-o", "{work}/x.dtvm"], "dyntvm compile: error: {model}:model(xs, mask) needs one"),
    (["compile", "{model}:model", "--input", "xs:N,4.5", "-o", "{work}/x.dtvm"], "dyntvm compile: error: --input"),
    (["compile", "{art}", "-o", "{work}/x.dtvm"], "dyntvm compile: error: {art} is a compiled artifact"),
    (["inspect", "{work}/none.json"], "dyntvm inspect: error: {work}/none.json: no such file"),
    (["compile", "--example", "lstm"], "dyntvm compile: error: the following arguments are required: -o/--output"),
    ([], "dyntvm: error: the following arguments are required: COMMAND"),
])
def test_errors_are_one_line(env, work, model_file, detection_art, args, message):
    fill = {"work": work, "art": detection_art, "model": model_file}
    r = dyntvm(env, *[a.format(**fill) for a in args], ok=False)
    assert r.returncode != 0
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(message.format(**fill)), r.stderr


def test_verbose_shows_traceback(env, work):
    r = dyntvm(env, "run", work / "nothing.dtvm", "-v", ok=False)
    assert r.returncode != 0 and "Traceback" in r.stderr and "ArtifactError" in r.stderr


def test_parse_input_spec():
    s = parse_input_spec("xs:T,B,128:float32")
    assert (s.name, s.shape, s.dtype) == ("xs", ("T", "B", 128), "float32")
    assert parse_input_spec("n::int64").shape == () and parse_input_spec("m:4").dtype == "float32"
    for bad, msg in [("xs", "expected NAME:DIMS"), ("xs:T,-1", "dim '-1'"), ("xs:T:float99", "unknown dtype"),
                     ("1x:T", "not a valid input name"), ("xs:T:float", "by its name, 'float64'"),
                     ("xs:T:f4", "by its name, 'float32'")]:
        with pytest.raises(InputError, match=msg):
            parse_input_spec(bad)
    assert parse_sizes(["T=16", "B=2"]) == {"T": 16, "B": 2}


def test_run_refuses_npz_and_repeated_inputs(env, work, detection_art):
    """Found by the hostile review: an .npz gave a raw AttributeError, a repeated --input went unnoticed."""
    np.savez(work / "two.npz", a=np.zeros(3), b=np.ones(3))
    r = dyntvm(env, "run", detection_art, "--input", f"scores={work / 'two.npz'}", "--random", ok=False)
    assert r.returncode == 1 and "is an .npz archive; give one array as a .npy file" in r.stderr, r.stderr
    np.save(work / "s.npy", np.zeros((2, 16), np.float32))
    r = dyntvm(env, "run", detection_art, "--input", f"scores={work / 's.npy'}", "--input",
               f"scores={work / 's.npy'}", "--random", ok=False)
    assert r.returncode == 1 and "input 'scores' is given twice" in r.stderr, r.stderr


def test_compile_without_a_c_compiler_is_a_clear_error(env, work):
    r = dyntvm({**env, "CXX": "/nonexistent/g++", "DYNTVM_CACHE_DIR": str(work / "nocc-cache")}, "compile",
               "--example", "branchy", "-o", work / "nocc.dtvm", ok=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "$CXX / $CC names '/nonexistent/g++', which is not an executable" in r.stderr, r.stderr
    assert not (work / "nocc.dtvm").exists()
