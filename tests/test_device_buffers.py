"""Device buffers the executor fills itself come from a pool (`runtime/placement.BufferPool`): on a GPU each fresh
buffer is a cudaMalloc and each dropped one a cudaFree that waits for the device. Run on the CPU's device path
(`CompiledModel._use_device_path(tvm.cpu())`, as a GPU runs it): a repeated call with the same sizes allocates
nothing, and a buffer anything still holds (a Python name, a view, the same tensor returned by a kernel) is
never handed out again. Results are checked against independent numpy expressions."""
import sys

import numpy as np
import pytest
import tvm

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.codegen.backends.cuda import gpu
from dyntvm.runtime.placement import BufferPool
from helpers import assert_same

DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not gpu.gpu_present(), reason="needs a CUDA GPU"))]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("device-buffers-cache"))


def _device_path(model):
    model._use_device_path(tvm.cpu())
    return model


@pytest.mark.parametrize("device", DEVICES)
def test_a_buffer_is_handed_out_again_only_when_nothing_holds_it(device):
    pool = BufferPool(tvm.device(device))
    a = pool.empty((4,), "float32")
    assert pool.empty((4,), "float32") is not a          # `a` is held here
    assert pool.allocs == 2
    a_id = a.data_ptr()
    view = a._create_view((2,), "float32", 8)             # a TVM reference: the view keeps `a`'s memory
    del a
    b = pool.empty((4,), "float32")
    assert b.data_ptr() != a_id and pool.allocs == 2        # the second buffer (free again), not the viewed one
    del b
    c = pool.empty((4,), "float32")
    d = pool.empty((4,), "float32")
    assert a_id not in (c.data_ptr(), d.data_ptr()) and pool.allocs == 3
    del view, c, d
    assert pool.empty((4,), "float32").data_ptr() == a_id     # free once the view is gone (the first kept)
    assert pool.allocs == 3
    assert pool.empty((4,), "int32").dtype == "int32" and pool.allocs == 4   # dtype is part of the key


def test_a_tracer_reading_locals_does_not_hold_buffers():
    """A debugger or coverage tool that reads each frame's locals (`frame.f_locals` keeps them in the frame's dict)
    must not make the pool's own frames look like holders: a CI run where something traced the process allocated
    every buffer afresh. A name the caller really holds still counts."""
    def tracer(frame, event, arg):
        frame.f_locals
        return tracer

    pool = BufferPool(tvm.cpu())
    sys.settrace(tracer)
    try:
        held = pool.empty((4,), "float32")
        pool.empty((4,), "float32")                       # dropped at once: free again
        again = pool.empty((4,), "float32")
        allocs = pool.allocs
        held_ptr, again_ptr = held.data_ptr(), again.data_ptr()
    finally:
        sys.settrace(None)
    assert allocs == 2 and again_ptr != held_ptr


def test_a_frame_evaluation_hook_does_not_hold_buffers():
    """Under a PEP 523 frame-evaluation hook (torch.compile's dynamo installs one) CPython 3.11 calls Python
    functions without moving their arguments: each call level holds one more reference. Checking a buffer through
    Python helper functions then counted them as holders (every buffer allocated afresh)."""
    torch = pytest.importorskip("torch")
    import torch._dynamo

    def use_pool():
        pool = BufferPool(tvm.cpu())
        held = pool.empty((4,), "float32")
        pool.empty((4,), "float32")                       # dropped at once: free again
        again = pool.empty((4,), "float32")
        return pool.allocs, held.data_ptr() != again.data_ptr()

    assert torch._dynamo.run(use_pool)() == (2, True)


def test_the_pool_keeps_at_most_its_byte_budget():
    pool = BufferPool(tvm.cpu(), max_bytes=64, per_shape=2)
    pool.empty((8,), "float32")                            # 32 bytes, kept
    pool.empty((4,), "float32")                            # 16, kept
    pool.empty((8,), "int32")                              # 32: over 64, the least recently used shape goes
    assert pool.bytes <= 64 and ((8,), "float32") not in pool.buffers
    big = pool.empty((100,), "float32")                    # larger than the budget: not kept at all
    assert all(t is not big for kept in pool.buffers.values() for t in kept)
    for _ in range(4):                                     # held ones: at most `per_shape` are kept
        held = [pool.empty((2,), "float32") for _ in range(3)]
    assert len(pool.buffers[((2,), "float32")]) == 2 and len(held) == 3
    pool = BufferPool(tvm.cpu(), max_bytes=64, per_shape=8)
    held = [pool.empty((12,), "float32") for _ in range(8)]   # 48 bytes each: one shape alone over the budget
    assert pool.bytes <= 64 and len(pool.buffers[((12,), "float32")]) == 1


