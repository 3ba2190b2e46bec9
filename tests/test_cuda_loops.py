"""Device loops in CUDA libraries (`codegen/compiled_loops.py`, `ir.compiled_loop`). The build test runs on any
machine with nvcc (device code built in the stub child, `codegen/backends/cuda/gpu.py`); the others need a GPU: the tests
of `test_device_loops.py` (numpy references, copy and call counts) run again with the programs compiled for
CUDA, and skip cleanly without one."""
import numpy as np
import pytest

import dyntvm as dt
from device_loop_programs import SPECS, LazyModels
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
    def make(name):
        fn, specs = SPECS[name]
        return dt.compile(fn, *specs, target="cuda", cache_dir=cache_dir_module)
    return LazyModels(make)


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


def _sources(module) -> str:
    """The generated source of a module and its imports (CUDA C where no GPU compiled it)."""
    out = []
    try:
        out.append(module.inspect_source())
    except Exception:  # noqa: BLE001 - a module kind without source
        pass
    for m in module.imports:
        out.append(_sources(m))
    return "\n".join(out)


@needs_nvcc
@pytest.mark.parametrize("name", ["rnn", "small_rows", "count", "greedy"])
def test_the_cuda_pipeline_splits_the_device_loop_into_host_code_and_kernels(name):
    """TVM's CUDA pipeline refuses host code that reads or writes device memory (VerifyMemory) and splits the
    thread-bound loops into kernels (SplitHostDevice): the device loop passes both, its copies and bookkeeping
    become kernels (built in this process: CUDA source where there is no GPU). The greedy decode's `take`
    is checked on the device (`compiled_loops._DeviceChecks`)."""
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.compiled_loops import loop_specs, stats
    from dyntvm.codegen.backends.cuda.gpu import build_cuda, cuda_target
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph
    fn, specs = SPECS[name]
    graph = partition_graph(dt.trace(fn, *specs))
    stats.declined.clear()
    stats.compiled.clear()
    ex = build_cuda(build_module(collect_regions(graph), device_checks=True), cuda_target("sm_90"), None,
                    loop_specs(graph, "cuda"))
    assert stats.compiled and not stats.declined, stats.declined
    if not HAS_GPU:
        src = _sources(ex.mod)
        assert "__dloop_kernel_kernel" in src and "__global__" in src
