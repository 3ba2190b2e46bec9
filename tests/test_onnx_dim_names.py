"""ONNX dim names (`dim_param`) are hints, not statements that dims are independent (frontend/onnx.py).

An op of an imported model that needs two dims equal whose names differ (`Add` of inputs declared ``("A",)`` and
``("B",)``, a MatMul contraction, a Concat, a Where, ScatterElements' indices and updates, a Loop carry) is
accepted, as onnxruntime accepts it: the dims are unified under a run-time check (ir/dim_checks.py), so equal
sizes run, and a mismatch is an ExecutionError naming both dims by origin and the ONNX node. Each model is
compiled once and compared with onnxruntime at several sizes (1, and 0 where valid). Traced Python programs keep
refusing two different user symbols (with the F.assert_dims_equal hint)."""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm.errors import ExecutionError, TraceError

from helpers import assert_same

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP, helper as oh  # noqa: E402

vi = oh.make_tensor_value_info
F32, I64, BOOL = TP.FLOAT, TP.INT64, TP.BOOL


def _model(nodes, inputs, outputs, opset=17):
    g = oh.make_graph(nodes, "g", [vi(n, t, s) for n, t, s in inputs], [vi(n, t, s) for n, t, s in outputs])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def _rand(rng, shape, dtype=np.float32):
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    return rng.standard_normal(shape).astype(dtype)


def _check(model, feeds_list, bad_feeds, texts):
    """`model` compiled once, equal to onnxruntime on each of `feeds_list`; `bad_feeds` an ExecutionError naming
    `texts` in the compiled model and in the reference interpreter. Returns the compiled model."""
    m = dt.compile(dt.from_onnx(model))
    sess = ort.InferenceSession(model.SerializeToString())
    for feeds in feeds_list:
        got = m(*feeds.values())
        assert_same(list(got) if isinstance(got, tuple) else [got], sess.run(None, feeds))
        ref = dt.run_reference(m.graph, *feeds.values())
        assert_same(list(ref) if isinstance(ref, tuple) else [ref], sess.run(None, feeds))
    for run in (lambda: m(*bad_feeds.values()), lambda: dt.run_reference(m.graph, *bad_feeds.values())):
        with pytest.raises(ExecutionError) as e:
            run()
        assert_names(e.value, *texts)
    return m


def assert_names(err, *texts):
    msg = str(err)
    for t in texts:
        assert t in msg, f"{t!r} not in:\n{msg}"
    assert "_u" not in msg and "_d0" not in msg, msg


def _add_model(op="Add"):
    return _model([oh.make_node(op, ["a", "b"], ["y"], name="my_add")],
                  [("a", F32, ["A"]), ("b", F32, ["B"])], [("y", F32, ["A"])])


def test_add_of_differently_named_dims():
    rng = np.random.default_rng(0)
    feeds = [{"a": _rand(rng, a), "b": _rand(rng, b)} for a, b in [(1, 1), (3, 3), (0, 0), (1, 4), (5, 1)]]
    _check(_add_model(), feeds, {"a": _rand(rng, 2), "b": _rand(rng, 3)},
               ["axis 0 of input 'a' (dim_param 'A') is 2", "axis 0 of input 'b' (dim_param 'B') is 3",
                "ONNX node 'my_add'", "must be equal (or one of them 1)"])
    g = dt.from_onnx(_add_model())
    assert [len(n.checks) for n in g.nodes] == [1]         # one check, on the add


def test_saved_artifact_checks_onnx_dims(tmp_path):
    m = dt.compile(dt.from_onnx(_add_model("Sub")))
    path = str(tmp_path / "m.dtvm")
    m.save(path)
    loaded = dt.load(path)
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    assert_same(loaded(a, b), a - b)
    with pytest.raises(ExecutionError) as e:
        loaded(a, np.ones(3, np.float32))
    assert_names(e.value, "axis 0 of input 'b' (dim_param 'B') is 3", "axis 0 of input 'a' (dim_param 'A') is 4",
                 "ONNX node 'my_add'")


def test_mul_broadcast_of_a_trailing_dim():
    rng = np.random.default_rng(1)
    model = _model([oh.make_node("Mul", ["x", "s"], ["y"], name="scale")],
                   [("x", F32, ["N", "A"]), ("s", F32, ["B"])], [("y", F32, ["N", "A"])])
    feeds = [{"x": _rand(rng, (n, a)), "s": _rand(rng, b)} for n, a, b in [(2, 1, 1), (3, 4, 4), (0, 2, 2), (2, 3, 1)]]
    _check(model, feeds, {"x": _rand(rng, (2, 3)), "s": _rand(rng, 2)},
           ["axis 1 of input 'x' (dim_param 'A') is 3", "axis 0 of input 's' (dim_param 'B') is 2", "ONNX node 'scale'"])


