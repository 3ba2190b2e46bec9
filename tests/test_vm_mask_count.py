"""boolean_mask and nonzero in the VM program (`codegen/vm_dynamic.py`): the count kernel returns the count, which
the program binds as a dim (`vm_dynamic.COUNT_RETURNED`: no int64[1] tensor read as a shape), and repeated
symbolic shapes are made once per sequence (`codegen/shape_reuse.py`). Results equal independent numpy
expressions (``x[m]``, ``np.flatnonzero``) for masks all false, all true and mixed, n = 0, 1 and odd, 1-d and
n-d data of bool / int / float dtypes, masks shared by several boolean_masks (counted once), inside cond branches
and foreach bodies; no Python callback runs."""
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.vm_program import python_callbacks
from helpers import assert_same, vm_calls  # tests/ is on sys.path


def _main(model) -> str:
    return [f for f in model.lib.as_text().split("\n@") if f.startswith("dyntvm_main:")][0]


def _masks(n: int, seed: int):
    """Selectors of n rows: all false, all true, alternating, random."""
    rng = np.random.default_rng(seed)
    return [np.full(n, -1.0, np.float32), np.full(n, 1.0, np.float32),
            np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32), rng.standard_normal(n).astype(np.float32)]


def _data(dtype: str, shape: tuple, seed: int):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return (rng.standard_normal(shape) * 10).astype(dtype)


@pytest.mark.parametrize("dtype,rest", [("float32", ()), ("int32", (3, 2)), ("bool", ()), ("float64", (4,)),
                                        ("int64", ())])
def test_shared_mask_and_its_nonzero_equal_numpy(monkeypatch, dtype, rest):
    """Two boolean_masks and a nonzero of one mask: one count kernel, its result stored in the shape heap (no
    ``tensor_to_shape``); every selector and size equals numpy; no callback."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def fn(x, y, s):
        keep = s > 0.0
        return F.boolean_mask(x, keep), F.boolean_mask(y * 2.0, keep), F.nonzero(keep)

    model = dt.compile(fn, dt.TensorSpec(("N",) + rest, dtype), dt.TensorSpec(("N",)), dt.TensorSpec(("N",)))
    assert model.vm_program, model.vm_program_fallback
    assert not python_callbacks(model.graph)
    main = _main(model)
    assert len(re.findall(r"call  dyntvm_vm_count_bool ", main)) == 1, main
    assert "tensor_to_shape" not in main, main
    for n in (0, 1, 7):
        x, y = _data(dtype, (n,) + rest, n), _data("float32", (n,), n + 1)
        for s in _masks(n, n):
            calls = model.vm_program_calls
            got = model(x, y, s)
            assert model.vm_program_calls == calls + 1
            keep = s > 0
            assert_same(got, (x[keep], y[keep] * 2.0, np.flatnonzero(keep)[None, :].astype(np.int64)),
                        what=f"n={n} kept={int(keep.sum())}")


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_nonzero_of_a_non_bool_tensor_equals_numpy(monkeypatch, dtype):
    """nonzero of a computed tensor (its count: entries != 0) and a boolean_mask of its `!= 0`: equal numpy."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def fn(x):
        v = F.logical_not(x) if dtype == "bool" else x * 3
        return F.nonzero(v)

    model = dt.compile(fn, dt.TensorSpec(("N",), dtype))
    assert model.vm_program, model.vm_program_fallback
    assert not python_callbacks(model.graph)
    for n in (0, 1, 9):
        for x in (_data(dtype, (n,), n), np.zeros(n, dtype), np.ones(n, dtype)):
            v = ~x if dtype == "bool" else x * 3
            assert_same(model(x), np.flatnonzero(v)[None, :].astype(np.int64), what=f"n={n}")


