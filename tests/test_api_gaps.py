"""API gaps a user hit (issue 21 item 16): `//` and `%` on traced tensors (numpy's floor_divide and mod), F.case
with a dict and `exclusive=`, F.ifelse (the seed's form), a while_loop body returning only its new loop vars.
Each: eager == traced (reference interpreter) == compiled, and the plain-Python semantics its docstring gives."""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.errors import ExecutionError, TraceError
from helpers import assert_same, assert_trace_matches_eager

S = dt.TensorSpec


def eager_traced_compiled(fn, specs, inputs_list):
    """fn eagerly == its trace on the reference interpreter == compiled, for each inputs tuple."""
    graph = assert_trace_matches_eager(fn, specs, inputs_list)
    model = dt.compile(graph)
    for inputs in inputs_list:
        assert_same(model(*inputs), fn(*inputs), what=f"compiled at {[np.shape(a) for a in inputs]}")


# ------------------------------------------------------------------------------------- // and %
INT8_EDGES = (np.array([-128, -128, 127, -7, 7, -7, 7, 0, 5, -5], np.int8),
              np.array([-1, 1, -1, 2, -2, -2, 2, 3, 0, 0], np.int8))
FLOAT_EDGES = (np.array([1.0, -1.0, 7.5, -7.5, 0.0, -0.0, np.inf, 1.0, -1.0, np.nan, 1.0, 0.0, 5.0, -3.0],
                        np.float32),
               np.array([0.1, 0.1, 2.0, 2.0, -2.0, 3.0, 1.0, np.inf, np.inf, 1.0, 0.0, 0.0, -0.3, -0.0],
                        np.float32))


def floor_ops(a, b):
    return [a // b, a % b, 3 // b, -7 % b, a // 2, a % -3]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype, edges", [("int8", INT8_EDGES), ("int64", None), ("uint8", None),
                                          ("float32", FLOAT_EDGES), ("float64", None), ("float16", None),
                                          ("bool", None)])
