"""Python control flow converted by autograph (`dt.compile(fn, ..., autograph=True)`): each program is compiled
once and compared, at several sizes (0 and 1 included), with the same Python function run on numpy arrays (Python's
own `if` / `for` / `while` then run it: the independent reference). The graphs are checked to hold the control-flow
ops the statements became, so a program unrolled or specialized while tracing would fail."""
from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from helpers import ops_in

S = dt.TensorSpec
SCALE = np.float32(0.5)          # a global the converted code reads


def data(n, m=4, seed=0):
    return np.random.default_rng(seed + 10 * n).uniform(-2, 2, (n, m) if m else (n,)).astype(np.float32)


def check(model, fn, *inputs):
    got, want = model(*inputs), fn(*inputs)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-5, atol=1e-5)


def compiled(fn, *specs, ops=()):
    """`fn` compiled once through autograph; its traced graph must use `ops`."""
    if ops:
        assert set(ops) <= ops_in(dt.trace(dt.autograph(fn), *specs)), ops_in(dt.trace(dt.autograph(fn), *specs))
    return dt.compile(fn, *specs, autograph=True)


# ------------------------------------------------------------------------------------------- if
def if_on_reduction(x):
    if x.sum() > 0:
        y = x * 2.0
    else:
        y = -x
    return y + 1.0


def elif_chain(x):
    s = F.sum(x)
    if s > 2.0:
        y = x - 2.0
    elif s > 0.0:
        y = x * 3.0
    elif s > -2.0:
        y = x * SCALE
    else:
        y = x * 0.0
    return y


def early_return(x):
    if F.sum(x) > 1.5:
        return x * 2.0
    y = x - 1.0
    return y * y


@pytest.mark.parametrize("fn", [if_on_reduction, elif_chain, early_return], ids=lambda f: f.__name__)
def test_if_elif_and_early_return(fn):
    model = compiled(fn, S(("N",)), ops={"cond"})
    for n in (0, 1, 2, 7):
        for sign in (1.0, -1.0, 0.1):
            check(model, fn, data(n, 0) * np.float32(sign))


# ----------------------------------------------------------------------------------------- loops
def rows_with_carry(xs, h):
    for x in xs:
        h = F.tanh(x + h * 0.5)
    return h


def range_from_data(x):
    n = F.sum(F.cast(x > 0, "int64"))
    acc = x * 0.0
    for i in range(n):
        acc = acc + x * F.cast(i + 1, "float32")
    return acc, n


def halve_until_small(x):
    steps = 0
    while F.sum(F.abs(x)) > 1.0:
        x = x * 0.5
        steps = steps + 1
    return x, steps


def nested_loop_and_if(m):
    total = 0.0
    for row in m:
        for v in row:
            if v > 0:
                total = total + v
            else:
                total = total - v * 0.5
    return total


def first_above(x):
    n = F.shape_of(x)[0]
    i = 0
    found = -1
    while i < n:
        if x[i] > 1.0:
            found = i
            break
        i = i + 1
    return found, i


def skip_negatives(xs):
    total = F.sum(xs, axis=0) * 0.0
    for x in xs:
        if F.sum(x) < 0:
            continue
        total = total + x
    return total


@pytest.mark.parametrize("fn, specs, ops, make", [
    (rows_with_carry, (S(("T", 4)), S((4,))), {"foreach"}, lambda n: (data(n), data(1)[0])),
    (range_from_data, (S(("N",)),), {"foreach"}, lambda n: (data(n, 0),)),
    (halve_until_small, (S(("N",)),), {"while_loop"}, lambda n: (data(n, 0) * np.float32(n),)),
    (nested_loop_and_if, (S(("R", "C")),), {"foreach", "cond"}, lambda n: (data(n, n + 1),)),
    (first_above, (S(("N",)),), {"while_loop", "cond"}, lambda n: (data(n, 0),)),
    (skip_negatives, (S(("T", 3)),), {"foreach", "cond"}, lambda n: (data(n, 3),))],
    ids=lambda p: getattr(p, "__name__", ""))
def test_loops(fn, specs, ops, make):
    model = compiled(fn, *specs, ops=ops)
    for n in (0, 1, 2, 6):
        check(model, fn, *make(n))


def enumerate_zip_and_symbolic_range(xs, ys):
    acc = F.sum(xs, axis=0) * 0.0
    for i, x in enumerate(xs):
        acc = acc + x * F.cast(i, "float32")
    for a, b in zip(xs, ys):
        acc = acc + a * b
    for t in range(xs.shape[0]):        # a symbolic dim
        acc = acc - ys[t]
    return acc


def test_enumerate_zip_and_symbolic_range_traced():     # the reference interpreter: no build needed
    g = dt.trace(dt.autograph(enumerate_zip_and_symbolic_range), S(("T", 3)), S(("T", 3)))
    assert sum(n.op == "foreach" for n in g.walk()) == 3
    for n in (0, 1, 4):
        xs, ys = data(n, 3), data(n, 3, seed=1)
        np.testing.assert_allclose(dt.run_reference(g, xs, ys), enumerate_zip_and_symbolic_range(xs, ys),
                                   rtol=1e-5, atol=1e-5)


def running_states(xs, h):
    hs = []
    for x in xs:
        h = F.tanh(x + h)
        hs.append(h * 2.0)
    return F.stack(hs), h


def test_list_append_in_loop_is_stacked():
    model = compiled(running_states, S(("T", 4)), S((4,)), ops={"foreach"})
    h0 = data(1)[0]
    for n in (1, 2, 5):
        check(model, running_states, data(n), h0)
    hs, h = model(data(0), h0)         # no step: no row (Python's np.stack would refuse an empty list)
    assert hs.shape == (0, 4)
    np.testing.assert_array_equal(h, h0)


