"""CUDA: device code is built on any machine with nvcc (this CPU-only one included); running needs a GPU.

The build tests run everywhere (nvcc is in the CI machine's image); the execution tests at the end skip
cleanly without a GPU and compare compiled-on-GPU results with the numpy reference at several sizes.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.codegen.backends.cuda import gpu
from helpers import assert_same

FATBIN = bytes.fromhex("50ed55ba")
HAS_GPU = gpu.gpu_present()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (the build tests above run without one)")
needs_nvcc = pytest.mark.skipif(not any(os.access(os.path.join(d, "nvcc"), os.X_OK) for d in
                                        os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/cuda/bin"]),
                                reason="CUDA builds need nvcc")


def assert_device_code(path: str, arch: str):
    """`path` (a kernels.so) holds a fatbin for `arch` with its ELF notes, and no CUDA C source."""
    blob = open(path, "rb").read()
    assert FATBIN in blob, "no fatbin in the library"
    assert arch.encode() in blob and b".nv.info" in blob
    assert b"__global__" not in blob and b"extern \"C\"" not in blob, "the library holds CUDA source"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cuda-cache"))


# -------------------------------------------------------------------------------- builds (no GPU needed)
@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("name", examples.NAMES)
def test_every_example_builds_device_code(name, tmp_path, cache_dir):
    ex = examples.get(name)
    model = dt.compile(ex.fn, *ex.specs, target="cuda", cache_dir=cache_dir)
    assert model.target == "cuda" and model.info["cuda_arch"] == (gpu.cuda_target().attrs["arch"])
    model.save(str(tmp_path / "m.dtvm"))
    assert_device_code(str(tmp_path / "m.dtvm" / "kernels.so"), model.info["cuda_arch"])
    if not HAS_GPU:
        with pytest.raises(dt.CompileError, match="compiled for CUDA on a machine without a GPU"):
            model(*ex.make_inputs(np.random.default_rng(0), **ex.sizes))
        with pytest.raises(dt.ArtifactError, match="CUDA artifact but no CUDA GPU"):
            dt.load(str(tmp_path / "m.dtvm"))


@needs_nvcc
def test_cli_compiles_for_a_named_arch_and_inspect_shows_cuda(tmp_path, cache_dir):
    out = tmp_path / "lstm_cuda.dtvm"
    r = subprocess.run([sys.executable, "-m", "dyntvm", "compile", "--example", "lstm", "--target", "cuda:sm_80",
                        "-o", str(out), "--cache-dir", cache_dir], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cuda_arch: sm_80" in r.stdout
    assert_device_code(str(out / "kernels.so"), "sm_80")
    assert b"sm_90" not in open(out / "kernels.so", "rb").read()
    r = subprocess.run([sys.executable, "-m", "dyntvm", "inspect", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "target cuda" in r.stdout.splitlines()[0]
    r = subprocess.run([sys.executable, "-m", "dyntvm", "compile", "--example", "lstm", "--target", "cuda:80",
                        "-o", str(tmp_path / "x")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "expected cpu, cuda or cuda:sm_XX" in r.stderr


@needs_nvcc
def test_cuda_build_is_cached(tmp_path, cache_dir):
    from dyntvm.codegen.build import stats
    fn = lambda x: F.tanh(x) * 3.0 + 1.0       # noqa: E731
    before = stats.builds
    a = dt.compile(fn, dt.TensorSpec(("N", 5)), target="cuda:sm_75", cache_dir=cache_dir)
    b = dt.compile(fn, dt.TensorSpec(("N", 5)), target="cuda:sm_75", cache_dir=cache_dir)
    assert stats.builds == before + 1 and a.info["cache"] == "miss" and b.info["cache"] == "hit"
    b.save(str(tmp_path / "b.dtvm"))
    assert_device_code(str(tmp_path / "b.dtvm" / "kernels.so"), "sm_75")
    c = dt.compile(fn, dt.TensorSpec(("N", 5)), target="cuda:sm_75", use_cache=False)
    c.save(str(tmp_path / "c.tar"))
    assert c.info["cache"] == "miss"


def _rowwise_select(x, w1, w2):
    """A loop body's cond between two matmul branches (branchy's per-row sub-networks): selected on CUDA too."""
    def step(row, acc):
        y = F.cond(F.sum(row) > 0, lambda: F.relu(F.matmul(row, w1)), lambda: F.tanh(F.matmul(row, w2)))
        return y, acc + y
    ys, total = F.foreach(step, x, F.zeros((8,)))
    return ys, total


@needs_nvcc
def test_a_loop_bodys_cond_becomes_a_select_on_cuda(cache_dir):
    """The cond becomes both branches and a ``where`` (no per-row host read); the ``where`` fused after
    a vectorized matmul epilogue made TVM's CUDA codegen print code nvcc rejects (``gpu_select``): it builds."""
    specs = (dt.TensorSpec(("N", 8)), dt.TensorSpec((8, 8)), dt.TensorSpec((8, 8)))
    model = dt.compile(_rowwise_select, *specs, target="cuda", cache_dir=cache_dir)
    assert "cond" not in [n.op for n in model.graph.walk()]
    if HAS_GPU:
        rng = np.random.default_rng(0)
        w1, w2 = rng.standard_normal((2, 8, 8)).astype(np.float32)
        for n in (0, 1, 5, 33):
            x = rng.standard_normal((n, 8)).astype(np.float32)
            pick = (x.sum(axis=1) > 0)[:, None]
            ys = np.where(pick, np.maximum(x @ w1, 0), np.tanh(x @ w2))
            _same(model(x, w1, w2), (ys, ys.sum(axis=0)))


