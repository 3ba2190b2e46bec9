"""Device loops (`ir.compiled_loop`, `codegen/compiled_loops.py` with `device`), run on the CPU: a CPU library
built with $DYNTVM_DEVICE_LOOPS_ON_CPU=1 holds the device loop functions, and the executor's device path
(`CompiledModel._use_device_path(tvm.cpu())`, values in TVM tensors, every host crossing counted) calls them
as it does on a GPU. Results are checked against independent numpy code at several sizes; the counts show a
foreach makes O(1) host<->device copies and one region call, a while_loop one read per chunk of steps."""
import numpy as np
import pytest
import tvm

import dyntvm as dt
from dyntvm.codegen import compiled_loops
from dyntvm.codegen.backends.cpu import DEVICE_LOOPS_ON_CPU
from dyntvm.runtime import loop_calls
from device_loop_programs import REFERENCE, SPECS, LazyModels, call_counting, device_loops, expected_chunks
from helpers import assert_same


@pytest.fixture(scope="module")
def cache_dir_module(tmp_path_factory):
    return str(tmp_path_factory.mktemp("device-loops-cache"))


@pytest.fixture(scope="module")
def models(cache_dir_module):
    """name -> the program compiled for the CPU with its device loops, on the device path."""
    def make(name):
        fn, specs = SPECS[name]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(DEVICE_LOOPS_ON_CPU, "1")
            compiled_loops.stats.declined.clear()
            model = dt.compile(fn, *specs, cache_dir=cache_dir_module)
        model._use_device_path(tvm.cpu())
        return model
    return LazyModels(make)


def _top_regions(model) -> int:
    return sum(n.op == "region" for n in model.graph.nodes)


@pytest.mark.parametrize("name, sizes", [("lstm", [(0, 1), (1, 1), (2, 3), (5, 2), (17, 1), (64, 4), (3, 0)]),
                                         ("rnn", [(0, 2), (1, 1), (2, 2), (3, 1), (9, 5), (4, 0)]),
                                         ("small_rows", [(0, None), (1, None), (2, None), (7, None)])])
def test_a_foreach_on_the_device_is_one_call_with_constant_copies(models, name, sizes):
    model = models[name]
    assert device_loops(model), compiled_loops.stats.declined
    rng = np.random.default_rng(3)
    for T, B in sizes:
        if name == "lstm":
            args = (rng.standard_normal((T, B, 128)).astype(np.float32),
                    *(rng.standard_normal((B, 256)).astype(np.float32) for _ in range(2)))
        elif name == "rnn":
            args = (rng.standard_normal((T, B, 16)).astype(np.float32), rng.standard_normal((B, 16)).astype(np.float32))
        else:
            args = (rng.standard_normal((T, 3)).astype(np.float32), np.asarray(0.5, np.float32))
        got, h2d, d2h, calls = call_counting(model, args)
        assert_same(got, REFERENCE[name](*args), rtol=1e-4, atol=1e-4)     # GPU math too (test_cuda_loops)
        n_out = len(got)
        # every input in once, every output back once (nothing of no elements is copied), whatever T is
        assert h2d == sum(a.size > 0 for a in args) and d2h == sum(np.asarray(g).size > 0 for g in got), (T, h2d, d2h)
        assert calls == _top_regions(model) + (T > 0)      # the loop: one region call (T = 0: no step at all)
        assert n_out >= 2


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4, 7, 15, 16, 31, 32, 40])
def test_a_while_loop_on_the_device_reads_its_condition_once_per_chunk(models, steps):
    model = models["count"]
    assert device_loops(model)
    x = np.arange(4, dtype=np.float32)
    args = (x, np.asarray(steps, np.int64))
    got, h2d, d2h, calls = call_counting(model, args)
    assert_same(got, REFERENCE["count"](*args), rtol=1e-4, atol=1e-4)
    chunks = expected_chunks(steps)
    assert calls == 1 + chunks                  # the first condition, then one call per chunk of 1, 2, 4, 8, 16...
    # reads: the first condition, (count, go) once per chunk, then the outputs that hold elements
    assert d2h == 1 + chunks + sum(np.asarray(g).size > 0 for g in got), (steps, d2h, chunks)
    assert h2d == 2                             # x and the limit (a capture the condition reads on the device)


