"""ONNX sequences and optionals (frontend/onnx_seq.py): import-time lists / maybes of traced tensors; graph
inputs and outputs of sequence type as lists of arrays; If with a known condition inlined; Loop carrying a
sequence unrolled. Each model is imported, compiled and compared with ONNX's reference evaluator at several
sizes (1 and 0 included where meaningful); the forms refused get an OnnxImportError naming the op."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm.errors import InputError
from dyntvm.frontend.onnx import OnnxImportError

import onnx  # noqa: F401, E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

RNG = np.random.default_rng(0)


def vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def seq_vi(name, elem, shape):
    return h.make_tensor_sequence_value_info(name, elem, shape)


def opt_vi(name, elem, shape, seq=False):
    inner = (h.make_sequence_type_proto(h.make_tensor_type_proto(elem, shape)) if seq
             else h.make_tensor_type_proto(elem, shape))
    return h.make_value_info(name, h.make_optional_type_proto(inner))


def model_of(nodes, inputs, outputs, inits=(), opset=18):
    g = h.make_graph(nodes, "m", inputs, outputs, initializer=[nh.from_array(v, k) for k, v in dict(inits).items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def same(got, want):
    """An output (an array or a list of them) equal to the reference's."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (type(got), want)
        for a, b in zip(got, want):
            same(a, b)
        return
    a = np.asarray(got)
    assert a.shape == want.shape and a.dtype == want.dtype, (a.shape, want.shape, a.dtype, want.dtype)
    np.testing.assert_allclose(a, want, rtol=1e-6, atol=1e-6)


def check(m, feeds_list, input_shapes=None, constant_inputs=None, ref_model=None):
    """Import (once, symbolic dims) + compile `m`, run each feed, compare with the reference evaluator (on
    `ref_model`, a model of the same semantics, where the evaluator gets `m` wrong)."""
    graph = dt.from_onnx(m, input_shapes=input_shapes, constant_inputs=constant_inputs)
    compiled = dt.compile(graph)
    ref = ReferenceEvaluator(ref_model or m)
    for feeds in feeds_list:
        want = ref.run(None, {**feeds, **(constant_inputs or {})})
        got = compiled(*feeds.values())
        got = list(got) if len(want) > 1 else [got]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            same(a, b)
    return graph


def ops_of(graph) -> set:
    return {n.op for n in graph.walk()}


def test_construct_insert_erase_at_length_and_concat():
    nodes = [h.make_node("SequenceConstruct", ["x", "y", "z"], ["s0"]),
             h.make_node("SequenceInsert", ["s0", "x"], ["s1"]),                 # at the back
             h.make_node("SequenceInsert", ["s1", "z", "zero"], ["s2"]),         # at the front
             h.make_node("SequenceErase", ["s2", "minus2"], ["s3"]),             # the second last
             h.make_node("SequenceErase", ["s3"], ["s4"]),                       # the last
             h.make_node("SequenceAt", ["s4", "minus1"], ["last"]),
             h.make_node("SequenceLength", ["s4"], ["n"]),
             h.make_node("ConcatFromSequence", ["s4"], ["cat"], axis=0),
             h.make_node("ConcatFromSequence", ["s4"], ["stk"], axis=-1, new_axis=1)]
    m = model_of(nodes, [vi("x", TP.FLOAT, ["N", 3]), vi("y", TP.FLOAT, ["N", 3]), vi("z", TP.FLOAT, ["N", 3])],
                 [seq_vi("s4", TP.FLOAT, ["N", 3]), vi("last", TP.FLOAT, ["N", 3]), vi("n", TP.INT64, []),
                  vi("cat", TP.FLOAT, None), vi("stk", TP.FLOAT, None)],
                 {"zero": np.asarray(0, np.int64), "minus1": np.asarray(-1, np.int64),
                  "minus2": np.asarray(-2, np.int64)})
    g = check(m, [{"x": f32(n, 3), "y": f32(n, 3), "z": f32(n, 3)} for n in (4, 1, 0)])
    assert g.out_tree[1][0] == ["list", ["*"] * 3]          # the sequence output: a list of 3 arrays


@pytest.mark.parametrize("split,keepdims", [(None, 1), (None, 0), (np.asarray(2, np.int64), 1),
                                            (np.asarray([1, 3, 1], np.int64), 1)])
