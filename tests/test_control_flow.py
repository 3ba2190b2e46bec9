"""cond, case, foreach, while_loop: traced graphs run by the reference interpreter equal eager execution
at several sizes (0-length included), lint and survive a JSON round trip; nesting and captures."""
from __future__ import annotations

import tracemalloc
import weakref

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.types import is_unknown
from dyntvm.runtime import control_flow as cf
from helpers import assert_trace_matches_eager, ops_in

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")   # mean of 0-length axes

S = dt.TensorSpec
W = np.random.default_rng(1).uniform(-1, 1, (4, 4)).astype(np.float32)
SIZES = (0, 1, 5)


def data(n, m=4, seed=0, dtype="float32"):
    return np.random.default_rng(seed + 10 * n).uniform(-1, 1, (n, m)).astype(dtype)


def check(fn, specs, make, sizes=SIZES):
    """Trace once, compare with eager at every size; returns the graph."""
    return assert_trace_matches_eager(fn, specs, [make(n) for n in sizes])


X = [S(("N", 4))]
one = lambda n: (data(n),)


# ------------------------------------------------------------------------------------------ cond
def cond_basic(x):
    return F.cond(F.sum(x) > 0, lambda: x * 2, lambda: x - W[0])


def cond_structures(x):
    def then():
        return {"a": x, "b": [F.sum(x), F.max(x, axis=1)]}

    def other():
        return {"a": -x, "b": [F.mean(x), F.min(x, axis=1)]}
    return F.cond(F.sum(x) > 0, then, other)


def cond_dims_differ(x):
    # then: (N, 4); else: a data-dependent number of rows -> an unknown dim in the result
    return F.cond(F.sum(x) > 0, lambda: x, lambda: F.boolean_mask(x, x[:, 0] > 0))


def cond_numpy_outputs(x):
    return F.cond(F.sum(x) > 0, lambda: W[:2], lambda: np.zeros((2, 4), np.float32))


def cond_python_pred(x):
    return F.cond(True, lambda: x + 1, lambda: x - 1), F.cond(np.bool_(False), lambda: x + 1, lambda: x - 1)


def cond_lazy(x):
    # The else branch would fail (index out of range) if it ran; only the taken branch runs.
    bad = np.array([10**6])
    return F.cond(F.sum(F.abs(x)) >= 0, lambda: x + 1, lambda: F.take(x, bad))


@pytest.mark.parametrize("fn", [cond_basic, cond_structures, cond_dims_differ, cond_numpy_outputs,
                                cond_python_pred, cond_lazy])
def test_cond(fn):
    g = check(fn, X, one)
    assert "cond" in ops_in(g)


def test_cond_unknown_dim_in_result():
    g = dt.trace(cond_dims_differ, *X)
    assert is_unknown(g.outputs[0].type.shape[0]) and g.outputs[0].type.shape[1] == 4
    g = dt.trace(cond_basic, *X)
    assert g.outputs[0].type.shape == ("N", 4)         # same dims in both branches stay


def test_cond_branches_capture_explicitly():
    g = dt.trace(cond_basic, *X)
    (node,) = [n for n in g.nodes if n.op == "cond"]
    then_g, else_g = node.subgraphs
    # both branches see the same capture list (x), passed as inputs of the node after the predicate
    assert len(node.inputs) == 2 and len(then_g.inputs) == len(else_g.inputs) == 1
    assert node.inputs[1] is g.inputs[0]
    assert "constant" in ops_in(else_g)                # the numpy closure W[0] became a constant


# ------------------------------------------------------------------------------------------ case
def case_tensor_preds(x):
    s = F.sum(x)
    return F.case([(s > 2, lambda: x + 1), (s > 0, lambda: x * W[1]), (s > -2, lambda: x @ W)], lambda: -x)


def case_fn_preds(x):
    return F.case([(lambda: F.sum(x) > 1, lambda: x + 1), (lambda: F.mean(x) < 0, lambda: x * 2)], lambda: x - 1)


