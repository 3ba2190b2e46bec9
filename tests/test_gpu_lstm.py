"""The LSTM step on CUDA in fewer, faster kernels (`codegen/backends/cuda/gpu_fuse.py`: elementwise groups that
FuseOps leaves apart merged into one kernel; `gpu_gemv.py`: `SmallMMatmul`, a matmul over a one-var batch of
rows split over the columns and K).

Without a GPU: the kernel count of the CUDA LSTM body (built in this process: CUDA source), the rule's choice
(the step's matmul, not the hoisted ``T * B`` input projection), the merged Relax module's results on the CPU
against numpy, and device code from nvcc for odd K / N. With a GPU (skipped here): the LSTM and small-M
matmuls compiled for CUDA against numpy, with each switch on and off."""
import contextlib
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.codegen.backends.cuda import gpu, gpu_fuse, gpu_gemv
from test_cuda import HAS_GPU, needs_gpu, needs_nvcc


@contextlib.contextmanager
def switches(merge=True, small_m=True):
    old = gpu_fuse.MERGE_ELEMENTWISE, gpu_gemv.SMALL_M_GEMV
    gpu_fuse.MERGE_ELEMENTWISE, gpu_gemv.SMALL_M_GEMV = merge, small_m
    try:
        yield
    finally:
        gpu_fuse.MERGE_ELEMENTWISE, gpu_gemv.SMALL_M_GEMV = old


def _regions_module(fn, *specs):
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph
    graph = partition_graph(dt.trace(fn, *specs))
    return graph, build_module(collect_regions(graph), device_checks=True)


def _sources(module) -> str:
    out = []
    with contextlib.suppress(Exception):
        out.append(module.inspect_source())
    return "\n".join(out + [_sources(m) for m in module.imports])


