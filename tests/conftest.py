"""Test-session settings. The shipped tuning logs (`tuning_logs/`) would apply to every bundled example a test
compiles on a matching CPU: tests compile with the default kernels unless they point $DYNTVM_TUNING_LOGS at a
log themselves (test_tuning.py). The empty folder that stands in for them is removed when the session ends."""
import os
import shutil
import tempfile

_NO_TUNING_LOGS = tempfile.mkdtemp(prefix="dyntvm-no-tuning-logs-")
os.environ["DYNTVM_TUNING_LOGS"] = _NO_TUNING_LOGS


def pytest_unconfigure(config):
    shutil.rmtree(_NO_TUNING_LOGS, ignore_errors=True)