def case_lazy_preds(x):
    # The second predicate would fail (index out of range) if evaluated: the first is always true.
    bad = np.array([10**6])
    return F.case([(lambda: F.sum(F.abs(x)) >= 0, lambda: x + 1),
                   (lambda: F.sum(F.take(x, bad)) > 0, lambda: x * 2)], lambda: x)


def case_default_only_branch(x):
    return F.case([(np.bool_(False), lambda: x + 1)], lambda: x - 1)


def case_structures(x):
    s = F.sum(x)
    return F.case([(s > 0, lambda: (x, F.sum(x, axis=0)))], lambda: (x * 0, F.mean(x, axis=0)))


@pytest.mark.parametrize("fn", [case_tensor_preds, case_fn_preds, case_lazy_preds, case_default_only_branch,
                                case_structures])
def test_case(fn):
    g = check(fn, X, lambda n: (data(n, seed=3),), sizes=(0, 1, 2, 5))
    assert "case" in ops_in(g)


def test_case_takes_every_branch():
    def f(x):
        s = F.sum(x)
        return F.case([(s > 1, lambda: x + 1), (s > 0, lambda: x + 2)], lambda: x + 3)
    g = dt.trace(f, S((1,)))
    for v, want in [(2.0, 3.0), (0.5, 2.5), (-1.0, 2.0)]:
        x = np.array([v], np.float32)
        assert dt.run_reference(g, x)[0] == want == f(x)[0]


# --------------------------------------------------------------------------------------- foreach
def foreach_rnn(xs, h):
    def step(x, states):
        (h,) = states
        h = F.tanh(F.matmul(x, W) + F.matmul(h, W.T))
        return h, [h]
    return F.foreach(step, xs, [h])


def foreach_list_data(xs, ys):
    return F.foreach(lambda d, st: ([d[0] * d[1], F.sum(d[0])], st), [xs, ys], [])


def foreach_empty_outputs(xs):
    return F.foreach(lambda x, st: ([], [st[0] + x, st[1] * 2]), xs, [F.zeros((4,)), np.float32(1)])


def foreach_empty_everything(xs):
    return F.foreach(lambda x, st: ([], []), xs, [])


def foreach_capture_outer(xs):
    scale = F.sum(xs) + 1                           # a traced outer value, captured by the body
    return F.foreach(lambda x, st: (x * scale + W[0], st), xs, [])


def foreach_symbolic_shape_in_body(xs):
    # F.zeros with a dim of an outer tensor: the body must capture a value that carries that dim
    return F.foreach(lambda x, st: (F.zeros((xs.shape[0],)) + F.sum(x), st), xs, [])


def foreach_single_state(xs):
    return F.foreach(lambda x, s: (F.max(x), s + x), xs, F.zeros((4,)))


def foreach_dict_state(xs):
    def step(x, st):
        return {"y": x - st["mean"]}, {"mean": st["mean"] * 0.5 + x * 0.5, "n": st["n"] + 1}
    return F.foreach(step, xs, {"mean": F.zeros((4,)), "n": np.int64(0)})


def foreach_growing_state(xs):
    # a state whose length grows each step: dtype and rank are kept, the dim becomes unknown
    def step(x, st):
        return F.sum(x), [F.concat([st[0], x[:1]])]
    return F.foreach(step, xs, [F.zeros((0,))])


FOREACH = [
    (foreach_rnn, [S(("T", 4)), S((4,))], lambda n: (data(n), data(1)[0] if n else np.zeros(4, np.float32))),
    (foreach_list_data, [S(("T", 4)), S(("T", 4))], lambda n: (data(n), data(n, seed=1))),
    (foreach_empty_outputs, [S(("T", 4))], one),
    (foreach_empty_everything, [S(("T", 4))], one),
    (foreach_capture_outer, [S(("T", 4))], one),
    (foreach_symbolic_shape_in_body, [S(("T", 4))], one),
    (foreach_single_state, [S(("T", 4))], one),
    (foreach_dict_state, [S(("T", 4))], one),
    (foreach_growing_state, [S(("T", 4))], one),
]


