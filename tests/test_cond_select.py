"""A `cond` of a loop body as a select (`partition/cond_select.py`): both small static branches computed, then
``where``; with hoisting, branchy's per-row cond becomes two GEMMs over the batch and the foreach disappears.
Results equal an independent numpy expression (and eager dyntvm) at 0, 1 and odd sizes, also where the branch
not taken gives NaN / inf, in the VM program and the executor; conds that could raise (integer division), are
too costly or have branches of different shapes stay conds."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.examples.plain_numpy import BY_EXAMPLE
from dyntvm.ir.compiled_loop import compiled_loop_name, while_loop_plan
from dyntvm.partition import cond_select
from dyntvm.partition.partitioner import partition
from helpers import assert_same, vm_calls  # tests/ is on sys.path

W = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)


@pytest.fixture(params=["always", "never"])
def program(request, monkeypatch):
    """Both runners: the VM program, and the Python executor."""
    if request.param == "always":
        monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    else:
        monkeypatch.setenv("DYNTVM_NO_VM_PROGRAM", "1")
    return request.param


def _ops(model) -> list:
    return [n.op for n in model.graph.walk()]


def test_branchy_rows_are_a_select_without_a_loop(monkeypatch):
    """branchy's per-row cond: no foreach and no per-row cond left (the heads' case stays); the VM executes as
    many instructions at B=16 as at B=1 (before: 210 and 1185); results equal plain numpy."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    ex = examples.get("branchy")
    model = dt.compile(ex.fn, *ex.specs)
    assert model.vm_program, model.vm_program_fallback
    ops = _ops(model)
    assert "foreach" not in ops and "where" in ops and "case" in ops, ops
    b1, b16 = (ex.make_inputs(np.random.default_rng(0), B=b) for b in (1, 16))
    assert vm_calls(model, b16) == vm_calls(model, b1) <= 150
    for i, sizes in enumerate(ex.test_sizes + ({"B": 7, "shift": 0.3},)):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        assert_same(model(*inputs), BY_EXAMPLE["branchy"](*inputs), rtol=1e-4, atol=1e-4, what=str(sizes))


def _guarded(x):
    """Per row: log of the row where its sum is positive, else sqrt of its negation: the branch not taken gives
    NaN on the row (and -inf on zeros), the taken one does not."""
    def body(row, states):
        y = F.cond(F.sum(row) > 0, lambda: F.log(F.abs(row) + 1.0) * 2.0, lambda: F.sqrt(-row) - F.log(row))
        return y, []
    ys, _ = F.foreach(body, x, [])
    return ys


def _guarded_numpy(x):
    out = np.empty_like(x)
    for i, row in enumerate(x):
        with np.errstate(all="ignore"):
            out[i] = np.log(np.abs(row) + 1.0) * 2.0 if row.sum() > 0 else np.sqrt(-row) - np.log(row)
    return out


@pytest.mark.parametrize("t", [0, 1, 5, 33])
def test_the_branch_not_taken_may_give_nan(program, t):
    model = dt.compile(_guarded, dt.TensorSpec(("T", 4)))
    assert "cond" not in _ops(model) and "foreach" not in _ops(model)
    rng = np.random.default_rng(t)
    x = rng.standard_normal((t, 4)).astype(np.float32)
    x[::2] = np.abs(x[::2])              # positive rows: the else branch is NaN there
    x[1::2] = -np.abs(x[1::2])           # negative rows: the then branch is finite, the taken else too
    if t > 1:
        x[1, 0] = 0.0                    # -log(0) = inf in the taken branch: kept
    want = _guarded_numpy(x)
    assert not np.isnan(want[::2]).any()
    assert_same(model(x), want, rtol=1e-5, atol=1e-6)
    with np.errstate(all="ignore"):
        assert_same(model(x), _guarded(x), rtol=1e-5, atol=1e-6)      # eager dyntvm
    assert_same(model(x, validate=True), want, rtol=1e-5, atol=1e-6)