# ------------------------------------------------------------------------- Python stays Python
def static_python(x, k=2):
    scale = SCALE
    if k > 1:                   # a Python int: decided while tracing
        x = x * k
    for j in range(k):          # unrolled
        x = x + j * scale
    flags = [True, False]
    for f in flags:
        if f and not k == 0:
            x = x - 1.0
    return x


def test_python_control_flow_on_python_values_stays_python():
    g = dt.trace(dt.autograph(static_python), S(("N",)))
    assert not ops_in(g) & {"cond", "foreach", "while_loop", "case"}
    model = compiled(static_python, S(("N",)))
    for n in (0, 1, 4):
        check(model, static_python, data(n, 0))
    offset = 3.0

    def closure(x):             # a closure cell, kept by the converted function
        if x.sum() > 0:
            x = x + offset
        return x
    model = compiled(closure, S(("N",)), ops={"cond"})
    for n in (1, 3):
        check(model, closure, data(n, 0))


def test_hybridize_and_show_converted():
    fast = dt.hybridize(rows_with_carry, dynamic=(("T", None), (None,)), autograph=True)
    for n in (0, 1, 3):
        check(fast, rows_with_carry, data(n), data(1)[0])
    assert len(fast.compiled) == 1
    text = dt.show_converted(if_on_reduction)
    assert "ag__.if_stmt" in text and "def if_true_" in text, text


# -------------------------------------------------------------------------------------- errors
def _line_of(fn, code: str) -> str:
    lines, first = inspect.getsourcelines(fn)
    k = next(i for i, s in enumerate(lines) if code in s)
    return f"{os.path.basename(__file__)}:{first + k}"


def assigned_in_one_branch(x):
    if x.sum() > 0:
        z = x * 2.0
    return z


def bad_matmul_in_branch(x):
    if x.sum() > 0:
        x = F.matmul(x, np.ones((4, 2), np.float32))
    return x


def return_in_loop(xs):
    for x in xs:
        if x.sum() > 0:
            return x
    return xs[0]


def test_errors_name_the_variable_and_the_users_line():
    with pytest.raises(dt.TraceError, match="'z'") as e:
        dt.trace(dt.autograph(assigned_in_one_branch), S(("N",)))
    assert _line_of(assigned_in_one_branch, "if x.sum() > 0") in str(e.value)
    with pytest.raises(dt.TraceError, match="matmul") as e:
        dt.trace(dt.autograph(bad_matmul_in_branch), S(("N", 3)))
    assert _line_of(bad_matmul_in_branch, "F.matmul") in str(e.value)
    with pytest.raises(dt.TraceError, match="`return` inside a loop") as e:
        dt.autograph(return_in_loop)
    assert _line_of(return_in_loop, "return x") in str(e.value)
    with pytest.raises(dt.TraceError, match="autograph=True"):      # the refusal without autograph says how
        dt.trace(if_on_reduction, S(("N",)))


def elementwise_condition(x):
    if x > 0:
        x = x * 2.0
    return x


def carries_a_list(xs):
    acc = []
    for x in xs:
        acc = acc + [x]
    return F.stack(acc)


def carried_without_a_value(xs):
    for x in xs:
        last = x * 2.0
    return last


def loop_with_else(xs):
    for x in xs:
        pass
    else:
        xs = xs * 2.0
    return xs


def generator(xs):
    yield xs


class Callable:
    def __call__(self, x):
        return x


def test_refusals_name_what_and_where():
    spec = S(("N",))
    for fn, spec, pattern in [
            (elementwise_condition, spec, "condition of the `if` at test_autograph.py:\\d+ is a traced tensor bool\\[N\\]"),
            (carries_a_list, S(("T", 3)), "'acc' is carried by the `for` loop .* it is a list"),
            (carried_without_a_value, S(("T", 3)), "'last' is carried by the `for` loop .* has no value before it")]:
        with pytest.raises(dt.TraceError, match=pattern):
            dt.trace(dt.autograph(fn), spec)
    for fn in (carries_a_list, carried_without_a_value):     # eagerly, Python runs them: the same results
        np.testing.assert_array_equal(dt.autograph(fn)(data(2, 3)), fn(data(2, 3)))
    for fn, pattern in [(loop_with_else, "loop's `else:`"), (generator, "generators"),
                        (Callable(), "got a Callable")]:
        with pytest.raises(dt.TraceError, match=pattern):
            dt.autograph(fn)
    namespace = {}
    exec("def typed_in(x):\n    if x.sum() > 0:\n        x = x * 2\n    return x\n", {}, namespace)
    with pytest.raises(dt.TraceError, match="cannot read the source of typed_in"):
        dt.autograph(namespace["typed_in"])


def int_becomes_float(xs):
    total = 0
    for x in xs:
        total = total + F.sum(x)
    return total


def test_op_errors_name_the_variables():
    with pytest.raises(dt.TraceError, match="0: 'total'"):
        dt.trace(dt.autograph(int_becomes_float), S(("T", 3)))


def appends_under_condition(xs):
    ys = [xs[0] * 0.0]
    for x in xs:
        if F.sum(x) > 0:            # a per-step value only on some steps: no foreach output expresses it
            ys.append(x)
    return F.stack(ys)


def test_side_effects_under_a_traced_condition_are_refused_not_dropped():
    with pytest.raises(dt.TraceError, match="another scope"):
        dt.trace(dt.autograph(appends_under_condition), S(("T", 3)))
    xs = data(4, 3)
    np.testing.assert_array_equal(dt.autograph(appends_under_condition)(xs), appends_under_condition(xs))