@pytest.mark.parametrize("fn, specs, make", FOREACH, ids=[f[0].__name__ for f in FOREACH])
def test_foreach(fn, specs, make):
    g = check(fn, specs, make)
    assert "foreach" in ops_in(g)


def test_foreach_zero_length_gives_empty_outputs_and_initial_states():
    xs, h = np.zeros((0, 4), np.float32), data(1)[0]
    hs, (hT,) = foreach_rnn(xs, h)
    assert hs.shape == (0, 4) and hs.dtype == np.float32
    np.testing.assert_array_equal(hT, h)
    g = dt.trace(foreach_rnn, S(("T", 4)), S((4,)))
    rhs, (rhT,) = dt.run_reference(g, xs, h)
    assert rhs.shape == (0, 4)
    np.testing.assert_array_equal(rhT, h)


def test_foreach_types():
    g = dt.trace(foreach_rnn, S(("T", 4)), S((4,)))
    assert [str(v.type) for v in g.outputs] == ["float32[T,4]", "float32[4]"]
    g = dt.trace(foreach_growing_state, S(("T", 4)))
    steps, st = g.outputs
    assert str(steps.type) == "float32[T]" and is_unknown(st.type.shape[0])


# ------------------------------------------------------------------------------------ while_loop
def while_counter(x):
    return F.while_loop(lambda i, acc: i < 3, lambda i, acc: (F.sum(acc), (i + 1, acc * 2)), [0, x])


def while_zero_iterations(x):
    return F.while_loop(lambda i, acc: i < 0, lambda i, acc: ((acc * 2, F.sum(acc)), (i + 1, acc)), [0, x])


def while_growing(x):
    # A decoded sequence that grows by one row per step (loop-var shape changes; step outputs stacked)
    def body(seq, n):
        nxt = F.tanh(F.matmul(seq[-1:], W))
        return F.sum(nxt), (F.concat([seq, nxt]), n - 1)
    return F.while_loop(lambda seq, n: n > 0, body, [x[:1], np.int64(4)])


def while_data_dependent(x):
    # halve until the sum is small: the trip count depends on the data
    return F.while_loop(lambda v: F.sum(F.abs(v)) > 0.5, lambda v: (F.max(v), [v * 0.5]), [x])


def while_max_iterations_int(x):
    return F.while_loop(lambda v: F.sum(v) > -1e9, lambda v: (v[:, 0], [v + 1]), [x], max_iterations=3)


def while_max_iterations_zero(x):
    return F.while_loop(lambda v: F.sum(v) > -1e9, lambda v: (v, [v + 1]), [x], max_iterations=0)


def while_max_iterations_tensor(x, m):
    return F.while_loop(lambda i, v: i < 100, lambda i, v: (v * 2, (i + 1, v + 1)), [np.int64(0), x],
                        max_iterations=m)


def while_no_step_outputs(x):
    return F.while_loop(lambda i, v: i < 2, lambda i, v: ([], [i + 1, v @ W]), [np.int32(0), x])


def while_capture(x):
    lim = F.sum(F.abs(x)) + 2.0           # outer traced value used in cond_fn and body_fn
    return F.while_loop(lambda v: F.sum(v) < lim, lambda v: ([], [v + 1.0 + lim * 0]), [F.sum(x)])


def while_float_scalar_var(x):
    # Python float loop var: float32, like every Python float constant
    return F.while_loop(lambda s, i: i < 2, lambda s, i: ([], [s + F.mean(x), i + 1]), [0.0, 0])


WHILE = [
    (while_counter, X, one),
    (while_zero_iterations, X, one),
    (while_growing, X, one, (1, 3)),
    (while_data_dependent, X, one),
    (while_max_iterations_int, X, one),
    (while_max_iterations_zero, X, one),
    (while_max_iterations_tensor, X + [S((), "int64")], lambda n: (data(n), np.int64(n))),
    (while_no_step_outputs, X, one),
    (while_capture, X, one),
    (while_float_scalar_var, X, one),
]