def test_bad_cuda_targets_are_clear_errors():
    for target, message in (("cuda:80", r"the CUDA arch must look like sm_90"), ("gpu", "unknown target 'gpu'"),
                            ("cpu:sm_90", "unknown target")):
        with pytest.raises(dt.CompileError, match=message):
            dt.compile(lambda x: x + 1.0, dt.TensorSpec(("N",)), target=target)


def test_cuda_build_without_nvcc_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))            # no nvcc anywhere the build looks
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(gpu, "CUDA_HOMES", ())
    with pytest.raises(dt.CompileError, match=r"a CUDA build needs nvcc \(the CUDA toolkit\)"):
        dt.compile(lambda x: x + 1.0, dt.TensorSpec(("N",)), target="cuda", use_cache=False)


# ---------------------------------------------------------------------------------- execution (a GPU)
def _same(got, want):
    assert_same(got, want, rtol=1e-4, atol=1e-4)


@needs_gpu
@pytest.mark.parametrize("name", examples.NAMES)
def test_every_example_runs_on_the_gpu(name, cache_dir, tmp_path):
    ex = examples.get(name)
    model = dt.compile(ex.fn, *ex.specs, target="cuda", cache_dir=cache_dir)
    for i, sizes in enumerate(ex.test_sizes):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        _same(model(*inputs), ex.fn(*inputs))
    model.save(str(tmp_path / "m.dtvm"))
    loaded = dt.load(str(tmp_path / "m.dtvm"))
    inputs = ex.make_inputs(np.random.default_rng(0), **ex.sizes)
    _same(loaded(*inputs), ex.fn(*inputs))


def _cond(x):
    return F.cond(F.sum(x) > 0, lambda: F.tanh(x) * 2.0, lambda: F.exp(x * 0.1) - 1.0)


def _case(x):
    s = F.sum(x)
    return F.case([(s > 1.0, lambda: x * 2.0), (s < -1.0, lambda: x - 1.0)], lambda: F.sigmoid(x))


def _foreach(x):
    def step(row, acc):
        acc = F.tanh(acc + row)
        return acc * 2.0, acc
    ys, last = F.foreach(step, x, F.zeros((4,)))
    return ys, last


def _while(x):
    def cond(i, h):
        return F.logical_and(i < 6, F.sum(h) < 100.0)

    def body(i, h):
        return h, [i + 1, h * 1.5 + 1.0]
    hs, (i, h) = F.while_loop(cond, body, [np.asarray(0, np.int64), x], max_iterations=10)
    return hs, i, h


def _mask(x):
    kept = F.boolean_mask(x, F.sum(x, axis=1) > 0)
    return F.tanh(kept) * 2.0, F.nonzero(F.sum(x, axis=1) > 0)


def _carry_row(x):
    """A state that is sometimes the data row itself and then kept for several steps: the device path's
    reused row buffer must not be overwritten while a state still holds it."""
    def step(row, keep):
        new = F.cond(F.sum(row) > 0, lambda: row, lambda: keep)
        return new * 2.0, new
    ys, last = F.foreach(step, x, F.zeros((4,)))
    return ys, last


