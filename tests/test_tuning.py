"""Autotuning (`dt.tune`, `dyntvm tune`, `codegen/tuning.py`): a real MetaSchedule tune of a small model (few
trials) writes a log; compiling with it builds the hinted sizes' specializations next to the generic kernels
and each call dispatches on its sizes; bad logs fall back with a warning; a second run resumes."""
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
from dyntvm.codegen import tuning
from dyntvm.codegen.build import concrete_target
from helpers import assert_same

pytestmark = pytest.mark.slow

W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
B = np.random.default_rng(1).standard_normal(64).astype(np.float32)
SPEC = dt.TensorSpec(("N", 64))


def affine(x):
    """One kernel (matmul + bias) MetaSchedule can tune; N symbolic."""
    return F.matmul(x, W) + B


def other(x):
    return F.matmul(x, W) - B


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tune") / "affine")
    out = dt.tune(affine, SPEC, trials=8, shape_hints={"N": [16]}, log_dir=path, progress=False)
    assert out == path
    return path


def _manifest(path) -> dict:
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)


def test_a_tune_writes_a_log(log):
    m = _manifest(log)
    assert m["model"] == "affine" and m["hints"] == {"N": [16]}
    assert m["target_key"] == tuning.target_key(concrete_target("cpu"))
    assert m["specialized"] == {"affine_r0": [[{"N": 16}, "affine_r0__at_N16"]]}
    (k,) = m["kernels"]
    assert k["status"] == "done" and k["default_us"] > 0 and k["tuned_us"] > 0
    assert k["use"] == k["verdict"]["use"] and k["verdict"]["compared"] == "region affine_r0__at_N16"
    assert (k["use"] == "tuned") == ("rejected" not in k)
    for name in ("database_workload.json", "database_tuning_record.json"):
        assert os.path.getsize(os.path.join(log, name)) > 0


def _winning_copy(log, tmp_path) -> str:
    """The log with its kernel marked as won by the tuned schedule (whichever won in this run's timing)."""
    path = str(tmp_path / "won")
    shutil.copytree(log, path)
    m = _manifest(path)
    m["kernels"][0]["use"] = "tuned"
    tuning.write_manifest(path, m)
    return path


def test_a_hinted_size_runs_the_specialized_build_and_other_sizes_the_generic_one(log, tmp_path, monkeypatch):
    path = _winning_copy(log, tmp_path)
    used = []
    real = tuning.TuningLog.tuned

    def spy(self, func, target):
        sch = real(self, func, target)
        used.append(sch is not None)
        return sch
    monkeypatch.setattr(tuning.TuningLog, "tuned", spy)
    model = dt.compile(affine, SPEC, tuning_log=path, use_cache=False)
    assert any(used)                                   # the tuned schedule replaced the default rule's
    info = model.info["tuning"]
    assert info["kernels_tuned"] == 1 and info["specialized"] == {"affine_r0": [[{"N": 16}, "affine_r0__at_N16"]]}
    assert "tuning" in model.summary()
    for n, special in ((16, True), (15, False), (1, False), (0, False), (64, False)):
        x = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
        before = model.specialized_calls
        assert_same(model(x), affine(x), rtol=1e-5, atol=1e-5)
        assert model.specialized_calls - before == special


def test_kernels_tuned_counts_what_applied_also_from_the_cache(log, tmp_path):
    """info["tuning"]["kernels_tuned"] is the number of kernels built with a tuned schedule: a winner whose
    workload the model does not have is not counted, and a cache hit reports what the build that stored
    the entry applied (recorded in its sidecar)."""
    path = _winning_copy(log, tmp_path)
    m = _manifest(path)
    m["kernels"].append(dict(m["kernels"][0], workload="0" * 64, name="not_in_this_model"))
    tuning.write_manifest(path, m)
    cache = str(tmp_path / "cache")
    first = dt.compile(affine, SPEC, tuning_log=path, cache_dir=cache)
    again = dt.compile(affine, SPEC, tuning_log=path, cache_dir=cache)
    assert (first.info["cache"], again.info["cache"]) == ("miss", "hit")
    assert first.info["tuning"]["kernels_tuned"] == again.info["tuning"]["kernels_tuned"] == 1


def test_the_dispatch_survives_save_and_load(log, tmp_path):
    model = dt.compile(affine, SPEC, tuning_log=log, use_cache=False)
    model.save(str(tmp_path / "m.dtvm"))
    loaded = dt.load(str(tmp_path / "m.dtvm"))
    assert loaded.info["tuning"]["specialized"] == model.info["tuning"]["specialized"]
    x = np.ones((16, 64), np.float32)
    assert_same(loaded(x), affine(x), rtol=1e-5, atol=1e-5)
    assert loaded.specialized_calls == 1


