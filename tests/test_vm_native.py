"""Nodes outside regions that the VM program runs as kernels, not Python callbacks (`codegen/vm_dynamic.py`,
`codegen/vm_topk.py`): `topk` with a tensor k and the view ops the partitioner leaves out of regions. Results
equal numpy's at k = 0, 1, n, on empty rows, with ties and NaN; k out of range raises the executor's error; no
callback into Python runs (counted); the detection example runs in the program by default."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.examples.plain_numpy import BY_EXAMPLE
from dyntvm.ir.vm_program import python_callbacks
from helpers import assert_same  # tests/ is on sys.path


@pytest.fixture
def count_callbacks(monkeypatch):
    """A list that gets one entry (the op) per Python callback the programs make from now on."""
    from dyntvm.runtime import vm_program
    calls: list = []

    class Counting(dict):
        def __getitem__(self, key):
            kern, attrs = dict.__getitem__(self, key)
            return (lambda a, *xs: calls.append(key) or kern(a, *xs)), attrs
    monkeypatch.setattr(vm_program, "_kernels", Counting(vm_program._kernels))
    return calls


def numpy_topk(x, k, largest, axis=-1):
    idx = np.take(np.argsort(-x if largest else x, axis=axis, kind="stable"), np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx


def _topk_inputs(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    x = rng.integers(-3, 4, shape).astype(dtype)          # few distinct values: many ties
    if dtype == "float32" and x.size > 2:
        x.flat[[0, x.size // 2]] = np.nan                   # NaN sorts after every number
    return x


@pytest.mark.parametrize("dtype,largest,ndim,axis", [("float32", True, 1, -1), ("float32", False, 2, -1),
                                                     ("int32", True, 2, -1), ("bool", False, 1, 0),
                                                     ("float64", True, 3, 1)])
def test_topk_with_a_tensor_k_runs_in_the_program(count_callbacks, dtype, largest, ndim, axis):
    def fn(x, k):                   # (a region, so that the model has a kernel library to hold the program)
        return F.topk(F.abs(x) if dtype != "bool" else F.logical_not(x), k, axis=axis, largest=largest)

    spec = dt.TensorSpec({1: ("N",), 2: ("R", "N"), 3: ("R", "N", 2)}[ndim], dtype)
    model = dt.compile(fn, spec, dt.TensorSpec((), "int64"))
    assert model.vm_program, model.vm_program_fallback
    assert not python_callbacks(model.graph)
    for n, ks in ((0, (0,)), (1, (0, 1)), (9, (0, 1, 4, 9)), (300, (5, 300))):
        for rows in ((None,) if ndim == 1 else (0, 1, 3)):
            x = _topk_inputs(dtype, {1: (n,), 2: (rows, n), 3: (rows, n, 2)}[ndim], seed=n)
            for k in ks:
                calls = model.vm_program_calls
                got = model(x, np.int64(k))
                assert model.vm_program_calls == calls + 1
                want = numpy_topk(np.abs(x) if dtype != "bool" else ~x, k, largest, axis)
                assert_same(got, want, what=f"n={n} rows={rows} k={k}")
    assert count_callbacks == []


def test_topk_k_out_of_range_raises_the_executors_error(monkeypatch):
    """k > n or k < 0: the kernel called back raises, the executor runs the call and raises its error (the same
    as with the program turned off); a later good call runs in the program again."""
    def fn(x, k):
        return F.topk(x * 2.0, k)
    specs = (dt.TensorSpec(("N",)), dt.TensorSpec((), "int64"))
    model = dt.compile(fn, *specs)
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "never")
    reference = dt.compile(fn, *specs)
    assert model.vm_program and not reference.vm_program
    x = np.arange(4, dtype=np.float32)
    for k in (5, -1):
        with pytest.raises(dt.errors.DyntvmError) as want:
            reference(x, np.int64(k))
        with pytest.raises(type(want.value)) as got:
            model(x, np.int64(k))
        assert str(got.value) == str(want.value) and f"k={k}" in str(got.value)
    calls = model.vm_program_calls
    assert_same(model(x, np.int64(4)), numpy_topk(x * 2.0, 4, True))
    assert model.vm_program_calls == calls + 1


def test_view_ops_outside_regions_run_in_the_program(count_callbacks):
    """slice / squeeze / transpose / expand_dims / reshape of a data-dependent value: ops the partitioner leaves
    out of regions (a region of views only would be a VM call for nothing), lowered by their converters."""
    def fn(x):
        kept = F.boolean_mask(x, F.max(x, axis=1) > 0.5)             # [K, 3]
        idx = F.nonzero(F.max(x, axis=1) > 0.5)[0]                   # slice + squeeze of int64[1, K]
        return F.expand_dims(F.transpose(kept, (1, 0)), 0), F.reshape(kept, (-1,)), idx

    model = dt.compile(fn, dt.TensorSpec(("N", 3)))
    assert model.vm_program, model.vm_program_fallback
    outside = {n.op for n in model.graph.nodes if n.op not in ("region", "constant")}
    assert {"slice", "squeeze", "transpose"} <= outside, outside     # (else this tests nothing)
    for n in (0, 1, 2, 50):
        x = np.random.default_rng(n).random((n, 3)).astype(np.float32)
        assert_same(model(x), fn(x), what=f"N={n}")
    assert count_callbacks == []


def test_detection_runs_in_the_program_by_default(count_callbacks, monkeypatch):
    """The detection example (boolean_mask, nonzero()[0], topk with a tensor k) calls no Python kernel: under the
    default mode it runs in the VM program, equal to plain numpy at every test size (0 and 1 included)."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "auto")
    ex = examples.get("detection")
    model = dt.compile(ex.fn, *ex.specs)
    assert model.vm_program, model.vm_program_fallback
    assert "every plain call runs as one VM call" in str(model)
    # what remains called back: the size check of the region whose values could exceed memory (cheap)
    assert [n.op for n in python_callbacks(model.graph)] == ["region"]
    for i, sizes in enumerate(ex.test_sizes + ({"N": 30, "keep_fraction": 0.1},)):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        calls = model.vm_program_calls
        assert_same(model(*inputs), BY_EXAMPLE["detection"](*inputs), rtol=1e-4, atol=1e-4, what=str(sizes))
        assert model.vm_program_calls == calls + 1 and model.kernel_calls == 0
    assert count_callbacks == []