def test_integer_division_stays_a_cond(program):
    """floor_divide on integers raises in the numpy reference on a zero divisor: the branch keeps its cond,
    and rows whose divisor is 0 take the other branch."""
    def fn(a, b):
        def body(rows, states):
            x, d = rows
            return F.cond(d != 0, lambda: x // d, lambda: x * 0), []
        ys, _ = F.foreach(body, [a, b], [])
        return ys

    model = dt.compile(fn, dt.TensorSpec(("T",), "int64"), dt.TensorSpec(("T",), "int64"))
    assert "cond" in _ops(model)
    a, b = np.array([7, 8, -9, 4], np.int64), np.array([2, 0, 4, 0], np.int64)
    assert_same(model(a, b), np.where(b != 0, a // np.where(b != 0, b, 1), 0))


def test_a_division_by_a_computed_value_stays_a_cond(program):
    """Found by review 38: ``1 / (row - row)`` in the branch not taken. As a select, TVM's simplifier proved the
    divisor zero under the ``where`` and failed the build ("Divide by zero", an InternalError); the cond compiles
    and runs as before, and a division by a constant may still be selected."""
    def fn(x):
        def body(row, states):
            return F.cond(F.sum(row) > 0, lambda: row * 2.0, lambda: 1.0 / (row - row)), []
        return F.foreach(body, x, [])[0]

    def by_constant(x):
        def body(row, states):
            return F.cond(F.sum(row) > 0, lambda: row * 2.0, lambda: row / 4.0), []
        return F.foreach(body, x, [])[0]

    model = dt.compile(fn, dt.TensorSpec(("T", 4)))
    assert "cond" in _ops(model)
    x = np.array([[1, 2, 3, 4], [-1, -2, -3, -4], [0, 0, 0, 0]], np.float32)
    with np.errstate(all="ignore"):
        want = np.where(x.sum(axis=1, keepdims=True) > 0, x * 2, 1.0 / (x - x))
    assert_same(model(x), want)
    assert_same(model(x[:0]), want[:0])
    selected = dt.compile(by_constant, dt.TensorSpec(("T", 4)))
    assert "cond" not in _ops(selected)
    assert_same(selected(x), np.where(x.sum(axis=1, keepdims=True) > 0, x * 2, x / 4))


def test_costly_or_unequal_branches_stay_conds(monkeypatch):
    """A branch over `SELECT_WORK` per step, and branches whose outputs differ in shape, keep their conds."""
    def fn(x):
        def body(row, states):
            return F.cond(F.sum(row) > 0, lambda: F.relu(F.matmul(row, W)), lambda: F.matmul(row, W) - 1.0), []
        ys, _ = F.foreach(body, x, [])
        return ys

    g = dt.trace(fn, dt.TensorSpec(("T", 4)))
    assert "cond" not in [n.op for n in partition(g).walk()]
    monkeypatch.setattr(cond_select, "SELECT_WORK", 11)       # the matmul: 12 multiply-adds
    assert "cond" in [n.op for n in partition(g).walk()]

    def widths(x):
        def body(row, states):
            y = F.cond(F.sum(row) > 0, lambda: row[:2] * 2.0, lambda: row[1:] + 1.0)
            return F.sum(y), []
        ys, _ = F.foreach(body, x, [])
        return ys
    assert "cond" in [n.op for n in partition(dt.trace(widths, dt.TensorSpec(("T", 4)))).walk()]


def test_a_state_dependent_cond_makes_a_compiled_while_loop(program):
    """The predicate reads the loop var: nothing hoists, but the body (cond selected) is one region, and the
    while_loop runs as a compiled loop."""
    def fn(x, n):
        def body(i, v):
            v = F.cond(F.sum(v) > 0, lambda: v * 0.5 - 1.0, lambda: F.tanh(v) + 1.5)
            return [i + 1, v]
        return F.while_loop(lambda i, v: i < n, body, [F.zeros((), "int64"), x])

    model = dt.compile(fn, dt.TensorSpec((3,)), dt.TensorSpec((), "int64"))
    (loop,) = [m for m in model.graph.walk() if m.op == "while_loop"]
    plan = while_loop_plan(loop)
    assert plan is not None and "cond" not in _ops(model)
    model.vm[compiled_loop_name(plan[0].attrs.name)]            # built (raises if codegen declined it)
    for x, n in ((np.array([1.0, -2.0, 0.5], np.float32), 7), (np.array([-1.0, 0.0, 0.2], np.float32), 0),
                 (np.array([0.1, 0.1, 0.1], np.float32), 1)):
        v = x.copy()
        for _ in range(n):
            v = (v * 0.5 - 1.0 if v.sum() > 0 else np.tanh(v) + 1.5).astype(np.float32)
        got = model(x, np.int64(n))
        assert_same(got, [np.int64(n), v], rtol=1e-5, atol=1e-6)
        assert_same(got, fn(x, np.int64(n)), rtol=1e-5, atol=1e-6)


def test_nested_conds_and_a_state(program):
    """A cond inside a branch is selected with it; a running state keeps the loop (its rows come from the
    select hoisted before it)."""
    def fn(x):
        def body(row, states):
            (acc,) = states
            s = F.sum(row)
            y = F.cond(s > 0, lambda: F.cond(s > 1.0, lambda: row * 3.0, lambda: row + 1.0), lambda: -row)
            return y, [acc + y]
        ys, (total,) = F.foreach(body, x, [F.zeros((4,))])
        return ys, total

    model = dt.compile(fn, dt.TensorSpec(("T", 4)))
    assert "cond" not in _ops(model)
    for t in (0, 1, 6):
        x = np.random.default_rng(t).standard_normal((t, 4)).astype(np.float32)
        s = x.sum(axis=1, keepdims=True)
        ys = np.where(s > 0, np.where(s > 1.0, x * 3.0, x + 1.0), -x).astype(np.float32)
        assert_same(model(x), (ys, ys.sum(axis=0)), rtol=1e-5, atol=1e-5)
        assert_same(model(x), fn(x), rtol=1e-5, atol=1e-5)
