"""Tuning-log files are untrusted input (`codegen/log_files.py`): a manifest or database that is a FIFO (the open
blocked), a device or a symlink to one (`/dev/zero`: read until MemoryError), too large, or nested too deeply
(RecursionError; TVM's own parser recurses too) is refused with a TuningWarning naming the file and the reason,
on every path that reads a log (`dt.compile(tuning_log=)`, `dyntvm compile --tuning-log`, the shipped logs of
$DYNTVM_TUNING_LOGS), and a tune refuses to resume into such a folder with a CompileError. No tuning here: the
logs are written by hand."""
import os
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen import log_files, tuning
from dyntvm.codegen.build import concrete_target
from helpers import assert_same

W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
SPEC = dt.TensorSpec(("N", 64))
DEEP = b"[" * 100_000 + b"]" * 100_000


def affine(x):
    return F.matmul(x, W) + 1.0


@pytest.fixture(autouse=True)
def no_hang():
    """A blocked open or an endless read fails the test instead of hanging it."""
    def expire(*_):
        raise TimeoutError("hung on a tuning-log file")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def write_log(path) -> str:
    """A sound log of `affine` for this machine (no tuned kernel: its specialization alone)."""
    from dyntvm.pipeline import partition_graph, trace
    from dyntvm.runtime.artifact import kernel_binding
    os.makedirs(path)
    for name in log_files.DATABASE_FILES:
        with open(os.path.join(path, name), "w"):
            pass
    tuning.write_manifest(str(path), {
        "format": tuning.FORMAT, "model": "affine", "model_hash": kernel_binding(partition_graph(trace(affine, SPEC))),
        **tuning.target_identity(concrete_target("cpu")), "hints": {"N": [16]},
        "specialized": {"affine_r0": [[{"N": 16}, "affine_r0__at_N16"]]}, "kernels": []})
    return str(path)


def spoil(path: str, name: str, how: str) -> str:
    """Replace the file `name` of the log in `path`; returns the reason the refusal must give."""
    target = os.path.join(path, name)
    os.remove(target)
    if how == "fifo":
        os.mkfifo(target)
        return "is a FIFO, not a regular file"
    if how == "dev-zero":
        os.symlink("/dev/zero", target)
        return "is a character device, not a regular file"
    if how == "deep":
        with open(target, "wb") as f:
            f.write(DEEP + b"\n")
        return "nests JSON deeper than"
    if how == "large":                              # sparse: no disk used
        limit = log_files.MAX_MANIFEST_BYTES if name == tuning.MANIFEST else log_files.MAX_DATABASE_BYTES
        with open(target, "wb") as f:
            f.truncate(limit + 1)
        return "MiB a tuning log file may be"
    raise AssertionError(how)


CASES = [(tuning.MANIFEST, how) for how in ("fifo", "dev-zero", "deep", "large")] + \
    [(db, how) for db in log_files.DATABASE_FILES for how in ("fifo", "dev-zero", "deep", "large")]


@pytest.mark.parametrize("name, how", CASES)
def test_a_hostile_log_file_is_refused_with_a_warning(tmp_path, name, how):
    path = write_log(tmp_path / "log")
    assert tuning.load_log(path, None, concrete_target("cpu")) is not None       # sound before
    reason = spoil(path, name, how)
    with pytest.warns(tuning.TuningWarning) as caught:
        assert tuning.load_log(path, None, concrete_target("cpu")) is None
    (message,) = [str(w.message) for w in caught]
    assert os.path.join(path, name) in message and reason in message and "using the default kernels" in message


def test_nesting_tvm_would_parse_is_capped_too(tmp_path):
    """40 levels: within Python's recursion limit, beyond what a log holds (7)."""
    path = write_log(tmp_path / "log")
    with open(os.path.join(path, "database_tuning_record.json"), "w") as f:
        f.write("[" * 40 + "]" * 40 + "\n")
    with pytest.warns(tuning.TuningWarning, match="line 1 nests JSON deeper than 32"):
        assert tuning.load_log(path, None, concrete_target("cpu")) is None