def test_floordiv_and_mod_operators_are_numpys(dtype, edges):
    """Python's // and % on tensors: np.floor_divide / np.mod (the sign of the divisor) eagerly, traced and
    compiled; integer division by 0 gives 0 like numpy, INT_MIN // -1 wraps, float 1 // 0.1 is 9.0."""
    if dtype == "bool":
        if edges is None:
            edges = (np.array([True, False, True, False]), np.array([True, True, False, False]))

        def fn(a, b):
            return [a // b, a % b]
    else:
        fn = floor_ops if dtype != "uint8" else (lambda a, b: [a // b, a % b, 3 // b])    # -7 is no uint8
        if edges is None:
            rng = np.random.default_rng(3)
            lo = 0 if dtype == "uint8" else -20
            edges = (rng.integers(lo, 20, 12).astype(dtype), np.array([3, 0, 7, 5, 1, 2] * 2, dtype)) \
                if np.dtype(dtype).kind in "iu" else (rng.uniform(-9, 9, 12).astype(dtype),
                                                      rng.uniform(-3, 3, 12).astype(dtype))
    a, b = edges
    with np.errstate(all="ignore"):
        want = [np.floor_divide(a, b), np.mod(a, b)]
    for got, w in zip(fn(a, b)[:2], want):          # eagerly: exactly numpy's
        assert_same(got, w)
    eager_traced_compiled(fn, [S(("N",), dtype), S(("N",), dtype)], [(a, b), (a[:0], b[:0]), (a[:1], b[:1])])


def test_floordiv_and_mod_known_values():
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    g = dt.trace(lambda x, y: [x // y, x % y], S((4,), "int32"), S((4,), "int32"))
    q, r = dt.run_reference(g, a, b)
    assert q.tolist() == [7 // 2, -7 // 2, 7 // -2, -7 // -2] == [3, -4, -4, 3]
    assert r.tolist() == [7 % 2, -7 % 2, 7 % -2, -7 % -2] == [1, 1, -1, -1]
    assert F.floor_divide(np.float32(1), np.float32(0.1)) == 1 // np.float32(0.1)
    assert (F.mod(a, 3) == a % 3).all() and (F.floor_divide(a, 3) == a // 3).all()


# ------------------------------------------------------------------------------------------ case
def case_pairs(x):
    s = F.sum(x)
    return F.case([(s > 1, lambda: x * 2), (lambda: s < -1, lambda: x - 1)], lambda: x)


def case_dict_fn_preds(x):
    s = F.sum(x)
    return F.case({(lambda: s > 1): lambda: x * 2, (lambda: s < -1): lambda: -x}, lambda: x + 1)


def case_exclusive(x):
    s = F.sum(x)
    return F.case([(s > 1, lambda: x * 2), (s < -1, lambda: -x)], lambda: x + 1, exclusive=True)


def case_exclusive_overlap(x):
    s = F.sum(x)
    return F.case({(lambda: s > 0): lambda: x * 2, (lambda: s > 1): lambda: -x}, lambda: x + 1, exclusive=True)


def sized(total):
    """Data whose sum is `total` (n rows)."""
    return lambda n: (np.full((n, 2), total / max(2 * n, 1), np.float32),)


@pytest.mark.parametrize("fn", [case_pairs, case_dict_fn_preds, case_exclusive])
def test_case_dict_and_exclusive(fn):
    eager_traced_compiled(fn, [S(("N", 2))], [sized(t)(n) for t in (3.0, -3.0, 0.0) for n in (1, 3)])


def test_case_dict_is_first_true_in_insertion_order():
    x = np.ones((2, 2), np.float32)                              # sum 4: both predicates hold
    got = F.case({(lambda: F.sum(x) > 1): lambda: x * 2, (lambda: F.sum(x) > 0): lambda: x * 3}, lambda: x)
    assert (got == 2).all()


def test_case_exclusive_with_two_true_predicates_raises():
    x = np.ones((2, 2), np.float32)
    with pytest.raises(TraceError, match=r"exclusive=True but predicates 0, 1 all hold"):
        case_exclusive_overlap(x)
    assert (case_exclusive_overlap(np.full((2, 2), 0.1, np.float32)) == 0.2).all()   # one holds: fine
    g = dt.trace(case_exclusive_overlap, S(("N", 2)))
    with pytest.raises(ExecutionError, match="exclusive=True but predicates 0, 1 all hold"):
        dt.run_reference(g, x)
    with pytest.raises(ExecutionError, match="exclusive=True but predicates 0, 1 all hold"):
        dt.compile(g)(x)


@pytest.mark.parametrize("bad, match", [
    (lambda x: F.case(3, lambda: x), "cases must be a dict"),
    (lambda x: F.case([(F.sum(x) > 0,)], lambda: x), r"cases\[0\] must be a \(pred, fn\) pair"),
    (lambda x: F.case({(lambda: F.sum(x) > 0): x}, lambda: x), r"with a callable fn"),
    (lambda x: F.case({F.sum(x) > 0: lambda: x}, lambda: x), r"keys of a cases dict must be no-argument functions"),
    (lambda x: F.case([(F.sum(x) > 0, lambda: x)], lambda: x, exclusive="yes"), "exclusive must be a Python bool"),
])
def test_case_bad_arguments_are_trace_errors(bad, match):
    x = np.ones((2, 2), np.float32)
    with pytest.raises(TraceError, match=match):
        bad(x)
    with pytest.raises(TraceError, match=match):
        dt.trace(bad, S(("N", 2)))


# ---------------------------------------------------------------------------------------- ifelse
def ifelse_list(x, y):
    return F.ifelse(lambda ins: F.sum(ins[0]) > F.sum(ins[1]), lambda ins: [ins[0] - ins[1], ins[1]],
                    lambda ins: [ins[1] * 2, ins[0]], [x, y])


def ifelse_single(x, y):
    return F.ifelse(F.sum(y) > 0, lambda t: t + 1, lambda t: t * 0, x)


@pytest.mark.parametrize("fn", [ifelse_list, ifelse_single])
def test_ifelse(fn):
    rng = np.random.default_rng(5)
    eager_traced_compiled(fn, [S(("N", 3)), S(("N", 3))],
                          [tuple(rng.uniform(-1, 1, (n, 3)).astype(np.float32) for _ in "xy") for n in (0, 1, 4, 4)])


def test_ifelse_is_the_python_expression():
    x, y = np.full((2, 3), 2, np.float32), np.ones((2, 3), np.float32)
    then, other = ifelse_list(x, y), ifelse_list(y, x)
    assert_same(then, [x - y, y])
    assert_same(other, [x * 2, y])


# ------------------------------------------------------------------------- while_loop, new vars only
def while_vars_only(x):
    return F.while_loop(lambda i, s: F.logical_and(i < 5, F.sum(s) < 100.0), lambda i, s: (i + 1, s * 2 + 1),
                        [F.sum(x > 0), x])


def while_single_var(x):
    return F.while_loop(lambda s: F.sum(s) < 50.0, lambda s: s + 1.0, [x], max_iterations=7)


def while_growing_vars_only(x):
    return F.while_loop(lambda s: F.shape_of(s)[0] < 6, lambda s: [F.concat([s, s[-1:] + 1])], [x])


@pytest.mark.parametrize("fn", [while_vars_only, while_single_var, while_growing_vars_only])
def test_while_loop_body_returning_new_vars_only(fn):
    eager_traced_compiled(fn, [S(("N", 3))], [(np.full((n, 3), 0.5, np.float32),) for n in (1, 3, 7)])


def test_while_loop_vars_only_is_the_python_loop():
    x = np.ones((2, 2), np.float32)
    i, s = while_vars_only(x)
    ri, rs, k = 4, x, 0                      # F.sum(x > 0) is 4
    while ri < 5 and rs.sum() < 100:
        ri, rs, k = ri + 1, rs * 2 + 1, k + 1
    assert int(i) == ri and (s == rs).all() and k == 1
    (s,) = while_single_var(np.full((1, 2), 100, np.float32))   # no iteration: the loop vars themselves
    assert (s == 100).all()
    step_outputs, (s,) = F.while_loop(lambda s: F.sum(s) < 6, lambda s: (F.sum(s), [s + 1]), [x])
    assert step_outputs.tolist() == [4.0] and (s == 2).all()         # the pair form as before


def test_while_loop_body_must_keep_one_form():
    flip = {"n": 0}

    def body(s):
        flip["n"] += 1
        return s + 1 if flip["n"] == 1 else (F.sum(s), [s + 1])
    with pytest.raises(TraceError, match="body_fn must return one form"):
        F.while_loop(lambda s: F.sum(s) < 10, body, [np.zeros(2, np.float32)])
    with pytest.raises(TraceError, match=r"or only the new loop vars"):
        F.while_loop(lambda s: F.sum(s) < 10, lambda s: (s, s, s), [np.zeros(2, np.float32)])


# --------------------------------------------------------------------------- x.shape vs F.shape_of(x)
def test_shape_dims_vs_shape_of():
    """x.shape: dims (ints, symbols such as "N") for building shapes; F.shape_of(x): an int64 tensor, a value
    of the graph. Comparing a symbolic dim with an int in Python cannot be decided while tracing: a TraceError
    that points to F.shape_of (was: a raw TypeError)."""
    def branchy(x):
        return x if x.shape[0] > 3 else -x

    def with_shape_of(x):
        return F.cond(F.shape_of(x)[0] > 3, lambda: x, lambda: -x)
    with pytest.raises(TraceError, match=r"'N' > 3: a symbolic dim .* F.shape_of\(x\)\[i\]") as e:
        dt.trace(branchy, S(("N", 2)))
    assert "at test_api_gaps.py:" in str(e.value) and "x.shape[0] > 3" in str(e.value)   # the user's line
    eager_traced_compiled(with_shape_of, [S(("N", 2))], [(np.ones((n, 2), np.float32),) for n in (2, 5)])
    seen = {}
    dt.trace(lambda x: seen.setdefault("dims", x.shape) and x, S(("N", 2)))
    assert seen["dims"] == ("N", 2) and sorted(["b", seen["dims"][0]]) == ["N", "b"]    # still a str