def test_split_to_sequence(split, keepdims):
    ins = ["x"] + (["split"] if split is not None else [])
    m = model_of([h.make_node("SplitToSequence", ins, ["s"], axis=1, keepdims=keepdims),
                  h.make_node("SequenceLength", ["s"], ["n"])],
                 [vi("x", TP.FLOAT, ["N", 5])], [seq_vi("s", TP.FLOAT, None), vi("n", TP.INT64, [])],
                 {} if split is None else {"split": split})
    check(m, [{"x": f32(n, 5)} for n in (3, 1, 0)])


def test_split_to_sequence_of_an_empty_axis_is_an_empty_sequence():
    m = model_of([h.make_node("SplitToSequence", ["x"], ["s"], axis=1), h.make_node("SequenceLength", ["s"], ["n"])],
                 [vi("x", TP.FLOAT, ["N", 0])], [vi("n", TP.INT64, [])])
    check(m, [{"x": f32(2, 0)}])


def test_sequence_inputs_are_lists_of_arrays():
    m = model_of([h.make_node("SequenceAt", ["s", "one"], ["second"]),
                  h.make_node("ConcatFromSequence", ["s"], ["cat"], axis=0),
                  h.make_node("Identity", ["s"], ["same"])],
                 [seq_vi("s", TP.FLOAT, ["N", 2])],
                 [vi("second", TP.FLOAT, None), vi("cat", TP.FLOAT, None), seq_vi("same", TP.FLOAT, None)],
                 {"one": np.asarray(1, np.int64)})
    # element dims: symbols of one's choice (each its own here), the length fixed when imported
    g = check(m, [{"s": [f32(a, 2), f32(b, 2), f32(c, 2)]} for a, b, c in ((3, 1, 2), (1, 1, 1), (0, 4, 0))],
              input_shapes={"s": [("A", 2), ("B", 2), ("C", 2)]})
    assert [v.name for v in g.inputs] == ["s_0", "s_1", "s_2"]
    m1 = model_of([h.make_node("SequenceLength", ["s"], ["n"])], [seq_vi("s", TP.FLOAT, ["N", 2])],
                  [vi("n", TP.INT64, [])])
    check(m1, [{"s": []}], input_shapes={"s": []})                                   # empty
    check(m1, [{}], constant_inputs={"s": [np.ones((2, 2), np.float32)]})            # fixed at import


def test_sequence_map_over_two_sequences_or_a_sequence_and_a_tensor():
    body = h.make_graph([h.make_node("Add", ["a", "b"], ["s"]), h.make_node("Shape", ["a"], ["shp"])], "body",
                        [vi("a", TP.FLOAT, ["K"]), vi("b", TP.FLOAT, ["K"])],
                        [vi("s", TP.FLOAT, ["K"]), vi("shp", TP.INT64, [1])])
    m = model_of([h.make_node("SequenceMap", ["x", "y"], ["ss", "shapes"], body=body)],
                 [seq_vi("x", TP.FLOAT, ["K"]), seq_vi("y", TP.FLOAT, ["K"])],
                 [seq_vi("ss", TP.FLOAT, None), seq_vi("shapes", TP.INT64, [1])])
    check(m, [{"x": [f32(a), f32(b)], "y": [f32(a), f32(b)]} for a, b in ((3, 5), (1, 0))],
          input_shapes={"x": [("A",), ("B",)], "y": [("A",), ("B",)]})
    body = h.make_graph([h.make_node("Mul", ["a", "t"], ["p"])], "body", [vi("a", TP.FLOAT, ["K"]),
                                                                           vi("t", TP.FLOAT, [1])],
                        [vi("p", TP.FLOAT, ["K"])])
    m = model_of([h.make_node("SequenceMap", ["x", "t"], ["ps"], body=body)],
                 [seq_vi("x", TP.FLOAT, ["K"]), vi("t", TP.FLOAT, [1])], [seq_vi("ps", TP.FLOAT, None)])
    check(m, [{"x": [f32(a), f32(b), f32(1)], "t": f32(1)} for a, b in ((3, 5), (0, 2))],
          input_shapes={"x": [("A",), ("B",), (1,)]})