def test_matmul_contraction_of_differently_named_dims():
    rng = np.random.default_rng(2)
    model = _model([oh.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
                   [("x", F32, ["M", "K"]), ("w", F32, ["L", "N"])], [("y", F32, ["M", "N"])])
    feeds = [{"x": _rand(rng, (m, k)), "w": _rand(rng, (k, n))} for m, k, n in [(1, 1, 1), (3, 4, 2), (0, 3, 2), (2, 5, 0)]]
    _check(model, feeds, {"x": _rand(rng, (2, 3)), "w": _rand(rng, (4, 2))},
           ["axis 1 of input 'x' (dim_param 'K') is 3", "axis 0 of input 'w' (dim_param 'L') is 4", "ONNX node 'proj'",
            "matmul"])


def test_einsum_contraction_of_differently_named_dims():
    rng = np.random.default_rng(3)
    model = _model([oh.make_node("Einsum", ["x", "w"], ["y"], equation="ij,jk->ik", name="contract")],
                   [("x", F32, ["I", "J"]), ("w", F32, ["L", "K"])], [("y", F32, ["I", "K"])])
    feeds = [{"x": _rand(rng, (i, j)), "w": _rand(rng, (j, k))} for i, j, k in [(1, 1, 1), (3, 4, 2), (0, 2, 3)]]
    m = dt.compile(dt.from_onnx(model))
    sess = ort.InferenceSession(model.SerializeToString())
    for f in feeds:
        assert_same(m(*f.values()), sess.run(None, f)[0])
    with pytest.raises(ExecutionError) as e:
        m(_rand(rng, (2, 3)), _rand(rng, (4, 2)))
    assert_names(e.value, "dim_param 'J'", "dim_param 'L'", "ONNX node 'contract'")


def test_concat_of_differently_named_other_axis():
    rng = np.random.default_rng(4)
    model = _model([oh.make_node("Concat", ["a", "b"], ["y"], axis=0, name="cat")],
                   [("a", F32, ["A", "C"]), ("b", F32, ["B", "D"])], [("y", F32, ["S", "C"])])
    feeds = [{"a": _rand(rng, (a, c)), "b": _rand(rng, (b, c))} for a, b, c in [(1, 1, 1), (2, 3, 4), (0, 2, 3), (2, 2, 0)]]
    _check(model, feeds, {"a": _rand(rng, (2, 3)), "b": _rand(rng, (2, 4))},
           ["axis 1 of input 'a' (dim_param 'C') is 3", "axis 1 of input 'b' (dim_param 'D') is 4", "ONNX node 'cat'"])


def test_where_of_three_differently_named_dims():
    rng = np.random.default_rng(5)
    model = _model([oh.make_node("Where", ["c", "x", "y"], ["z"], name="pick")],
                   [("c", BOOL, ["A"]), ("x", F32, ["B"]), ("y", F32, ["C"])], [("z", F32, ["A"])])
    feeds = [{"c": _rand(rng, a, np.bool_), "x": _rand(rng, b), "y": _rand(rng, c)}
             for a, b, c in [(1, 1, 1), (4, 4, 4), (0, 0, 0), (3, 1, 3), (1, 5, 5)]]
    _check(model, feeds, {"c": _rand(rng, 3, np.bool_), "x": _rand(rng, 3), "y": _rand(rng, 2)},
           ["(dim_param 'C') is 2", "ONNX node 'pick'"])


def test_scatter_elements_indices_and_updates_named_apart():
    rng = np.random.default_rng(6)
    model = _model([oh.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=0, name="scatter")],
                   [("data", F32, ["R", "S"]), ("idx", I64, ["A", "B"]), ("upd", F32, ["C", "D"])],
                   [("y", F32, ["R", "S"])])

    def feeds(r, s, a, b, c=None, d=None):
        return {"data": _rand(rng, (r, s)), "idx": rng.integers(0, max(r, 1), (a, b)).astype(np.int64),
                "upd": _rand(rng, (a if c is None else c, b if d is None else d))}
    _check(model, [feeds(1, 1, 1, 1), feeds(4, 3, 2, 3), feeds(3, 2, 0, 2), feeds(2, 4, 1, 1)],
           feeds(4, 3, 2, 2, 2, 3),
           ["axis 1 of input 'idx' (dim_param 'B') is 2", "axis 1 of input 'upd' (dim_param 'D') is 3",
            "ONNX node 'scatter'"])
    m = dt.compile(dt.from_onnx(model))         # as many updates as indices, in another shape: refused too
    bad = feeds(4, 3, 2, 3, 3, 2)
    for run in (lambda: m(*bad.values()), lambda: dt.run_reference(m.graph, *bad.values())):
        with pytest.raises(ExecutionError) as e:
            run()
        assert_names(e.value, "(dim_param 'C') is 3", "(dim_param 'A') is 2", "ONNX ScatterElements: axis 0 of the updates and the indices")