@pytest.mark.parametrize("case", WHILE, ids=[w[0].__name__ for w in WHILE])
def test_while_loop(case):
    fn, specs, make = case[:3]
    g = check(fn, specs, make, *case[3:])
    assert "while_loop" in ops_in(g)


def test_while_loop_step_outputs_are_stacked_to_iterations_run():
    g = dt.trace(while_max_iterations_tensor, S(("N", 4)), S((), "int64"))
    x = data(2)
    for m in [0, 1, 4]:
        steps, (i, v) = dt.run_reference(g, x, np.int64(m))
        assert steps.shape == (m, 2, 4) and int(i) == m
        np.testing.assert_allclose(v, x + m)
    steps, (seq, n) = dt.run_reference(dt.trace(while_growing, S(("N", 4))), data(1))
    assert steps.shape == (4,) and seq.shape == (5, 4) and int(n) == 0
    zero_steps, (i, acc) = while_zero_iterations(data(3))
    assert [s.shape for s in zero_steps] == [(0, 3, 4), (0,)] and i == 0


def _run_steps(n_iter: int, on_step=lambda out: None) -> np.ndarray:
    """The while_loop runner (as eager mode calls it) for `n_iter` steps of a 16-float step output."""
    def body(args):
        out = np.full(16, args[0], np.float32)
        on_step(out)
        return [out, args[0] + 1]
    (stacked,), (i,) = cf.while_loop(lambda args: [args[0] < n_iter], body, [0], [], None, None,
                                     truth=lambda res: bool(res[0]))
    return stacked


def _check_steps(stacked: np.ndarray, n_iter: int) -> None:
    np.testing.assert_array_equal(stacked, np.repeat(np.arange(n_iter, dtype=np.float32)[:, None], 16, 1))


def test_while_loop_keeps_few_step_outputs_alive():
    """Step outputs are copied out in chunks: 5000 steps never hold more than one chunk of them (each may
    hold a 4 KB TVM page: 100k steps of 16 floats once kept 454 MB for a 6.4 MB result)."""
    alive = [0, 0]                  # now, most at once

    def on_step(out):
        alive[0] += 1
        alive[1] = max(alive)
        weakref.finalize(out, lambda: alive.__setitem__(0, alive[0] - 1))
    _check_steps(_run_steps(5000, on_step), 5000)
    assert 0 < alive[1] <= 256


