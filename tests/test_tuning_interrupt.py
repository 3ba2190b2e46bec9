"""Ctrl-C during `dt.tune` (`codegen/tuning_interrupt.py`): a real subprocess tuning a small model is sent a real
SIGINT, to its whole process group as a terminal's Ctrl-C is (MetaSchedule's build and run workers get it too),
at moments found by polling the log folder. Each time the tune must end in KeyboardInterrupt (it was a SIGSEGV,
"RuntimeError: cannot join current thread" or an IndexError in tuning.py), leave a sound log, and the next run
resume it: the kernel finished before the last Ctrl-C is not tuned again."""
import contextlib
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from dyntvm.codegen import log_files, tuning
from dyntvm.codegen.build import concrete_target

pytestmark = pytest.mark.slow

SCRIPT = """import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)     # the test's diagnosis of a tune that does not end
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "SIGINT is not Python's default here"
import numpy as np
import dyntvm as dt
from dyntvm import F
W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
def affine(x):
    return F.tanh(F.matmul(x, W) + 1.0)
dt.tune(affine, dt.TensorSpec(("N", 64)), trials=4, shape_hints={"N": [8, 16]}, log_dir=sys.argv[1], progress=False)
# a Ctrl-C lost (once, under load): what this process's SIGINT looked like at the end, for the failure message
print("tuned; SIGINT handler", signal.getsignal(signal.SIGINT), "pending", signal.sigpending(),
      "blocked", signal.pthread_sigmask(signal.SIG_BLOCK, []))
"""
SCHEDULER_LOG = os.path.join("logs", "tvm.s_tir.meta_schedule.logging.task_scheduler.log")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _finished(log: str) -> list:
    return [k for k in log_files.read_json(os.path.join(log, tuning.MANIFEST))["kernels"] if k["status"] == "done"]


# when to press Ctrl-C: a test of the log folder, given the scheduler log's text written by this run and the
# kernels finished before it
MOMENTS = {
    "at the start (default timing, MetaSchedule's imports)":
        lambda log, new, done: os.path.exists(os.path.join(log, tuning.MANIFEST)),
    "while the first batch is built": lambda log, new, done: "to builder" in new,
    "while the first batch is measured": lambda log, new, done: "to runner" in new,
    "in the second kernel":             # the first finished in this run, or before it (then: once it builds)
        lambda log, new, done: len(_finished(log)) > done or (done > 0 and "to builder" in new),
}


def _group(pgid: int) -> list:
    """The live processes of process group `pgid` (the tune and the build / run workers it started)."""
    ps = subprocess.run(["ps", "-eo", "pid=,pgid=,stat=,etime=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in ps.splitlines()
            if line.split()[1] == str(pgid) and not line.split()[2].startswith("Z")]


def _as_from_a_terminal() -> None:
    """In the tune's process before it runs Python: SIGINT's default action, as a program started from a
    terminal has it. A test run started in the background of a shell without job control can have SIGINT
    ignored, and its children inherit that: Python then keeps ignoring it, and so does the tune
    (`deferred_interrupt` leaves a program's own SIGINT handling alone): the Ctrl-C would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _tune(script: str, log: str, moment=None) -> subprocess.CompletedProcess:
    """Run the tune; with a `moment`, Ctrl-C it when the moment comes (it must not end before). Its output goes
    to files, not pipes: a worker outliving the tune would hold a pipe open, and is checked for by name here.
    A tune that does not end is diagnosed: its threads' stacks (faulthandler) and its processes."""
    before = len(_read(os.path.join(log, SCHEDULER_LOG)))
    done = len(_finished(log)) if os.path.exists(os.path.join(log, tuning.MANIFEST)) else 0
    out_path, err_path = log + ".stdout", log + ".stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, script, log], stdout=out, stderr=err, start_new_session=True,
                                preexec_fn=_as_from_a_terminal)
    try:
        while moment is not None and not moment(log, _read(os.path.join(log, SCHEDULER_LOG))[before:], done):
            assert proc.poll() is None, "the tune ended before the moment to interrupt it"
            time.sleep(0.1)
        if moment is not None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(3)
            pytest.fail("the tune did not end within 600 s; its processes:\n" + "\n".join(_group(proc.pid)) +
                        "\nits stderr (with its threads' stacks):\n" + _read(err_path)[-12000:])
        deadline = time.monotonic() + 60
        while _group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _group(proc.pid)
        assert not left, "processes of the tune still running 60 s after it ended:\n" + "\n".join(left)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, _read(out_path), _read(err_path))


def _assert_sound(log: str) -> None:
    manifest = log_files.read_json(os.path.join(log, tuning.MANIFEST))
    assert all(k["status"] in ("done", "failed") for k in manifest["kernels"])
    log_files.read_database_files(log)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.load_log(log, None, concrete_target("cpu")) is not None


