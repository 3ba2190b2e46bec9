"""GPU reductions: max / min / argmax / argmin as the CUDA backend lowers them (`te_kernels.te_nan_reduce_keyed`,
an integer-key max/min its threads can reduce together) and schedules them (`backends/cuda/gpu_reduction.py`:
one thread block per output, the reduced extent split over its threads).

The lowering is checked on the CPU (the same Relax module built for the CPU) against numpy, with NaN, infinities
and signed zeros among the inputs (the sign of a zero max / min is not compared: numpy keeps the first of -0.0 and
0.0, the integer key orders -0.0 first); the schedule by its form (a cross-thread `rfactor` block bound to threadIdx.x) and by a
CUDA build with device code; the results on a GPU at the end (skipped without one)."""
import os

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.backends.cuda import gpu

HAS_GPU = gpu.gpu_present()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
needs_nvcc = pytest.mark.skipif(not any(os.access(os.path.join(d, "nvcc"), os.X_OK) for d in
                                        os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/cuda/bin"]),
                                reason="CUDA builds need nvcc")

REDUCTIONS = {
    "max_rows": (lambda x: F.max(x, axis=1), lambda x: np.max(x, axis=1)),
    "min_rows_keep": (lambda x: F.min(x, axis=1, keepdims=True), lambda x: np.min(x, axis=1, keepdims=True)),
    "max_cols": (lambda x: F.max(x, axis=0), lambda x: np.max(x, axis=0)),
    "max_all": (lambda x: F.max(x), lambda x: np.max(x)),
    "argmax_rows": (lambda x: F.argmax(x, axis=1), lambda x: np.argmax(x, axis=1)),
    "argmin_rows": (lambda x: F.argmin(x, axis=1), lambda x: np.argmin(x, axis=1)),
    "argmax_flat": (lambda x: F.argmax(x), lambda x: np.argmax(x)),
}


def _inputs(rng, n, k, dtype):
    """[n, k] values with NaNs, infinities, signed zeros and ties in some rows."""
    x = rng.standard_normal((n, k)).astype(dtype)
    if n * k:
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 3.0, 3.0, -np.nan, np.inf, -np.inf, 0.0, -0.0],
                            dtype)
        flat[picks] = specials[:len(picks)]
    if n > 2:
        x[1] = np.nan                        # a row of NaNs
        x[2] = -np.inf                       # a row of -inf (the key of -inf is not the identity)
    return x


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_the_gpu_lowering_equals_numpy_on_the_cpu(dtype):
    """The Relax module a CUDA build gets (``device_checks=True``: the keyed max/min), built for the CPU."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph

    rng = np.random.default_rng(0)
    for name, (fn, ref) in REDUCTIONS.items():
        regions = collect_regions(partition_graph(dt.trace(fn, dt.TensorSpec(("N", "K"), dtype))))
        mod = build_module(regions, device_checks=True)
        assert any("key" in str(f.script()) for gv, f in mod.functions_items()
                   if gv.name_hint.startswith("dt_max") or gv.name_hint.startswith("dt_min")), name
        run = VirtualMachine(build_cpu(mod), tvm.cpu())[regions[0][0]]
        for n, k in ((1, 1), (1, 1000), (5, 3), (7, 130), (64, 1)):
            x = _inputs(rng, n, k, dtype)
            got = run(tvm.runtime.tensor(x))[0].numpy()
            np.testing.assert_array_equal(got, ref(x), err_msg=f"{name} {dtype} [{n}, {k}]")


def _scheduled(fn_compute, *shapes):
    import tvm
    from tvm import te

    placeholders = [te.placeholder(s, "float32", name=f"x{i}") for i, s in enumerate(shapes)]
    func = te.create_prim_func([*placeholders, fn_compute(*placeholders)])
    target = gpu.cuda_target("sm_90")
    with target:
        return gpu.dlight_pass()(tvm.IRModule({"main": func}))["main"].script()


def test_argmax_index_pass_is_a_cross_thread_reduction():
    from tvm import tirx

    from dyntvm.codegen.te_kernels import te_first_index
    n = tirx.Var("n", "int64")
    for rows in (1, 1000, n):
        script = _scheduled(lambda x, m: te_first_index(x, m, 1, False), (rows, 1000), (rows, 1))
        assert "_rf" in script and 'thread="threadIdx.x"' in script and 'thread="blockIdx.x"' in script, rows
    # a short reduced extent stays one thread per output (the block's threads would idle)
    assert "_rf" not in _scheduled(lambda x, m: te_first_index(x, m, 1, False), (4096, 8), (4096, 1))
    # reduced extent outermost: threads over the outputs read memory contiguously, no cross-thread form
    assert "_rf" not in _scheduled(lambda x, m: te_first_index(x, m, 0, False), (1000, 256), (1, 256))


def test_keyed_max_is_reduced_across_threads_and_the_custom_reducer_is_declined():
    from dyntvm.codegen.backends.cuda.gpu_reduction import InnerReduction
    from dyntvm.codegen.te_kernels import te_nan_reduce, te_nan_reduce_keyed
    keyed = _scheduled(lambda x: te_nan_reduce_keyed(x, [1], True, True), (1, 1000))
    assert 'thread="threadIdx.x"' in keyed and "for ax1 in range(1000)" not in keyed
    # the NaN-propagating custom reducer cannot be split over threads: the rule declines, no error
    from tvm import te
    x = te.placeholder((1, 1000), "float32", name="x")
    func = te.create_prim_func([x, te_nan_reduce(x, [1], True, True)])
    assert InnerReduction().apply(func, gpu.cuda_target("sm_90"), False) is None


def test_a_reduction_to_one_value_runs_in_one_block_not_a_launch_per_element():
    """With no spatial loop to bind, dlight's fallback left the reduction's loops on the host: every element was a
    kernel launch (branchy's max over [B, 32]: 32 B launches per call). Its first loop is now a thread binding,
    whatever the reduced extent (symbolic, short, long)."""
    from tvm import tirx

    from dyntvm.codegen.te_kernels import te_nan_reduce_keyed
    n = tirx.Var("n", "int64")
    for shape in ((n, 32), (3, 5), (1000, 7), (n, n)):
        for is_max in (True, False):
            script = _scheduled(lambda x: te_nan_reduce_keyed(x, [0, 1], False, is_max), shape)
            head = script[:script.index('T.sblock("key")')]
            loops = [line.strip() for line in head.splitlines() if line.strip().startswith("for ")]
            assert loops and "T.thread_binding" in loops[0], (shape, loops)
            assert 'thread="threadIdx.x"' in head, shape


@needs_nvcc
def test_argmax_model_builds_device_code(tmp_path):
    model = dt.compile(lambda x: (F.argmax(x, axis=1), F.max(x, axis=1)), dt.TensorSpec(("N", 1000)),
                       target="cuda:sm_90", use_cache=False)
    model.save(str(tmp_path / "m.dtvm"))
    blob = open(tmp_path / "m.dtvm" / "kernels.so", "rb").read()
    assert bytes.fromhex("50ed55ba") in blob and b"sm_90" in blob


@needs_gpu
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_on_the_gpu(name):
    fn, ref = REDUCTIONS[name]
    model = dt.compile(fn, dt.TensorSpec(("N", "K")), target="cuda", use_cache=False)
    rng = np.random.default_rng(1)
    for n, k in ((1, 1), (1, 1000), (5, 3), (7, 130), (300, 4097)):
        x = _inputs(rng, n, k, "float32")
        np.testing.assert_array_equal(np.asarray(model(x)), ref(x), err_msg=f"{name} [{n}, {k}]")