PROGRAMS = [(_cond, (("N", 4),)), (_case, (("N", 4),)), (_foreach, (("N", 4),)), (_while, ((4,),)),
            (_mask, (("N", 4),)), (_carry_row, (("N", 4),))]


@needs_gpu
@pytest.mark.parametrize("fn, shapes", PROGRAMS, ids=[f.__name__.strip("_") for f, _ in PROGRAMS])
def test_control_flow_on_the_gpu(fn, shapes, cache_dir):
    model = dt.compile(fn, *[dt.TensorSpec(s) for s in shapes], target="cuda", cache_dir=cache_dir)
    for n, seed in ((0, 0), (1, 1), (5, 2), (37, 3), (5, 4)):
        if n == 0 and fn is _while:
            continue
        inputs = [np.random.default_rng(seed).standard_normal([n if d == "N" else d for d in s]).astype(np.float32)
                  for s in shapes]
        _same(model(*inputs), fn(*inputs))


# ------------------------------------------------- the GPU's run-time checks, exercised on the CPU
def test_device_checks_raise_like_numpy_on_the_cpu():
    """On a GPU an assert cannot raise inside a kernel; CUDA regions count bad values on the device and
    assert on the host instead (`te_kernels.te_check_device`). The same lowering built for the CPU shows
    it raises exactly where numpy does."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph

    def compiled(f, *specs):
        regions = collect_regions(partition_graph(dt.trace(f, *specs)))
        mod = build_module(regions, device_checks=True)
        assert any(gv.name_hint.startswith("dt_pass_") for gv in mod.get_global_vars())
        return VirtualMachine(build_cpu(mod), tvm.cpu())[regions[0][0]]

    take = compiled(lambda x, i: F.take(x, i, axis=0) * 2.0, dt.TensorSpec(("N", 3)), dt.TensorSpec(("K",), "int64"))
    power = compiled(lambda e, p: F.power(e, p) + 1, dt.TensorSpec(("K",), "int32"), dt.TensorSpec(("K",), "int32"))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for idx in ([0, -1, 3], [], [-4]):
        got = take(x, tvm.runtime.tensor(np.array(idx, np.int64)))[0].numpy()
        np.testing.assert_array_equal(got, np.take(x, np.array(idx, np.int64), axis=0) * 2)
    for idx in ([0, 4], [-5], [1, -2, 9]):
        with pytest.raises(Exception, match="take: index out of range"):
            take(x, np.array(idx, np.int64))
    e = np.array([2, 3], np.int32)
    np.testing.assert_array_equal(power(e, np.array([3, 0], np.int32))[0].numpy(), e ** np.array([3, 0]) + 1)
    with pytest.raises(Exception, match="integers to negative integer powers are not allowed"):
        power(e, np.array([3, -1], np.int32))


# ------------------------------------------ the GPU data path (values stay on the device), on the CPU
# `CompiledModel._use_device_path(dev)` runs a model the way it runs on a GPU (values in TVM tensors on `dev`,
# every host crossing an explicit copy, counted); on `tvm.cpu()` this checks the path without a GPU.
def _on_device_path(model):
    import tvm
    model._use_device_path(tvm.cpu())
    return model


@pytest.mark.parametrize("name", examples.NAMES)
def test_every_example_on_the_device_path(name, cache_dir):
    ex = examples.get(name)
    model = _on_device_path(dt.compile(ex.fn, *ex.specs, cache_dir=cache_dir))
    for i, sizes in enumerate(ex.test_sizes):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        _same(model(*inputs, profile=True), ex.fn(*inputs))
        assert model.last_copies["device_to_host"] >= 0


@pytest.mark.parametrize("fn, shapes", PROGRAMS, ids=[f.__name__.strip("_") for f, _ in PROGRAMS])
def test_control_flow_on_the_device_path(fn, shapes, cache_dir):
    model = _on_device_path(dt.compile(fn, *[dt.TensorSpec(s) for s in shapes], cache_dir=cache_dir))
    for n, seed in ((0, 0), (1, 1), (5, 2), (37, 3)):
        inputs = [np.random.default_rng(seed).standard_normal([n if d == "N" else d for d in s]).astype(np.float32)
                  for s in shapes]
        if n == 0 and fn is _while:
            continue
        _same(model(*inputs), fn(*inputs))


def test_only_inputs_outputs_and_conditions_cross_to_the_host(cache_dir):
    ex = examples.get("lstm")
    lstm = _on_device_path(dt.compile(ex.fn, *ex.specs, cache_dir=cache_dir))
    for t in (1, 7, 30):            # three inputs in, two outputs back: nothing per step
        lstm(*ex.make_inputs(np.random.default_rng(t), T=t, B=2), profile=True)
        assert (lstm.last_copies["host_to_device"], lstm.last_copies["device_to_host"]) == (3, 2)

    loop = _on_device_path(dt.compile(_while, dt.TensorSpec((4,)), cache_dir=cache_dir))
    for x in (np.full(4, 0.5, np.float32), np.full(4, 30.0, np.float32), np.full(4, -9.0, np.float32)):
        hs, i, h = loop(x, profile=True)
        steps = int(i)
        # one condition scalar per test (steps + 1, or steps when max_iterations stops it), and the outputs
        # (the stack of zero steps is made on the host: nothing to copy)
        tests = steps + (0 if steps == 10 else 1)
        assert loop.last_copies["device_to_host"] == tests + (3 if steps else 2), (steps, loop.last_copies)
        assert loop.last_copies["host_to_device"] == 1 + 0            # x; the constant 0 moved once per model

    def rowwise(x):
        def step(row, acc):
            y = F.cond(F.sum(row) > 0, lambda: row * 2.0, lambda: row - 1.0)
            return y, acc + y
        ys, total = F.foreach(step, x, F.zeros((4,)))
        return ys, total
    from dyntvm.partition import cond_select
    with cond_select.off():         # the per-row cond stays a cond (as one too large to select would)
        fe = _on_device_path(dt.compile(rowwise, dt.TensorSpec(("N", 4)), cache_dir=cache_dir))
    for n in (0, 1, 9):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        _same(fe(x, profile=True), rowwise(x))
        # one branch decision per row, and the outputs (zero rows: only the total is on the device)
        assert fe.last_copies["device_to_host"] == n + (2 if n else 1)


def test_boolean_mask_on_the_device_copies_only_the_mask(cache_dir):
    """On a device boolean_mask sends its mask to the host and its indices back; the data is gathered on the
    device by the library's `take` kernel (`ir.ops.mask_gather_name`), never copied."""
    from dyntvm.ir.ops import mask_gather_name

    def masked(x):
        return F.boolean_mask(F.tanh(x), F.sum(x, axis=1) > 0) * 2.0

    model = _on_device_path(dt.compile(masked, dt.TensorSpec(("N", 64)), cache_dir=cache_dir))
    assert model.vm[mask_gather_name("float32", 2, 0)] is not None
    for n in (1, 2, 9, 200):
        x = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
        _same(model(x, profile=True), masked(x))
        c, kept = model.last_copies, int((x.sum(axis=1) > 0).sum())
        # in: x, and the indices unless none is kept; out: the mask, and the result unless it is empty
        assert (c["host_to_device"], c["device_to_host"]) == (1 + (kept > 0), 1 + (kept > 0)), c
        assert c["device_to_host_bytes"] == n + 4 * 64 * kept


