"""foreach loops compiled end to end (`codegen/compiled_loops.py`): one TIR function runs every step and calls
the body's kernels directly, so a step costs no Python. Each model is checked against numpy at several
lengths (0, 1, odd and even: states alternate between two buffers) and against its own step-by-step run
(``profile=True`` runs the plan, not the compiled loop)."""
import threading

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen import compiled_loops
from dyntvm.examples import lstm as lstm_example
from dyntvm.ir.compiled_loop import compiled_loop_name, foreach_loop_plan
from helpers import assert_same


def _compiled(model) -> list:
    """Names of the compiled loop functions the model's library has, for every foreach (nested too)."""
    found = []

    def walk(g):
        for n in g.nodes:
            if n.op == "foreach":
                plan = foreach_loop_plan(n)
                if plan is not None:
                    try:
                        model.vm[compiled_loop_name(plan[0].attrs.name)]
                        found.append(plan[0].attrs.name)
                    except Exception:  # noqa: BLE001 - declined by codegen
                        pass
            for sub in n.subgraphs:
                walk(sub)
    walk(model.graph)
    return found


def _top_regions(model) -> int:
    """Region calls outside loops (hoisted work, say)."""
    return sum(n.op == "region" for n in model.graph.nodes)


def _has_loop(model) -> bool:
    return bool(_compiled(model))


def lstm_with_c(xs, h, c):
    """The example's LSTM, also returning the final cell state."""
    hs, (h, c) = F.foreach(lstm_example.step, xs, [h, c])
    return hs, h, c


def two_kernels(xs, s):
    """A body of several kernels with an intermediate, a per-step output that is not a state, and a state
    that is not stacked (kept in the two alternating buffers)."""
    def step(x, states):
        (s,) = states
        m = F.softmax(x * 2.0 + s, axis=-1)          # a row reduction: its own kernel
        out = F.tanh(m) - s
        return out * 3.0, [s * 0.5 + m]
    ys, (s,) = F.foreach(step, xs, [s])
    return ys, s


@pytest.fixture(scope="module")
def lstm_c(cache_dir_module):
    fn = lstm_with_c
    model = dt.compile(fn, dt.TensorSpec(("T", "B", 128)), dt.TensorSpec(("B", 256)), dt.TensorSpec(("B", 256)),
                       cache_dir=cache_dir_module)
    return fn, model


@pytest.fixture(scope="module")
def cache_dir_module(tmp_path_factory):
    return str(tmp_path_factory.mktemp("loops-cache"))


def test_the_lstm_runs_as_one_compiled_loop(lstm_c):
    fn, model = lstm_c
    assert _has_loop(model)
    rng = np.random.default_rng(0)
    for T, B in ((0, 1), (1, 1), (2, 3), (5, 2), (64, 1), (64, 16)):
        xs = rng.standard_normal((T, B, 128)).astype(np.float32)
        h0, c0 = (rng.standard_normal((B, 256)).astype(np.float32) for _ in range(2))
        before = model.kernel_calls
        got = model(xs, h0, c0)
        assert _top_regions(model) == 1
        assert model.kernel_calls - before == 2            # x @ W for all steps, then the loop: no call per step
        assert_same(got, fn(xs, h0, c0), rtol=1e-4, atol=1e-5)
        assert_same(model(xs, h0, c0, profile=True), got, rtol=1e-5, atol=1e-6)   # the step-by-step plan


def test_a_body_of_several_kernels_and_an_unstacked_state(cache_dir_module):
    model = dt.compile(two_kernels, dt.TensorSpec(("T", "B", 16)), dt.TensorSpec(("B", 16)),
                       cache_dir=cache_dir_module)
    assert _has_loop(model)
    for T, B in ((0, 2), (1, 1), (2, 2), (3, 1), (4, 5), (9, 3)):
        rng = np.random.default_rng(T)
        xs = rng.standard_normal((T, B, 16)).astype(np.float32)
        s0 = rng.standard_normal((B, 16)).astype(np.float32)
        before = model.kernel_calls
        assert_same(model(xs, s0), two_kernels(xs, s0), rtol=1e-5, atol=1e-6)
        assert model.kernel_calls - before == _top_regions(model) + 1