def test_while_loop_stacking_memory_stays_near_the_result():
    """Traced numpy memory peaks under 1.75x the result (one buffer grown 1.5x at a time, cut to size;
    concatenating chunks at the end peaked at 2x)."""
    tracemalloc.start()
    try:
        stacked = _run_steps(30000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _check_steps(stacked, 30000)
    assert peak < 1.75 * stacked.nbytes, f"peak {peak / stacked.nbytes:.2f}x the result"


def test_while_loop_growing_var_type():
    g = dt.trace(while_growing, S(("N", 4)))
    steps, seq, n = g.outputs
    assert is_unknown(steps.type.shape[0]) and is_unknown(seq.type.shape[0]) and seq.type.shape[1] == 4
    assert steps.type.shape[0] != seq.type.shape[0]


# ------------------------------------------------------------------------------------- nesting
def nested(x):
    """A cond inside a foreach inside a while_loop, capturing values of every enclosing scope."""
    thresh = F.mean(x)                                        # main graph value

    def wbody(i, acc):
        bias = F.sum(acc) * 0.01                              # while-body value

        def fbody(row, st):
            r = F.cond(F.sum(row) > thresh, lambda: row * W[0] + bias, lambda: row - st[0])
            return r, [st[0] + r]
        out, (st,) = F.foreach(fbody, acc, [F.zeros((4,))])
        return st, (i + 1, out * 0.5)
    return F.while_loop(lambda i, acc: i < 3, wbody, [np.int64(0), x])


def nested_loops_with_masks(x):
    """Data-dependent shapes inside nested bodies."""
    def body(row, st):
        kept = F.boolean_mask(row, row > 0)
        total = F.cond(F.sum(kept) > 0, lambda: F.sum(kept), lambda: F.sum(row) * 0)
        return [total, F.sum(F.arange(F.sum(row > 0)))], st
    return F.foreach(body, x, [])


def nested_case_in_while(x):
    def body(i, v):
        v = F.case([(i < 1, lambda: v + 1), (lambda: i < 2, lambda: v * 2)], lambda: v - 3)
        return F.sum(v), (i + 1, v)
    return F.while_loop(lambda i, v: i < 4, body, [np.int64(0), x])


@pytest.mark.parametrize("fn", [nested, nested_loops_with_masks, nested_case_in_while])
def test_nested_control_flow(fn):
    check(fn, X, one)


def test_nested_subgraphs_are_closed():
    g = dt.trace(nested, *X)
    (w,) = [n for n in g.nodes if n.op == "while_loop"]
    body = w.subgraphs[1]
    (fe,) = [n for n in body.nodes if n.op == "foreach"]
    (cn,) = [n for n in fe.subgraphs[0].nodes if n.op == "cond"]
    # thresh (main graph) is captured by the while body, then the foreach body, then the cond
    assert len(w.inputs) > 2 and len(fe.inputs) > 2 and len(cn.inputs) >= 3
    for n in g.walk():
        for sg in n.subgraphs:
            sg.lint()                     # each subgraph checks on its own: it is closed


def test_numpy_closures_become_constants():
    g = dt.trace(foreach_rnn, S(("T", 4)), S((4,)))
    (fe,) = g.nodes
    consts = [n for n in fe.subgraphs[0].nodes if n.op == "constant"]
    assert any(np.array_equal(c.attrs.value, W) for c in consts)
    assert all(not c.attrs.value.flags.writeable for c in consts)


# ------------------------------------------------------------------- long loops, compiled models
def while_many_steps(x, m):
    # more steps than the runner stacks per chunk (256): chunks joined, at and around the boundary
    return F.while_loop(lambda i, v: i < m, lambda i, v: ((v[:, 0] * F.cast(i, "float32"), i), (i + 1, v)),
                        [np.int64(0), x])


def test_while_loop_over_many_steps():
    check(while_many_steps, X + [S((), "int64")], lambda m: (data(2), np.int64(m)), sizes=(255, 256, 257, 600))


def one_input_cases(x):
    """Every single-input control-flow case above, as one model (one TVM build)."""
    return ([f(x) for f in (cond_basic, cond_structures, cond_dims_differ, cond_numpy_outputs, cond_python_pred,
                            cond_lazy)],
            [f(x) for f in (case_tensor_preds, case_fn_preds, case_lazy_preds, case_default_only_branch,
                            case_structures)],
            [f(x) for f in (foreach_empty_outputs, foreach_empty_everything, foreach_capture_outer,
                            foreach_single_state, foreach_dict_state,
                            foreach_growing_state)],
            [f(x) for f in (while_counter, while_zero_iterations, while_data_dependent, while_max_iterations_int,
                            while_max_iterations_zero, while_no_step_outputs, while_capture, while_float_scalar_var)],
            [f(x) for f in (nested, nested_loops_with_masks, nested_case_in_while)])


def multi_input_cases(x, y, m):
    return (foreach_rnn(x, W[0]), foreach_list_data(x, y), while_max_iterations_tensor(x, m),
            while_many_steps(y, m * 100))


def test_compiled_models_match_eager(tmp_path):
    """The executor drives the same runner as eager mode and the interpreter: same results, every case."""
    from helpers import assert_same
    cache = str(tmp_path)
    one = dt.compile(one_input_cases, *X, cache_dir=cache)
    multi = dt.compile(multi_input_cases, S(("T", 4)), S(("T", 4)), S((), "int64"), cache_dir=cache)
    for n in SIZES:
        x = data(n)
        assert_same(one(x), one_input_cases(x), rtol=1e-4, atol=1e-4, what=f"single-input cases at N={n}")
        args = (data(n), data(n, seed=1), np.int64(n))
        assert_same(multi(*args), multi_input_cases(*args), rtol=1e-4, atol=1e-4, what=f"multi-input at N={n}")
