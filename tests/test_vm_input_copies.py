"""Inputs of a VM program call without copies: the kernels of a library with a program assume only element
alignment (`codegen/backends/cpu/cpu_alignment.py`, `vm_program.ELEMENT_ALIGNED_INPUTS`), so a C-contiguous,
writeable numpy input goes to the VM as it is wherever its data starts; the others (not contiguous, read-only,
not element-aligned) are copied into the runner's kept buffers (`runtime/tensors.InputStaging.copies` counts
them). Results equal numpy at every offset, including the kernels' vector loads (64 floats a row)."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.errors import InputError
from dyntvm.examples.plain_numpy import BY_EXAMPLE
from dyntvm.ir.vm_program import ELEMENT_ALIGNED_FUNCTION
from helpers import assert_same  # tests/ is on sys.path

W = (np.arange(64 * 32, dtype=np.float32).reshape(64, 32) % 7 - 3) / 8


def _at(a: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `a` whose data starts `offset` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    off = (-raw.ctypes.data) % 64 + offset
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 64 == offset or not a.size
    return out


def _fn(x, m):
    y = F.relu(x * 2.0 + 1.0)                            # vectorized elementwise over rows of 64
    kept = F.boolean_mask(y, m)
    return F.matmul(kept, W), F.sum(y, axis=1), kept


def _want(x, m):
    y = np.maximum(x * 2.0 + 1.0, 0.0)
    return y[m] @ W, y.sum(axis=1), y[m]


@pytest.fixture
def model(monkeypatch):
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    m = dt.compile(_fn, dt.TensorSpec(("N", 64)), dt.TensorSpec(("N",), "bool"))
    assert m.vm_program, m.vm_program_fallback
    return m


def _staging(model):
    return model._threads.executor.program.staging


@pytest.mark.parametrize("n", [0, 1, 7, 33])
def test_misaligned_contiguous_inputs_are_not_copied(model, n):
    """Every offset of a float32 array (4 to 60 bytes past 64) and of the bool mask (1 to 63) passes without a
    copy; the result equals numpy's."""
    rng = np.random.default_rng(n)
    staging = _staging(model)
    assert staging.element_aligned and "@" + ELEMENT_ALIGNED_FUNCTION in model.lib.as_text()
    x0, m0 = rng.standard_normal((n, 64)).astype(np.float32), rng.random(n) < 0.5
    for offset in (0, 4, 8, 16, 32, 60):
        x, m = _at(x0, offset), _at(m0, (offset * 5 + 1) % 64)
        copies, calls = staging.copies, model.vm_program_calls
        assert_same(model(x, m), _want(x0, m0), rtol=1e-5, atol=1e-5, what=f"offset {offset}")
        assert model.vm_program_calls == calls + 1
        assert staging.copies == copies          # (n = 0: an empty tensor, no copy either)


def test_inputs_the_kernels_cannot_take_as_they_are_are_copied(model):
    """A strided view, a read-only array and a float32 array starting one byte off its element alignment are
    copied (one copy each); a wrong dtype or rank is still the checker's error naming the input."""
    rng = np.random.default_rng(0)
    x0, m0 = rng.standard_normal((9, 64)).astype(np.float32), rng.random(9) < 0.5
    staging = _staging(model)
    wide = np.repeat(x0, 2, axis=1)
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous
    readonly = x0.copy()
    readonly.flags.writeable = False
    raw = np.empty(x0.nbytes + 65, np.uint8)
    off = (-raw.ctypes.data) % 64 + 1
    unaligned = raw[off:off + x0.nbytes].view(np.float32).reshape(x0.shape)
    unaligned[...] = x0
    assert not unaligned.flags.aligned
    for x in (strided, readonly, unaligned):
        copies = staging.copies
        assert_same(model(x, m0), _want(x0, m0), rtol=1e-5, atol=1e-5)
        assert staging.copies == copies + 1
    with pytest.raises(InputError, match=r"input 0 .*dtype is float64, expected float32"):
        model(x0.astype(np.float64), m0)
    with pytest.raises(InputError, match=r"input 0 .*rank is 1"):
        model(x0[0], m0)
    with pytest.raises(InputError, match=r"input 1 .*axis 0 is N=8, but N=9"):
        model(x0, m0[:8])


