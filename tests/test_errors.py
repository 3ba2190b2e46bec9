"""Trace errors: each names the API, the rule, what was got, a hint where one helps, and the user's line."""
from __future__ import annotations

import linecache
import os
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

S = dt.TensorSpec
X = S(("N", 4))


def raises(match, fn, *specs, snippet):
    """Tracing `fn` raises a TraceError matching `match` that points at this file's line containing `snippet`."""
    with pytest.raises(dt.TraceError, match=match) as info:
        dt.trace(fn, *specs)
    assert_points_at(info.value, snippet)
    return str(info.value)


def assert_points_at(err, snippet):
    m = re.search(r"\n    at ([^:\n]+):(\d+): (.*)$", str(err))
    assert m, f"no source location in: {err}"
    assert m.group(1) == os.path.basename(__file__)
    line = linecache.getline(__file__, int(m.group(2)))
    assert snippet in line and snippet in m.group(3), (snippet, line)


# --------------------------------------------------------------------------------- branches
def test_cond_branch_structure_mismatch():
    def f(x):
        return F.cond(F.sum(x) > 0, lambda: (x, x), lambda: x)      # structure
    raises(re.escape("cond: branches must have the same structure; then branch is (*, *) and else branch is *"),
           f, X, snippet="# structure")


def test_cond_branch_dtype_mismatch():
    def f(x):
        return F.cond(F.sum(x) > 0, lambda: x, lambda: F.cast(x, "int32"))    # dtype
    raises(re.escape("cond: branches must have the same dtype and rank; output 0 is float32[N,4] in the then "
                     "branch and int32[N,4] in the else branch"), f, X, snippet="# dtype")


def test_cond_branch_rank_mismatch():
    def f(x):
        return F.cond(F.sum(x) > 0, lambda: [x, x], lambda: [x, F.sum(x, axis=0)])    # rank
    raises(re.escape("output 1 is float32[N,4] in the then branch and float32[4] in the else branch"), f, X,
           snippet="# rank")


def test_case_branch_mismatch_names_the_branch():
    def f(x):
        return F.case([(F.sum(x) > 0, lambda: x)], lambda: F.sum(x))    # case rank
    raises(re.escape("case: branches must have the same dtype and rank; output 0 is float32[N,4] in the branch 0 "
                     "and float32[] in the default"), f, X, snippet="# case rank")


# ------------------------------------------------------------------------------------- loops
def test_while_loop_var_rank_change():
    def f(x, h):
        return F.while_loop(lambda i, h: i < 3, lambda i, h: ([], (i + 1, F.sum(h, axis=1))), [0, h])  # loop
    raises(re.escape("while_loop: body_fn must return loop vars of the same dtype and rank; loop_vars[1] is "
                     "float32[B,256] in and float32[B] out"), f, X, S(("B", 256)), snippet="# loop")


def test_while_loop_var_dtype_change():
    def f(x):
        return F.while_loop(lambda v: F.sum(v) > 0, lambda v: ([], [v > 0]), [x])  # dtype change
    raises(re.escape("loop_vars[0] is float32[N,4] in and bool[N,4] out"), f, X, snippet="# dtype change")


def test_while_loop_eager_var_change_has_the_same_message():
    with pytest.raises(dt.TraceError, match=re.escape("loop_vars[1] is float32[2,3] in and float32[2] out")):
        F.while_loop(lambda i, h: i < 3, lambda i, h: ([], (i + 1, F.sum(h, axis=1))), [0, np.ones((2, 3), "f")])


def test_while_loop_structure_change():
    def f(x):
        return F.while_loop(lambda v: F.sum(v) > 0, lambda v: ([], [v, v]), [x])  # structure change
    raises(re.escape("while_loop: body_fn's new loop vars must have the structure of loop_vars; got [*, *], "
                     "expected [*]"), f, X, snippet="# structure change")


def test_foreach_state_change():
    def f(x):
        return F.foreach(lambda s, st: (s, [F.sum(st[0])]), x, [F.zeros((4,))])  # state change
    raises(re.escape("foreach: body must return states of the same dtype and rank; states[0] is float32[4] in "
                     "and float32[] out"), f, X, snippet="# state change")