# ------------------------------------------------------------------ found by the hostile review of issue 9
def test_bad_cuda_arch_in_the_environment_is_a_compile_error(monkeypatch):
    for value in ("garbage", "compute_80", "sm_1"):
        monkeypatch.setenv("DYNTVM_CUDA_ARCH", value)
        with pytest.raises(dt.CompileError, match="DYNTVM_CUDA_ARCH must look like sm_90"):
            gpu.cuda_target() if not HAS_GPU else gpu.default_arch()
    monkeypatch.setenv("DYNTVM_CUDA_ARCH", "")
    assert gpu.default_arch() == "sm_90"


@needs_nvcc
def test_a_corrupt_stub_driver_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNTVM_CACHE_DIR", str(tmp_path))
    folder = gpu.stub_dir()
    lib = os.path.join(folder, "libcuda.so.1")
    with open(lib, "r+b") as f:
        f.truncate(100)
    assert gpu.stub_dir() == folder
    from dyntvm.native import shared_object_problem
    assert shared_object_problem(lib) is None


@needs_nvcc
def test_a_hanging_nvcc_times_out(tmp_path, monkeypatch):
    if HAS_GPU:
        pytest.skip("on a GPU host the build runs in this process")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvcc").write_text("#!/bin/sh\nsleep 600\n")
    (fake / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DYNTVM_CUDA_BUILD_TIMEOUT", "20")
    import tempfile
    work = tmp_path / "work"            # the child's build folder, named in its command line: this test's child
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))
    with pytest.raises(dt.CompileError, match=r"the CUDA build took more than 20 s"):
        dt.compile(lambda x: F.exp(x) * 3.0, dt.TensorSpec(("N", 3)), target="cuda", use_cache=False)
    r = subprocess.run(["pgrep", "-f", f"dyntvm.codegen.backends.cuda.cuda_child {work}"], capture_output=True, text=True)
    assert r.stdout.strip() == "", "the build child was left running"


