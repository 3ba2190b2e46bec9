"""The IR: registry completeness, lint, JSON round trip, printer, dims, tree specs, interpreter checks."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.errors import GraphError
from dyntvm.ir import attrs as A
from dyntvm.ir import ops as O
from dyntvm.ir.graph import Graph, Node, Value, assign_names
from dyntvm.ir.serialize import graph_from_json, graph_to_json, graphs_equal, load_graph, save_graph
from dyntvm.ir.tree import tree_flatten, tree_str, tree_unflatten
from dyntvm.ir.dims import parse_dim
from dyntvm.ir.types import (SymDim, TensorType, dim_add, dim_bounds, dim_max, dim_min, dim_mul, dim_sub, dim_symbols,
                             eval_dim, join_types, shape_matches)
from dyntvm.runtime.interpreter import Interpreter
from dyntvm.runtime.kernels import KERNELS
from helpers import round_trip

S = dt.TensorSpec
X = S(("N", 4))
W = np.arange(16, dtype=np.float32).reshape(4, 4) / 16


# ------------------------------------------------------------------------------------- registry
def test_every_op_has_a_kernel_and_a_type_rule():
    ops = O.all_ops()
    assert len(ops) > 60
    for name, d in ops.items():
        assert d.name == name and callable(d.infer_type), name
        assert dataclasses.is_dataclass(d.attrs) and d.attrs.__dataclass_params__.frozen, name
        assert d.kind in (O.STATIC, O.DYNAMIC_SHAPE, O.CONTROL_FLOW, O.REGION), name
        if d.kind in (O.CONTROL_FLOW, O.REGION):
            # types come from subgraphs (lint checks them); the interpreter has a handler per op
            assert callable(getattr(Interpreter, f"run_{name}", None)), name
            assert name not in KERNELS
        else:
            assert name in KERNELS, f"{name} has no numpy kernel"
    assert set(KERNELS) <= set(ops), "kernels for unregistered ops"
    for name, d in ops.items():     # dim attrs name real fields
        assert set(d.dim_attrs) <= {f.name for f in dataclasses.fields(d.attrs)}, name


def test_register_refuses_duplicates_and_get_op_unknown():
    with pytest.raises(ValueError, match="registered twice"):
        O.register("add", A.NoAttrs, lambda ts, a: ts)
    with pytest.raises(KeyError, match="unknown op 'nope'"):
        O.get_op("nope")


def test_attrs_json_round_trip_for_every_attrs_class():
    samples = [A.ReduceAttrs((0, -1), True), A.SliceAttrs((0,), (None,), (-1,), (2,)), A.SplitAttrs((1, 3), 1),
               A.SplitAttrs(2), A.PadAttrs(((1, 2), (0, 0)), float("-inf")), A.FullAttrs(("N", 3), True, "bool"),
               A.ArangeAttrs(0, "(N * 2)", 3, "int64"), A.TopkAttrs(None, -1, False),
               A.WhileAttrs(2, 1, None, True),
               A.FullLikeAttrs(float("nan"), None), A.ShapeAttrs(("N", -1))]
    for a in samples:
        back = A.attrs_from_json(type(a), json.loads(json.dumps(A.attrs_to_json(a))))
        assert repr(back) == repr(a)


# ----------------------------------------------------------------------------------------- lint
def _simple_graph():
    x = Value(TensorType(("N", 4)), "x")
    n1 = Node("exp", (x,), A.NoAttrs(), name="exp0")
    n1.outputs = (Value(TensorType(("N", 4)), "y", n1, 0),)
    n2 = Node("sum", (n1.outputs[0],), A.ReduceAttrs((1,)), name="sum0")
    n2.outputs = (Value(TensorType(("N",)), "z", n2, 0),)
    return Graph([x], [n1, n2], [n2.outputs[0]])


def test_lint_accepts_a_good_graph():
    _simple_graph().lint()


def test_lint_use_before_def():
    g = _simple_graph()
    g.nodes.reverse()
    with pytest.raises(GraphError, match=r"node 0 \(sum sum0\) uses %y: float32\[N,4\] before it is defined"):
        g.lint()


def test_lint_subgraph_using_an_outer_value_without_capture():
    g = dt.trace(lambda x: F.cond(F.sum(x) > 0, lambda: x * 2, lambda: x), X)
    (cond,) = [n for n in g.nodes if n.op == "cond"]
    then = cond.subgraphs[0]
    mul = then.nodes[-1]
    mul.inputs = (g.inputs[0],) + mul.inputs[1:]          # the outer x, not the captured input
    with pytest.raises(GraphError, match=r"lint\(lambda/cond_\d+/then\): .* uses %x: float32\[N,4\] before "
                                         r"it is defined \(or from outside this graph: subgraphs must capture"):
        g.lint()


def test_lint_wrong_attrs_type():
    g = _simple_graph()
    g.nodes[1].attrs = A.AxisAttrs(1)
    with pytest.raises(GraphError, match=r"node 1 \(sum sum0\) attrs are AxisAttrs, expected ReduceAttrs"):
        g.lint()


def test_lint_type_disagrees_with_rule():
    g = _simple_graph()
    g.nodes[1].outputs[0].type = TensorType(("N",), "int64")
    with pytest.raises(GraphError, match=re.escape("output types ['int64[N]'] do not match its type rule "
                                                   "['float32[N]']")):
        g.lint()
    g = _simple_graph()
    g.nodes[0].outputs[0].type = TensorType(("N", 5))
    with pytest.raises(GraphError, match="fails its type rule|do not match its type rule"):
        g.lint()


def test_lint_other_checks():
    g = _simple_graph()
    g.nodes[0].op = "no_such_op"
    with pytest.raises(GraphError, match="unregistered op 'no_such_op'"):
        g.lint()
    g = _simple_graph()
    g.nodes[1].outputs[0].name = "y"
    with pytest.raises(GraphError, match="value name 'y' is used twice"):
        g.lint()
    g = _simple_graph()
    g.nodes[0].inputs = g.nodes[0].inputs * 2
    with pytest.raises(GraphError, match="has 2 inputs, expected 1"):
        g.lint()
    g = _simple_graph()
    g.nodes[1].outputs[0].producer = g.nodes[0]
    with pytest.raises(GraphError, match="does not point back to its node"):
        g.lint()
    g = _simple_graph()
    g.outputs = [Value(TensorType((1,)), "stray")]
    with pytest.raises(GraphError, match="graph output %stray: float32\\[1\\] is not defined"):
        g.lint()
    g = _simple_graph()
    g.nodes[0].subgraphs = (Graph(),)
    with pytest.raises(GraphError, match="is not control flow but has subgraphs"):
        g.lint()


def test_lint_attr_symbols_must_be_defined():
    g = dt.trace(lambda x: F.foreach(lambda r, st: (F.zeros((x.shape[0],)) + r[0], st), x, []), X)
    (fe,) = [n for n in g.nodes if n.op == "foreach"]
    body = fe.subgraphs[0]
    # the body captured a value of type [N, 4] only to know N; drop that capture and lint must object
    cap = next(v for v in body.inputs if v.type.shape == ("N", 4))
    body.inputs.remove(cap)
    fe.inputs = fe.inputs[:-1]
    with pytest.raises(GraphError, match=re.escape("attrs use symbol(s) ['N'] that no input or earlier value")):
        g.lint()


def test_lint_control_flow_structure():
    g = dt.trace(lambda x: F.cond(F.sum(x) > 0, lambda: x * 2, lambda: x), X)
    cond = next(n for n in g.nodes if n.op == "cond")
    cond.subgraphs = cond.subgraphs[:1]
    with pytest.raises(GraphError, match="has 1 subgraphs, expected 2"):
        g.lint()
    g = dt.trace(lambda x: F.cond(F.sum(x) > 0, lambda: x * 2, lambda: x), X)
    cond = next(n for n in g.nodes if n.op == "cond")
    cond.subgraphs[1].outputs = [cond.subgraphs[1].inputs[0]] * 2
    with pytest.raises(GraphError, match="else outputs .* do not match"):
        g.lint()
    g = dt.trace(lambda x: F.while_loop(lambda v: F.sum(v) > 0, lambda v: ([], [v - 1]), [x]), X)
    w = next(n for n in g.nodes if n.op == "while_loop")
    w.subgraphs[0].outputs = [w.subgraphs[0].inputs[0]]
    with pytest.raises(GraphError, match=re.escape("cond outputs ['float32[N,4]'] do not match ['bool[]']")):
        g.lint()


# ------------------------------------------------------------------------------------ JSON
def _nested(x, k):
    def wbody(i, acc):
        def fbody(row, st):
            r = F.cond(F.sum(row) > 0, lambda: row * W[0], lambda: F.boolean_mask(row, row > 0)[:1] * 0 + row)
            return r, [st[0] + r]
        out, (st,) = F.foreach(fbody, acc, [F.zeros((4,))])
        return {"st": st}, (i + 1, out * 0.5)
    res = F.while_loop(lambda i, acc: i < 3, wbody, [np.int64(0), x], max_iterations=k)
    return res, F.case([(lambda: F.sum(x) > 0, lambda: F.topk(x, 2)[0])], lambda: F.full((x.shape[0], 2), -1.0))


def test_json_round_trip_nested():
    g = dt.trace(_nested, X, S((), "int64"))
    text, params = graph_to_json(g)
    assert all(isinstance(v, np.ndarray) for v in params.values())
    copy = graph_from_json(text, params)
    assert graphs_equal(g, copy)
    copy.lint()
    assert str(copy) == str(g)
    x = np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32)
    from helpers import assert_same
    assert_same(dt.run_reference(copy, x, np.int64(2)), _nested(x, 2))


def test_save_and_load_graph_file(tmp_path):
    g = dt.trace(_nested, X, S((), "int64"))
    path = tmp_path / "g.json"
    save_graph(g, str(path))
    assert graphs_equal(g, load_graph(str(path)).lint())


def test_graphs_equal_sees_differences():
    a = dt.trace(lambda x: x * W, X)
    b = dt.trace(lambda x: x * W, X)
    assert graphs_equal(a, b) and a.nodes[-1].source != b.nodes[-1].source     # source lines do not count
    c = dt.trace(lambda x: x * (W + 1), X)
    assert not graphs_equal(a, c)
    d = dt.trace(lambda x: F.sum(x * W, axis=0), X)
    e = dt.trace(lambda x: F.sum(x * W, axis=1), X)
    assert not graphs_equal(d, e)


def test_json_errors():
    g = dt.trace(lambda x: x * W, X)
    text, params = graph_to_json(g)
    with pytest.raises(GraphError, match="is missing from params"):
        graph_from_json(text, {})
    with pytest.raises(GraphError, match="does not parse"):
        graph_from_json(text[:-5], params)
    obj = json.loads(text)
    obj["format"] = 99
    with pytest.raises(GraphError, match="format 99 is not supported"):
        graph_from_json(json.dumps(obj), params)
    obj = json.loads(text)
    obj["graph"]["nodes"][-1]["inputs"] = [12345]
    with pytest.raises(GraphError, match="value 12345 is used before it is defined"):
        graph_from_json(json.dumps(obj), params)
    with pytest.raises(GraphError, match="missing top-level 'graph'"):
        graph_from_json("{}")


# ----------------------------------------------------------------------------------- printer
def test_printer_is_readable():
    def f(x):
        return F.cond(F.sum(x) > 0, lambda: F.softmax(x), lambda: x)
    g = dt.trace(f, X)
    assert str(g) == """\