def test_optionals_present_and_empty():
    m = model_of([h.make_node("Optional", ["x"], ["o"]), h.make_node("OptionalHasElement", ["o"], ["has"]),
                  h.make_node("OptionalHasElement", ["p"], ["has_p"]),
                  h.make_node("OptionalGetElement", ["q"], ["got_q"])],
                 [vi("x", TP.FLOAT, ["N"]), opt_vi("p", TP.FLOAT, ["N"]), opt_vi("q", TP.FLOAT, ["N"])],
                 [vi("has", TP.BOOL, []), vi("has_p", TP.BOOL, []), vi("got_q", TP.FLOAT, ["N"])])
    check(m, [{"x": f32(n), "p": f32(n), "q": f32(n)} for n in (3, 1, 0)])      # the optional inputs present
    g = check(m, [{"x": f32(n), "q": f32(n)} for n in (2, 0)], constant_inputs={"p": None})   # ... p empty
    assert [v.name for v in g.inputs] == ["x", "q"]
    # OptionalGetElement(Optional(x)) is x, Optional() is empty (the reference evaluator gets both wrong: its
    # optionals are lists, [x] and [None]; the conformance tests test_optional_* agree with this)
    m = model_of([h.make_node("Optional", ["x"], ["o"]), h.make_node("OptionalGetElement", ["o"], ["y"]),
                  h.make_node("Optional", [], ["e"], type=h.make_tensor_type_proto(TP.FLOAT, [2])),
                  h.make_node("OptionalHasElement", ["e"], ["has_e"])],
                 [vi("x", TP.FLOAT, ["N"])], [vi("y", TP.FLOAT, ["N"]), vi("has_e", TP.BOOL, [])])
    compiled = dt.compile(dt.from_onnx(m))
    for n in (3, 1, 0):
        x = f32(n)
        y, has_e = compiled(x)
        np.testing.assert_array_equal(y, x)
        assert has_e.dtype == np.bool_ and has_e.shape == () and not has_e


def _if_seq_model(cond_input: bool, then_len=1, else_opt_empty=False):
    def branch(name, n, scale):
        nodes = [h.make_node("Mul", ["x", f"{name}_k"], [f"{name}_y"])]
        nodes.append(h.make_node("SequenceConstruct", [f"{name}_y"] * n, [f"{name}_s"]))
        return h.make_graph(nodes, name, [], [seq_vi(f"{name}_s", TP.FLOAT, ["N"])],
                            initializer=[nh.from_array(np.asarray(scale, np.float32), f"{name}_k")])
    then = branch("then", then_len, 2.0)
    els = branch("else", 1, -1.0)
    if else_opt_empty:
        els = h.make_graph([h.make_node("Optional", [], ["else_o"], type=h.make_sequence_type_proto(
            h.make_tensor_type_proto(TP.FLOAT, ["N"])))], "else", [], [opt_vi("else_o", TP.FLOAT, ["N"], seq=True)])
    return model_of([h.make_node("If", ["c"], ["s"], then_branch=then, else_branch=els),
                     h.make_node("SequenceAt", ["s", "zero"], ["first"])],
                    [vi("x", TP.FLOAT, ["N"])] + ([vi("c", TP.BOOL, [])] if cond_input else []),
                    [vi("first", TP.FLOAT, ["N"])],
                    {"zero": np.asarray(0, np.int64), **({} if cond_input else {"c": np.asarray(True)})})


def test_if_with_a_known_condition_is_inlined():
    g = check(_if_seq_model(cond_input=False), [{"x": f32(n)} for n in (3, 1, 0)])
    assert "cond" not in ops_of(g)
    # fixed at import: only the taken branch is converted, so the other may yield another structure (a
    # longer sequence, an empty optional) than a data-dependent If allows
    for c, else_opt_empty in ((True, True), (False, False)):
        g = check(_if_seq_model(cond_input=True, then_len=2, else_opt_empty=else_opt_empty),
                  [{"x": f32(n)} for n in (3, 0)], constant_inputs={"c": np.asarray(c)})
        assert "cond" not in ops_of(g)


def test_if_on_data_yielding_sequences():
    g = check(_if_seq_model(cond_input=True), [{"x": f32(n), "c": np.asarray(c)} for n, c in
                                               ((3, True), (3, False), (1, False), (0, True))])
    assert "cond" in ops_of(g)
    # branches yielding sequences of different lengths: run-time lists (tests/test_onnx_lists.py)
    g = check(_if_seq_model(cond_input=True, then_len=2), [{"x": f32(n), "c": np.asarray(c)} for n, c in
                                                           ((3, True), (3, False), (0, True))])
    assert "make_list" in ops_of(g)
    with pytest.raises(OnnxImportError, match=r"'If'.*empty optional.*must be known when the model is imported"):
        dt.from_onnx(_if_seq_model(cond_input=True, else_opt_empty=True))