def test_foreach_body_must_return_a_pair():
    def f(x):
        return F.foreach(lambda s, st: s, x, [])  # not a pair
    raises(re.escape("foreach: body must return a pair (outputs, new_states)"), f, X, snippet="# not a pair")


def test_foreach_data_of_unequal_length():
    def f(x, y):
        return F.foreach(lambda d, st: (d[0] + d[1], st), [x, y], [])  # lengths
    raises(re.escape("foreach: data tensors must have the same length (axis 0); got lengths N, M"), f, X,
           S(("M", 4)), snippet="# lengths")
    raises(re.escape("got lengths 3, 5"), f, S((3, 4)), S((5, 4)), snippet="# lengths")
    with pytest.raises(dt.TraceError, match=re.escape("got lengths 2, 3")):
        F.foreach(lambda d, st: (d[0] + d[1], st), [np.ones((2, 4)), np.ones((3, 4))], [])


def test_foreach_unequal_unknown_lengths_fail_at_run_time():
    def f(x):
        return F.foreach(lambda d, st: (d[0] + d[1], st), [x[x[:, 0] > 0], x[x[:, 1] > 0]], [])
    g = dt.trace(f, X)                 # two unknown lengths may agree: checked when it runs
    x = np.array([[1, 1, 0, 0], [1, -1, 0, 0]], np.float32)
    with pytest.raises(dt.ExecutionError, match=r"foreach node '\w+' failed: foreach: data tensors must have the same "
                       r"length \(axis 0\); got lengths 2, 1") as info:
        dt.run_reference(g, x)
    assert_points_at(info.value, "F.foreach(lambda d, st: (d[0] + d[1], st), [x[x[:, 0] > 0]")


def test_foreach_zero_d_data():
    def f(x):
        return F.foreach(lambda d, st: (d, st), F.sum(x), [])  # 0-d data
    raises(re.escape("foreach: data[0] is 0-d (float32[])"), f, X, snippet="# 0-d data")


# -------------------------------------------------------------------------------- predicates
@pytest.mark.parametrize("pred, got", [(lambda x: x > 0, "bool[N,4]"), (lambda x: F.sum(x), "float32[]")])
def test_cond_predicate_must_be_0d_bool(pred, got):
    def f(x):
        return F.cond(pred(x), lambda: x, lambda: x)  # cond pred
    raises(re.escape(f"cond: pred must be a 0-d bool tensor, got {got}; use e.g. F.greater(F.sum(x), 0)"), f, X,
           snippet="# cond pred")


def test_case_predicates_must_be_0d_bool():
    def f(x):
        return F.case([(F.sum(x) > 0, lambda: x), (F.sum(x), lambda: x)], lambda: x)  # tensor pred
    raises(re.escape("case: predicate 1 must be a 0-d bool tensor, got float32[]"), f, X, snippet="# tensor pred")

    def g(x):
        return F.case([(lambda: x > 0, lambda: x)], lambda: x)  # function pred
    raises(re.escape("case: predicate 0 must be a 0-d bool tensor, got bool[N,4]"), g, X,
           snippet="# function pred")


def test_while_cond_fn_must_return_0d_bool():
    def f(x):
        return F.while_loop(lambda v: F.sum(v), lambda v: ([], [v]), [x])  # cond_fn
    raises(re.escape("while_loop: cond_fn must return a 0-d bool tensor, got float32[]"), f, X,
           snippet="# cond_fn")

    def g(x):
        return F.while_loop(lambda v: v > 0, lambda v: ([], [v]), [x])  # cond_fn rank
    raises(re.escape("got bool[N,4]"), g, X, snippet="# cond_fn rank")


def test_eager_predicates_are_checked_too():
    with pytest.raises(dt.TraceError, match=re.escape("cond: pred must be a 0-d bool tensor, got float64[3]")):
        F.cond(np.ones(3), lambda: 1, lambda: 2)
    with pytest.raises(dt.TraceError, match=re.escape("while_loop: cond_fn must return a 0-d bool tensor, got int64[]")):
        F.while_loop(lambda v: v, lambda v: ([], [v - 1]), [np.int64(3)])


