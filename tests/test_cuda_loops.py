"""Device loops in CUDA libraries (`codegen/compiled_loops.py`, `ir.compiled_loop`). The build test runs on any
machine with nvcc (device code built in the stub child, `codegen/gpu.py`); the others need a GPU: the tests
of `test_device_loops.py` (numpy references, copy and call counts) run again with the programs compiled for
CUDA, and skip cleanly without one."""
import numpy as np
import pytest

import dyntvm as dt
from device_loop_programs import SPECS
from test_cuda import FATBIN, HAS_GPU, needs_nvcc
from test_device_loops import (test_a_device_loop_failing_where_the_steps_run_falls_back_with_a_warning,  # noqa: F401
                               test_a_foreach_on_the_device_is_one_call_with_constant_copies,
                               test_a_greedy_decode_on_the_device,
                               test_a_while_loop_on_the_device_reads_its_condition_once_per_chunk)


@pytest.fixture(scope="module")
def cache_dir_module(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cuda-loops-cache"))


@pytest.fixture(scope="module")
def models(cache_dir_module):
    """name -> the program compiled for CUDA (the tests imported above run with these)."""
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU (test_device_loops.py runs the same tests on the CPU's device path)")
    return {name: dt.compile(fn, *specs, target="cuda", cache_dir=cache_dir_module)
            for name, (fn, specs) in SPECS.items()}


@needs_nvcc
@pytest.mark.parametrize("name", ["rnn", "count"])
def test_a_cuda_library_holds_the_device_loops(name, cache_dir_module, tmp_path):
    """The loop function is in the host code, its copy and bookkeeping kernels in the fatbin (device code for
    the arch), and the body's kernels under the loop's names (`compiled_loops._alias`)."""
    fn, specs = SPECS[name]
    model = dt.compile(fn, *specs, target="cuda:sm_90", cache_dir=cache_dir_module)
    model.save(str(tmp_path / "m.dtvm"))
    blob = open(tmp_path / "m.dtvm" / "kernels.so", "rb").read()
    assert FATBIN in blob and b"sm_90" in blob
    assert b"__dloop_kernel" in blob, "no device loop function in the library"
    assert b"__dloop_kernel_kernel" in blob, "no copy kernel of the device loop in the device code"
    assert b"__loop__" in blob                         # the body's kernels, copied for the loop
    if HAS_GPU:
        xs = np.ones((3, 2, 16), np.float32) if name == "rnn" else np.ones(4, np.float32)
        args = (xs, np.zeros((2, 16), np.float32)) if name == "rnn" else (xs, np.asarray(5, np.int64))
        loaded = dt.load(str(tmp_path / "m.dtvm"))
        assert len(loaded(*args)) == len(model(*args))
