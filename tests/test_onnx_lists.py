"""ONNX sequences whose length or positions are known only when the model runs (frontend/onnx_seq_runtime.py):
positions from inputs, SplitToSequence along a symbolic axis or by a split tensor, sequence inputs of any
length, sequence outputs, a Loop carrying a sequence with a data-dependent trip count or condition. Each model
(made with onnx.helper) is imported once with symbolic dims, compiled, and compared with onnxruntime at three
sizes or more; a model whose sequences are all known at import keeps the import-time fast path (no list op)."""
import numpy as np
import pytest

import dyntvm as dt

from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402

from test_onnx_seq import _loop_seq_model, model_of, same, seq_vi, vi   # noqa: E402  (the models' helpers)

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(1)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def i64(v):
    return np.asarray(v, np.int64)


def list_ops(graph) -> set:
    return {n.op for n in graph.walk() if n.op.startswith("list_") or n.op in ("make_list", "split_to_list")}


def check(model, feeds: list, input_shapes=None):
    """Import once, compile once, and compare every feed with onnxruntime; returns the graph."""
    graph = dt.from_onnx(model, input_shapes=input_shapes)
    compiled = dt.compile(graph)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    for feed in feeds:
        want = sess.run(None, feed)
        got = compiled(*[feed[n] for n in names])
        got = list(got) if len(want) > 1 else [got]
        for g, w in zip(got, want):
            same(g, w)
    return graph


def test_positions_from_inputs():
    nodes = [h.make_node("SequenceConstruct", ["x", "y", "x"], ["s"]),
             h.make_node("SequenceInsert", ["s", "y", "p"], ["s2"]),
             h.make_node("SequenceAt", ["s2", "q"], ["a"]),
             h.make_node("SequenceErase", ["s2", "q"], ["s3"]),
             h.make_node("SequenceLength", ["s3"], ["n"]),
             h.make_node("ConcatFromSequence", ["s3"], ["c"], axis=0)]
    m = model_of(nodes, [vi("x", TP.FLOAT, ["A", 2]), vi("y", TP.FLOAT, ["B", 2]), vi("p", TP.INT64, []),
                         vi("q", TP.INT64, [])],
                 [vi("a", TP.FLOAT, [None, 2]), vi("n", TP.INT64, []), vi("c", TP.FLOAT, [None, 2]),
                  seq_vi("s3", TP.FLOAT, [None, 2])])
    m.graph.output.append(seq_vi("s2", TP.FLOAT, [None, 2]))
    g = check(m, [{"x": f32(a, 2), "y": f32(b, 2), "p": i64(p), "q": i64(q)}
                  for a, b, p, q in [(1, 3, 0, 0), (2, 0, 3, -1), (0, 4, -2, 2), (3, 1, 1, -4)]])
    assert {"list_insert", "list_at", "list_erase", "list_length", "list_concat"} <= list_ops(g)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_split_to_sequence_along_a_symbolic_axis(keepdims):
    nodes = [h.make_node("SplitToSequence", ["x"], ["s"], axis=1, keepdims=keepdims),
             h.make_node("SequenceLength", ["s"], ["n"]),
             h.make_node("ConcatFromSequence", ["s"], ["c"], axis=0, new_axis=1)]
    m = model_of(nodes, [vi("x", TP.FLOAT, [3, "T"])],
                 [vi("n", TP.INT64, []), vi("c", TP.FLOAT, None), seq_vi("s", TP.FLOAT, None)])
    # T = 0: onnxruntime's ConcatFromSequence refuses an empty sequence, as dyntvm's (checked below)
    g = check(m, [{"x": f32(3, t)} for t in (1, 2, 5)])
    assert "split_to_list" in list_ops(g)
    with pytest.raises(dt.ExecutionError, match=r"empty list"):
        dt.compile(g)(f32(3, 0))


@pytest.mark.parametrize("split", [[1, 0, 2], [3], 2])
def test_split_to_sequence_by_a_split_input(split):
    split = i64(split)
    nodes = [h.make_node("SplitToSequence", ["x", "sp"], ["s"], axis=0),
             h.make_node("SequenceAt", ["s", "last"], ["a"]),
             h.make_node("SequenceLength", ["s"], ["n"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, ["N", 2]), vi("sp", TP.INT64, list(split.shape))],
                 [vi("a", TP.FLOAT, None), vi("n", TP.INT64, []), seq_vi("s", TP.FLOAT, None)],
                 {"last": i64(-1)})
    sizes = [3] if split.ndim else [int(split.sum())]
    sizes += [5, 7] if split.ndim == 0 else []
    check(m, [{"x": f32(n, 2), "sp": split} for n in sizes] if split.ndim == 1 else
          [{"x": f32(n, 2), "sp": split} for n in sizes])