def test_ctrl_c_keeps_what_was_tuned_and_raises_keyboard_interrupt(tmp_path):
    script, log = str(tmp_path / "tune_affine.py"), str(tmp_path / "log")
    with open(script, "w") as f:
        f.write(SCRIPT)
    finished = []
    for what, moment in MOMENTS.items():
        run = _tune(script, log, moment)
        assert run.returncode == -signal.SIGINT, \
            f"Ctrl-C {what}: exit {run.returncode}\nstdout:\n{run.stdout[-1000:]}\nstderr:\n{run.stderr[-3000:]}"
        assert run.stderr.rstrip().splitlines()[-1] == "KeyboardInterrupt", f"Ctrl-C {what}:\n{run.stderr[-3000:]}"
        assert "what was tuned is kept" in run.stdout
        _assert_sound(log)
        finished = _finished(log)       # one, if the Ctrl-C came as the first kernel was finishing
        assert len(finished) == 1 if what == "in the second kernel" else len(finished) < 2, what
    run = _tune(script, log)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(_finished(log)) == 2 and finished[0] in _finished(log)     # resumed: the first not tuned again
    _assert_sound(log)


@pytest.mark.parametrize("part", ["builder", "runner"])
def test_ctrl_c_while_the_builder_or_runner_is_made(part):
    """Their sanity check runs a job in a worker process, which a terminal's Ctrl-C kills too: with a stop
    requested, that failure is the KeyboardInterrupt (it was "ChildProcessError: Subprocess terminated"); without
    one, their own error. A function name no worker has makes the check fail here as the killed worker did."""
    from dyntvm.codegen.tuning_interrupt import StopRequest, StoppableBuilder, StoppableRunner
    make = {"builder": lambda stop: StoppableBuilder(stop, max_workers=1, f_build="dyntvm.no_such_function"),
            "runner": lambda stop: StoppableRunner(stop, f_run_evaluator="dyntvm.no_such_function")}[part]
    stop = StopRequest()
    with pytest.raises(Exception) as failed:
        make(stop)
    assert not isinstance(failed.value, KeyboardInterrupt)
    stop.requested = True
    with pytest.raises(KeyboardInterrupt):
        make(stop)


@pytest.mark.parametrize("part", ["builder", "runner"])
def test_a_worker_hung_holding_the_gil_is_killed(part, monkeypatch):
    """A build or measuring process hung in a call that keeps the GIL never answers: its own timeout is a timer
    thread in it, which then never runs (a tune under load once waited on such a measuring process for good).
    It is killed HUNG_GRACE_S after that timeout could have fired; the candidate fails saying so, another
    candidate of the batch that failed on its own keeps its own error, and the pool shuts down."""
    import threading

    import tvm
    from tvm import te
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from dyntvm.codegen import tuning_interrupt as ti
    # the builder's deadline counts from the batch's start, its worker processes' start-up included (~25 s
    # under load); the runner's worker is started by its sanity check
    monkeypatch.setattr(ti, "HUNG_GRACE_S", 60.0 if part == "builder" else 2.0)

    def hang(mod=None, *_args):             # nested: pickled by value into the worker process
        if mod is not None and not len(mod.functions):
            raise ValueError("an empty module, failed on its own")
        import ctypes
        ctypes.PyDLL(None).sleep(3600)      # a C call made holding the GIL

    stop, got = ti.StopRequest(), []
    a = te.placeholder((4,), name="a")
    some = tvm.IRModule({"main": te.create_prim_func([a, te.compute((4,), lambda i: a[i] + 1.0, name="b")])})

    def tune_step():
        if part == "builder":
            builder = ti.StoppableBuilder(stop, max_workers=2, timeout_sec=1, f_build=hang)
            got.extend(r.error_msg for r in builder.build([BuilderInput(some, tvm.target.Target("llvm")),
                                                           BuilderInput(tvm.IRModule(), tvm.target.Target("llvm"))]))
        else:
            runner = ti.StoppableRunner(stop, timeout_sec=1, f_cleanup=hang)   # cleanup runs after the load fails
            try:
                got.append(runner.run([RunnerInput("/nonexistent/candidate.so", "cpu", [])])[0].result().error_msg)
            finally:
                runner.close()
    step = threading.Thread(target=tune_step, daemon=True)
    step.start()
    step.join(timeout=400)
    assert not step.is_alive(), f"the {part} still waits on its hung process after 400 s"
    assert len(got) == (2 if part == "builder" else 1), got
    assert "no answer" in str(got[0]) and "killed" in str(got[0]), got
    if part == "builder":
        assert "failed on its own" in str(got[1]), got