def _kernels(fn, *specs) -> list:
    """The __global__ kernels of the program's CUDA build (this process: CUDA source where there is no GPU)."""
    from dyntvm.codegen.compiled_loops import loop_specs
    graph, mod = _regions_module(fn, *specs)
    ex = gpu.build_cuda(mod, gpu.cuda_target("sm_90"), None, loop_specs(graph, "cuda"))
    return sorted(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", _sources(ex.mod))))


@needs_nvcc
@pytest.mark.skipif(HAS_GPU, reason="counts the kernels in CUDA source, which a GPU host compiles away")
def test_the_cuda_lstm_step_is_two_kernels():
    """The device loop's body: the step's matmul (+ x W and the bias) and one kernel for the gates, the cell and
    h (three before: c is also a state the step returns, so FuseOps kept h's kernel apart)."""
    ex = examples.get("lstm")
    with switches(merge=True):
        body = [k for k in _kernels(ex.fn, *ex.specs) if "__loop__" in k]
    with switches(merge=False):
        before = [k for k in _kernels(ex.fn, *ex.specs) if "__loop__" in k]
    assert len(body) == 2, body
    assert len(before) == 3, before
    assert any("merged" in k for k in body)


@needs_nvcc
@pytest.mark.skipif(HAS_GPU, reason="counts the kernels in CUDA source, which a GPU host compiles away")
def test_wheres_stay_fused_unless_their_condition_is_broadcast():
    """On CUDA relu / clip are ``where``s of a condition shaped like their result: they stay in the matmul's
    kernel. A ``where`` whose condition is broadcast (one bool per row: a loop body's cond as a select) is a
    kernel of its own (`gpu_select`: vectorized, TVM's CUDA codegen prints it as code nvcc rejects)."""
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    relu = _kernels(lambda x: F.relu(F.matmul(x, w) + 1.0), dt.TensorSpec(("B", 64)))
    clip = _kernels(lambda x: F.clip(F.matmul(x, w), 0.0, 6.0), dt.TensorSpec(("B", 64)))
    assert len(relu) == 1 and len(clip) == 1, (relu, clip)
    rows = _kernels(lambda x: F.where(F.sum(x, axis=1, keepdims=True) > 0, F.matmul(x, w), F.tanh(F.matmul(x, w))),
                    dt.TensorSpec(("B", 64)))
    assert any(k.startswith("where") for k in rows), rows


def _fused(fn, *specs):
    import tvm
    target = gpu.cuda_target("sm_90")
    _graph, mod = _regions_module(fn, *specs)
    with target:
        return tvm.transform.Sequential(gpu.fuse_passes(target) + [gpu_gemv.mark_pass()])(mod), target


def test_the_small_m_rule_takes_the_step_matmul_only():
    """Marked and scheduled: the step's [B, 256] x [256, 1024] (B: one var); not the input projection hoisted
    out of the loop (its rows are T * B), which dlight's Matmul keeps."""
    ex = examples.get("lstm")
    with switches():
        mod, target = _fused(ex.fn, *ex.specs)
        rule = gpu_gemv.small_m_rule()
        step = [gv for gv, f in mod.functions_items() if "matmul_add" in gv.name_hint]
        assert step and mod[step[0]].attrs.get(gpu_gemv.ATTR, False)
        with target:
            sch = rule.apply(mod[step[0]], target, False)
        assert sch is not None
        text = sch.mod["main"].script()
        assert 'thread="threadIdx.y"' in text and 'thread="blockIdx.y"' in text and "T.vectorized" in text
        assert not (mod["matmul1"].attrs or {}).get(gpu_gemv.ATTR, False)
        with target:
            assert rule.apply(mod["matmul1"], target, False) is None
    with switches(small_m=False), target:
        assert rule.apply(mod[step[0]], target, False) is None


def test_the_merged_module_equals_numpy_on_the_cpu():
    """The Relax module after the CUDA fusion passes (the two elementwise groups merged into one PrimFunc with
    two outputs), built for the CPU: the LSTM body == numpy at B = 0, 1, 3."""
    import tvm
    from tvm.runtime.vm import VirtualMachine
    ex = examples.get("lstm")
    with switches():
        mod, _ = _fused(ex.fn, *ex.specs)
    from tvm import relax
    body = next(gv for gv, f in mod.functions_items() if gv.name_hint.endswith("body_r0")
                and isinstance(f, relax.Function))
    assert any("merged" in gv.name_hint for gv, _ in mod.functions_items())
    vm = VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    W, U, b = examples.lstm.W, examples.lstm.U, examples.lstm.b
    rng = np.random.default_rng(3)
    H = examples.lstm.HIDDEN
    for batch in (0, 1, 3):
        h = rng.standard_normal((batch, H)).astype(np.float32)
        xw = rng.standard_normal((batch, 4 * H)).astype(np.float32)
        c = rng.standard_normal((batch, H)).astype(np.float32)
        names = [p.name for p in mod[body].params]
        feed = {"v5": h, "v9_t": xw, "v6": c}
        assert sorted(names) == sorted(feed), names
        got = vm[body.name_hint](*[tvm.runtime.tensor(feed[n]) for n in names])
        z = h @ U + xw + b
        i, f, g, o = np.split(z.astype(np.float64), 4, axis=-1)
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c_ref = sig(f) * c + sig(i) * np.tanh(g)
        h_ref = sig(o) * np.tanh(c_ref)
        np.testing.assert_allclose(got[0].numpy(), c_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[1].numpy(), h_ref, rtol=1e-5, atol=1e-5)


def _matmul_program(k, n):
    rng = np.random.default_rng(k * 1000 + n)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return (lambda x: F.tanh(F.matmul(x, w) + bias)), w, bias


def test_the_small_m_rule_takes_a_static_m_up_to_16():
    """A static batch of 2..16 rows too (a model specialized for B = 16 by a tuning log's hints); one row is
    dlight's GEMV's, 17 Matmul's."""
    fn, _w, _b = _matmul_program(64, 96)
    taken = {}
    for m in (1, 4, 16, 17):
        with switches():
            mod, target = _fused(fn, dt.TensorSpec((m, 64)))
            funcs = [f for _gv, f in mod.functions_items() if getattr(f, "attrs", None) is not None
                     and f.attrs.get(gpu_gemv.ATTR, False)]
            with target:
                taken[m] = any(gpu_gemv.small_m_rule().apply(f, target, False) is not None for f in funcs)
    assert taken == {1: False, 4: True, 16: True, 17: False}


@needs_nvcc
def test_odd_k_and_n_build_device_code(tmp_path):
    """K and N that the tile does not divide (predicated loops): nvcc compiles the kernel for sm_90."""
    fn, _w, _b = _matmul_program(67, 45)
    with switches():
        mod, target = _fused(fn, dt.TensorSpec(("M", 67)))
        funcs = [f for _gv, f in mod.functions_items() if hasattr(f, "attrs") and f.attrs is not None
                 and f.attrs.get(gpu_gemv.ATTR, False)]
        assert funcs
        with target:
            assert gpu_gemv.small_m_rule().apply(funcs[0], target, False) is not None
        model = dt.compile(fn, dt.TensorSpec(("M", 67)), target="cuda:sm_90", use_cache=False)
    model.save(str(tmp_path / "m.dtvm"))
    blob = open(tmp_path / "m.dtvm" / "kernels.so", "rb").read()
    assert b"sm_90" in blob and b"__global__" not in blob


# ------------------------------------------------------------------------------------------- on a GPU
@needs_gpu
@pytest.mark.parametrize("merge,small_m", [(True, True), (False, False), (True, False), (False, True)])
def test_the_cuda_lstm_equals_numpy(merge, small_m):
    ex = examples.get("lstm")
    W, U, b = examples.lstm.W, examples.lstm.U, examples.lstm.b
    with switches(merge, small_m):
        model = dt.compile(ex.fn, *ex.specs, target="cuda", use_cache=False)
    rng = np.random.default_rng(1)
    for T, B in ((0, 1), (1, 1), (7, 3), (5, 16), (64, 1)):
        xs, h0, c0 = ex.make_inputs(rng, T=T, B=B)
        h0 = rng.standard_normal(h0.shape).astype(np.float32)
        c0 = rng.standard_normal(c0.shape).astype(np.float32)
        hs, h = model(xs, h0, c0)
        hh, cc, ref = h0.astype(np.float64), c0.astype(np.float64), []
        for t in range(T):
            z = xs[t] @ W + hh @ U + b
            i, f, g, o = np.split(z, 4, axis=-1)
            sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
            cc = sig(f) * cc + sig(i) * np.tanh(g)
            hh = sig(o) * np.tanh(cc)
            ref.append(hh)
        ref_hs = np.stack(ref) if ref else np.zeros((0, B, examples.lstm.HIDDEN))
        np.testing.assert_allclose(np.asarray(hs), ref_hs, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(np.asarray(h), hh, rtol=2e-4, atol=2e-4)


@needs_gpu
@pytest.mark.parametrize("k,n", [(256, 1024), (67, 45), (33, 129)])
@pytest.mark.parametrize("small_m", [True, False])
def test_small_m_matmuls_equal_numpy(k, n, small_m):
    fn, w, bias = _matmul_program(k, n)
    with switches(small_m=small_m):
        model = dt.compile(fn, dt.TensorSpec(("M", k)), target="cuda", use_cache=False)
    rng = np.random.default_rng(k + n)
    for m in (0, 1, 3, 16):
        x = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(model(x)), np.tanh(x.astype(np.float64) @ w + bias),
                                   rtol=1e-4, atol=1e-4)
    for m in (3, 16):                        # a static M (the rule's other case)
        with switches(small_m=small_m):
            fixed = dt.compile(fn, dt.TensorSpec((m, k)), target="cuda", use_cache=False)
        x = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(fixed(x)), np.tanh(x.astype(np.float64) @ w + bias),
                                   rtol=1e-4, atol=1e-4)


@needs_nvcc
@pytest.mark.skipif(HAS_GPU, reason="the build child runs only where there is no GPU")
def test_the_build_child_gets_the_switches(tmp_path):
    """Without a GPU the CUDA build runs in a child process: it is given this process's switches (and the
    compile cache keys them), so a flipped switch builds the other kernels."""
    ex = examples.get("lstm")
    found = {}
    for merge in (True, False):
        with switches(merge=merge):
            model = dt.compile(ex.fn, *ex.specs, target="cuda:sm_90", cache_dir=str(tmp_path / "cache"))
        model.save(str(tmp_path / f"m{merge}.dtvm"))
        found[merge] = b"fused_merged" in open(tmp_path / f"m{merge}.dtvm" / "kernels.so", "rb").read()
    assert found == {True: True, False: False}