def test_max_iterations_must_be_an_integer():
    def f(x):
        return F.while_loop(lambda v: F.sum(v) > 0, lambda v: ([], [v]), [x], max_iterations=F.sum(x))  # max
    raises(re.escape("while_loop: max_iterations must be an int or a 0-d integer tensor, got float32[]"), f, X,
           snippet="# max")


# ------------------------------------------------------------------- Python on traced tensors
@pytest.mark.parametrize("use, what, hint", [
    (lambda x: x if x else x, "bool()", "F.cond / F.case for data-dependent branches or F.while_loop"),
    (lambda x: int(F.sum(x)), "int()", "F.while_loop / F.cond"),
    (lambda x: float(F.sum(x)), "float()", "keep it a tensor"),
    (lambda x: [r for r in x], "iteration", "use F.foreach to loop over axis 0"),
    (lambda x: len(x), "len()", "F.foreach"),
    (lambda x: range(10)[F.sum(x > 0)], "the integer value", "F.take"),
    (lambda x: np.asarray(x), "the numpy value", "dyntvm.F functions"),
])
def test_python_on_a_traced_tensor(use, what, hint):
    msg = raises(re.escape(what) + " of a traced tensor .* is not known while tracing; .*" + re.escape(hint),
                 use, X, snippet="(lambda x: ")
    assert re.search(r"(float32|int64)\[(N,4)?\]", msg)


def test_numpy_function_on_a_traced_tensor():
    def f(x):
        return np.sum(x)  # numpy
    raises(re.escape("np.sum was called on a traced tensor; use F.sum"), f, X, snippet="# numpy")


def test_bitwise_operators_need_bools():
    def f(x):
        return F.cast(x, "int32") & 1  # bitwise
    raises(re.escape("& is only supported on bool tensors"), f, X, snippet="# bitwise")


# ------------------------------------------------------------------------- shape / type rules
def test_broadcast_errors_name_the_op_and_shapes():
    def f(x, y):
        return x + y  # bcast
    raises(re.escape("add: cannot broadcast dims 4 and 3; inputs are float32[N,4], float32[3]"), f, X, S((3,)),
           snippet="# bcast")
    raises(re.escape("add: broadcast needs the symbolic dim N and the symbolic dim M equal, but they are not known "
                     "to be equal; if they are always equal, say so with F.assert_dims_equal(x, y, axis_x, axis_y) "
                     "(checked at run time) or give both inputs the same "
                     "symbol; inputs are float32[N,4], float32[M,4]"), f, X, S(("M", 4)), snippet="# bcast")

    def g(x):
        return F.where(x > 0, x, np.zeros((2, 4), np.float32))  # where
    raises(re.escape("where: cannot broadcast"), g, S((3, 4)), snippet="# where")


def test_broadcast_errors_inside_bodies_point_at_the_body():
    def f(x):
        def body(row, st):
            return row + np.ones(3, np.float32), st  # in body
        return F.foreach(body, x, [])
    raises(re.escape("add: cannot broadcast dims 4 and 3; inputs are float32[4], float32[3]"), f, X,
           snippet="# in body")


