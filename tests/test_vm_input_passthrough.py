"""Inputs a VM program takes as they are (`vm_program.ELEMENT_ALIGNED_INPUTS`), beyond float32 and bool: every
dtype at every offset of its element alignment (views of a bytearray, as `np.frombuffer(buf, offset=k)` makes),
layouts the runtime must copy or convert (Fortran order, negative strides, read-only, size 0, size-1 axes with
odd strides, one array given twice or overlapping), and the caller's arrays never written (an input passed as it
is where it used to be copied: an in-place kernel or loop state would now write into the caller's array).
Every result against an independent numpy expression."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.examples.plain_numpy import BY_EXAMPLE
from helpers import assert_same  # tests/ is on sys.path


def _at(a: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `a` in a bytearray, its data `offset` bytes past a 64-byte boundary (writeable, as a caller's)."""
    buf = bytearray(a.nbytes + 128)
    start = (-np.frombuffer(buf, np.uint8).ctypes.data) % 64 + offset
    out = np.frombuffer(buf, a.dtype, count=a.size, offset=start).reshape(a.shape)
    out[...] = a
    return out


def _staging(model):
    return model._threads.executor.program.staging


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "int64"])
def test_every_dtype_at_every_element_aligned_offset(monkeypatch, dtype):
    """concat of two inputs, elementwise, a row sum, a reshape and a slice of an input: at each offset that is
    a multiple of the dtype's size, no copy and numpy's results; at the others (not element-aligned) a copy."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def fn(x, y):
        z = F.concat([x, y], axis=1)
        return z * z + z, F.sum(z, axis=1), F.reshape(x, (-1,)), x[1:]

    model = dt.compile(fn, dt.TensorSpec(("N", 37), dtype), dt.TensorSpec(("N", 70), dtype))
    assert model.vm_program, model.vm_program_fallback
    staging = _staging(model)
    assert staging.element_aligned
    rng = np.random.default_rng(0)
    size = np.dtype(dtype).itemsize
    tol = 1e-2 if dtype == "float16" else 1e-9
    for n in (0, 1, 6):
        x0 = (rng.standard_normal((n, 37)) * 3).astype(dtype)
        y0 = (rng.standard_normal((n, 70)) * 3).astype(dtype)
        z = np.concatenate([x0, y0], axis=1)
        want = (z * z + z, z.sum(axis=1), x0.reshape(-1), x0[1:])     # (int8: wraps in both)
        for offset in range(64):
            copies = staging.copies
            got = model(_at(x0, offset), _at(y0, (offset * 7) % 64 // size * size))
            assert_same(got, want, rtol=tol, atol=tol, what=f"{dtype} N={n} offset {offset}")
            aligned = offset % size == 0
            assert staging.copies == copies + (0 if aligned or not n else 1), f"{dtype} offset {offset}"


def test_layouts_the_runtime_copies_or_converts(monkeypatch):
    """Fortran order, negative strides, a transposed view, read-only data, size 0, size-1 axes with strides
    that are not the compact ones, a broadcast view, big-endian data: numpy's results; one array passed as both
    arguments, and two overlapping views of one buffer, too."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    model = dt.compile(lambda x: (F.relu(x) * 2.0, F.sum(x, axis=0), F.reshape(x, (-1,))),
                       dt.TensorSpec(("N", "K")))
    assert model.vm_program, model.vm_program_fallback
    base = np.arange(20 * 40, dtype=np.float32).reshape(20, 40) / 7 - 30
    readonly = np.frombuffer(base.tobytes(), np.float32).reshape(20, 40)
    for name, x in {"fortran": np.asfortranarray(base), "rows reversed": base[::-1],
                    "columns reversed": base[:, ::-1], "strided": base[::2, ::3], "transposed": base.T,
                    "read-only": readonly, "size 0": base[:0], "no columns": base[:, :0],
                    "one column": base[:, 3:4], "size-1 axis, odd stride": base[:1].T,
                    "broadcast": np.broadcast_to(base[0], (5, 40)), "big-endian": base.astype(">f4")}.items():
        want = (np.maximum(x, 0) * 2, x.sum(axis=0), np.ascontiguousarray(x).reshape(-1))
        assert_same(model(x), tuple(np.asarray(w, np.float32) for w in want), rtol=1e-5, atol=1e-5, what=name)

    pair = dt.compile(lambda a, b: (a + b, a * b), dt.TensorSpec(("N",)), dt.TensorSpec(("N",)))
    assert pair.vm_program, pair.vm_program_fallback
    for offset in (0, 4, 20):
        a = _at(np.arange(101, dtype=np.float32) - 50, offset)
        assert_same(pair(a, a), (a + a, a * a), what=f"one array twice, offset {offset}")
        assert_same(pair(a[1:], a[:-1]), (a[1:] + a[:-1], a[1:] * a[:-1]), what=f"overlapping, offset {offset}")


def _unchanged(model, inputs, what: str) -> None:
    for offset in (0, 4, 16):
        args = [_at(x, offset) for x in inputs]
        before = [a.copy() for a in args]
        for _ in range(2):
            model(*args)
        for k, (a, b) in enumerate(zip(args, before)):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: input {k} written (offset {offset})")


def test_the_callers_inputs_are_never_written(monkeypatch):
    """Loop states that start as an input (a while_loop's carried value, the LSTM example's h0 and c0) and a
    cond returning an input: the caller's arrays are read, never written, at offsets passed without a copy."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def halve(x, n):
        _, y = F.while_loop(lambda i, y: i < n, lambda i, y: [i + 1, y * 0.5 + 1.0], [np.int64(0), x])
        return y, F.cond(n > 1, lambda: x, lambda: x * 2.0)

    model = dt.compile(halve, dt.TensorSpec(("N", 16)), dt.TensorSpec((), "int64"))
    assert model.vm_program, model.vm_program_fallback
    x0 = np.linspace(-3, 3, 5 * 16, dtype=np.float32).reshape(5, 16)
    for n in (0, 1, 3):
        y = x0.copy()
        for _ in range(n):
            y = y * 0.5 + 1.0
        assert_same(model(_at(x0, 4), np.int64(n)), (y, x0 if n > 1 else x0 * 2.0), rtol=1e-6, atol=1e-6)
        _unchanged(model, [x0, np.array(n, np.int64)], f"while_loop n={n}")

    ex = examples.get("lstm")
    lstm = dt.compile(ex.fn, *ex.specs)
    assert lstm.vm_program, lstm.vm_program_fallback
    inputs = ex.make_inputs(np.random.default_rng(1), T=5, B=2)
    assert_same(lstm(*[_at(x, 16) for x in inputs]), BY_EXAMPLE["lstm"](*inputs), rtol=1e-4, atol=1e-4)
    _unchanged(lstm, inputs, "lstm")
