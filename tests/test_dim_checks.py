"""Run-time checked dim equalities (ir/dim_checks.py, runtime/dim_check_run.py), F.assert_dims_equal, and errors
that name dims by their origin.

Two dims an op needs equal that tracing can neither prove equal nor different (rows kept by two boolean masks,
loop vars that shrink together, ONNX dims without a name) are unified and checked when the node runs: a
mismatch is an ExecutionError naming both dims by where they come from, the op and the user's line - in the
reference interpreter, a host (numpy) node, a compiled region, a loop body and a loaded artifact alike."""
from __future__ import annotations

import os
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.errors import ExecutionError, GraphError, TraceError
from dyntvm.ir.dim_checks import DimCheck, describe_dim
from dyntvm.ir.serialize import graph_from_json, graph_to_json
from dyntvm.partition.selector import OpListSelector

from helpers import assert_same

S = dt.TensorSpec
INTERNAL = re.compile(r"\b_[ud]\d")       # an internal dim name: never in a message


def two_masks(x, y):
    a = F.boolean_mask(x, x > 0)
    b = F.boolean_mask(y, y > 0)
    return a * 2.0 + b  # the add


MASKS = (S(("N",)), S(("M",)))
X = np.array([1.0, -1.0, 2.0], np.float32)          # 2 rows kept
Y_OK = np.array([-3.0, 5.0, 4.0], np.float32)        # 2 rows kept
Y_BAD = np.array([1.0, 2.0, 3.0], np.float32)        # 3 rows kept


def line_of(snippet: str) -> str:
    """"test_dim_checks.py:LINE" of the line of this file holding `snippet`."""
    with open(__file__) as f:
        return next(f"test_dim_checks.py:{i}" for i, line in enumerate(f, 1)
                    if snippet in line and "line_of" not in line)


def assert_names_origins(err: Exception, *texts):
    msg = str(err)
    for t in texts:
        assert t in msg, f"{t!r} not in:\n{msg}"
    assert not INTERNAL.search(msg), f"internal dim name in:\n{msg}"


def check_mask_failure(err, line="# the add"):
    assert_names_origins(err, "dims that must be equal (or one of them 1) differ",
                         f"rows kept by boolean_mask at {line_of('a = F.boolean_mask(x, x > 0)')}",
                         f"rows kept by boolean_mask at {line_of('b = F.boolean_mask(y, y > 0)')}", "is 3", "is 2",
                         "add needs them equal",
                         "To fix", line)


# --------------------------------------------------------------------------------- tracing
def test_undecided_dims_are_unified_with_a_check_on_the_node():
    g = dt.trace(two_masks, *MASKS)
    (add,) = [n for n in g.nodes if n.op == "add"]
    assert len(add.checks) == 1 and add.checks[0].what == "broadcast"
    c = add.checks[0]
    assert {c.kept, c.other} == {add.inputs[0].type.shape[0], add.inputs[1].type.shape[0]}
    (out,) = add.outputs[0].type.shape       # numpy lets either be 1: the result has a dim of its own
    assert out not in (c.kept, c.other) and g.dim_origins[out].startswith("the broadcast of rows kept by")
    assert sum(len(n.checks) for n in g.walk()) == 1        # nothing else was checked


def test_user_symbols_are_still_refused_with_the_fix():
    with pytest.raises(TraceError) as e:
        dt.trace(lambda x, y: x + y, S(("N",)), S(("M",)))
    assert_names_origins(e.value, "the symbolic dim N", "the symbolic dim M",
                         "not known to be equal", "F.assert_dims_equal")


def test_refusals_name_origins_not_internal_names():
    def g(x, y):
        return F.matmul(x, y)
    with pytest.raises(TraceError) as e:
        dt.trace(g, S(("N", "K")), S(("L", 3)))
    assert_names_origins(e.value, "the symbolic dim K", "the symbolic dim L")


