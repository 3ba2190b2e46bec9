"""Lists of tensors at run time (ir/list_type.py, ir/ops_lists.py, frontend/lists.py, runtime/kernels_lists.py):
each op eager, through the reference interpreter and compiled, against an independent numpy expression at
several lengths (0 and 1 included); a while_loop collecting a data-dependent number of rows; list inputs and
outputs through compile, save and dt.load; bad list inputs, out-of-range positions and mismatched elements as
clear errors."""
import os

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.serialize import graph_from_json, graph_to_json, graphs_equal

RNG = np.random.default_rng(0)
ROWS = dt.ListSpec(dt.TensorSpec((None, 3)))          # a list of [?, 3] float32 tensors, any length
_COMPILED: dict = {}


def rows(*sizes):
    return [RNG.standard_normal((k, 3)).astype(np.float32) for k in sizes]


def compiled(fn, *specs):
    """`fn` traced and compiled once per test session (the graph too, for the reference interpreter)."""
    key = (fn.__name__, specs)
    if key not in _COMPILED:
        g = dt.trace(fn, *specs)
        _COMPILED[key] = (g, dt.compile(g))
    return _COMPILED[key]


def same(got, want):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (type(got), len(got), len(want))
        for a, b in zip(got, want):
            same(a, b)
        return
    got = np.asarray(got)
    assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, (got.shape, np.shape(want), got.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def all_ways(fn, specs, args, want):
    """Eager, the reference interpreter and the compiled model all give `want`."""
    same(list(fn(*args)), want)
    g, m = compiled(fn, *specs)
    same(list(dt.run_reference(g, *args)), want)
    same(list(m(*args)), want)


# ------------------------------------------------------------------------------------------ the ops
def at_length_concat(lst):
    return F.list_length(lst), F.list_concat(lst, 0) * 2.0, lst


@pytest.mark.parametrize("sizes", [(), (2,), (1, 0, 4)])
def test_length_concat_and_the_list_itself(sizes):
    lst = rows(*sizes)
    want = [np.asarray(len(sizes), np.int64), np.concatenate(lst) * 2 if lst else None, lst]
    if not lst:     # an empty list of [?, 3] rows: only the joined axis is unknown, so the result is [0, 3]
        g, m = compiled(at_length_concat, ROWS)      # (eagerly, a bare [] has no dtype: the traced ways only)
        want[1] = np.zeros((0, 3), np.float32)
        same(list(dt.run_reference(g, lst)), want)
        same(list(m(lst)), want)
        return
    all_ways(at_length_concat, (ROWS,), (lst,), want)


def insert_erase_at(lst, x, pos, i):
    ins = F.list_insert(lst, x, pos)
    return F.list_at(ins, i), F.list_length(F.list_erase(ins, 0)), F.list_erase(ins, pos)


@pytest.mark.parametrize("n,pos,i", [(0, 0, 0), (1, 1, -1), (3, -1, 2), (3, 0, -4), (2, 2, 1)])
def test_insert_erase_at_with_positions_from_data(n, pos, i):
    lst, x = rows(*[2] * n), rows(5)[0]
    ref = list(lst)
    ref.insert(pos if pos >= 0 else pos + n, x)
    erased = list(ref)
    del erased[pos if pos >= 0 else pos + len(ref)]
    want = [ref[i], np.asarray(len(ref) - 1, np.int64), erased]
    scalar = dt.TensorSpec((), "int64")
    all_ways(insert_erase_at, (ROWS, dt.TensorSpec((None, 3)), scalar, scalar),
             (lst, x, np.asarray(pos, np.int64), np.asarray(i, np.int64)), want)


def test_out_of_range_positions_are_execution_errors():
    scalar = dt.TensorSpec((), "int64")
    g, m = compiled(insert_erase_at, ROWS, dt.TensorSpec((None, 3)), scalar, scalar)
    lst, x = rows(2, 2), rows(1)[0]
    for pos, i, match in [(3, 0, r"list_insert.*position 3 is out of range \[-2, 2\] for a list of 2 tensors"),
                          (0, 3, r"list_at.*index 3 is out of range \[-3, 2\] for a list of 3 tensors"),
                          (-3, 0, r"list_insert.*position -3 is out of range")]:
        args = (lst, x, np.asarray(pos, np.int64), np.asarray(i, np.int64))
        for run in (m, lambda *a: dt.run_reference(g, *a), insert_erase_at):
            with pytest.raises(dt.ExecutionError, match=match):
                run(*args)
    with pytest.raises(dt.ExecutionError, match=r"list_at.*index 0 is out of range.*an empty list has no elements"):
        compiled(first, ROWS)[1]([])
    with pytest.raises(dt.TraceError, match=r"list_at: cannot take an element of an empty list"):
        F.list_at(F.list_erase(F.make_list(x), 0), 0)           # known empty when traced (or called eagerly)


def first(lst):
    return F.list_at(lst, 0)


def stack_split(x, split):
    pieces = F.split_to_list(x, split, 1)
    return F.list_stack(F.split_to_list(x, None, 0, False), 1), F.list_length(pieces), pieces


@pytest.mark.parametrize("n,split", [(0, [4]), (1, [1, 0, 3]), (4, [4]), (3, [2, 2])])
def test_split_to_list_and_stack_along_symbolic_axes(n, split):
    x = RNG.standard_normal((n, 4)).astype(np.float32)
    sizes = [s for s in split]
    bounds = np.cumsum([0] + sizes)
    want = [x.T.copy(), np.asarray(len(sizes), np.int64), [x[:, lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]]
    all_ways(stack_split, (dt.TensorSpec(("N", 4)), dt.TensorSpec(("K",), "int64")),
             (x, np.asarray(split, np.int64)), want)


def test_split_to_list_by_a_size_and_keepdims():
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    same(list(F.split_to_list(x, 2, 0)), [x[0:2], x[2:4], x[4:5]])
    same(list(F.split_to_list(x, None, 1, keepdims=False)), [x[:, 0], x[:, 1]])
    with pytest.raises(dt.ExecutionError, match=r"split \[1, 1\] must be non-negative sizes adding up to .* 5"):
        F.split_to_list(x, [1, 1], 0)


def test_stack_of_an_empty_list_with_a_known_element_shape_and_of_unequal_elements():
    empty = F.list_empty("float32", (2, 3))
    same(F.list_stack(empty, 1), np.zeros((2, 0, 3), np.float32))
    same(F.list_concat(empty, 0), np.zeros((0, 3), np.float32))
    with pytest.raises(dt.ExecutionError, match=r"list_stack: the list's tensors have different shapes"):
        F.list_stack(F.make_list(*rows(1, 2)))


def test_trace_time_errors_name_the_api():
    x = dt.TensorSpec(("N", 3))
    with pytest.raises(dt.TraceError, match=r"list_append: the tensor int64\[N,3\] cannot join a list of float32 "
                                            r"tensors of rank 2"):
        dt.trace(lambda a: F.list_append(F.make_list(a), F.cast(a, "int64")), x)
    with pytest.raises(dt.TraceError, match=r"make_list: element 1 float32\[3\] cannot join a list of float32 "
                                            r"tensors of rank 2"):
        dt.trace(lambda a: F.make_list(a, a[0]), x)
    with pytest.raises(dt.TraceError, match=r"list_at: cannot take an element of an empty list"):
        dt.trace(lambda a: F.list_at(F.list_empty("float32", 2), 0), x)
    with pytest.raises(dt.TraceError, match=r"len\(\) of a traced list .* F.list_length"):
        dt.trace(lambda a: len(F.make_list(a)), x)
    with pytest.raises(dt.TraceError, match=r"list_length: expected a list of tensors .*got Tensor"):
        dt.trace(lambda a: F.list_length(a), x)
    with pytest.raises(dt.TraceError, match=r"list_at: index must be an int or an integer scalar tensor"):
        F.list_at(F.make_list(np.zeros(2)), 1.5)


# --------------------------------------------------------------------------------- loops, regions
def collect_rows(x):
    """The rows of x with a positive sum, through tanh * 2, collected in a list by a while_loop."""
    n = F.shape_of(x)[0]

    def body(i, lst):
        row = F.take(x, i, axis=0)       # x[i] of a numpy x would not trace (an eager loop of no iterations)
        kept = F.cond(F.sum(row) > 0, lambda: F.list_append(lst, F.tanh(row) * 2.0), lambda: lst)
        return i + 1, kept
    _, lst = F.while_loop(lambda i, lst: i < n, body, [np.asarray(0, np.int64), F.list_empty("float32", (4,))])
    return F.list_stack(lst, 0), F.list_length(lst), lst


@pytest.mark.parametrize("n", [0, 1, 7, 30])
def test_while_loop_collects_a_data_dependent_number_of_rows(n):
    x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
    kept = np.tanh(x[x.sum(1) > 0]) * 2
    want = [kept.reshape(-1, 4), np.asarray(len(kept), np.int64), list(kept)]
    all_ways(collect_rows, (dt.TensorSpec(("N", 4)),), (x,), want)
    g, m = compiled(collect_rows, dt.TensorSpec(("N", 4)))
    # the element math compiles; no list op is inside a compiled region
    regions = [nd for nd in m.graph.walk() if nd.op == "region"]
    assert any("tanh" in {o.op for o in r.subgraphs[0].nodes} for r in regions)
    assert not any(o.op.startswith("list_") for r in regions for o in r.subgraphs[0].walk())


def test_a_list_as_a_step_output_is_refused():
    with pytest.raises(dt.TraceError, match=r"a per-step output is a list: .*carry the list as a loop variable"):
        dt.trace(lambda x: F.while_loop(lambda i: i < 3, lambda i: (F.make_list(x), i + 1),
                                        [np.asarray(0, np.int64)]), dt.TensorSpec((2,)))


# ------------------------------------------------------------------------- inputs, outputs, artifacts
def weighted(lst, w):
    y = F.tanh(F.list_concat(lst, 0) @ w)
    return y, F.split_to_list(y, None, 0, False), F.list_length(lst)


def test_list_inputs_and_outputs_through_save_and_load(tmp_path):
    g, m = compiled(weighted, ROWS, dt.TensorSpec((3, 2)))
    assert graphs_equal(graph_from_json(*graph_to_json(g)), g)
    m.save(os.path.join(tmp_path, "model"))
    loaded = dt.load(os.path.join(tmp_path, "model"))
    w = RNG.standard_normal((3, 2)).astype(np.float32)
    for sizes in [(1,), (2, 0, 3), (4, 4, 4, 1)]:
        lst = rows(*sizes)
        y = np.tanh(np.concatenate(lst) @ w)
        for model in (m, loaded):
            got = model(lst, w)
            same(got[0], y)
            same(got[1], list(y))
            same(got[2], np.asarray(len(sizes), np.int64))
        same(list(model(tuple(lst), w)), [y, list(y), np.asarray(len(sizes), np.int64)])    # a tuple is a list too


@pytest.mark.parametrize("bad,match", [
    ([np.zeros((2, 3))], r"input 0 \('lst'\), element 0: dtype is float64, expected float32"),
    ([np.zeros((2, 3), np.float32), np.zeros(3, np.float32)], r"element 1: rank is 1 \(shape \[3\]\), expected 2"),
    ([np.zeros((2, 4), np.float32)], r"element 0: axis 1 has size 4, expected 3 \(a list of float32\[\?,3\]\)"),
    (np.zeros((2, 3), np.float32), r"input 0 \('lst'\): expected a Python list of arrays .*got ndarray"),
    ([[1.0, 2.0, 3.0]], r"element 0: expected an array .*got list"),
])
def test_bad_list_inputs_are_input_errors(bad, match):
    g, m = compiled(weighted, ROWS, dt.TensorSpec((3, 2)))
    w = np.zeros((3, 2), np.float32)
    with pytest.raises(dt.InputError, match=match):
        m(bad, w)
    with pytest.raises(dt.InputError, match=match.replace(r"input 0 \('lst'\)", r"input 0 \(%lst\)")):
        dt.run_reference(g, bad, w)


def test_list_spec_length_and_shared_symbols():
    g = dt.trace(lambda lst, x: F.list_concat(lst, 0) + x[0], dt.ListSpec(dt.TensorSpec(("M", 2)), 2),
                 dt.TensorSpec(("M", 2)))
    m = dt.compile(g)
    a, b = np.ones((3, 2), np.float32), np.full((3, 2), 2, np.float32)
    same(m([a, b], a), np.concatenate([a, b]) + a[0])
    with pytest.raises(dt.InputError, match=r"a list of 3 tensors, expected 2"):
        m([a, b, b], a)
    with pytest.raises(dt.InputError, match=r"element 1: axis 0 is M=1, but M=3 elsewhere"):
        m([a, b[:1]], a)
    with pytest.raises(dt.TraceError, match=r"ListSpec: elem must be a dt.TensorSpec"):
        dt.ListSpec((None, 3))


def shifted_rows(xs):
    """foreach carrying a list: each row + 1 appended; a list carried through a while_loop untouched."""
    ys, (lst,) = F.foreach(lambda row, st: (row * 2.0, [F.list_append(st[0], row + 1.0)]), xs,
                           [F.list_empty("float32", (2,))])
    _, same_list = F.while_loop(lambda i, lst: i < 2, lambda i, lst: (i + 1, lst), [np.asarray(0, np.int64), lst])
    return ys, F.list_stack(same_list, 0), F.list_length(lst)


@pytest.mark.parametrize("t", [0, 1, 5])
def test_foreach_and_while_loop_carry_lists(t):
    xs = RNG.standard_normal((t, 2)).astype(np.float32)
    all_ways(shifted_rows, (dt.TensorSpec(("T", 2)),), (xs,), [xs * 2, xs + 1, np.asarray(t, np.int64)])


def test_a_region_with_symbolic_attrs_next_to_a_list_input():
    """A region needing a value that binds N (F.arange of x.shape[0]) never takes the list input for it."""
    def f(lst, x):
        return F.list_concat(lst, 0), F.arange(x.shape[0]) * 2 + F.list_length(lst)
    g, m = compiled(f, ROWS, dt.TensorSpec(("N",)))
    for n, sizes in [(0, (1,)), (3, (2, 0))]:
        lst = rows(*sizes)
        same(list(m(lst, np.zeros(n, np.float32))), [np.concatenate(lst), np.arange(n) * 2 + len(sizes)])