@needs_nvcc
def test_a_cuda_cache_entry_without_device_code_is_rebuilt(tmp_path):
    import json as _json
    from dyntvm.codegen import cache as c
    fn = lambda x: F.exp(x) * 5.0 + 1.0          # noqa: E731
    cpu = dt.compile(fn, dt.TensorSpec(("N", 3)), use_cache=False)
    dt.compile(fn, dt.TensorSpec(("N", 3)), target="cuda", cache_dir=str(tmp_path))
    (key,) = [k for k in os.listdir(tmp_path) if not k.startswith(".") and not k.startswith("cuda-stub")]
    lib = os.path.join(tmp_path, key, c.LIBRARY)
    cpu.lib.export_library(lib)                  # a CPU library, the sidecar re-fixed to match it
    side = os.path.join(tmp_path, key, c.SIDECAR)
    meta = _json.load(open(side))
    meta["sha256"], meta["size"] = c.file_digest(lib)
    _json.dump(meta, open(side, "w"))
    with pytest.warns(c.CacheWarning, match="no device code"):
        again = dt.compile(fn, dt.TensorSpec(("N", 3)), target="cuda", cache_dir=str(tmp_path))
    assert again.info["cache"] == "miss"
    again.save(str(tmp_path / "again.dtvm"))
    assert_device_code(str(tmp_path / "again.dtvm" / "kernels.so"), again.info["cuda_arch"])


def test_uncached_cuda_builds_leave_no_files(tmp_path):
    try:
        gpu.find_nvcc()
    except dt.CompileError:
        pytest.skip("needs nvcc")
    model = dt.compile(lambda x: F.exp(x) - 2.0, dt.TensorSpec(("N", 3)), target="cuda", use_cache=False)
    assert model.lib_path is None
    if not HAS_GPU:            # built in the stub child: the bytes are kept; on a GPU host the executable is
        assert FATBIN in model.lib_bytes
    model.save(str(tmp_path / "m.dtvm"))
    assert_device_code(str(tmp_path / "m.dtvm" / "kernels.so"), model.info["cuda_arch"])


def test_kernels_over_a_symbolic_grid_skip_empty_launches():
    """A CUDA launch over an empty grid fails and poisons the context (H100: ``sum(x, axis=1)`` of a [0, 4]
    input); every kernel whose grid depends on a symbol is guarded by ``if extent > 0`` on the host side
    (inserted right before TVM splits host and device code, after its ThreadSync pass)."""
    import tvm

    from dyntvm.codegen import launch_guard
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph
    seen = []
    real = launch_guard.launch_condition
    split = tvm.tirx.transform.SplitHostDevice

    def spy(f):
        cond = real(f)
        seen.append((f.attrs["global_symbol"] if f.attrs and "global_symbol" in f.attrs else "?", cond))
        return cond
    launch_guard.launch_condition = spy
    try:
        # a row reduction across threads (the softmax: syncs) over a symbolic grid, and an elementwise kernel
        regions = collect_regions(partition_graph(dt.trace(lambda x: F.softmax(F.tanh(x) * 2.0, axis=1) + 1.0,
                                                           dt.TensorSpec(("N", 300)))))
        gpu.build_cuda(build_module(regions, device_checks=True), gpu.cuda_target("sm_90"))
    finally:
        launch_guard.launch_condition = real
    guarded = {name for name, cond in seen if cond is not None and "N" in str(cond)}
    assert any("softmax" in name for name in guarded) and any("tanh" in name for name in guarded), seen
    # the build put TVM's own pass back and released the lock
    assert tvm.tirx.transform.SplitHostDevice is split and launch_guard._LOCK.acquire(blocking=False)
    launch_guard._LOCK.release()