def test_describe_dim():
    assert describe_dim(3) == "3"
    assert describe_dim("N") == "the symbolic dim N"
    origins = {"_d0": "rows kept by boolean_mask at m.py:3"}
    assert describe_dim("_d0", origins) == "rows kept by boolean_mask at m.py:3"
    text = describe_dim("(_d0 + N)", origins)
    assert "rows kept by boolean_mask at m.py:3" in text and "N" in text and not INTERNAL.search(text)
    assert not INTERNAL.search(describe_dim("_d7", {}))         # no origin known: still no internal name


def test_origins_of_fresh_dims():
    def f(x, m):
        kept = F.boolean_mask(x, m)  # mask line
        nz = F.nonzero(x)  # nonzero line
        steps, _ = F.while_loop(lambda i: i < 3, lambda i: (i * 2, [i + 1]), [np.int64(0)])
        return kept, nz, steps
    g = dt.trace(f, S((None, 2), name="x"), S((None,), "bool"))
    origins = set(g.dim_origins.values())
    assert "axis 0 of input 'x'" in origins
    assert f"rows kept by boolean_mask at {line_of('# mask line')}" in origins
    assert f"the number of non-zero entries found by nonzero at {line_of('# nonzero line')}" in origins
    assert f"the number of iterations of while_loop at {line_of('steps, _ = F.while_loop(')}" in origins
    assert all(INTERNAL.fullmatch(d) for d in g.dim_origins)        # keys renamed with the graph's dims
    # they survive serialization, and a graph saved without them still loads
    text, params = graph_to_json(g)
    assert graph_from_json(text, params).dim_origins == g.dim_origins
    import json
    old = json.loads(text)
    old.pop("dim_origins")
    assert graph_from_json(json.dumps(old), params).dim_origins == {}


def test_checks_survive_json_and_old_graphs_keep_their_json():
    g = dt.trace(two_masks, *MASKS)
    text, params = graph_to_json(g)
    copy = graph_from_json(text, params)
    assert [n.checks for n in copy.walk()] == [n.checks for n in g.walk()]
    assert all(isinstance(c, DimCheck) for n in copy.walk() for c in n.checks)
    for bad in ('["N", "(N +", "broadcast"]', '["N", -1, "broadcast"]', '["N"]', '7'):     # hostile or broken
        with pytest.raises(GraphError, match="malformed"):
            graph_from_json(re.sub(r'"checks": \[\[[^]]*\]\]', f'"checks": [{bad}]', text), params)
    plain, _ = graph_to_json(dt.trace(lambda x: F.boolean_mask(x, x > 0) * 2.0, S(("N",))))
    assert '"checks"' not in plain and '"dim_origins"' in plain
    obj = json.loads(text)
    for bad in ([1, 2], {"N": [1.5, 3]}, {"N": [True, 3]}, {"N": [-1, None]}, {"N": [2]}, {"N": "2,3"}):
        with pytest.raises(GraphError, match="malformed"):                       # hostile dim ranges
            graph_from_json(json.dumps({**obj, "dim_ranges": bad}), params)
    assert graph_from_json(json.dumps({**obj, "dim_ranges": {"N": [2, None]}}), params).dim_ranges == {"N": (2, None)}


# ------------------------------------------------------------------------------ run time
def test_reference_interpreter_checks():
    g = dt.trace(two_masks, *MASKS)
    assert_same(dt.run_reference(g, X, Y_OK), two_masks(X, Y_OK))
    with pytest.raises(ExecutionError) as e:
        dt.run_reference(g, X, Y_BAD)
    check_mask_failure(e.value)


def test_a_size_1_dim_broadcasts_against_a_unified_one():
    g = dt.trace(two_masks, *MASKS)
    one = np.array([-1.0, 4.0], np.float32)
    for x, y in ((X, one), (one, Y_BAD), (one[:1], one[:1])):
        assert_same(dt.run_reference(g, x, y), two_masks(x, y))


def test_eager_follows_numpy():
    with pytest.raises(ValueError):             # numpy's broadcasting error: eager has no unification
        two_masks(X, Y_BAD)


@pytest.fixture(scope="module")
def compiled_masks():
    return dt.compile(two_masks, *MASKS)