def test_loop_carry_plus_a_differently_named_row():
    """Loop: the carried v (declared ("A",)) plus row i of a captured x (declared ("T", "B"))."""
    rng = np.random.default_rng(7)
    body = oh.make_graph([oh.make_node("Gather", ["x", "i"], ["row"], axis=0),
                          oh.make_node("Add", ["v_in", "row"], ["v_out"], name="carry_add"),
                          oh.make_node("Identity", ["c_in"], ["c_out"])],
                         "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F32, ["A"])],
                         [vi("c_out", BOOL, []), vi("v_out", F32, ["A"])])
    model = _model([oh.make_node("Loop", ["n", "", "v0"], ["v"], body=body, name="loop")],
                   [("n", I64, []), ("v0", F32, ["A"]), ("x", F32, ["T", "B"])], [("v", F32, ["A"])])
    feeds = [{"n": np.array(n, np.int64), "v0": _rand(rng, a), "x": _rand(rng, (t, b))}
             for n, a, t, b in [(0, 2, 1, 3), (1, 1, 1, 1), (3, 4, 4, 4), (2, 3, 2, 3), (2, 1, 2, 3)]]
    _check(model, feeds, {"n": np.array(2, np.int64), "v0": _rand(rng, 3), "x": _rand(rng, (2, 4))},
           ["axis 1 of input 'x' (dim_param 'B') is 4", "ONNX node 'carry_add'"])


def test_declared_output_dim_name_is_not_checked():
    """A graph output declared with a dim name other than the computed one (here "A" for a broadcast of A and
    B): the computed dim is trusted, as onnxruntime does (it checks no declared output names)."""
    rng = np.random.default_rng(8)
    model = _model([oh.make_node("Add", ["a", "b"], ["y"])], [("a", F32, ["A"]), ("b", F32, ["B"])],
                   [("y", F32, ["Q"])])
    m = dt.compile(dt.from_onnx(model))
    a, b = _rand(rng, 1), _rand(rng, 3)
    assert_same(m(a, b), a + b)


def test_input_shapes_symbols_stay_the_users():
    """Symbols named in input_shapes are the user's own, as in a traced program: two different ones an op needs
    equal are refused (the fix: give both the same symbol); a model dim_param beside them is unified."""
    with pytest.raises(TraceError, match="same symbol"):
        dt.from_onnx(_add_model(), input_shapes={"a": ("P",), "b": ("Q",)})
    g = dt.from_onnx(_add_model(), input_shapes={"a": ("P",)})      # b keeps the model's B: a hint
    a, b = np.ones(3, np.float32), np.arange(3, dtype=np.float32)
    assert_same(dt.run_reference(g, a, b), a + b)
    with pytest.raises(ExecutionError, match="dim_param 'B'"):
        dt.run_reference(g, a, np.ones(2, np.float32))


def test_traced_program_still_refuses_two_user_symbols():
    with pytest.raises(TraceError) as e:
        dt.trace(lambda x, y: x + y, dt.TensorSpec(("A",)), dt.TensorSpec(("B",)))
    assert "F.assert_dims_equal" in str(e.value) and "the symbolic dim A" in str(e.value)


def test_three_way_broadcast_checks_its_last_operand():
    """`where` of three dims unknown while tracing: the second broadcast's check names the first one's result,
    a dim bound when the first check runs (ir/dim_checks.py `DimCheck.result`), so it runs too."""
    from dyntvm import F
    spec = [dt.TensorSpec((None,), "bool", name="c")] + [dt.TensorSpec((None,), name=n) for n in "xy"]
    m = dt.compile(lambda c, x, y: F.where(c, x, y), *spec)
    rng = np.random.default_rng(9)
    for a, b, c in [(3, 3, 3), (1, 4, 1), (2, 1, 2), (0, 0, 1)]:
        args = (_rand(rng, a, np.bool_), _rand(rng, b), _rand(rng, c))
        assert_same(m(*args), np.where(*args))
    bad = (np.ones(3, bool), np.ones(3, np.float32), np.ones(2, np.float32))
    for run in (lambda: m(*bad), lambda: dt.run_reference(m.graph, *bad)):
        with pytest.raises(ExecutionError) as e:
            run()
        assert_names(e.value, "must be equal (or one of them 1)", "axis 0 of input 'y' is 2")