def _loop_seq_model(trip_input=False, trip=3, with_cond=False, stop_after=None):
    """Loop carrying a sequence: appends x[:i + 1] * 2 each iteration, a scan output of [sum(x[:i + 1])];
    with `stop_after`, its condition turns False once i == stop_after."""
    body_nodes = [h.make_node("Add", ["i", "one"], ["end"]), h.make_node("Unsqueeze", ["end", "ax0"], ["end1"]),
                  h.make_node("Slice", ["x", "start", "end1"], ["piece"]),
                  h.make_node("Mul", ["piece", "two"], ["p2"]),
                  h.make_node("SequenceInsert", ["s_in", "p2"], ["s_out"]),
                  h.make_node("ReduceSum", ["piece", "ax0"], ["tot"], keepdims=1)]
    if stop_after is None:
        body_nodes.append(h.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        body_nodes.append(h.make_node("Less", ["i", "stop"], ["c_out"]))
    body = h.make_graph(body_nodes, "body", [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []),
                                             seq_vi("s_in", TP.FLOAT, None)],
                        [vi("c_out", TP.BOOL, []), seq_vi("s_out", TP.FLOAT, None), vi("tot", TP.FLOAT, [1])])
    inits = {"one": np.asarray(1, np.int64), "ax0": np.asarray([0], np.int64), "start": np.asarray([0], np.int64),
             "two": np.asarray(2, np.float32), "stop": np.asarray(stop_after or 0, np.int64),
             "c0": np.asarray(True)}
    if not trip_input:
        inits["M"] = np.asarray(trip, np.int64)
    nodes = [h.make_node("SequenceEmpty", [], ["s0"], dtype=TP.FLOAT),
             h.make_node("Loop", ["M", "c0" if with_cond else "", "s0"], ["s", "tots"], body=body),
             h.make_node("SequenceLength", ["s"], ["n"])]
    return model_of(nodes, [vi("x", TP.FLOAT, ["N"])] + ([vi("M", TP.INT64, [])] if trip_input else []),
                    [seq_vi("s", TP.FLOAT, None), vi("tots", TP.FLOAT, None), vi("n", TP.INT64, [])], inits)


@pytest.mark.parametrize("trip,with_cond,stop_after", [(3, False, None), (1, False, None), (5, True, None),
                                                       (6, True, 1)])
def test_a_loop_carrying_a_sequence_is_unrolled(trip, with_cond, stop_after):
    # (the reference evaluator runs no iteration without a condition input: compared with the model with one)
    g = check(_loop_seq_model(trip=trip, with_cond=with_cond, stop_after=stop_after),
              [{"x": f32(8)}, {"x": f32(6)}], ref_model=_loop_seq_model(trip=trip, with_cond=True,
                                                                       stop_after=stop_after))
    assert "while_loop" not in ops_of(g)
    n = trip if stop_after is None else stop_after + 1
    assert len(g.out_tree[1][0][1]) == n             # the sequence output: one array per iteration run


def _loop_slicing_at_i(op):
    """A Loop over M = 4 whose body reads x at the iteration number: `Slice(x, i, i + 1)`, (`op="Tile"`)
    `ReduceSum(Tile(x, i + 1))`, or (`op="Pad"`) `ReduceSum(Pad(x, (i, i)))` in edge mode, whose pads dyntvm needs
    at import (pads computed at run time: constant mode only)."""
    if op == "Slice":
        nodes = [h.make_node("Add", ["i", "one"], ["end"]), h.make_node("Unsqueeze", ["i", "ax0"], ["b"]),
                 h.make_node("Unsqueeze", ["end", "ax0"], ["e"]), h.make_node("Slice", ["x", "b", "e"], ["xi"])]
    elif op == "Pad":
        nodes = [h.make_node("Unsqueeze", ["i", "ax0"], ["b"]), h.make_node("Concat", ["b", "b"], ["p"], axis=0),
                 h.make_node("Pad", ["x", "p"], ["xp"], mode="edge"), h.make_node("ReduceSum", ["xp", "ax0"], ["xi"])]
    else:
        nodes = [h.make_node("Add", ["i", "one"], ["reps"]), h.make_node("Unsqueeze", ["reps", "ax0"], ["r"]),
                 h.make_node("Tile", ["x", "r"], ["xt"]), h.make_node("ReduceSum", ["xt", "ax0"], ["xi"])]
    body = h.make_graph(nodes + [h.make_node("Add", ["acc", "xi"], ["acc2"]),
                                 h.make_node("Identity", ["acc2"], ["sc"])], "body",
                        [vi("i", TP.INT64, []), vi("c", TP.BOOL, []), vi("acc", TP.FLOAT, [1])],
                        [vi("c", TP.BOOL, []), vi("acc2", TP.FLOAT, [1]), vi("sc", TP.FLOAT, [1])])
    return model_of([h.make_node("Loop", ["M", "c0", "a0"], ["final", "scans"], body=body)],
                    [vi("a0", TP.FLOAT, [1]), vi("x", TP.FLOAT, ["N"])],
                    [vi("final", TP.FLOAT, [1]), vi("scans", TP.FLOAT, None)],
                    {"M": np.asarray(4, np.int64), "c0": np.asarray(True), "one": np.asarray(1, np.int64),
                     "ax0": np.asarray([0], np.int64)})