def test_compile_with_a_fifo_log_file_uses_the_default_kernels(tmp_path):
    path = write_log(tmp_path / "log")
    model = dt.compile(affine, SPEC, tuning_log=path, use_cache=False)
    assert "tuning" in model.info                                       # the sound log applies
    spoil(path, "database_tuning_record.json", "fifo")
    with pytest.warns(tuning.TuningWarning, match="database_tuning_record.json is a FIFO"):
        model = dt.compile(affine, SPEC, tuning_log=path, use_cache=False)
    assert "tuning" not in model.info
    x = np.ones((16, 64), np.float32)
    assert_same(model(x), affine(x), rtol=1e-5, atol=1e-5)


def test_a_shipped_log_with_a_fifo_manifest_warns(tmp_path, monkeypatch):
    """$DYNTVM_TUNING_LOGS: a log for this model and target that cannot be read warns (one of another CPU
    says nothing: test_tuning.py)."""
    shipped = tmp_path / "shipped"
    path = write_log(shipped / "affine" / tuning.target_key(concrete_target("cpu")))
    spoil(path, tuning.MANIFEST, "fifo")
    monkeypatch.setenv("DYNTVM_TUNING_LOGS", str(shipped))
    with pytest.warns(tuning.TuningWarning, match="manifest.json is a FIFO"):
        model = dt.compile(affine, SPEC, use_cache=False)
    assert "tuning" not in model.info


def test_the_cli_warns_about_a_dev_zero_database(tmp_path):
    path = write_log(tmp_path / "log")
    spoil(path, "database_workload.json", "dev-zero")
    src = tmp_path / "model.py"
    src.write_text("import numpy as np\nfrom dyntvm import F\n"
                   "W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)\n"
                   "def affine(x):\n    return F.matmul(x, W) + 1.0\n")
    run = subprocess.run([sys.executable, "-m", "dyntvm", "compile", f"{src}:affine", "--input", "x:N,64",
                          "--tuning-log", path, "-o", str(tmp_path / "m.dtvm")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "database_workload.json is a character device" in run.stderr


@pytest.mark.parametrize("name, how", [(tuning.MANIFEST, "fifo"), (tuning.MANIFEST, "deep"),
                                       ("database_tuning_record.json", "fifo"),
                                       ("database_workload.json", "dev-zero")])
def test_a_tune_does_not_resume_from_a_hostile_folder(tmp_path, name, how):
    path = write_log(tmp_path / "log")
    reason = spoil(path, name, how)
    with pytest.raises(dt.CompileError, match=f"{name} {reason}".replace("(", r"\(")):
        dt.tune(affine, SPEC, trials=1, shape_hints={"N": [16]}, log_dir=path, progress=False)


def test_a_tune_does_not_resume_from_a_truncated_database(tmp_path):
    """A tune killed while MetaSchedule appended a record leaves half a line: a clear error, not TVM's."""
    path = write_log(tmp_path / "log")
    with open(os.path.join(path, "database_tuning_record.json"), "w") as f:
        f.write('[0, [[["GetSBlock"')
    with pytest.raises(dt.CompileError, match="ends in an unfinished line"):
        dt.tune(affine, SPEC, trials=1, shape_hints={"N": [16]}, log_dir=path, progress=False)


def test_the_manifest_is_replaced_through_a_new_temporary_file(tmp_path):
    """A FIFO where the old fixed temporary name was blocked the write."""
    path = write_log(tmp_path / "log")
    os.mkfifo(os.path.join(path, "manifest.json.tmp"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tuning.write_manifest(path, {"format": tuning.FORMAT, "kernels": [], "hints": {}})
    assert log_files.read_json(os.path.join(path, tuning.MANIFEST))["kernels"] == []
    assert sorted(os.listdir(path)) == sorted([*log_files.DATABASE_FILES, tuning.MANIFEST, "manifest.json.tmp"])
