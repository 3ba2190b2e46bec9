"""Ctrl-C during `dt.compile` (`codegen/interrupts.py`): a KeyboardInterrupt raised while TVM's C++ runs our
Python comes out of the C++ call as an ordinary error; a schedule rule's fallback took it for a rule that does
not apply and the compile finished, exit 0, as if no Ctrl-C had come (seen with a real Ctrl-C 7-8 s into the
transformer example's build). Here a real process compiles a matmul model; its matmul schedule rule first
calls, through tvm-ffi, a Python function that sends the process a real SIGINT and waits for it: the
signal's handler runs inside that callback, as with a Ctrl-C landing in C++ code. The compile must end in
KeyboardInterrupt and keep nothing in the compile cache."""
import os
import signal
import subprocess
import sys

SCRIPT = """import os, signal, sys, time
import numpy as np
import tvm_ffi
import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.backends.cpu import cpu_schedule
ctrl_c = sys.argv[2] == "ctrl-c"
seen = []

@tvm_ffi.register_global_func("dyntvm_test.ctrl_c")
def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)                       # the handler runs here: KeyboardInterrupt inside the callback

original = cpu_schedule._matmul_select
def matmul_select(*args, **kwargs):
    if ctrl_c and not seen:
        try:
            tvm_ffi.get_global_func("dyntvm_test.ctrl_c")()
        except BaseException as e:      # what the rule's fallback sees
            seen.append(type(e).__name__)
            print("the callback's KeyboardInterrupt came out as", type(e).__name__, flush=True)
            raise
    return original(*args, **kwargs)
cpu_schedule._matmul_select = matmul_select

W = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
model = dt.compile(lambda x: F.relu(F.matmul(x, W)), dt.TensorSpec(("N", 64)), cache_dir=sys.argv[1])
x = np.ones((3, 64), np.float32)
assert np.allclose(model(x), np.maximum(x @ W, 0), rtol=1e-5, atol=1e-5)
print("compiled", flush=True)
"""


def _run(tmp_path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "compile_matmul.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), mode], capture_output=True,
                          text=True, timeout=600,
                          # SIGINT's default action, as from a terminal (a test run's may be ignored)
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _cached(tmp_path) -> list:
    folder = tmp_path / "cache"
    return [f for _, _, files in os.walk(folder) for f in files if f.endswith(".so")] if folder.exists() else []


def test_a_ctrl_c_a_fallback_took_for_an_error_still_stops_the_compile(tmp_path):
    run = _run(tmp_path, "ctrl-c")
    assert "came out as" in run.stdout, run.stdout + run.stderr[-3000:]
    assert run.returncode == -signal.SIGINT, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert run.stderr.rstrip().splitlines()[-1] == "KeyboardInterrupt", run.stderr[-3000:]
    assert "compiled" not in run.stdout
    assert _cached(tmp_path) == [], "a library built after the Ctrl-C was kept in the compile cache"


def test_without_a_ctrl_c_the_same_compile_runs_and_is_cached(tmp_path):
    run = _run(tmp_path, "none")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "compiled" in run.stdout and len(_cached(tmp_path)) == 1


ESCAPING = """import os, signal, sys, time
import numpy as np
import tvm_ffi
import dyntvm as dt
from dyntvm import F
from dyntvm.codegen import vm_program
from dyntvm.codegen.backends.cpu import cpu_schedule
vm_program.build_with_program = lambda *args, **kwargs: None    # no program build: nothing takes the error

@tvm_ffi.register_global_func("dyntvm_test.ctrl_c_escaping")
def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)

original = cpu_schedule.build_cpu
def build_cpu(*args, **kwargs):
    tvm_ffi.get_global_func("dyntvm_test.ctrl_c_escaping")()   # comes out as an error, not taken by a fallback
    return original(*args, **kwargs)
cpu_schedule.build_cpu = build_cpu

W = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
dt.compile(lambda x: F.relu(F.matmul(x, W)), dt.TensorSpec(("N", 64)), cache_dir=sys.argv[1])
print("compiled", flush=True)
"""


def test_a_ctrl_c_that_came_out_of_a_tvm_call_as_an_error_ends_the_compile_as_keyboard_interrupt(tmp_path):
    """The callback's KeyboardInterrupt comes out of the C++ call as a RuntimeError that nothing takes: the
    compile ends in KeyboardInterrupt (exit by SIGINT), that error its cause (before: a RuntimeError, exit 1)."""
    script = tmp_path / "compile_escaping.py"
    script.write_text(ESCAPING)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")], capture_output=True, text=True,
                         timeout=600, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert run.returncode == -signal.SIGINT, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert run.stderr.rstrip().splitlines()[-1] == "KeyboardInterrupt", run.stderr[-3000:]
    assert "RuntimeError" in run.stderr and "compiled" not in run.stdout
    assert _cached(tmp_path) == []


def test_a_ctrl_c_during_the_program_build_is_not_followed_by_another_build(tmp_path):
    """The same error inside the VM program's build (which falls back to building again, with the regions
    called, then without the program, on an error): KeyboardInterrupt at once, one build (before: three)."""
    script = tmp_path / "compile_program.py"
    count = "import atexit; calls = []; atexit.register(lambda: print('builds', len(calls)))"
    script.write_text(ESCAPING.replace("vm_program.build_with_program = lambda *args, **kwargs: None", count)
                      .replace("def build_cpu(*args, **kwargs):\n",
                               "def build_cpu(*args, **kwargs):\n    calls.append(1)\n"))
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")], capture_output=True, text=True,
                         timeout=600, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert run.returncode == -signal.SIGINT, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert "builds 1" in run.stdout, run.stdout + run.stderr[-3000:]
    assert _cached(tmp_path) == []