def test_loops_it_cannot_compile_run_step_by_step(cache_dir_module):
    def small_rows(xs, s):                            # 3 floats a row: not 64-byte aligned rows
        def step(x, st):
            return F.tanh(x + st[0]), [st[0] + x]
        return F.foreach(step, xs, [s])

    def counter(xs, n):                               # a 0-d state
        def step(x, st):
            y = x * st[0]
            return y, [st[0] * 0.5 + F.sum(y)]
        return F.foreach(step, xs, [n])

    compiled_loops.stats.declined.clear()
    for fn, specs, make in (
            (small_rows, (dt.TensorSpec(("T", 3)), dt.TensorSpec((3,))),
             lambda T: (np.ones((T, 3), np.float32), np.zeros(3, np.float32))),
            (counter, (dt.TensorSpec(("T", 16)), dt.TensorSpec(())),
             lambda T: (np.ones((T, 16), np.float32), np.ones((), np.float32)))):
        model = dt.compile(fn, *specs, use_cache=False)
        assert not _has_loop(model)
        for T in (0, 1, 4):
            before = model.kernel_calls
            assert_same(model(*make(T)), fn(*make(T)))
            assert model.kernel_calls - before == _top_regions(model) + T
    reasons = " ".join(r for _, r in compiled_loops.stats.declined)
    assert "64-byte" in reasons and "0-d" in reasons


def test_errors_are_the_step_by_step_errors(cache_dir_module):
    table = np.random.default_rng(1).standard_normal((10, 16)).astype(np.float32)

    def lookups(idx, s):
        def step(i, st):
            h = F.tanh(F.take(table, i, axis=0) + st[0])
            return h, [h]
        return F.foreach(step, idx, [s])
    model = dt.compile(lookups, dt.TensorSpec(("T", 8), "int64"), dt.TensorSpec((8, 16)), cache_dir=cache_dir_module)
    assert _has_loop(model)
    s = np.zeros((8, 16), np.float32)
    good = np.random.default_rng(2).integers(-10, 10, (5, 8))
    assert_same(model(good, s), lookups(good, s))
    bad = good.copy()
    bad[3, 5] = 10                                    # out of range at step 3
    with pytest.raises(dt.ExecutionError, match="index out of range") as compiled:
        model(bad, s)
    with pytest.raises(dt.ExecutionError, match="index out of range") as stepwise:
        model(bad, s, profile=True)
    assert type(compiled.value) is type(stepwise.value)
    with pytest.raises(dt.ExecutionError, match="index out of range"):     # eager mode too
        lookups(bad, s)


def test_an_inner_loop_is_compiled_inside_an_outer_one(cache_dir_module):
    def nested(xss, s):
        def outer(xs, s):              # s: the list of states
            ys, (t,) = F.foreach(lambda x, st: (F.tanh(x + st[0]), [st[0] * 0.5 + x]), xs, [s[0]])
            return F.sum(ys, axis=0), [t]
        return F.foreach(outer, xss, [s])
    model = dt.compile(nested, dt.TensorSpec(("A", "T", 16)), dt.TensorSpec((16,)), cache_dir=cache_dir_module)
    for A, T in ((0, 2), (1, 0), (2, 3), (3, 1)):
        xss = np.random.default_rng(A * 7 + T).standard_normal((A, T, 16)).astype(np.float32)
        s = np.linspace(-1, 1, 16).astype(np.float32)
        assert_same(model(xss, s), nested(xss, s), rtol=1e-5, atol=1e-6)
    assert len(_compiled(model)) == 1                  # the inner loop (the outer body holds a foreach)