def test_slice_bounds_from_the_iteration_number_keep_the_loop():
    # a data-dependent slice (slice_dyn) in the body: still a loop, x's size symbolic
    g = check(_loop_slicing_at_i("Slice"), [{"a0": f32(1), "x": f32(n)} for n in (4, 7)])
    assert {"while_loop", "slice_dyn"} <= ops_of(g)


def test_a_loop_needing_its_iteration_number_at_import_is_unrolled():
    # Pad's pads (edge mode) from the iteration number: no loop form, unrolled as the trip count is known
    g = check(_loop_slicing_at_i("Pad"), [{"a0": f32(1), "x": f32(n)} for n in (1, 3, 6)])
    assert "while_loop" not in ops_of(g)


def test_tile_repeats_from_the_iteration_number_keep_the_loop():
    # repeats computed in the body: a data-dependent tile (tile_dyn), still a loop
    g = check(_loop_slicing_at_i("Tile"), [{"a0": f32(1), "x": f32(n)} for n in (1, 3, 6)])
    assert {"while_loop", "tile_dyn"} <= ops_of(g)


def test_refusals_name_the_op():
    # a position known at import out of range (one read from data, a Loop's trip count from data, a sequence
    # input without element shapes, a split along a symbolic axis: run-time lists, tests/test_onnx_lists.py)
    m = model_of([h.make_node("SequenceConstruct", ["x", "x"], ["s"]), h.make_node("SequenceAt", ["s", "p"], ["y"])],
                 [vi("x", TP.FLOAT, [2]), vi("p", TP.INT64, [])], [vi("y", TP.FLOAT, [2])])
    with pytest.raises(OnnxImportError, match=r"\(SequenceAt\).*position 2 is out of range \[-2, 1\]"):
        dt.from_onnx(m, constant_inputs={"p": np.asarray(2, np.int64)})
    # element shapes of the wrong rank; an empty optional as a graph output
    m = model_of([h.make_node("SequenceLength", ["s"], ["n"])], [seq_vi("s", TP.FLOAT, [2])], [vi("n", TP.INT64, [])])
    with pytest.raises(InputError, match=r"input_shapes\['s'\]\[1\] = \(2, 2\) has rank 2, .*rank 1"):
        dt.from_onnx(m, input_shapes={"s": [(2,), (2, 2)]})
    with pytest.raises(OnnxImportError, match=r"constant_inputs\['s'\]\[0\] is float64, .*float32\[2\]"):
        dt.from_onnx(m, constant_inputs={"s": [np.ones(2)]})
    m = model_of([h.make_node("Optional", [], ["o"], type=h.make_tensor_type_proto(TP.FLOAT, [2]))], [],
                 [opt_vi("o", TP.FLOAT, [2])])
    with pytest.raises(OnnxImportError, match=r"graph output 'o' is an empty optional"):
        dt.from_onnx(m)
    # malformed: an element of another dtype, an empty optional read, an empty concat, a symbolic split axis
    for nodes, ins, match in [
            ([h.make_node("SequenceConstruct", ["x", "k"], ["s"])], [vi("k", TP.INT64, [2])],
             r"\(SequenceConstruct\).*input 1 \('inputs'\) is tensor\(int64\), but input 0 is tensor\(float\)"),
            ([h.make_node("Optional", [], ["o"], type=h.make_tensor_type_proto(TP.FLOAT, [2])),
              h.make_node("OptionalGetElement", ["o"], ["s"])], [], r"\(OptionalGetElement\).*empty optional"),
            ([h.make_node("SequenceEmpty", [], ["e"]), h.make_node("ConcatFromSequence", ["e"], ["s"], axis=0)], [],
             r"\(ConcatFromSequence\).*empty sequence")]:
        m = model_of(nodes, [vi("x", TP.FLOAT, [2])] + ins, [vi("s", TP.FLOAT, None)])
        with pytest.raises(OnnxImportError, match=match):
            dt.from_onnx(m)
