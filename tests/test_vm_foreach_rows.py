"""A foreach without a compiled loop in the VM program (issue 25, `codegen/vm_loops._inplace_foreach`): where
its per-step outputs have static shapes, each step copies its rows into stacks allocated once per call, and
ranges of up to `_CHAIN` steps run one call per step (longer ones halve). Results equal an independent numpy
expression at 0, 1, odd, chain-boundary and halving sizes; the program text holds no concatenation and fewer VM
instructions per step than the halving lowering; errors stay the executor's."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.vm_loops import _CHAIN
from dyntvm.partition import cond_select
from helpers import assert_same, vm_calls  # tests/ is on sys.path

W = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)


@pytest.fixture(autouse=True)
def program_always(monkeypatch):
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")


def _fn(x, flags, scale):
    """Two data inputs (a row of 4 and a bool flag), a capture, a state, two per-step outputs (float32[3] and a
    scalar int64)."""
    def body(rows, states):
        row, flag = rows
        (acc,) = states
        y = F.cond(flag, lambda: F.relu(F.matmul(row, W)) * scale, lambda: F.tanh(F.matmul(row, W)) - 1.0)
        n = F.cast(F.sum(row) > 0, "int64")
        return [y, n], [acc + y]
    (ys, ns), (total,) = F.foreach(body, [x, flags], [F.zeros((3,))])
    return ys, ns, total


def _numpy(x, flags, scale):
    h = x @ W
    ys = np.where(flags[:, None], np.maximum(h, 0) * scale, np.tanh(h) - 1.0).astype(np.float32)
    return ys, (x.sum(axis=1) > 0).astype(np.int64), ys.sum(axis=0)


@pytest.fixture(scope="module")
def model():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNTVM_VM_PROGRAM", "always")
        mp.setattr(cond_select, "SELECT_WORK", -1)      # the cond stays in the body (not a select)
        m = dt.compile(_fn, dt.TensorSpec(("T", 4)), dt.TensorSpec(("T",), "bool"), dt.TensorSpec((), "float32"))
    assert m.vm_program, m.vm_program_fallback
    return m


@pytest.mark.parametrize("t", [0, 1, 2, 7, _CHAIN - 1, _CHAIN, _CHAIN + 1, 2 * _CHAIN, 2 * _CHAIN + 1, 100, 1000])
def test_rows_written_in_place_equal_numpy(model, t):
    rng = np.random.default_rng(t)
    x = rng.standard_normal((t, 4)).astype(np.float32)
    flags = rng.random(t) < 0.5
    scale = np.float32(1.5)
    calls = model.vm_program_calls
    got = model(x, flags, scale)
    assert model.vm_program_calls == calls + 1
    want = _numpy(x, flags, scale)
    if t == 0:
        want = (want[0].reshape(0, 3), want[1], np.zeros(3, np.float32))
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    assert_same(got, _fn(x, flags, scale), rtol=1e-5, atol=1e-5)       # eager dyntvm


def test_nan_rows(model):
    x = np.full((5, 4), np.nan, np.float32)
    x[2] = 1.0
    flags = np.array([True, False, True, False, True])
    got = model(x, flags, np.float32(2.0))
    assert_same(got, _numpy(x, flags, np.float32(2.0)), rtol=1e-5, atol=1e-5)


def test_program_stacks_rows_without_concatenation(model):
    """The foreach's function copies each per-step output into its stack (one TVMTensorCopyFromTo each) and
    concatenates nothing."""
    funcs = {f.split(":")[0].strip(): f for f in model.lib.as_text().split("\n@")}
    (name,) = [k for k in funcs if k.startswith("dyntvm_foreach")]
    assert "concatenate" not in funcs[name]
    assert funcs[name].count("call  runtime.TVMTensorCopyFromTo") == 2, funcs[name]


def test_vm_instructions_per_row_of_branchy(monkeypatch):
    """branchy's foreach over rows with its cond per row kept (by default the cond is a select and the loop goes:
    `partition/cond_select.py`): at most 70 VM Call instructions per row, its two region calls included (the
    halving lowering executed 100: a concatenation, tuple packing and a second call per row)."""
    from dyntvm import examples
    monkeypatch.setattr(cond_select, "SELECT_WORK", -1)
    ex = examples.get("branchy")
    model = dt.compile(ex.fn, *ex.specs)
    assert model.vm_program, model.vm_program_fallback
    b1, b16 = (ex.make_inputs(np.random.default_rng(0), B=b) for b in (1, 16))
    assert "foreach" in [n.op for n in model.graph.walk()]
    per_row = (vm_calls(model, b16) - vm_calls(model, b1)) / 15
    assert per_row <= 70, per_row


def test_per_step_outputs_of_run_time_shape_still_stack():
    """A per-step output whose length is known only when the model runs (N) keeps the halving lowering (stacks
    concatenated)."""
    def fn(x):
        def body(row, states):
            y = F.cond(F.sum(row) > 0, lambda: row * 2.0, lambda: row - 1.0)
            return y, []
        ys, _ = F.foreach(body, x, [])
        return ys

    model = dt.compile(fn, dt.TensorSpec(("T", "N")))
    assert model.vm_program, model.vm_program_fallback
    funcs = {f.split(":")[0].strip(): f for f in model.lib.as_text().split("\n@")}
    assert "concatenate" in funcs[[k for k in funcs if k.startswith("dyntvm_foreach")][0]]
    for t, n in ((1, 4), (5, 6), (40, 3)):
        x = np.random.default_rng(t).standard_normal((t, n)).astype(np.float32)
        want = np.where(x.sum(axis=1, keepdims=True) > 0, x * 2.0, x - 1.0)
        assert_same(model(x), want, rtol=1e-6, atol=1e-6)


def test_an_error_in_a_step_is_the_executors():
    """A step whose topk reads a k larger than its row fails inside the program: the call raises the executor's
    error (naming the node and iteration), as it did with the halving lowering."""
    def fn(x, ks):
        def body(rows, states):
            row, k = rows
            return F.topk(row * 2.0, k)[0], []
        ys, _ = F.foreach(body, [x, ks], [])
        return ys

    model = dt.compile(fn, dt.TensorSpec(("T", 4)), dt.TensorSpec(("T",), "int64"))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    ok = np.array([2, 2, 2], np.int64)
    assert_same(model(x, ok), np.sort(x * 2.0, axis=1)[:, ::-1][:, :2])
    bad = np.array([2, 9, 2], np.int64)
    with pytest.raises(dt.ExecutionError) as in_vm:
        model(x, bad)
    with pytest.raises(dt.ExecutionError) as in_executor:
        model(x, bad, profile=True)
    assert str(in_vm.value) == str(in_executor.value)
