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


def _torchvision_with_cpu_ops():
    """transformers and torch's dynamo exporter import torchvision when it is installed, and the torchvision wheel
    of the package index here is a CUDA build whose import fails on a CPU machine (`torchvision::nms does not
    exist`): its CPU ops are defined first (tests/torchvision_cpu.py), once for the whole session."""
    import importlib.util
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None:
        return
    import torchvision_cpu      # tests/ is on sys.path
    torchvision_cpu.load()


_torchvision_with_cpu_ops()


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def executor_only():
    """Models compiled and loaded in the module run in the Python executor, not as VM programs
    (`runtime/vm_program.py`): for tests that count the executor's region calls (`model.kernel_calls`). Use it
    with ``pytestmark = pytest.mark.usefixtures("executor_only")``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNTVM_NO_VM_PROGRAM", "1")
        yield


@pytest.fixture
def conv_log(caplog):
    """`caplog` recording the CPU schedule's debug log (which conv rule and form each kernel took)."""
    import logging

    from dyntvm.codegen.backends.cpu import cpu_schedule
    caplog.set_level(logging.DEBUG, logger=cpu_schedule.__name__)
    return caplog