def test_sequence_inputs_of_any_length_and_sequence_outputs():
    nodes = [h.make_node("SequenceLength", ["s"], ["n"]),
             h.make_node("SequenceInsert", ["s", "x"], ["s2"]),
             h.make_node("ConcatFromSequence", ["s2"], ["c"], axis=1),
             h.make_node("Relu", ["c"], ["r"])]
    m = model_of(nodes, [seq_vi("s", TP.FLOAT, [2, None]), vi("x", TP.FLOAT, [2, "K"])],
                 [vi("n", TP.INT64, []), vi("r", TP.FLOAT, [2, None]), seq_vi("s2", TP.FLOAT, [2, None])])
    g = check(m, [{"s": [f32(2, k) for k in ks], "x": f32(2, 3)} for ks in ([], [1], [2, 0, 4], [1] * 6)])
    assert g.inputs[0].type.__class__.__name__ == "ListType"
    # element shapes given: the import-time fast path (a fixed length), no list op
    fixed = dt.from_onnx(m, input_shapes={"s": [(2, 1), (2, 3)], "x": (2, 3)})
    assert not list_ops(fixed)
    with pytest.raises(dt.InputError, match=r"input 0 \('s'\), element 1: axis 0 has size 3, expected 2"):
        dt.compile(g)([f32(2, 1), f32(3, 1)], f32(2, 3))


@pytest.mark.parametrize("with_cond", [False, True])
def test_a_loop_carrying_a_sequence_with_a_trip_count_from_data(with_cond):
    m = _loop_seq_model(trip_input=True, with_cond=with_cond)
    g = check(m, [{"x": f32(n), "M": i64(k)} for n, k in ((6, 3), (4, 0), (7, 1), (9, 9))])
    assert "while_loop" in {n.op for n in g.walk()} and "list_append" in list_ops(g)


def test_a_loop_whose_condition_the_body_computes():
    """while (i < stop): the trip count is known at import, the condition is not: a run-time loop."""
    m = _loop_seq_model(trip=6, with_cond=True, stop_after=1)
    stop = [t for t in m.graph.initializer if t.name == "stop"][0]
    m.graph.initializer.remove(stop)
    m.graph.input.append(vi("stop", TP.INT64, []))
    g = check(m, [{"x": f32(8), "stop": i64(s)} for s in (0, 2, 4, 10)])
    assert "while_loop" in {n.op for n in g.walk()}


def test_known_sequences_keep_the_import_time_path():
    m = _loop_seq_model(trip=3)
    g = check(m, [{"x": f32(n)} for n in (3, 5, 8)])
    assert not list_ops(g) and "while_loop" not in {n.op for n in g.walk()}


# ONNX backend node tests with sequence inputs, imported without input_shapes: the sequences are run-time lists of
# any length (tests/test_onnx_conformance.py fixes their lengths and element shapes, the import-time path)
RUN_TIME_LIST_CASES = ["test_optional_get_element_sequence", "test_sequence_map_extract_shapes_expanded",
                       "test_sequence_map_identity_1_sequence_1_tensor_expanded",
                       "test_sequence_map_identity_1_sequence_expanded", "test_sequence_map_identity_2_sequences_expanded"]


@pytest.mark.slow                   # imports the conformance cases (all of onnx's node tests)
@pytest.mark.parametrize("name", RUN_TIME_LIST_CASES)
def test_backend_cases_with_sequence_inputs_of_any_length(name):
    from test_onnx_conformance import CASES, _array, _compare
    case = next(c for c in CASES if c.name == name)
    graph = dt.from_onnx(case.model)
    assert any(type(v.type).__name__ == "ListType" for v in graph.inputs)
    model = dt.compile(graph)
    for inputs, outputs in case.data_sets:
        got = model(*[_array(v) for v in inputs])
        got = list(got) if len(outputs) > 1 else [got]
        for k, (a, b) in enumerate(zip(got, [_array(v) for v in outputs])):
            _compare(a, b, case, f"output {k}")


def test_if_on_data_whose_branches_yield_sequences_of_different_lengths():
    then_g = h.make_graph([h.make_node("SequenceConstruct", ["x", "x"], ["t"])], "then", [],
                          [seq_vi("t", TP.FLOAT, ["N"])])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["nx"]), h.make_node("SequenceConstruct", ["nx"], ["e"])], "else",
                          [], [seq_vi("e", TP.FLOAT, ["N"])])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["seq"], then_branch=then_g, else_branch=else_g),
             h.make_node("SequenceLength", ["seq"], ["n"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, ["N"])], [seq_vi("seq", TP.FLOAT, ["N"]), vi("n", TP.INT64, [])],
                 {"zero": np.asarray(0, np.float32)})
    g = check(m, [{"x": x} for x in (np.ones(3, np.float32), -np.ones(2, np.float32), np.zeros(1, np.float32),
                                     np.full(4, 2, np.float32))])
    assert "make_list" in list_ops(g)
