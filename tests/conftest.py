"""Test-session settings. The shipped tuning logs (`tuning_logs/`) would apply to every bundled example a test
compiles on a matching CPU: tests compile with the default kernels unless they point $DYNTVM_TUNING_LOGS at a
log themselves (test_tuning.py)."""
import os
import tempfile

os.environ["DYNTVM_TUNING_LOGS"] = tempfile.mkdtemp(prefix="dyntvm-no-tuning-logs-")