def test_repeated_calls_allocate_no_device_buffers(cache_dir):
    ex = examples.get("lstm")
    lstm = _device_path(dt.compile(ex.fn, *ex.specs, cache_dir=cache_dir))
    for t, b in ((7, 2), (7, 2), (7, 2), (3, 1), (7, 2)):
        inputs = ex.make_inputs(np.random.default_rng(t * 10 + b), T=t, B=b)
        before = lstm.device_allocations
        assert_same(lstm(*inputs), ex.fn(*inputs))
        if (t, b) == (7, 2) and before:                   # sizes seen before: every buffer comes from the pool
            assert lstm.device_allocations == before, (t, b)
    assert lstm.device_allocations > 0


@pytest.mark.skipif(not gpu.gpu_present(), reason="needs a CUDA GPU")
def test_repeated_calls_on_a_gpu_allocate_no_device_buffers(cache_dir):
    masked = dt.compile(lambda x: F.boolean_mask(F.tanh(x), F.sum(x, axis=1) > 0) * 2.0, dt.TensorSpec(("N", 8)),
                        target="cuda", cache_dir=cache_dir)
    rng = np.random.default_rng(0)
    xs = {n: rng.standard_normal((n, 8)).astype(np.float32) for n in (1, 9)}
    for n in (9, 9, 9, 1, 9):                               # the same data: the same kept rows, the same sizes
        x = xs[n]
        before = masked.device_allocations
        np.testing.assert_allclose(masked(x), np.tanh(x[x.sum(axis=1) > 0]) * 2.0, rtol=1e-5, atol=1e-6)
        if n == 9 and before:
            assert masked.device_allocations == before


def test_two_inputs_of_one_shape_get_two_buffers(cache_dir):
    model = _device_path(dt.compile(lambda x, y: (x - y) * 2.0, dt.TensorSpec(("N",)), dt.TensorSpec(("N",)),
                                    cache_dir=cache_dir))
    rng = np.random.default_rng(0)
    for n in (5, 5, 1, 0, 5):
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(model(x, y), (x - y) * 2.0, rtol=1e-6)


def _carry_rows(xs):
    """Each row becomes the next step's state (the step returns its row input as a state: the same tensor)."""
    def step(row, prev):
        return prev + row, row
    ys, last = F.foreach(step, xs, F.zeros((3,)))
    return ys, last


@pytest.mark.parametrize("profile", [False, True], ids=["plain", "step-by-step"])
def test_a_loop_row_kept_as_a_state_is_not_overwritten(cache_dir, profile):
    model = _device_path(dt.compile(_carry_rows, dt.TensorSpec(("T", 3)), cache_dir=cache_dir))
    for t in (0, 1, 2, 6, 6):
        xs = np.random.default_rng(t).standard_normal((t, 3)).astype(np.float32)
        prev = np.vstack([np.zeros((1, 3), np.float32), xs[:-1]]) if t else np.zeros((0, 3), np.float32)
        ys, last = model(xs, profile=profile)
        np.testing.assert_allclose(ys, prev + xs, rtol=1e-6)
        np.testing.assert_array_equal(last, xs[-1] if t else np.zeros(3, np.float32))


def test_a_mask_shared_by_dynamic_ops_crosses_once_per_call(cache_dir):
    """Three boolean_masks and a nonzero read one mask: it goes to the host once per call and its indices come
    back once (a host copy is remembered for the call only: the next call, with other data, reads again)."""
    def shared(x, y):
        keep = F.sum(x, axis=1) > 0
        a, b = F.boolean_mask(x, keep), F.boolean_mask(y, keep)
        return a * 2.0, F.tanh(b), F.boolean_mask(x + y, keep), F.nonzero(keep)
    model = _device_path(dt.compile(shared, dt.TensorSpec(("N", 4)), dt.TensorSpec(("N", 4)), cache_dir=cache_dir))
    rng = np.random.default_rng(3)
    for n in (7, 7, 1, 0, 12):
        x, y = rng.standard_normal((2, n, 4)).astype(np.float32)
        keep = x.sum(axis=1) > 0
        got = model(x, y, profile=True)
        want = (x[keep] * 2.0, np.tanh(y[keep]), (x + y)[keep], np.stack(np.nonzero(keep), axis=1))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.reshape(g.shape) if g.size == w.size else w, rtol=1e-6)
            assert g.flags.writeable
        c, kept = model.last_copies, int(keep.sum())
        # in: x, y, and the indices once (none when nothing is kept); out: the mask once, and the 3 device outputs
        # (empty tensors are not copied: nothing at all for N = 0)
        assert c["host_to_device"] == (2 + (kept > 0) if n else 0), (n, c)
        assert c["device_to_host"] == (1 + 3 * (kept > 0) if n else 0), (n, c)     # nonzero runs on the host