def test_compiled_region_checks(compiled_masks):
    m = compiled_masks
    assert_same(m(X, Y_OK), two_masks(X, Y_OK))
    one = np.array([-1.0, 4.0], np.float32)
    for x, y in ((X, one), (one, Y_BAD), (one[:1], one[:1]), (one[:1], one[:0])):     # numpy's broadcasting
        assert_same(m(x, y), two_masks(x, y))
    with pytest.raises(ExecutionError) as e:
        m(X, Y_BAD)
    check_mask_failure(e.value)
    assert "in region node" in str(e.value)


def test_host_node_checks():
    m = dt.compile(two_masks, *MASKS, selector=OpListSelector(exclude={"add"}))
    assert any(n.op == "add" for n in m.graph.nodes)            # the add runs as a numpy kernel
    assert_same(m(X, Y_OK), two_masks(X, Y_OK))
    with pytest.raises(ExecutionError) as e:
        m(X, Y_BAD)
    check_mask_failure(e.value)


def test_loaded_artifact_checks(compiled_masks, tmp_path):
    path = str(tmp_path / "m.dtvm")
    compiled_masks.save(path)
    loaded = dt.load(path)
    assert_same(loaded(X, Y_OK), two_masks(X, Y_OK))
    with pytest.raises(ExecutionError) as e:
        loaded(X, Y_BAD)
    check_mask_failure(e.value)
    # in a fresh process: only the artifact knows the origins
    code = textwrap.dedent(f"""
        import numpy as np, dyntvm as dt
        m = dt.load({path!r})
        try:
            m(np.array([1., -1., 2.], np.float32), np.array([1., 2., 3.], np.float32))
        except dt.ExecutionError as e:
            print("ERROR:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert "ERROR:" in out.stdout, out.stderr
    check_mask_failure(out.stdout[out.stdout.index("ERROR:"):])


def loop_sum(h, s, steps):
    """Two loop vars that shrink by one mask each: their dims are unified inside the body."""
    def body(h, s, i):
        t = s + F.sum(h, axis=1)  # the loop add
        return F.boolean_mask(h, F.sum(h, axis=1) > 0), F.boolean_mask(t, t > 0), i + 1
    return F.while_loop(lambda h, s, i: i < steps, body, [h, s, np.int64(0)])[:2]


LOOP = (S(("K", 2)), S(("K",)), S((), "int64"))


def test_check_inside_a_compiled_loop_body():
    m = dt.compile(loop_sum, *LOOP)
    h = np.array([[1, 1], [-1, -1], [2, 2]], np.float32)
    s_ok, s_bad = np.array([0, 1, 1], np.float32), np.array([0, 3, 1], np.float32)   # t > 0 where h's rows sum > 0
    for steps in (0, 1, 3):
        assert_same(m(h, s_ok, np.int64(steps)), loop_sum(h, s_ok, np.int64(steps)))
    for run in (lambda: m(h, s_bad, np.int64(2)), lambda: dt.run_reference(m.graph, h, s_bad, np.int64(2))):
        with pytest.raises(ExecutionError) as e:
            run()
        assert_names_origins(e.value, f"axis 0 of loop_vars[0] of while_loop at {line_of('return F.while_loop(')}",
                             "is 3", "is 2",
                             "# the loop add", "iteration 1")
    assert_same(m(h, s_bad, np.int64(1)), loop_sum(h, s_bad, np.int64(1)))     # one step: nothing to check


# ------------------------------------------------------------------------- assert_dims_equal
def stated(x, y):
    y = F.assert_dims_equal(x, y, 0, 0)  # the assertion
    return x * 2.0 + y


def test_assert_dims_equal_traced_and_compiled():
    g = dt.trace(stated, S(("N",)), S(("M",)))
    assert g.outputs[0].type.shape == ("N",)
    m = dt.compile(stated, S(("N",)), S(("M",)))
    for n in (0, 1, 4):
        x, y = np.arange(n, dtype=np.float32), np.ones(n, np.float32)
        assert_same(m(x, y), x * 2 + y)
        assert_same(dt.run_reference(g, x, y), x * 2 + y)
    x, y = np.arange(3, dtype=np.float32), np.ones(2, np.float32)
    for run in (lambda: m(x, y), lambda: dt.run_reference(g, x, y), lambda: stated(x, y)):
        with pytest.raises(ExecutionError) as e:
            run()
        assert_names_origins(e.value, "F.assert_dims_equal states that they are equal", "# the assertion",
                             "To fix")
    with pytest.raises(ExecutionError, match="the symbolic dim M is 2, but the symbolic dim N is 3"):
        m(x, y)


def test_assert_dims_equal_bad_arguments():
    with pytest.raises(TraceError, match="axis_b 3 is out of range"):
        F.assert_dims_equal(np.zeros(2), np.zeros(2), 0, 3)
    with pytest.raises(TraceError, match="differ"):
        dt.trace(lambda x, y: F.assert_dims_equal(x, y, 0, 0), S((2,)), S((3,)))
    assert_same(F.assert_dims_equal(np.zeros((2, 3)), np.ones((4, 3)), 1, 1), np.ones((4, 3)))


# ------------------------------------------------------------------------------------ ONNX
def _scan_model():
    from onnx import TensorProto as TP, helper as oh
    vi = oh.make_tensor_value_info
    body = oh.make_graph([oh.make_node("Add", ["y_in", "x_t"], ["y_out"]), oh.make_node("Identity", ["y_out"], ["s"])],
                         "body", [vi("y_in", TP.FLOAT, [None]), vi("x_t", TP.FLOAT, [None])],
                         [vi("y_out", TP.FLOAT, [None]), vi("s", TP.FLOAT, [None])])
    scan = oh.make_node("Scan", ["y0", "x"], ["y", "ys"], body=body, num_scan_inputs=1)
    g = oh.make_graph([scan], "scan", [vi("y0", TP.FLOAT, [None]), vi("x", TP.FLOAT, ["T", None])],
                      [vi("y", TP.FLOAT, None), vi("ys", TP.FLOAT, None)])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def _loop_model():
    """Loop: the carried v (unnamed dim) plus row i of a captured x (its dims unnamed too)."""
    from onnx import TensorProto as TP, helper as oh
    vi = oh.make_tensor_value_info
    body = oh.make_graph([oh.make_node("Gather", ["x", "i"], ["row"], axis=0),
                          oh.make_node("Add", ["v_in", "row"], ["v_out"]),
                          oh.make_node("Identity", ["c_in"], ["c_out"])],
                         "body", [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("v_in", TP.FLOAT, [None])],
                         [vi("c_out", TP.BOOL, []), vi("v_out", TP.FLOAT, [None])])
    loop = oh.make_node("Loop", ["n", "", "v0"], ["v"], body=body)
    g = oh.make_graph([loop], "loop", [vi("n", TP.INT64, []), vi("v0", TP.FLOAT, [None]),
                                       vi("x", TP.FLOAT, [None, None])], [vi("v", TP.FLOAT, None)])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def _compiled_and_ort(model, feeds_list):
    """The model compiled once, checked equal to onnxruntime on each of `feeds_list` (dicts in input order)."""
    ort = pytest.importorskip("onnxruntime")
    m = dt.compile(dt.from_onnx(model))
    sess = ort.InferenceSession(model.SerializeToString())
    for feeds in feeds_list:
        got = m(*feeds.values())
        assert_same(list(got) if isinstance(got, tuple) else [got], sess.run(None, feeds))
    return m


def test_onnx_scan_adds_carried_to_scanned():
    rng = np.random.default_rng(0)
    m = _compiled_and_ort(_scan_model(), [{"y0": rng.standard_normal(d).astype(np.float32),
                                           "x": rng.standard_normal((t, d)).astype(np.float32)}
                                          for t, d in [(1, 1), (2, 3), (4, 5)]])  # (ORT refuses a Scan of 0 steps)
    # 0 steps: the initial state, and no rows of a size never seen (the per-step sum's size is a broadcast's,
    # known only when a step runs): (0, 0), as onnxruntime shapes a Loop's per-step outputs of unknown size
    y, ys = m(np.ones(2, np.float32), np.zeros((0, 2), np.float32))
    assert_same([y, ys], [np.ones(2, np.float32), np.zeros((0, 0), np.float32)])
    with pytest.raises(ExecutionError) as e:
        m(np.zeros(3, np.float32), np.zeros((2, 4), np.float32))
    assert_names_origins(e.value, "axis 1 of input 'x' (unnamed in the model) is 4",
                         "axis 0 of states[0] of foreach at ONNX node 'Scan' (Scan) (it changes between iterations) is 3",
                         "ONNX node 'Add'")


def test_onnx_loop_adds_carried_to_a_row():
    rng = np.random.default_rng(1)
    m = _compiled_and_ort(_loop_model(), [{"n": np.array(n, np.int64), "v0": rng.standard_normal(d).astype(np.float32),
                                           "x": rng.standard_normal((rows, d)).astype(np.float32)}
                                          for n, rows, d in [(0, 2, 3), (1, 1, 1), (3, 4, 5)]])
    with pytest.raises(ExecutionError) as e:
        m(np.array(2, np.int64), np.zeros(3, np.float32), np.zeros((2, 4), np.float32))
    assert_names_origins(e.value, "axis 1 of input 'x' (unnamed in the model)", "ONNX node 'Add'")


# ------------------------------------------------------------------- messages that show types
def test_messages_showing_types_name_unknown_dims_by_origin():
    from dyntvm.errors import InputError
    m = dt.compile(lambda x: x * 2.0, S((None, 2), name="x"))
    bad = np.zeros((3, 3), np.float32)
    for run in (lambda: m(bad), lambda: dt.run_reference(m.graph, bad)):
        with pytest.raises(InputError) as e:
            run()
        assert_names_origins(e.value, "#1", "#1 is axis 0 of input 'x'")

    def f(x, w):
        return F.matmul(F.boolean_mask(x, F.sum(x, axis=1) > 0), w)  # the matmul
    with pytest.raises(TraceError) as e:
        dt.trace(f, S(("N", 3)), S((4, 2)))
    assert_names_origins(e.value, "float32[#1,3]", f"#1 is rows kept by boolean_mask at {line_of('# the matmul')}",
                         "# the matmul")
    assert str(e.value).rstrip().endswith("# the matmul")         # the user's line stays last


def test_hashes_leave_origins_out():
    """Origins hold source lines: editing a line must not change the model's hash (artifact binding, tuning logs);
    a graph without checks serializes as before (its hashes were checked equal to main's when this was written)."""
    from dyntvm.runtime.artifact import kernel_binding
    g = dt.trace(lambda x, m: F.boolean_mask(x, m) * 2.0, S((None, 2)), S((None,), "bool"))
    assert g.dim_origins and not any(n.checks for n in g.walk())
    before = kernel_binding(g)
    g.dim_origins = {d: "somewhere else" for d in g.dim_origins}
    assert kernel_binding(g) == before


def test_a_symbolic_dim_against_a_fixed_size_is_checked():
    """Review 37: ``x [B, 6] * b [M]`` traces to [B, 6] (M must be 6 or 1); compiled it ran for any M, reading past
    the end of `b` for M = 4 (a silent wrong answer). The broadcast now records a check, run by the compiled
    region, the executor and the VM program alike; M = 6 and M = 1 keep numpy's result."""
    def fn(x, b):
        return x * b + F.exp(x)
    specs = (dt.TensorSpec(("B", 6)), dt.TensorSpec(("M",)))
    (mul,) = [n for n in dt.trace(fn, *specs).nodes if n.op == "multiply"]
    assert [(c.kept, c.other, c.what) for c in mul.checks] == [(6, "M", "broadcast")]
    m = dt.compile(fn, *specs)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 6)).astype("float32")
    for size in (6, 1):
        b = rng.standard_normal(size).astype("float32")
        np.testing.assert_allclose(m(x, b), x * b + np.exp(x), rtol=1e-5, atol=1e-6)
    for size in (4, 7, 0, 100000):
        b = np.ones(size, "float32")
        with pytest.raises(ValueError):
            x * b                                   # numpy refuses it too
        with pytest.raises(ExecutionError, match=f"cannot broadcast the symbolic dim M = {size} against a fixed "
                                                 "size 6: it must be 6 or 1"):
            m(x, b)