def test_detection_with_misaligned_inputs(monkeypatch):
    """The detection example (masks, an MLP's GEMMs, topk) at inputs 4, 16 and 32 bytes past a 64-byte boundary:
    no copy, results equal plain numpy; the same inputs aligned give the same results."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    ex = examples.get("detection")
    model = dt.compile(ex.fn, *ex.specs)
    assert model.vm_program, model.vm_program_fallback
    staging = _staging(model)
    for n in (1, 200, 37):
        scores, boxes = ex.make_inputs(np.random.default_rng(n), N=n)
        want = BY_EXAMPLE["detection"](scores, boxes)
        for offset in (0, 4, 16, 32):
            copies = staging.copies
            got = model(_at(scores, offset), _at(boxes, (offset + 8) % 64))
            assert_same(got, want, rtol=1e-4, atol=1e-4, what=f"N={n} offset {offset}")
            assert staging.copies == copies


def test_without_the_switch_misaligned_inputs_are_copied(monkeypatch):
    """`vm_program.ELEMENT_ALIGNED_INPUTS` off (part of the cache key): the library does not say its kernels take
    any alignment, and an input not 64-byte aligned is copied (one per input and call); aligned ones are not."""
    from dyntvm.codegen import vm_program
    monkeypatch.setattr(vm_program, "ELEMENT_ALIGNED_INPUTS", False)
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    model = dt.compile(_fn, dt.TensorSpec(("N", 64)), dt.TensorSpec(("N",), "bool"))
    assert model.vm_program, model.vm_program_fallback
    staging = _staging(model)
    assert not staging.element_aligned and ELEMENT_ALIGNED_FUNCTION not in model.lib.as_text()
    rng = np.random.default_rng(3)
    x0, m0 = rng.standard_normal((5, 64)).astype(np.float32), rng.random(5) < 0.5
    for offset, copied in ((0, 0), (16, 2), (4, 2)):
        copies = staging.copies
        assert_same(model(_at(x0, offset), _at(m0, offset)), _want(x0, m0), rtol=1e-5, atol=1e-5)
        assert staging.copies == copies + copied


def test_a_program_with_row_views_of_inputs_keeps_the_copies(monkeypatch):
    """A foreach run by the program row by row (a `cond` in its body, kept as a cond) takes each row as a view made
    zero-offset by TVM's `ensure_zero_offset`, which requires a 64-byte aligned base: such a library does not say
    its kernels take any alignment, so inputs not 64-byte aligned are copied (7 rows of 16 bytes: row 4 starts 64
    bytes in). Results equal numpy at offsets 0 and 16."""
    from dyntvm.partition import cond_select
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    monkeypatch.setattr(cond_select, "SELECT_WORK", -1)

    def fn(x, flags):
        def body(rows, states):
            row, flag = rows
            y = F.cond(flag, lambda: F.relu(row) * 2.0, lambda: row - 1.0)
            return [y], [states[0] + F.sum(y)]
        (ys,), (total,) = F.foreach(body, [x, flags], [F.zeros(())])
        return ys, total

    model = dt.compile(fn, dt.TensorSpec(("T", 4)), dt.TensorSpec(("T",), "bool"))
    assert model.vm_program, model.vm_program_fallback
    staging = _staging(model)
    assert not staging.element_aligned and ELEMENT_ALIGNED_FUNCTION not in model.lib.as_text()
    rng = np.random.default_rng(5)
    x0, f0 = rng.standard_normal((7, 4)).astype(np.float32), rng.random(7) < 0.5
    ys = np.where(f0[:, None], np.maximum(x0, 0) * 2.0, x0 - 1.0)
    for offset, copied in ((0, 0), (16, 2)):
        copies = staging.copies
        assert_same(model(_at(x0, offset), _at(f0, offset)), (ys, ys.sum()), rtol=1e-5, atol=1e-5)
        assert staging.copies == copies + copied


def test_views_of_unaligned_inputs(monkeypatch):
    """An input given back, reshaped, expanded and squeezed, and sliced (views the VM makes at byte offset 0, or
    a slice kernel) at offsets 4 to 52: no copy, results equal numpy; the input and its reshape given back are the
    caller's data, as the executor gives them back."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def fn(x, m):
        return x, F.reshape(x, (-1,)), F.squeeze(F.expand_dims(x, 0), 0) * 2.0, \
            F.reshape(F.boolean_mask(x, m), (-1,)), x[1:3]

    model = dt.compile(fn, dt.TensorSpec(("N", 3)), dt.TensorSpec(("N",), "bool"))
    assert model.vm_program, model.vm_program_fallback
    staging = _staging(model)
    assert staging.element_aligned
    rng = np.random.default_rng(2)
    for n in (3, 8, 30):
        x0, m0 = rng.standard_normal((n, 3)).astype(np.float32), rng.random(n) < 0.5
        for offset in (0, 4, 16, 52):
            x, copies = _at(x0, offset), staging.copies
            got = model(x, _at(m0, offset))
            assert_same(got, (x0, x0.reshape(-1), x0 * 2.0, x0[m0].reshape(-1), x0[1:3]))
            assert staging.copies == copies
            x[...] = 7.0
            assert (got[0] == 7.0).all() and (got[1] == 7.0).all()
