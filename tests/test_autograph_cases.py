"""More converted statements, traced once and run by the reference interpreter (no build: cheap) against the same
Python function run by plain numpy at several sizes, 0 included: if inside a user's F.foreach body, a tensor `if`
in a static loop, a loop over a Python list, conditional expressions, and / or, nested early returns, `continue`
in a while, `break` in a for over a tensor, a method reading `self`, tuple swaps, a nested function reading a
variable assigned in an `if` after it."""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from helpers import ops_in

S = dt.TensorSpec
def c_inner_def(xs):
    def body(x, st):
        if F.sum(x) > 0:
            y = x
        else:
            y = -x
        return y, st
    ys, _ = F.foreach(body, xs, [])
    return ys

def d_static_unroll(x):
    for k in range(3):
        if F.sum(x) > k:
            x = x - 1.0
    return x

def e_python_list(x):
    acc = x * 0.0
    for w in [x, x * 2.0, -x]:
        acc = acc + w
    return acc

def f_ifexp(x):
    x = x + 1.0 if F.sum(x) > 0 else x - 1.0
    return x

def g_python_while(x):
    i = 0
    while i < 3:
        x = F.tanh(x) if F.max(x) > 0.5 else x * 2.0
        i += 1
    return x

def h_and_or(x):
    if F.sum(x) > 0 and F.max(x) < 1.5:
        y = x * 2.0
    elif F.sum(x) < -1 or F.min(x) < -1.9:
        y = x * 3.0
    else:
        y = x
    return y

def i_nested_return(x):
    if F.sum(x) > 0:
        if F.max(x) > 1.0:
            return x * 10.0
        x = x + 1.0
    else:
        return x - 5.0
    return x * x

def j_continue_while(x):
    i = 0
    acc = F.sum(x) * 0.0
    n = F.shape_of(x)[0]
    while i < n:
        i = i + 1
        if x[i - 1] < 0:
            continue
        acc = acc + x[i - 1]
    return acc, i

class Model:
    def __init__(self):
        self.w = np.float32(2.0)
    def forward(self, x):
        if F.sum(x) > 0:
            x = x * self.w
        return x

def k_break_for(xs):
    total = F.sum(xs, axis=0) * 0.0
    for x in xs:
        if F.sum(x) < -1.0:
            break
        total = total + x
    return total

def l_augassign_tuple(x):
    a, b = x, x * 2.0
    for r in range(2):
        if F.sum(a) > 0:
            a, b = b, a
        a = a + 1.0
    return a, b

def m_closure_reads_later(x):
    def helper():               # reads y when called, after the if: y is an output of the if
        return y * 2.0
    if F.sum(x) > 0:
        y = x
    else:
        y = -x
    return helper()


MODEL = Model()
ROWS = (S(("T", 3)),)
VEC = (S(("N",)),)


@pytest.mark.parametrize("fn, specs, ops", [
    (c_inner_def, ROWS, {"foreach", "cond"}), (k_break_for, ROWS, {"foreach", "cond"}),
    (d_static_unroll, VEC, {"cond"}), (e_python_list, VEC, set()), (f_ifexp, VEC, {"cond"}),
    (g_python_while, VEC, {"cond"}), (h_and_or, VEC, {"cond"}), (i_nested_return, VEC, {"cond"}),
    (j_continue_while, VEC, {"while_loop", "cond"}), (MODEL.forward, VEC, {"cond"}), (l_augassign_tuple, VEC, {"cond"}),
    (m_closure_reads_later, VEC, {"cond"})],
    ids=lambda p: getattr(p, "__name__", None))
def test_converted_matches_python(fn, specs, ops):
    g = dt.trace(dt.autograph(fn), *specs)
    assert ops_in(g) & {"cond", "foreach", "while_loop"} == ops
    for n in (0, 1, 2, 5):
        if n == 0 and fn in (h_and_or, i_nested_return, g_python_while, c_inner_def):
            continue    # no reference: numpy refuses max / min of an empty vector, and an eager F.foreach over 0
                        # rows traces its body (for the output types), where the unconverted Python `if` is refused
        for sign in (1.0, -1.0):
            shape = (n, 3) if specs is ROWS else (n,)
            x = np.random.default_rng(n).uniform(-2, 2, shape).astype(np.float32) * np.float32(sign)
            want = fn(x.copy())
            got = dt.run_reference(g, x)
            want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
            for a, b in zip(got, want):
                assert np.shape(a) == np.shape(b)
                np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=1e-5)


def n_python_then_traced_while(x):
    ys = [x * 0.0]
    i = 0
    while i < 2 or F.sum(x) > 1.0:      # two Python iterations, then the condition is a tensor
        x = x * 0.5
        ys.append(x)
        i = i + 1
    return F.stack(ys), i


def test_while_becomes_traced_after_python_iterations():
    g = dt.trace(dt.autograph(n_python_then_traced_while), *VEC)
    assert "while_loop" in ops_in(g)
    for n in (1, 3, 6):
        x = np.random.default_rng(n).uniform(0, 3, (n,)).astype(np.float32)
        want, got = n_python_then_traced_while(x), dt.run_reference(g, x)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=1e-5)


def o_if_then_match(x, mode):
    y = x
    if F.sum(x) > 0:
        y = x * 2.0
    match mode:                     # assigns y on one arm only: the if before it must still output y
        case "a":
            y = x + 1.0
        case _:
            pass
    z: np.ndarray                   # declares, assigns nothing
    if F.sum(x) > 0:
        z = y
    else:
        z = y - 1.0
    return z


@pytest.mark.parametrize("mode", ["a", "b"])
def test_a_match_after_an_if_keeps_the_ifs_assignment(mode):
    """Review 33 #1: a `match` (or an annotation without a value) counted as assigning on every path made the
    `if` before it drop its output: a silent wrong answer."""
    converted = dt.autograph(o_if_then_match)
    for n in (1, 4):
        for sign in (1.0, -1.0):
            x = np.random.default_rng(n).uniform(0.5, 2, (n,)).astype(np.float32) * np.float32(sign)
            np.testing.assert_allclose(converted(x.copy(), mode), o_if_then_match(x.copy(), mode), atol=1e-6)


def _module_from(tmp_path, name, source):
    import importlib.util
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("guards, refused", [(3, False), (25, True)])
def test_many_guard_clauses_are_refused_not_expanded_without_end(tmp_path, guards, refused):
    """Review 33 #9: each `if` that returns on some paths copies the rest of the function into both branches;
    25 in a row were 2^25 copies (conversion hung). Past a budget of copied code: refused, naming the line."""
    body = "".join(f"    if F.sum(x) > {k}.0:\n        if F.max(x) > {k}.0:\n            return x * {k}.0\n"
                   for k in range(guards))
    module = _module_from(tmp_path, f"guards{guards}", f"from dyntvm import F\n\ndef f(x):\n{body}    return x\n")
    if refused:
        with pytest.raises(dt.TraceError, match="return on some paths only") as e:
            dt.show_converted(module.f)
        assert f"guards{guards}.py:" in str(e.value)
    else:
        g = dt.trace(dt.autograph(module.f), *VEC)
        x = np.array([0.5, 2.5], np.float32)
        np.testing.assert_allclose(dt.run_reference(g, x), module.f(x))