def test_masks_in_cond_branches_and_foreach_bodies(monkeypatch):
    """A mask in each branch of a cond (a count bound in a branch) and a mask of each row in a foreach body
    (summed: the body's outputs have static shapes): equal numpy at n = 0, 1, odd."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def branches(x):
        return F.cond(F.sum(x) > 0, lambda: F.boolean_mask(x, x > 0.5) * 2.0,
                      lambda: F.boolean_mask(x + 1.0, x < 0.0))

    def rows(x):
        def body(row, states):
            kept = F.boolean_mask(row, row > 0.0)
            return F.sum(kept) + F.sum(F.nonzero(row > 0.0)).astype("float32"), states
        ys, _ = F.foreach(body, x, [])
        return ys

    m_branches = dt.compile(branches, dt.TensorSpec(("N",)))
    m_rows = dt.compile(rows, dt.TensorSpec(("B", 5)))
    for m in (m_branches, m_rows):
        assert m.vm_program, m.vm_program_fallback
    rng = np.random.default_rng(5)
    for n in (0, 1, 7):
        for x in (rng.standard_normal(n).astype(np.float32), np.full(n, 2.0, np.float32),
                  np.full(n, -2.0, np.float32)):
            want = x[x > 0.5] * 2.0 if x.sum() > 0 else (x + 1.0)[x < 0.0]
            assert_same(m_branches(x), want, what=f"n={n}")
        xs = rng.standard_normal((n, 5)).astype(np.float32)
        want = np.array([r[r > 0].sum() + np.flatnonzero(r > 0).sum() for r in xs], np.float32)
        assert_same(m_rows(xs), want, rtol=1e-5, atol=1e-5, what=f"rows n={n}")


def test_the_count_and_shared_shapes_save_vm_instructions(monkeypatch):
    """A mask link (comparison region + mask) with the count returned and shapes made once executes 8 VM
    instructions fewer than with the count read from a tensor and a make_shape per use (the switches off),
    with the same results; the mask of 2-d data too."""
    from dyntvm.codegen import branch_storage, vm_dynamic
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def chain(x):
        for _ in range(3):
            x = F.boolean_mask(x, F.sum(x, axis=1) > -0.5)
        return x

    x = np.linspace(-1.0, 2.0, 14).astype(np.float32).reshape(7, 2)
    want = x
    for _ in range(3):
        want = want[want.sum(axis=1) > -0.5]
    counts = {}
    for on in (True, False):
        monkeypatch.setattr(vm_dynamic, "COUNT_RETURNED", on)
        monkeypatch.setattr(branch_storage, "REUSE_SHAPES", on)
        model = dt.compile(chain, dt.TensorSpec(("N", 2)))
        assert model.vm_program, model.vm_program_fallback
        counts[on] = vm_calls(model, [x])
        assert_same(model(x), want)
        assert_same(model(x[:0]), want[:0])
    assert counts[False] - counts[True] >= 3 * 8, counts


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_nonzero_counts_nan_as_numpy_does(monkeypatch, dtype):
    """nonzero of a computed float tensor with NaN, -0.0 and infinities in the VM program: NaN is nonzero and -0.0
    is zero, as numpy says (TIR's ``!=`` on floats is LLVM's ordered ``fcmp one``, false for NaN: the count and
    fill kernels dropped NaNs)."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def fn(x):
        y = x * 2.0
        return F.nonzero(y), F.boolean_mask(x, F.logical_not(F.isnan(y)))

    model = dt.compile(fn, dt.TensorSpec(("N",), dtype))
    assert model.vm_program, model.vm_program_fallback
    assert not python_callbacks(model.graph)
    x = np.array([np.nan, -0.0, 0.0, 1.0, np.inf, -np.inf, np.nan, 3.0], dtype)
    for n in (0, 1, 2, 8):
        v = x[:n] * 2
        assert_same(model(x[:n]), (np.flatnonzero(v)[None, :].astype(np.int64), x[:n][~np.isnan(v)]), what=f"n={n}")


def test_masks_in_case_branches_and_while_loop_bodies(monkeypatch):
    """Masks and nonzero in the branches of a case (a mask made outside, used in each branch; a branch's result
    mixing the outer count with one made in the branch is not a VM program: its dims are checked at run time)
    and in a while_loop body (a count bound per step): the VM program, equal numpy at n = 0, 1, odd."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def branches(x, y, i):
        k = x > 0.0
        a = F.boolean_mask(x, k)
        s, t = F.case([(i == 0, lambda: (F.sum(F.boolean_mask(y * 2.0, k)) + F.sum(a), F.boolean_mask(y + 1.0, k))),
                       (i == 1, lambda: (F.sum(F.nonzero(y < 0.0)).astype("float32"), a * 3.0))],
                      default=lambda: (F.sum(F.boolean_mask(y, y > 0.5)), F.boolean_mask(y - x, k)))
        return s, t, a + F.boolean_mask(y, k)

    def loop(x):
        def body(i, acc):
            kept = F.boolean_mask(x, x > F.astype(i, "float32") * 0.5)
            return [], [i + 1, acc + F.sum(kept) + F.sum(F.nonzero(kept > 1.0)).astype("float32")]
        return F.while_loop(lambda i, acc: i < 3, body, [F.zeros((), "int32"), F.zeros((), "float32")])[1][1]

    m_case = dt.compile(branches, dt.TensorSpec(("N",)), dt.TensorSpec(("N",)), dt.TensorSpec((), "int32"))
    m_loop = dt.compile(loop, dt.TensorSpec(("N",)))
    for m in (m_case, m_loop):
        assert m.vm_program, m.vm_program_fallback
    rng = np.random.default_rng(7)
    for n in (0, 1, 9):
        x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        k = x > 0
        a = x[k]
        for i in (0, 1, 2):
            s, t = [((y * 2)[k].sum() + a.sum(), (y + 1)[k]), (np.float32(np.flatnonzero(y < 0).sum()), a * 3),
                    (y[y > 0.5].sum(), (y - x)[k])][i]
            assert_same(m_case(x, y, np.int32(i)), (np.float32(s), t, a + y[k]), rtol=1e-5, atol=1e-5,
                        what=f"case n={n} i={i}")
        acc = np.float32(0)
        for i in range(3):
            kept = x[x > np.float32(i) * np.float32(0.5)]
            acc = acc + kept.sum() + np.float32(np.flatnonzero(kept > 1).sum())
        assert_same(m_loop(x), np.float32(acc), rtol=1e-5, atol=1e-5, what=f"loop n={n}")