def test_compiled_loops_survive_save_and_load_and_threads(lstm_c, tmp_path):
    fn, model = lstm_c
    model.save(str(tmp_path / "m.dtvm"))
    loaded = dt.load(str(tmp_path / "m.dtvm"))
    rng = np.random.default_rng(5)
    cases = []
    for T, B in ((3, 2), (8, 1), (1, 4), (6, 3)):
        xs = rng.standard_normal((T, B, 128)).astype(np.float32)
        h0, c0 = (rng.standard_normal((B, 256)).astype(np.float32) for _ in range(2))
        cases.append(((xs, h0, c0), fn(xs, h0, c0)))
    before = loaded.kernel_calls
    assert_same(loaded(*cases[0][0]), cases[0][1], rtol=1e-4, atol=1e-5)
    assert loaded.kernel_calls - before == 2
    errors = []

    def work(k):
        try:
            for _ in range(20):
                args, want = cases[k % len(cases)]
                assert_same(loaded(*args), want, rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_compiled_loop_failing_where_the_steps_run_falls_back_with_a_warning(lstm_c):
    """Latent (no input found that does it, by review): the compiled loop raising while its steps run. The
    result then comes from the step-by-step run, with a RuntimeWarning, instead of a misleading error."""
    from dyntvm.runtime.executor import Executor
    fn, model = lstm_c

    class LoopFails:
        def __init__(self, vm):
            self.vm = vm

        def __getitem__(self, name):
            if name.endswith("__loop"):
                def boom(*args):
                    raise RuntimeError("boom")
                return boom
            return self.vm[name]
    ex = Executor(model.graph, LoopFails(model.vm))
    rng = np.random.default_rng(9)
    xs = rng.standard_normal((4, 2, 128)).astype(np.float32)
    h0, c0 = (rng.standard_normal((2, 256)).astype(np.float32) for _ in range(2))
    with pytest.warns(RuntimeWarning, match="compiled loop of foreach node .* failed .*boom"):
        got = ex.run([xs, h0, c0])
    assert_same([np.asarray(g.numpy() if hasattr(g, "numpy") else g) for g in got], list(fn(xs, h0, c0)),
                rtol=1e-4, atol=1e-5)


def test_a_compiled_loop_never_breaks_a_build(monkeypatch):
    """Compiled loops are an optimization: an IR the generator did not foresee declines the loop, and a
    build that fails with the loops in it is redone without them (a RuntimeWarning says so)."""
    import tvm

    from dyntvm.codegen import cpu_schedule

    def fn(xs, s):
        ys, (s,) = F.foreach(lambda x, st: (F.tanh(x + st[0]), [st[0] * 0.5 + x]), xs, [s])
        return ys, s
    specs = (dt.TensorSpec(("T", 16)), dt.TensorSpec((16,)))
    xs, s0 = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32), np.ones(16, np.float32)

    def unforeseen(*a, **k):
        raise KeyError("an unforeseen binding")
    monkeypatch.setattr(compiled_loops, "build_loop", unforeseen)
    compiled_loops.stats.declined.clear()
    model = dt.compile(fn, *specs, use_cache=False)
    assert not _has_loop(model) and "unexpected KeyError" in compiled_loops.stats.declined[0][1]
    assert_same(model(xs, s0), fn(xs, s0))
    monkeypatch.undo()

    def failing_pass(specs):
        @tvm.transform.module_pass(opt_level=0, name="broken")
        def broken(mod, ctx):
            raise RuntimeError("a loop function TVM cannot build")
        return broken
    monkeypatch.setattr(cpu_schedule, "loop_pass", failing_pass)
    with pytest.warns(RuntimeWarning, match="building the compiled loops failed"):
        model = dt.compile(fn, *specs, use_cache=False)
    assert not _has_loop(model)
    assert_same(model(xs, s0), fn(xs, s0))