def test_chunks_grow_to_sixteen_steps():
    assert [loop_calls._device_chunk(done, None, None) for done in (0, 1, 3, 7, 15, 31, 47)] == \
        [1, 2, 4, 8, 16, 16, 16]
    assert loop_calls._device_chunk(5, 7, None) == 2            # never past max_iterations
    assert loop_calls._device_chunk(15, None, loop_calls._WHILE_BYTES // 3) == 3     # nor the bytes of a call
    assert expected_chunks(0) == 0 and expected_chunks(1) == 1 and expected_chunks(31) == 5
    assert expected_chunks(32) == 6 and expected_chunks(47) == 6 and expected_chunks(48) == 7


def test_a_greedy_decode_on_the_device(models):
    model = models["greedy"]
    assert device_loops(model)
    h0 = np.linspace(-1, 1, 16, dtype=np.float32)
    lengths = set()
    for start in (0, 4, 3):
        for limit in (0, 1, 2, 3, 7, 100):
            args = (np.array(start, np.int64), h0, np.array(limit, np.int64))
            want = REFERENCE["greedy"](*args)
            got, h2d, d2h, calls = call_counting(model, args)
            assert_same(got, want, rtol=1e-4, atol=1e-4)
            runs = len(want[0])
            lengths.add(runs)
            chunks = expected_chunks(runs, limit)
            # the first condition (not with a limit of 0), then the chunks (the last may end early: the token)
            assert calls == (limit > 0) + chunks, (start, limit, calls, chunks)
            assert d2h == (limit > 0) + chunks + sum(np.asarray(g).size > 0 for g in got)
    assert 0 in lengths and 1 in lengths and max(lengths) == 17         # the stopping token was reached


def test_the_device_path_without_device_loops_runs_step_by_step(cache_dir_module):
    """A CPU library built without $DYNTVM_DEVICE_LOOPS_ON_CPU has no device loops: the device path runs the
    loop step by step, a region call per step (what a CUDA library without them does)."""
    fn, specs = SPECS["rnn"]
    model = dt.compile(fn, *specs, cache_dir=cache_dir_module)
    model._use_device_path(tvm.cpu())
    assert not device_loops(model)
    xs, h = np.ones((5, 2, 16), np.float32), np.zeros((2, 16), np.float32)
    got, h2d, d2h, calls = call_counting(model, (xs, h))
    assert_same(got, REFERENCE["rnn"](xs, h), rtol=1e-5, atol=1e-6)
    assert calls == _top_regions(model) + 5


def test_a_device_loop_failing_where_the_steps_run_falls_back_with_a_warning(models):
    model = models["rnn"]
    xs, h = np.ones((3, 2, 16), np.float32), np.zeros((2, 16), np.float32)
    ex = model._thread_executor()
    real = ex.vm

    class Failing:                      # the loop function raises; the regions run
        def __getitem__(self, name):
            if name.endswith("__dloop"):
                def fail(*args):
                    raise RuntimeError("device loop failed")
                return fail
            return real[name]
    model._threads.executor = type(ex)(model.graph, Failing(), constants=model._constants,
                                       placement=model._placement())
    try:
        with pytest.warns(RuntimeWarning, match="compiled loop of foreach node"):
            got = model(xs, h)
        assert_same(got, REFERENCE["rnn"](xs, h), rtol=1e-4, atol=1e-4)
    finally:
        model._threads.executor = ex


def test_a_gpus_run_time_checks_stay_on_the_device_in_a_while_loop():
    """CUDA regions check take's indices on the device (`te_kernels.te_check_device`) and read the count of bad
    ones to the host before the take runs; a device loop sums the counts on the device instead and zeroes bad
    indices (`compiled_loops._DeviceChecks`), and the caller re-runs the loop step by step when the sum is not 0.
    The regions built for the CPU with those checks show both: results, and the step-by-step error."""
    from tvm.runtime.vm import VirtualMachine

    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.compiled_loops import loop_specs
    from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph
    from dyntvm.runtime.model import CompiledModel
    fn, specs = SPECS["greedy"]
    graph = partition_graph(dt.trace(fn, *specs))
    compiled_loops.stats.declined.clear()
    ex = build_cpu(build_module(collect_regions(graph), device_checks=True), loops=loop_specs(graph, "cpu"))
    model = CompiledModel(graph, VirtualMachine(ex, tvm.cpu()), "cpu", ex)
    model._use_device_path(tvm.cpu())
    assert device_loops(model), compiled_loops.stats.declined
    h0 = np.linspace(-1, 1, 16, dtype=np.float32)
    for start, limit in ((0, 100), (4, 5), (1, 1)):
        args = (np.array(start, np.int64), h0, np.array(limit, np.int64))
        got, _, _, calls = call_counting(model, args)
        assert_same(got, REFERENCE["greedy"](*args), rtol=1e-5, atol=1e-6)
        assert calls == 1 + expected_chunks(len(got[0]), limit)
    for bad in (9, -9):                 # out of the table at the first step: the step-by-step run's error
        with pytest.raises(dt.ExecutionError, match="index out of range"):
            model(np.array(bad, np.int64), h0, np.array(5, np.int64))


@pytest.mark.parametrize("which", ["_foreach", "_while"])
def test_the_gpu_tests_control_flow_programs_with_device_loops(which, cache_dir_module, monkeypatch):
    """test_cuda.py's foreach and while_loop programs (run on a GPU there), on the CPU's device path with device
    loops: the same results as eager mode at every size."""
    from test_cuda import PROGRAMS
    fn, shapes = next((f, s) for f, s in PROGRAMS if f.__name__ == which)
    monkeypatch.setenv(DEVICE_LOOPS_ON_CPU, "1")
    model = dt.compile(fn, *[dt.TensorSpec(s) for s in shapes], cache_dir=cache_dir_module)
    model._use_device_path(tvm.cpu())
    assert device_loops(model)
    for n, seed in ((0, 0), (1, 1), (5, 2), (37, 3)):
        inputs = [np.random.default_rng(seed).standard_normal([n if d == "N" else d for d in s]).astype(np.float32)
                  for s in shapes]
        if n == 0 and which == "_while":
            continue
        assert_same(model(*inputs), fn(*inputs), rtol=1e-4, atol=1e-4)
