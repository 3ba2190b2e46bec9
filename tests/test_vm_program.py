"""The VM program (`ir/vm_program.py`, `codegen/vm_program.py`, `runtime/vm_program.py`): a supported model runs
as one Relax VM call per model call, equal to eager numpy; an unsupported node is listed and the executor runs
the model; errors are the executor's."""
import warnings

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from helpers import assert_same as _assert_same  # tests/ is on sys.path


def assert_same(got, want):
    _assert_same(got, want, rtol=1e-4, atol=1e-4)


VM_EXAMPLES = ("branchy", "lstm", "detection")


@pytest.fixture(scope="module", autouse=True)
def program_always():
    """The program wherever it can run, callbacks into Python included (by default such a model runs in the
    executor: `test_a_model_with_python_callbacks_runs_in_the_executor_by_default`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNTVM_VM_PROGRAM", "always")
        yield


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(name):
        if name not in cache:
            ex = examples.get(name)
            cache[name] = (ex, dt.compile(ex.fn, *ex.specs))
        return cache[name]
    return get


def test_a_model_with_python_callbacks_runs_in_the_executor_by_default(compiled, monkeypatch, tmp_path):
    """A program that calls back into Python for a dynamic-shape op (`unique`) is slower than the executor, so
    by default the executor runs it, and says why; branchy's and detection's call no Python for an op
    (tests/test_vm_native.py) and run in the VM. The mode is read when a model is made (here: loaded)."""
    def uniq(x):
        return F.unique(x * 2.0)
    saved = {"unique": str(tmp_path / "unique.dtvm")}
    dt.compile(uniq, dt.TensorSpec(("N",))).save(saved["unique"])
    for name in ("detection", "branchy"):
        saved[name] = str(tmp_path / f"{name}.dtvm")
        compiled(name)[1].save(saved[name])
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "auto")
    loaded = dt.load(saved["unique"])
    assert not loaded.vm_program
    assert any("call back into Python" in line and "unique" in line for line in loaded.vm_program_fallback)
    x = np.array([3.0, 1.0, 3.0, 0.5], np.float32)
    assert_same(loaded(x), uniq(x))
    assert loaded.vm_program_calls == 0 and loaded.kernel_calls > 0
    assert dt.load(saved["branchy"]).vm_program and dt.load(saved["detection"]).vm_program
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "sometimes")
    with pytest.warns(UserWarning, match="DYNTVM_VM_PROGRAM is 'sometimes': expected auto, always or never"):
        assert dt.load(saved["branchy"]).vm_program


@pytest.mark.parametrize("name", VM_EXAMPLES)
def test_example_runs_as_one_vm_call(compiled, name):
    """Every test size (1 and 0 included) matches eager numpy, each call is one VM call and no region is called
    from Python (the executor's region-call counter stays 0)."""
    ex, model = compiled(name)
    assert model.vm_program, model.vm_program_fallback
    assert "every plain call runs as one VM call" in str(model)
    for i, sizes in enumerate(ex.test_sizes):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        calls, regions = model.vm_program_calls, model.kernel_calls
        got = model(*inputs)
        assert model.vm_program_calls == calls + 1, sizes
        assert model.kernel_calls == regions == 0, sizes
        assert_same(got, ex.fn(*inputs))


def test_many_steps_of_a_foreach_that_is_not_a_compiled_loop():
    """A foreach whose body holds a cond runs by halving the range of steps: 3000 steps are far deeper than
    a recursion per step could go, and match eager numpy."""
    w = np.linspace(-1, 1, 8, dtype=np.float32)

    def fn(x):
        def body(row, states):
            (acc,) = states
            y = F.cond(F.sum(row) > 0, lambda: row * w, lambda: row - 1.0)
            return y, [acc + y]
        ys, (total,) = F.foreach(body, x, [F.zeros((8,))])
        return ys, total

    model = dt.compile(fn, dt.TensorSpec(("T", 8)))
    assert model.vm_program, model.vm_program_fallback
    for t in (0, 1, 5, 3000):
        x = np.random.default_rng(t).standard_normal((t, 8)).astype(np.float32)
        calls = model.vm_program_calls
        assert_same(model(x), fn(x))
        assert model.vm_program_calls == calls + 1


def test_compiled_while_loop_runs_in_the_program():
    """A while_loop whose body is a compiled loop: calls of growing capacity inside the VM (300 iterations take
    two calls of the loop function), a static or tensor max_iterations, zero iterations."""
    def fn(x, limit):
        def body(i, v):
            return v * 0.5, [i + 1, v * 1.01 + 1.0]
        ys, (i, v) = F.while_loop(lambda i, v: F.sum(v) < 1e4, body, [F.zeros((), "int64"), x],
                                  max_iterations=limit)
        return ys, i, v

    model = dt.compile(fn, dt.TensorSpec(("N",)), dt.TensorSpec((), "int64"))
    assert model.vm_program, model.vm_program_fallback
    for n, limit in ((0, 300), (1, 300), (5, 2), (3, 1000), (2000, 1000)):
        x = np.random.default_rng(n).random(n).astype(np.float32)
        calls = model.vm_program_calls
        assert_same(model(x, np.int64(limit)), fn(x, np.int64(limit)))
        assert model.vm_program_calls == calls + 1 and model.kernel_calls == 0
    # no iteration: stacks of rows whose size is known only at run time: the program hands the call to the
    # executor (one condition region call), quietly
    x = np.ones(4, np.float32)
    assert_same(model(x, np.int64(0)), fn(x, np.int64(0)))


def test_unsupported_node_is_listed_and_the_executor_runs_it():
    def fn(xs, h0, lens):
        def step(x, states):
            h = F.tanh(x + states[0])
            return h, [h]
        return F.foreach(step, xs, [h0], valid_length=lens)

    model = dt.compile(fn, dt.TensorSpec(("T", "B", 4)), dt.TensorSpec(("B", 4)), dt.TensorSpec(("B",), "int64"))
    assert not model.vm_program
    assert any("valid_length" in line for line in model.vm_program_fallback)
    assert "vm program: no, the executor runs the model" in str(model) and "valid_length" in str(model)
    xs, h0 = np.ones((3, 2, 4), np.float32), np.zeros((2, 4), np.float32)
    lens = np.array([3, 1], np.int64)
    assert_same(model(xs, h0, lens), fn(xs, h0, lens))
    assert model.vm_program_calls == 0 and model.kernel_calls > 0


def _has_function(model, name: str) -> bool:
    try:
        model._threads.executor.vm[name]
        return True
    except Exception:  # noqa: BLE001 - not in this library
        return False


def test_while_loop_without_a_compiled_loop_runs_in_the_program():
    """A while_loop codegen builds no compiled loop for (a growing carry; a cond inside the body; a condition
    reading the carry at the counter) runs as the program's recursive functions (`dyntvm_while_steps_*` in the
    library): one VM call per model call at 0, 1 and many iterations (3000: far deeper than a recursion per
    iteration could go), stops at chunk boundaries (1, 3, 7 iterations), a static, a tensor and a negative
    limit, per-step outputs stacked; the condition is never evaluated after the last iteration the limit allows
    (`reads`: there it would read past the end of `v`, as the executor never does)."""
    def growing(x, lim):
        def body(v, i):
            return F.sum(v[:1]) * 0.5 + i, [F.concat([v, v[:1] + 1.0], axis=0), i + 1.0]
        return F.while_loop(lambda v, i: F.sum(v) < 1e9, body, [x, F.zeros(())], max_iterations=lim)

    def branchy(x):
        def body(v):
            return [F.cond(F.sum(v) > 10.0, lambda: v + 1.0, lambda: v * 2.0 + 1.0)]
        return F.while_loop(lambda v: F.sum(v) < 100.0, body, [x], max_iterations=50)

    def reads(v, lim):                  # v[i] > 0 read for i < lim = len(v) only; grows a carry
        def body(i, acc):
            return [i + 1, F.concat([acc, F.take(v, F.reshape(i, (1,)), axis=0)], axis=0)]
        return F.while_loop(lambda i, acc: F.take(v, i, axis=0) > 0.0, body,
                            [F.zeros((), "int64"), F.zeros((0,))], max_iterations=lim)

    for fn, specs, cases in [
            (growing, (dt.TensorSpec(("N",)), dt.TensorSpec((), "int64")),
             [(np.ones(n, np.float32), np.int64(lim)) for n, lim in
              ((1, 0), (1, -3), (1, 1), (3, 5), (2, 3), (2, 7), (2, 3000))]),
            (branchy, (dt.TensorSpec(("N",)),), [(np.full(n, v, np.float32),) for n, v in
                                                   ((0, 1.0), (1, 0.5), (3, 0.5), (7, 200.0))]),
            (reads, (dt.TensorSpec(("N",)), dt.TensorSpec((), "int64")),
             [(np.array(v, np.float32), np.int64(len(v))) for v in
              ([1.0], [1.0, 2.0, 3.0], [1.0, -1.0, 2.0], [-1.0], [1.0] * 7, [1.0] * 8)])]:
        model = dt.compile(fn, *specs)
        assert model.vm_program, model.vm_program_fallback
        assert _has_function(model, "dyntvm_while_steps_0"), f"{fn.__name__}: not the recursive functions"
        for args in cases:
            calls, regions = model.vm_program_calls, model.kernel_calls
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got = model(*args)
            assert model.vm_program_calls == calls + 1 and model.kernel_calls == regions == 0
            assert_same(got, fn(*args))


def test_errors_are_the_executors(compiled):
    """A run-time failure inside the program (a bad size read from the data) raises the executor's error."""
    def fn(x):
        k = F.cast(F.sum(x), "int64")               # topk's k read from the data: more than N fails
        return F.topk(x * 2.0, k)

    model = dt.compile(fn, dt.TensorSpec(("N",)))
    assert model.vm_program, model.vm_program_fallback
    x = np.array([1.0, 0.0, 0.5, 0.5], np.float32)
    assert_same(model(x), fn(x))
    bad = np.full(3, 2.0, np.float32)
    with pytest.raises(dt.ExecutionError) as in_vm:
        model(bad)
    with pytest.raises(dt.ExecutionError) as in_executor:
        model(bad, profile=True)            # profile=True: the executor runs the call
    assert str(in_vm.value) == str(in_executor.value)


def test_saved_artifact_runs_its_program(compiled, tmp_path):
    ex, model = compiled("detection")
    path = str(tmp_path / "detection.dtvm")
    model.save(path)
    loaded = dt.load(path)
    assert loaded.vm_program, loaded.vm_program_fallback
    inputs = ex.make_inputs(np.random.default_rng(3), N=40)
    assert_same(loaded(*inputs), ex.fn(*inputs))
    assert loaded.vm_program_calls == 1 and loaded.kernel_calls == 0


def test_validate_and_profile_run_in_the_executor(compiled):
    ex, model = compiled("branchy")
    inputs = ex.make_inputs(np.random.default_rng(0), B=4)
    calls = model.vm_program_calls
    assert_same(model(*inputs, validate=True), ex.fn(*inputs))
    assert_same(model(*inputs, profile=True), ex.fn(*inputs))
    assert model.vm_program_calls == calls and model.last_profile


def test_threads_each_run_their_own_program(compiled):
    """Calls from several threads at once: each thread's VM runs the program (one call per model call there)."""
    import threading
    ex, model = compiled("detection")
    inputs = [ex.make_inputs(np.random.default_rng(i), N=n) for i, n in enumerate((0, 1, 30, 200))]
    wants = [ex.fn(*x) for x in inputs]
    errors, counts = [], []

    def work(k):
        try:
            for r in range(20):
                i = (k + r) % len(inputs)
                assert_same(model(*inputs[i]), wants[i])
            counts.append(model.vm_program_calls)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert counts == [20] * 4


def test_a_while_loop_of_no_iteration_does_not_give_out_a_constant():
    """Review 33 #6: a while_loop that runs no iteration returned its initial var, here a constant of the model,
    itself: a caller writing into the result changed every later call's result. It is copied, as the executor
    copies its constants."""
    def fn(lim):
        return F.while_loop(lambda v: F.sum(v) < lim, lambda v: [v + 1.0], [F.zeros((4,))], max_iterations=10)

    model = dt.compile(fn, dt.TensorSpec((), "float32"))
    assert model.vm_program, model.vm_program_fallback
    calls = model.vm_program_calls
    out = model(np.float32(-1.0))
    out = out[0] if isinstance(out, (list, tuple)) else out
    np.asarray(out)[...] = 7.0
    again = model(np.float32(-1.0))
    again = again[0] if isinstance(again, (list, tuple)) else again
    np.testing.assert_array_equal(np.asarray(again), np.zeros(4, np.float32))
    assert model.vm_program_calls == calls + 2
    three = model(np.float32(2.5))           # sum 0 < 2.5 -> ones (sum 4): one iteration
    three = three[0] if isinstance(three, (list, tuple)) else three
    np.testing.assert_array_equal(np.asarray(three), np.ones(4, np.float32))


def test_a_region_whose_results_are_all_unused_runs_in_the_program():
    """An ONNX Dropout's mask nobody reads makes a region with no output: the program skips its call (the VM
    cannot call a function returning the empty tuple: the model ran in the executor, with a warning)."""
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Dropout", ["x"], ["y", "mask"])], "dropout_mask_unused",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    model = dt.compile(dt.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])))
    assert any(line.endswith("0 out") for line in str(model).splitlines()), str(model)
    for n in (0, 1, 4):
        x = np.linspace(-2.0, 2.0, 3 * n, dtype=np.float32).reshape(n, 3)
        calls = model.vm_program_calls
        got = model(x)
        assert model.vm_program_calls == calls + 1
        assert_same(got, x)


def test_callback_tables_keep_only_live_models(compiled, tmp_path):
    """A long-lived process loading model after model: the program's callback entries (dynamic-shape kernels,
    size checks) of a model that is gone leave the tables (they were never cleared); a model of the same graph
    and library shares them with the others."""
    import gc

    from dyntvm.runtime import vm_program
    ex, model = compiled("detection")
    gc.collect()                        # earlier tests' models that are gone: their entries leave first
    before = vm_program.registered()

    def fn(x, k):                       # a dynamic-shape op the program calls back for: entries of its own
        return F.topk(F.boolean_mask(x, x > 0.5), k)[0]
    other = dt.compile(fn, dt.TensorSpec(("N",)), dt.TensorSpec((), "int64"))
    assert other.vm_program and vm_program.registered() > before
    path = str(tmp_path / "other.dyntvm")
    other.save(path)
    added = vm_program.registered()
    loaded = [dt.load(path) for _ in range(3)]
    assert vm_program.registered() == added                 # the same keys: shared
    x, k = np.linspace(0.0, 1.0, 9, dtype=np.float32), np.int64(2)
    for m in [other] + loaded:
        assert m.vm_program
        assert_same(m(x, k), np.sort(x[x > 0.5])[::-1][:2])
    del loaded, m
    gc.collect()
    assert vm_program.registered() == added                 # `other` still uses them
    del other
    gc.collect()
    assert vm_program.registered() == before
    inputs = ex.make_inputs(np.random.default_rng(0), **ex.sizes)
    assert_same(model(*inputs), ex.fn(*inputs))              # the live model's entries are still there