def test_an_edited_specialization_in_an_artifact_is_refused(log, tmp_path):
    """Found by the hostile review (issue 21): manifest.json's info.tuning.specialized was covered by no digest,
    so routing another size to a specialization (bound to N=16) loaded and computed wrong results. The
    library's binding covers it now."""
    model = dt.compile(affine, SPEC, tuning_log=log, use_cache=False)
    art = str(tmp_path / "m.dtvm")
    model.save(art)
    with open(os.path.join(art, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["info"]["tuning"]["specialized"] == {"affine_r0": [[{"N": 16}, "affine_r0__at_N16"]]}
    manifest["info"]["tuning"]["specialized"]["affine_r0"][0][0] = {"N": 15}
    with open(os.path.join(art, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(dt.ArtifactError, match=r"info\.tuning\.specialized\); recompile the model"):
        dt.load(art)


def test_a_shipped_log_for_the_model_is_picked_up(log, tmp_path, monkeypatch):
    """A log under $DYNTVM_TUNING_LOGS/<model>/<target key>/ (the shipped `tuning_logs/`) applies without
    `tuning_log=`, and says so in the model's summary; another model's compile ignores it silently."""
    shipped = tmp_path / "shipped"
    shutil.copytree(log, shipped / "affine" / tuning.target_key(concrete_target("cpu")))
    shutil.copytree(log, shipped / "other" / tuning.target_key(concrete_target("cpu")))   # not other's log
    monkeypatch.setenv("DYNTVM_TUNING_LOGS", str(shipped))
    model = dt.compile(affine, SPEC, use_cache=False)
    assert model.info["tuning"]["log"] == str(shipped / "affine" / tuning.target_key(concrete_target("cpu")))
    assert "affine_r0__at_N16" in model.summary()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = dt.compile(other, SPEC, use_cache=False)
    assert "tuning" not in plain.info


def test_bad_logs_fall_back_with_a_warning(log, tmp_path):
    x = np.ones((16, 64), np.float32)

    def compiled_with(path, fn=affine):
        with pytest.warns(tuning.TuningWarning) as w:
            model = dt.compile(fn, SPEC, tuning_log=path, use_cache=False)
        assert "tuning" not in model.info
        assert_same(model(x), fn(x), rtol=1e-5, atol=1e-5)
        return str(w[0].message)
    assert "another model" in compiled_with(log, other)                 # a foreign model's log
    corrupt = str(tmp_path / "corrupt")
    shutil.copytree(log, corrupt)
    with open(os.path.join(corrupt, "manifest.json"), "w") as f:
        f.write('{"format": 1, "kern')
    assert "corrupt" in compiled_with(corrupt)
    foreign = str(tmp_path / "foreign")
    shutil.copytree(log, foreign)
    m = _manifest(foreign)
    m["target_key"], m["cpu"], m["core_class"] = "llvm-skylake-avx512-8c", "Intel(R) Xeon(R) Platinum 8280", 8
    tuning.write_manifest(foreign, m)
    assert "another target" in compiled_with(foreign)
    broken_db = str(tmp_path / "db")
    shutil.copytree(log, broken_db)
    with open(os.path.join(broken_db, "database_tuning_record.json"), "w") as f:
        f.write("[[[not json\n")
    assert "database" in compiled_with(broken_db)
    assert "no such folder" in compiled_with(str(tmp_path / "missing"))


@pytest.mark.parametrize("specialized", [[1, 2], None, {"affine_r0": "abc"}, {"affine_r0": [[{"N": 16}, "a", "b"]]},
                                         {"affine_r0": [[{"N": "16"}, "a"]]}, {"affine_r0": [[{}, "a"]]}])
def test_a_malformed_specialized_section_falls_back_with_a_warning(log, tmp_path, specialized):
    """Hand-edited manifests: a `specialized` of the wrong shape is a corrupt log (it raised a raw
    AttributeError / ValueError from `dt.compile`, also for a shipped log)."""
    path = str(tmp_path / "edited")
    shutil.copytree(log, path)
    m = _manifest(path)
    m["specialized"] = specialized
    tuning.write_manifest(path, m)
    with pytest.warns(tuning.TuningWarning, match="corrupt"):
        model = dt.compile(affine, SPEC, tuning_log=path, use_cache=False)
    assert "tuning" not in model.info
    x = np.ones((16, 64), np.float32)
    assert_same(model(x), affine(x), rtol=1e-5, atol=1e-5)


def test_tune_into_a_file_or_a_foreign_manifest_is_a_compile_error(tmp_path):
    """Raised before any tuning: a log_dir that is a file, and a manifest.json that is JSON but no object."""
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(dt.CompileError, match="cannot write the log folder"):
        dt.tune(affine, SPEC, trials=1, shape_hints={"N": [4]}, log_dir=str(afile), progress=False)
    (tmp_path / "lst").mkdir()
    (tmp_path / "lst" / "manifest.json").write_text("[]")
    with pytest.raises(dt.CompileError, match="not readable"):
        dt.tune(affine, SPEC, trials=1, shape_hints={"N": [4]}, log_dir=str(tmp_path / "lst"), progress=False)
    with pytest.raises(dt.CompileError, match="folder path"):
        dt.compile(affine, SPEC, tuning_log=5, use_cache=False)


def test_a_build_that_fails_with_the_log_is_redone_without_it(log, monkeypatch):
    from dyntvm.codegen import build as build_mod
    real = build_mod.build_executable

    def failing(regions, target, binding=None, tvm_target=None, loops=(), tuning=None, program=None):
        if tuning is not None:
            raise RuntimeError("FuseTIR: Inconsistent buffers")
        return real(regions, target, binding, tvm_target, loops, None, program)
    monkeypatch.setattr(build_mod, "build_executable", failing)
    with pytest.warns(tuning.TuningWarning, match="the build with it failed"):
        model = dt.compile(affine, SPEC, tuning_log=log, use_cache=False)
    assert "tuning" not in model.info
    x = np.ones((16, 64), np.float32)
    assert_same(model(x), affine(x), rtol=1e-5, atol=1e-5)
    assert model.specialized_calls == 0


def test_a_second_tune_resumes_instead_of_starting_over(log, monkeypatch):
    from tvm.s_tir import meta_schedule as ms

    def no_tuning(*a, **k):
        raise AssertionError("a finished kernel was tuned again")
    monkeypatch.setattr(ms, "tune_tir", no_tuning)
    before = _manifest(log)["kernels"]
    assert dt.tune(affine, SPEC, trials=8, shape_hints={"N": [16]}, log_dir=log, progress=False) == log
    assert _manifest(log)["kernels"] == before
    with pytest.raises(dt.CompileError, match="another model"):           # a folder of another model's log
        dt.tune(other, SPEC, trials=8, shape_hints={"N": [16]}, log_dir=log, progress=False)


def test_the_cli_reads_hints_strictly():
    from dyntvm.cli import _hints
    assert _hints(["T=16,64", "B=1"]) == {"T": [16, 64], "B": [1]}
    for bad, match in ((["T=16", "T=64"], "given twice"), (["T="], "expected SYMBOL"), (["=4"], "expected SYMBOL"),
                       (["T=a"], "expected SYMBOL"), (["T=4,,8"], "expected SYMBOL")):
        with pytest.raises(dt.InputError, match=match):
            _hints(bad)


def test_tune_checks_its_arguments(tmp_path):
    for kwargs, match in (({"shape_hints": {"M": [4]}}, "not a symbolic dim"),
                          ({"shape_hints": {"N": [0]}}, "sizes >= 1"),
                          ({"shape_hints": {"N": "16"}}, "sizes >= 1"),
                          ({"trials": 0}, "positive int"),
                          ({"target": "tpu"}, "unknown target")):
        with pytest.raises(dt.CompileError, match=match):
            dt.tune(affine, SPEC, log_dir=str(tmp_path / "x"), progress=False, **kwargs)


def test_the_cli_tunes_and_compiles_with_the_log(log, tmp_path):
    """`dyntvm tune` (here resuming the fixture's finished log: no kernel is tuned again) and
    `dyntvm compile --tuning-log`, in real subprocesses."""
    src = tmp_path / "model.py"
    src.write_text("import numpy as np\nfrom dyntvm import F\n"
                   "W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)\n"
                   "B = np.random.default_rng(1).standard_normal(64).astype(np.float32)\n"
                   "def affine(x):\n    return F.matmul(x, W) + B\n")
    env = dict(os.environ, PYTHONWARNINGS="default")
    run = subprocess.run([sys.executable, "-m", "dyntvm", "tune", f"{src}:affine", "--input", "x:N,64",
                          "--hint", "N=16", "--trials", "8", "-o", log], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert "affine" in run.stdout and "default" in run.stdout
    art = str(tmp_path / "m.dtvm")
    run = subprocess.run([sys.executable, "-m", "dyntvm", "compile", f"{src}:affine", "--input", "x:N,64",
                          "--tuning-log", log, "-o", art], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "affine_r0__at_N16" in run.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = dt.load(art)
    assert loaded.info["tuning"]["log"] == os.path.abspath(log)
    run = subprocess.run([sys.executable, "-m", "dyntvm", "tune", f"{src}:affine", "--input", "x:N,64",
                          "--hint", "M=16", "-o", str(tmp_path / "t")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and "not a symbolic dim" in run.stderr


def test_a_loop_body_specialization_gets_a_compiled_loop_of_its_own(tmp_path):
    """A log specializing a foreach body (here written by hand, no tuning: the dispatch alone): the body's
    specialization is compiled as a loop of its own, and the loop call picks it by the sizes."""
    from dyntvm.pipeline import partition_graph, trace
    from dyntvm.runtime.artifact import kernel_binding
    U = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32) / 8

    def rnn(xs, h):
        def step(x, st):
            h = F.tanh(x + F.matmul(st[0], U))
            return h, [h]
        return F.foreach(step, xs, [h])
    specs = (dt.TensorSpec(("T", "B", 64)), dt.TensorSpec(("B", 64)))
    pg = partition_graph(trace(rnn, *specs))
    (loop,) = [n for n in pg.nodes if n.op == "foreach"]
    (body,) = [n.attrs.name for n in loop.subgraphs[0].nodes if n.op == "region"]
    path = tmp_path / "log"
    path.mkdir()
    (path / "database_workload.json").write_text("")
    (path / "database_tuning_record.json").write_text("")
    tuning.write_manifest(str(path), {
        "format": tuning.FORMAT, "model": "rnn", "model_hash": kernel_binding(pg),
        **tuning.target_identity(concrete_target("cpu")), "hints": {"B": [2]},
        "specialized": {body: [[{"B": 2}, body + "__at_B2"]]}, "kernels": []})
    model = dt.compile(rnn, *specs, tuning_log=str(path), use_cache=False)
    assert model.info["tuning"]["specialized"] == {body: [[{"B": 2}, body + "__at_B2"]]}
    model.vm[body + "__at_B2__loop"]                                   # its own compiled loop
    for T, B in ((5, 2), (5, 3), (0, 2), (1, 2)):
        rng = np.random.default_rng(T * 10 + B)
        xs, h = rng.standard_normal((T, B, 64)).astype(np.float32), rng.standard_normal((B, 64)).astype(np.float32)
        before, spec = model.kernel_calls, model.specialized_calls
        assert_same(model(xs, h), rnn(xs, h), rtol=1e-5, atol=1e-5)
        assert model.kernel_calls - before == 1
        assert model.specialized_calls - spec == (B == 2)


def test_a_second_tune_into_a_folder_being_tuned_is_refused(log, tmp_path):
    import fcntl
    path = str(tmp_path / "busy")
    shutil.copytree(log, path)
    with open(os.path.join(path, ".lock"), "a") as held:          # what a running tune holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(dt.CompileError, match="another dyntvm tune is writing"):
            dt.tune(affine, SPEC, trials=8, shape_hints={"N": [16]}, log_dir=path, progress=False)
    assert dt.tune(affine, SPEC, trials=8, shape_hints={"N": [16]}, log_dir=path, progress=False) == path


def test_tune_says_why_nothing_is_tuned_when_regions_use_data_dependent_dims(tmp_path):
    """Found by the new-user review: the docs' `dyntvm tune my_model.py:model ... --hint N=1000` tuned 0 of 0
    kernels without a word (its one region reads boolean_mask's rows, a dim _d0 that no hint can fix)."""
    W = np.ones((8, 4), np.float32)

    def masked(xs, mask):
        return F.tanh(F.matmul(F.boolean_mask(xs, mask), W))
    with pytest.warns(tuning.TuningWarning, match=r"no kernel to tune: .*masked_r0 uses _d0"):
        log = dt.tune(masked, dt.TensorSpec(("N", 8)), dt.TensorSpec(("N",), "bool"), trials=1,
                      shape_hints={"N": [100]}, log_dir=str(tmp_path / "masked"), progress=False)
    assert json.load(open(os.path.join(log, "manifest.json")))["kernels"] == []
