"""Nothing is left behind. `model.save` writes a hidden folder next to its target and renames it into place; a
save killed with SIGKILL leaves that folder (tens of MB for a real model): the next save or load of the same
path removes it, but never the folder of a save still running in another process. Real processes, really
killed. A test session removes its own temporary folder (tests/conftest.py)."""
import glob
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

CHILD = """
import os, signal, sys
import dyntvm as dt
from dyntvm import F
from dyntvm.runtime import artifact
path, how = sys.argv[1], sys.argv[2]
model = dt.compile(lambda x: F.tanh(x) * 2.0, dt.TensorSpec(("N", 4), name="x"))
model.save(path)                                      # a whole artifact first
real_write, real_rename = artifact._write_files, os.rename

def write_then(model, folder):
    files = real_write(model, folder)
    if how == "kill_while_writing":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "wait":
        print("ready", flush=True)
        sys.stdin.readline()
    return files

def rename_then(src, dst):
    real_rename(src, dst)
    if how == "kill_between_renames" and ".dyntvm-old-" in dst:
        os.kill(os.getpid(), signal.SIGKILL)

artifact._write_files = write_then
artifact.os.rename = rename_then
model.save(path)
print("saved", flush=True)
"""


def model_fn(x):
    return F.tanh(x) * 2.0


X = np.ones((2, 4), np.float32)


def hidden(tmp_path):
    return sorted(glob.glob(str(tmp_path / ".m.dtvm.dyntvm-*")))


def run_child(path, how):
    return subprocess.Popen([sys.executable, "-c", CHILD, path, how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("how", ["kill_while_writing", "kill_between_renames"])
@pytest.mark.parametrize("then", ["save", "load"])
def test_a_killed_save_is_cleaned_up(tmp_path, how, then):
    path = str(tmp_path / "m.dtvm")
    child = run_child(path, how)
    child.communicate(timeout=600)
    assert child.returncode == -signal.SIGKILL
    assert hidden(tmp_path)                                        # what the killed save left
    if how == "kill_between_renames":
        assert not os.path.exists(path)                            # the old artifact is hidden too
    if then == "save":
        dt.compile(model_fn, dt.TensorSpec(("N", 4), name="x")).save(path)
    model = dt.load(path)                                          # the old artifact back, or the new one
    np.testing.assert_allclose(model(X), np.tanh(X) * 2, rtol=1e-6)
    assert hidden(tmp_path) == []
    assert os.listdir(tmp_path) == ["m.dtvm"]


def test_a_running_save_is_left_alone(tmp_path):
    path = str(tmp_path / "m.dtvm")
    child = run_child(path, "wait")
    try:
        assert child.stdout.readline().strip() == "ready"
        (theirs,) = hidden(tmp_path)
        dt.compile(model_fn, dt.TensorSpec(("N", 4), name="x")).save(path)      # a save of our own meanwhile
        dt.load(path)
        assert hidden(tmp_path) == [theirs]
        out, _ = child.communicate("go\n", timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0 and "saved" in out
    assert hidden(tmp_path) == [] and os.listdir(tmp_path) == ["m.dtvm"]
    dt.load(path)


@pytest.mark.slow
def test_a_test_session_leaves_no_temp_folder(tmp_path):
    """tests/conftest.py makes an empty $DYNTVM_TUNING_LOGS folder per session: removed at its end."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "--co",
                        os.path.join(tests, "test_layering.py")], cwd=os.path.dirname(tests), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert glob.glob(str(tmp_path / "dyntvm-no-tuning-logs-*")) == []