@pytest.mark.parametrize("fn, specs, match, snippet", [
    (lambda x: x @ np.zeros((3, 2), np.float32), [X], "matmul: matmul contraction dims differ", "@ np.zeros"),
    (lambda x: F.concat([x, np.zeros((2, 3), np.float32)], axis=0), [X], "concat: concat: dims 4 and 3 differ",
     "F.concat("),
    (lambda x: F.reshape(x, (3, 5)), [S((4, 3))], "reshape: cannot reshape", "F.reshape("),
    (lambda x: F.reshape(x, ("K", 4)), [X], "the symbolic dim 'K' is not a dim of any traced tensor",
     "F.reshape("),
    (lambda x: F.squeeze(x), [X], "squeeze: squeeze without an axis is ambiguous", "F.squeeze("),
    (lambda x: F.squeeze(x, 1), [X], "cannot squeeze axis 1 of size 4", "F.squeeze("),
    (lambda x: F.boolean_mask(x, x > 0), [X], "boolean_mask: mask must be 1-d", "F.boolean_mask("),
    (lambda x: F.boolean_mask(x, x[:, 0]), [X], "boolean_mask: mask must be bool, got float32", "F.boolean_mask("),
    (lambda x: F.take(x, x), [X], "take: indices must be integers", "F.take("),
    (lambda x: F.topk(x, 5), [X], "topk: k=5 is larger than axis 1 of size 4", "F.topk("),
    (lambda x: F.sum(x, axis=2), [X], "sum: axis 2 is out of range for a tensor of rank 2", "F.sum("),
    (lambda x: F.layer_norm(x, np.ones(3, "f"), np.ones(4, "f")), [X], r"layer_norm: gamma float32\[3\]",
     "F.layer_norm("),
    (lambda x: F.split(x, 3, axis=1), [X], "cannot split axis of size 4 into 3 equal parts", "F.split("),
    (lambda x: x[:, :, 0], [X], "index .* has too many entries for a tensor of rank 2", "x[:, :, 0]"),
    (lambda x: x[:, 4], [X], "index 4 is out of range for axis 1 of size 4", "x[:, 4]"),
    (lambda x: x[:F.sum(x > 0)], [X], "slice: bounds and steps must be Python ints or None", "x[:F.sum"),
    (lambda x: x[::-1, 1:], [S(("N", "M"))] * 1, None, None),
    (lambda x: x[1::-1], [X], None, None),         # a negative step with bounds: min(N, 2) rows
    (lambda x: F.arange(F.sum(x)), [S(("N",), "int32")], None, None),
    (lambda x: F.arange(F.sum(x, axis=0)), [X], "arange: arange bounds must be 0-d tensors", "F.arange("),
    (lambda x: x + x.shape[0], [X], "add: got the symbolic dim 'N' where a tensor is expected", "x.shape[0]"),
    (lambda x: F.cast(x, "int32") & 1, [X], "& is only supported on bool tensors", "& 1"),
    (lambda x: None, [X], "trace: output 0 is None", "dt.trace(fn, *specs)"),    # points at the trace call
    (lambda x: F.full_like(x, F.sum(x)), [X], "full_like: expected a Python or numpy scalar", "F.full_like("),
    (lambda x: x + F.full((), -1, "uint8"), [S(("N",), "uint8")], "full: fill value -1 does not fit uint8",
     "F.full((), -1"),
    (lambda x: F.full_like(x, 256), [S(("N",), "uint8")], "full_like: fill value 256 does not fit uint8",
     "F.full_like(x, 256)"),
    (lambda x: F.full_like(x, -129, "int8"), [X], "full_like: fill value -129 does not fit int8", "-129"),
    (lambda x: x + F.full((2,), 2 ** 64), [X], "the Python int 18446744073709551616 does not fit int64", "2 ** 64"),
    (lambda x: F.full_like(x, -1.0, "uint8") + F.full((), 255, "uint8"), [X], None, None),   # numpy: fine
    (lambda x: F.topk(x, -1), [X], "topk: k must be >= 0, got -1", "F.topk(x, -1)"),
    (lambda x: x + F.arange(float("nan")), [X], re.escape("arange: arange(0, nan, 1): cannot compute the length"),
     "F.arange(float"),
    (lambda x: F.arange(3, 5, 0) + x[0], [X], re.escape("arange: arange(3, 5, 0): step must not be 0"), "F.arange(3"),
    (lambda x: F.arange(2 ** 62) + x[0], [X], "4611686018427387904 elements of int64 are more than an array can",
     "F.arange(2 ** 62)"),
])
def test_op_errors(fn, specs, match, snippet):
    if match is None:                   # control: these trace fine
        dt.trace(fn, *specs)
        return
    raises(match, fn, *specs, snippet=snippet)


def test_full_fill_values_that_do_not_fit_raise_eagerly_too():
    """np.full((), -1, np.uint8) raises OverflowError: eager and traced full raise the same TraceError when
    the op is created (compiled code used to wrap to 255)."""
    for make, msg in [(lambda: F.full((), -1, "uint8"), "full: fill value -1 does not fit uint8"),
                      (lambda: F.full_like(np.zeros(2, "int16"), 2 ** 15), "full_like: fill value 32768 does not fit int16"),
                      (lambda: F.full((), 2 ** 70), "the Python int 1180591620717411303424 does not fit int64")]:
        with pytest.raises(dt.TraceError, match=re.escape(msg)):
            make()
    assert F.full((2,), 255, "uint8").tolist() == [255, 255]