def test_slice_with_tensor_bounds_runs_in_the_program(count_callbacks, monkeypatch):
    """`F.slice` with tensor starts / stops / steps on two axes: Python's clamping (bounds past either end,
    negative bounds and steps, huge values), empty results and empty data, as numpy; a zero step raises the
    executor's error (the same as with the program off)."""
    def fn(x, starts, stops, steps):
        return F.slice(x * 2.0, starts, stops, steps, axes=[2, 0])

    specs = (dt.TensorSpec(("A", 3, "B")),) + tuple(dt.TensorSpec((2,), t) for t in ("int64", "int32", "int64"))
    model = dt.compile(fn, *specs)
    assert model.vm_program, model.vm_program_fallback
    assert not python_callbacks(model.graph)
    rng = np.random.default_rng(0)
    big = 2 ** 62
    for a, b in ((0, 0), (1, 1), (4, 7), (6, 0)):
        x = rng.standard_normal((a, 3, b)).astype(np.float32)
        for _ in range(12):
            starts = rng.choice([-big, -9, -3, -1, 0, 1, 2, 5, 9, big], 2)
            stops = rng.choice([-2 ** 31, -9, -3, -1, 0, 1, 2, 5, 9, 2 ** 31 - 1], 2).astype(np.int32)
            steps = rng.choice([-3, -1, 1, 2, 4], 2)
            calls = model.vm_program_calls
            want = (x * 2.0)[int(starts[1]):int(stops[1]):int(steps[1]), :, int(starts[0]):int(stops[0]):int(steps[0])]
            assert_same(model(x, starts, stops, steps), want, what=f"{x.shape} {starts} {stops} {steps}")
            assert model.vm_program_calls == calls + 1
    assert count_callbacks == []

    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "never")
    reference = dt.compile(fn, *specs)
    bad = (np.ones((2, 3, 4), np.float32), np.array([0, 0]), np.array([2, 2], np.int32), np.array([1, 0]))
    with pytest.raises(dt.errors.DyntvmError) as want:
        reference(*bad)
    with pytest.raises(type(want.value)) as got:
        model(*bad)
    assert str(got.value) == str(want.value) and "step is 0" in str(got.value)