graph f(%x: float32[N,4]) {
  %v0: float32[] = sum(%x; axis=None, keepdims=False)
  %v2: float32[] = constant(; value=0.)
  %v4: bool[] = greater(%v0, %v2)
  %v6: float32[N,4] = cond(%v4, %x; num_outputs=1)
    graph then(%v8: float32[N,4]) {
      %v9: float32[N,4] = softmax(%v8; axis=-1)
      return %v9
    }
    graph else(%v11: float32[N,4]) {
      return %v11
    }
  return %v6
}"""


def test_printer_abbreviates_big_constants():
    text = str(dt.trace(lambda x: x @ W, X))
    assert "constant(; value=<float32[4, 4]>)" in text


def test_names_are_unique_and_deterministic():
    g1, g2 = dt.trace(_nested, X, S((), "int64")), dt.trace(_nested, X, S((), "int64"))
    assert str(g1) == str(g2) and graphs_equal(g1, g2)        # unknown dims are renamed _d0, _d1, ...
    assert "_d0" in str(g1)
    names = [v.name for n in g1.walk() for v in n.outputs] + [n.name for n in g1.walk()]
    assert len(names) == len(set(names))
    g = _simple_graph()
    for v in g.values():
        v.name = ""
    assign_names(g)
    assert len({v.name for v in g.values()}) == 3


def test_networkx_view():
    g = dt.trace(lambda x: F.exp(x) + F.sum(x), X)
    nxg = g.to_networkx()
    assert nxg.number_of_nodes() == len(g.nodes)
    ops = {i: d["node"].op for i, d in nxg.nodes(data=True)}
    assert {(ops[a], ops[b]) for a, b in nxg.edges()} == {("exp", "add"), ("sum", "add")}


# -------------------------------------------------------------------------------------- dims
def test_dim_arithmetic():
    assert dim_add(2, 3) == 5 and dim_add("N", 0) == "N" and dim_add("N", -2) == "(N - 2)"
    assert dim_sub("N", "N") == 0 and dim_sub("N", -1) == "(N + 1)"
    assert dim_mul("N", 1) == "N" and dim_mul("N", 0) == 0 and dim_mul(2, "T") == "(2 * T)"
    assert dim_max("N", 0) == "N" and dim_max("(N - 1)", 0) == "max((N - 1), 0)" and dim_min(3, 5) == 3
    assert dim_symbols("max((N - T), min(B, 2))") == {"N", "T", "B"}
    assert eval_dim("max((N - T), min(B, 2))", {"N": 3, "T": 5, "B": 4}) == 2
    assert eval_dim("((N * 2) // 3)", {"N": 4}) == 2
    # an expression dim seen as a whole (the size of a value typed min(N, 2)) evaluates where N is unknown
    assert eval_dim("(4 * min(N, 2))", {"min(N, 2)": 1}) == 4 and dim_min("N", 0) == 0
    assert parse_dim("(4 * min(N, 2))").free_symbols({"min(N, 2)"}) == set()
    assert parse_dim("(N + min(N, 2))").free_symbols({"min(N, 2)"}) == {"N"}
    assert dim_bounds("max((min(N, 3) - 1), 0)") == (0, 2) and dim_bounds("((N - 5) // 2)")[0] == -3
    assert dim_min("min(N, 2)", 5) == "min(N, 2)" and dim_max("min(N, 2)", 3) == 3


def test_symdim_arithmetic():
    n = SymDim("N")
    # canonical forms (ir/dim_algebra.py): N * 2, 2 * N and N + N are one dim
    assert n * 2 == "(2 * N)" and 2 * n == "(2 * N)" and n + n == "(2 * N)" and n - 1 == "(N - 1)"
    assert n // 2 == "(N // 2)" and n * 1 == "N" and isinstance(n + 1, SymDim)
    assert "id_" + n == "id_N" and n == "N" and hash(n) == hash("N")
    assert json.dumps([n]) == '["N"]'


def test_slice_length_matches_numpy():
    """The length over a symbolic axis is exact for every size, whatever the bounds and the step."""
    for start in [None, 0, 1, 2, 5, 9, -1, -2, -4, -9]:
        for stop in [None, 0, 1, 3, 6, 9, -1, -3, -9]:
            for step in [1, 2, 3, -1, -2, -3]:
                n = O.slice_length("N", start, stop, step)
                for size in range(12):
                    assert eval_dim(n, {"N": size}) == len(range(size)[start:stop:step]), (start, stop, step, size)
    assert O.slice_length("N", None, 2, 1) == "min(N, 2)" and O.slice_length("N", -3, None, 1) == "min(N, 3)"
    assert O.slice_length("N", 1, None, 1) == "max((N - 1), 0)" and O.slice_length("N", None, None, -1) == "N"


def test_types():
    t = TensorType(("N", 4), "float")
    assert str(t) == "float64[N,4]" and t.ndim == 2 and not t.is_static and t.symbols() == {"N"}
    assert TensorType.from_json(json.loads(json.dumps(t.to_json()))) == t
    with pytest.raises(ValueError, match=">= 0"):
        TensorType((-1,))
    with pytest.raises(TypeError, match="int or a symbol"):
        TensorType((True,))
    with pytest.raises(ValueError, match="bad dim expression"):
        TensorType(("N +",))
    for bad in ("nonsense", "U3", object, "complex64", "datetime64"):
        with pytest.raises(ValueError, match="unsupported dtype"):
            TensorType((1,), bad)
    # dims are stored canonically: equal dims compare equal, and expressions built on them keep their meaning
    assert TensorType(("N+1", " N", "4", "N % 3")).shape == ("(N + 1)", "N", 4, "(N % 3)")
    assert dim_mul(TensorType(("N+1",)).shape[0], 2) == "((2 * N) + 2)"        # canonical: constants distributed
    for bad, msg in [("-1", ">= 0"), ("N/2", "bad dim expression"), ("+".join(["N"] * 20000), "too long"),
                     ("(" * 900 + "N" + ")" * 900, "nested too deeply|bad dim expression"), ("-" * 1900 + "N", "nested too deeply|bad dim"), ("\U0001d40d", "ASCII")]:
        with pytest.raises(ValueError, match=msg):
            TensorType((bad,))
    env = {}
    assert shape_matches(TensorType(("N", "(N * 2)")), (3, 6), env) and env == {"N": 3}
    assert not shape_matches(TensorType(("N", "N")), (3, 4))
    j = join_types(TensorType(("N", 4)), TensorType(("M", 4)))
    assert j.shape[0] not in ("N", "M") and j.shape[1] == 4


def test_broadcast_shapes():
    assert O.broadcast_shapes(("N", 1), (4,)) == ("N", 4)
    assert O.broadcast_shapes(("N", 4), (1, 4), ()) == ("N", 4)
    assert O.broadcast_shapes(("N",), (3,)) == (3,)          # N must be 3 (or 1) at run time
    with pytest.raises(O.ShapeError, match="cannot broadcast dims 2 and 3"):
        O.broadcast_shapes((2,), (3,))


def test_tree():
    obj = {"a": [1, (2, 3)], "b": 4}
    leaves, spec = tree_flatten(obj)
    assert leaves == [1, 2, 3, 4] and tree_unflatten(spec, leaves) == obj
    assert tree_str(spec) == "{a: [*, (*, *)], b: *}" and tree_str(tree_flatten((1,))[1]) == "(*,)"
    assert json.loads(json.dumps(spec)) == spec


# ------------------------------------------------------------------------------- interpreter
def test_interpreter_checks_every_output_against_its_type():
    g = _simple_graph()
    g.nodes[1].outputs[0].type = TensorType((3,))           # wrong on purpose (lint would refuse it)
    with pytest.raises(GraphError, match=re.escape("sum node 'sum0' produced float32[2] for %z: float32[3]")):
        Interpreter(g).run(np.ones((2, 4), np.float32))


def test_interpreter_frees_values_and_keeps_outputs():
    g = dt.trace(lambda x: (F.exp(x), F.exp(x) + 1), X)
    a, b = dt.run_reference(g, np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(a, np.ones((2, 4)))
    np.testing.assert_array_equal(b, np.full((2, 4), 2.0))


def test_symbols_bound_by_control_flow_outputs():
    # the cond result has an unknown dim; a reshape after it uses that dim from the cond's output
    def f(x):
        y = F.cond(F.sum(x) > 0, lambda: F.boolean_mask(x, x[:, 0] > 0), lambda: x)
        return F.reshape(y * 2, (y.shape[0], 2, 2)), F.arange(y.shape[0])
    g = dt.trace(f, X)
    for n in (0, 1, 4):
        x = np.random.default_rng(n).uniform(-1, 1, (n, 4)).astype(np.float32)
        from helpers import assert_same
        assert_same(dt.run_reference(g, x), f(x))
    round_trip(g)


def test_nested_inputs_and_outputs():
    def f(pair, d):
        a, b = pair
        return {"sum": a + b, "parts": [d["x"] * 2, (F.sum(a),)]}
    specs = [[X, X], {"x": S((3,), "int32")}]
    g = dt.trace(f, *specs)
    args = ([np.ones((2, 4), np.float32), np.full((2, 4), 2, np.float32)], {"x": np.arange(3, dtype=np.int32)})
    from helpers import assert_same
    assert_same(dt.run_reference(g, *args), f(*args))
    assert_same(dt.run_reference(round_trip(g), *args), f(*args))


def test_parameters_named_like_internal_values():
    """Found by the hostile review: inputs are named after parameters, and a parameter called v0 / v2 clashed
    with the generated value names (GraphError 'value name used twice')."""
    S = dt.TensorSpec
    g = dt.trace(lambda x, v2: F.tanh(x) * 2.0 + v2, S((3,)), S((3,)))
    assert [v.name for v in g.inputs] == ["x", "v2"]
    names = [v.name for v in g.values()]
    assert len(names) == len(set(names))
    model = dt.compile(lambda v0: v0 * 2.0, S((3,)))
    np.testing.assert_array_equal(model(np.ones(3, np.float32)), np.full(3, 2.0, np.float32))
    with pytest.raises(dt.TraceError, match=r"input name\(s\) 'a' given to more than one TensorSpec"):
        dt.trace(lambda a, b: a + b, S((3,), name="a"), S((3,), name="a"))