def test_eager_ops_raise_dyntvm_errors_not_raw_numpy_ones():
    """Eager F ops used to raise numpy's ValueError / MemoryError / ZeroDivisionError / OverflowError."""
    x = np.array([3, 1, 2], "float32")
    for make, err, msg in [
            (lambda: F.topk(x, np.array(-1)), dt.ExecutionError, "topk failed: topk: k=-1 must be in [0, 3]"),
            (lambda: F.topk(x, np.array(5)), dt.ExecutionError, "topk failed: topk: k=5 must be in [0, 3]"),
            (lambda: F.topk(x, np.array([1])), dt.TraceError, "topk: topk's k must be 0-d tensors, got int64[1]"),
            (lambda: F.topk(x, 1.5), dt.TraceError, "topk: k must be an integer, got 1.5"),
            (lambda: F.arange(np.array(np.nan, "float32")), dt.TraceError, "cannot compute the length"),
            (lambda: F.arange(np.array(np.inf, "float32")), dt.TraceError, "cannot compute the length"),
            (lambda: F.arange(np.array(3), np.array(5), np.array(0)), dt.TraceError, "step must not be 0"),
            (lambda: F.arange(-3, -36, -46, dtype="uint8"), dt.TraceError, "as uint8: Python integer -3 out of bounds"),
            (lambda: F.arange(10 ** 17), dt.TraceError, "arange: a tensor of shape (100000000000000000,) and dtype "
             "int64 needs")]:      # (refused before numpy tries to allocate it: issue 21)
        with pytest.raises(err, match=re.escape(msg)):
            make()
    np.testing.assert_array_equal(F.topk(x, np.array(2))[1], [0, 2])
    np.testing.assert_array_equal(F.arange(0.1, 0.3, 0.1), np.arange(0.1, 0.3, 0.1, dtype="float32"))


# ------------------------------------------------------------------------------------ scopes
def test_tensor_from_a_finished_trace():
    leaked = []
    dt.trace(lambda x: leaked.append(x) or x, X)

    def f(x):
        return x + leaked[0]  # leaked
    raises(re.escape("a traced tensor from another scope was used here"), f, X, snippet="# leaked")


def test_value_from_inside_a_body_used_outside():
    inner = []

    def f(x):
        y = F.cond(F.sum(x) > 0, lambda: inner.append(x * 2) or x, lambda: x)
        return y + inner[0]  # escaped
    raises(re.escape("(a finished trace, or a value computed inside a control-flow body); return it from the "
                     "body instead"), f, X, snippet="# escaped")


def test_bad_specs():
    with pytest.raises(dt.TraceError, match="expected a dt.TensorSpec"):
        dt.trace(lambda x: x, "N")
    with pytest.raises(dt.TraceError, match="a dim must be >= 0"):
        dt.trace(lambda x: x, S((-1, 4)))


# ----------------------------------------------------------------------------------- runtime
def test_interpreter_input_errors():
    g = dt.trace(lambda x, y: x + y, X, S(("N", 4), "float32"))
    x = np.ones((2, 4), np.float32)
    with pytest.raises(dt.InputError, match="takes 2 inputs, got 1"):
        dt.run_reference(g, x)
    with pytest.raises(dt.InputError, match=re.escape("input 1 (%y) must be float32[N,4], got float64[2, 4]")):
        dt.run_reference(g, x, x.astype(np.float64))
    with pytest.raises(dt.InputError, match=re.escape("input 1 (%y) must be float32[N,4], got float32[3, 4] "
                                                      "(symbols so far: {'N': 2})")):
        dt.run_reference(g, x, np.ones((3, 4), np.float32))


def test_static_slice_of_a_too_short_axis_is_clamped_as_numpy_does():
    g = dt.trace(lambda x: x[:2], X)          # min(N, 2) rows (issue 8 item 6: was typed 2, a GraphError at N=1)
    assert g.outputs[0].type.shape == ("min(N, 2)", 4)
    assert dt.run_reference(g, np.ones((1, 4), np.float32)).shape == (1, 4)