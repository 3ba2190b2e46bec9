"""The ONNX importer against hostile input: malformed nodes and subgraphs, sequence ops misused, bad run-time
values, NaNs, threads, and random variants against onnxruntime. Each bad input must give a dyntvm error naming
what was wrong (never a raw Python / numpy exception, a hang or a silent wrong answer)."""
import threading

import numpy as np
import pytest

import dyntvm as dt
from dyntvm.frontend.onnx import OnnxImportError

import onnx  # noqa: E402,F401
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

RNG = np.random.default_rng(7)
FL, I64, B = TP.FLOAT, TP.INT64, TP.BOOL


def vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "m", inputs, outputs,
                     initializer=[nh.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def ort_run(m, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def outs(v):
    return [np.asarray(a) for a in (v if isinstance(v, (list, tuple)) else [v])]


def assert_same(got, want):
    got, want = outs(got), outs(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------- malformed nodes
def test_an_empty_name_for_a_required_input_is_refused_by_name():
    """'' marks an omitted *optional* input; for a required one it was read as None and failed deep in a
    converter ('constant: unsupported dtype object')."""
    m = model_of([h.make_node("Gemm", ["x", ""], ["y"])], [vi("x", FL, [2, 2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match=r"Gemm.*input 1 \('B'\) is required"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Relu", [""], ["y"])], [vi("x", FL, [2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match=r"input 0 \('X'\) is required"):
        dt.from_onnx(m)


def test_too_few_or_too_many_inputs_and_outputs_are_refused():
    m = model_of([h.make_node("Add", ["x"], ["y"])], [vi("x", FL, [2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="Add takes 2 inputs, the node has 1"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Relu", ["x", "x"], ["y"])], [vi("x", FL, [2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="Relu takes 1 input, the node has 2"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Relu", ["x"], ["y", "z"])], [vi("x", FL, [2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="Relu has 1 output, the node names 2"):
        dt.from_onnx(m)


def test_attributes_of_the_wrong_type_or_missing_are_refused_by_name():
    m = model_of([h.make_node("Softmax", ["x"], ["y"], axis="a")], [vi("x", FL, [2, 3])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="attribute 'axis' must be an INT, got a STRING"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Concat", ["x", "x"], ["y"], axis=1.5)], [vi("x", FL, [2, 3])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="attribute 'axis' must be an INT, got a FLOAT"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Concat", ["x", "x"], ["y"])], [vi("x", FL, [2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="required attribute 'axis' is missing"):
        dt.from_onnx(m)


def test_a_node_yielding_fewer_values_than_it_names_is_refused():
    """Split with 0 outputs divided by zero (a raw ZeroDivisionError)."""
    m = model_of([h.make_node("Split", ["x"], [])], [vi("x", FL, [4])], [vi("x", FL, None)])
    with pytest.raises(OnnxImportError, match="Split"):
        dt.from_onnx(m)


def test_slice_axes_out_of_range_or_bounds_of_other_lengths_are_refused():
    """Were wrapped modulo the rank (axis 3 of a rank-1 tensor sliced axis 0) / truncated to the shortest."""
    base = dict(inputs=[vi("x", FL, [4, 4])], outputs=[vi("y", FL, None)])
    m = model_of([h.make_node("Slice", ["x", "s", "e", "a"], ["y"])], **base,
                 inits={"s": np.array([0]), "e": np.array([2]), "a": np.array([2])})
    with pytest.raises(OnnxImportError, match="axis 2 is out of range for a rank-2"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Slice", ["x", "s", "e"], ["y"])], **base, inits={"s": np.array([0, 1]), "e": np.array([2])})
    with pytest.raises(OnnxImportError, match="2 starts, 1 ends"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Slice", ["x", "s", "e", "a"], ["y"])], **base,
                 inits={"s": np.array([0, 0]), "e": np.array([2, 2]), "a": np.array([1, -1])})
    with pytest.raises(OnnxImportError, match="repeat"):
        dt.from_onnx(m)


@pytest.mark.parametrize("sizes, why", [([2, 2], "add up to 4, not the axis' 5"), ([2, 4], "add up to 6"),
                                        ([-1, 6], "negative"), ([2, 2, 1], "3 sizes for 2 outputs")])
def test_split_sizes_that_do_not_fit_are_refused(sizes, why):
    """Were accepted silently (the last part took the rest; a negative size split from the end)."""
    m = model_of([h.make_node("Split", ["x", "s"], ["a", "b"])], [vi("x", FL, [5])], [vi("a", FL, None), vi("b", FL, None)],
                 {"s": np.array(sizes)})
    with pytest.raises(OnnxImportError, match=why):
        dt.from_onnx(m)


def test_split_sizes_are_checked_on_a_symbolic_dim_at_run_time():
    m = model_of([h.make_node("Split", ["x", "s"], ["a", "b"])], [vi("x", FL, ["N", 2])],
                 [vi("a", FL, None), vi("b", FL, None)], {"s": np.array([2, 3])})
    g = dt.from_onnx(m)
    compiled = dt.compile(g)
    x = f32(5, 2)
    assert_same(compiled(x), ort_run(m, {"x": x}))
    for n in (4, 6, 1, 0):
        for run in (compiled, lambda x: dt.run_reference(g, x)):
            with pytest.raises(dt.ExecutionError, match="Split"):
                run(f32(n, 2))


# ------------------------------------------------------------------------------------------ types
@pytest.mark.parametrize("op", ["Add", "Mul", "Equal", "Max", "Where"])
def test_inputs_of_one_type_parameter_must_share_a_dtype(op):
    """A float32 + int64 Add was imported (promoted silently); ONNX has no promotion: the model is malformed."""
    ins = ["c", "x", "k"] if op == "Where" else ["x", "k"]
    m = model_of([h.make_node(op, ins, ["y"])], [vi("c", B, [2]), vi("x", FL, [2]), vi("k", I64, [2])],
                 [vi("y", FL, None)])
    first, second = ins.index("x"), ins.index("k")
    with pytest.raises(OnnxImportError, match=rf"\({op}\): {op}'s input {second} .* is tensor\(int64\), but input "
                                              rf"{first} is tensor\(float\): both are of type T"):
        dt.from_onnx(m)


@pytest.mark.parametrize("op, ins, why", [
    ("Add", ["c", "c"], r"Add's input 0 \('A'\) is tensor\(bool\); the spec allows .*tensor\(float\)"),
    ("Reshape", ["x", "x"], r"Reshape's input 1 \('shape'\) is tensor\(float\); the spec allows tensor\(int64\)"),
    ("Not", ["x"], r"Not's input 0 \('X'\) is tensor\(float\); the spec allows tensor\(bool\)"),
])
def test_inputs_of_a_type_the_spec_does_not_allow_are_refused(op, ins, why):
    m = model_of([h.make_node(op, ins, ["y"])], [vi("c", B, [2]), vi("x", FL, [2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match=why):
        dt.from_onnx(m)


def test_declared_graph_outputs_are_checked():
    """A declared output type was not compared with what the import computed."""
    relu = [h.make_node("Relu", ["x"], ["y"])]
    for declared, why in [(vi("y", I64, [2]), "graph output 'y' is declared int64, it is float32"),
                          (vi("y", FL, [3]), r"graph output 'y' is declared with dim 3 at axis 0, it has 2"),
                          (vi("y", FL, [2, 1]), "graph output 'y' is declared of rank 2, it has rank 1")]:
        with pytest.raises(OnnxImportError, match=why):
            dt.from_onnx(model_of(relu, [vi("x", FL, [2])], [declared]))
    dt.from_onnx(model_of(relu, [vi("x", FL, ["N"])], [vi("y", FL, [2])]))         # a symbolic dim: not known
    # input_shapes may change the sizes the model declares: its declared output dims no longer hold
    m = model_of(relu, [vi("x", FL, [2])], [vi("y", FL, [2])])
    assert dt.run_reference(dt.from_onnx(m, input_shapes={"x": (3,)}), f32(3)).shape == (3,)


def test_declared_subgraph_outputs_are_checked():
    then = h.make_graph([h.make_node("Cast", ["x"], ["t"], to=I64)], "then", [], [vi("t", FL, [2])])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", FL, [2])])
    m = model_of([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                 [vi("x", FL, [2]), vi("c", B, [])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match=r"\(If\): If's then_branch output 't' is declared float32, it is int64"):
        dt.from_onnx(m)


# -------------------------------------------------------------------------------------- subgraphs
def _loop_body(n_in, n_out):
    ins = [vi("i", I64, []), vi("c", B, []), vi("v", FL, [2]), vi("w", FL, [2])][:n_in]
    nodes = [h.make_node("Identity", ["c"], ["co"]), h.make_node("Add", ["x", "x"], ["vo"]),
             h.make_node("Neg", ["x"], ["so"])]
    outs_ = [vi("co", B, []), vi("vo", FL, [2]), vi("so", FL, [2])][:n_out]
    return h.make_graph(nodes, "body", ins, outs_)


@pytest.mark.parametrize("n_in, n_out, node_outs, why", [
    (2, 2, ["y"], "body has 2 inputs, the Loop gives it 3"),
    (4, 2, ["y"], "body has 4 inputs, the Loop gives it 3"),
    (3, 1, ["y"], "body has 1 output"),
    (3, 2, ["y", "z"], "names 2 outputs, its body yields 1"),
])
def test_loop_bodies_of_the_wrong_signature_are_refused(n_in, n_out, node_outs, why):
    """A body with fewer inputs than the Loop passes was run with the extra values dropped (zip), silently."""
    m = model_of([h.make_node("Loop", ["n", "", "x"], node_outs, body=_loop_body(n_in, n_out))],
                 [vi("x", FL, [2]), vi("n", I64, [])], [vi(o, FL, None) for o in node_outs])
    with pytest.raises(OnnxImportError, match=why):
        dt.from_onnx(m)


def test_if_branches_of_the_wrong_signature_are_refused():
    one = h.make_graph([h.make_node("Neg", ["x"], ["a"])], "t", [], [vi("a", FL, [2])])
    two = h.make_graph([h.make_node("Neg", ["x"], ["a"]), h.make_node("Abs", ["x"], ["b"])], "e", [],
                       [vi("a", FL, [2]), vi("b", FL, [2])])
    base = dict(inputs=[vi("x", FL, [2]), vi("c", B, [])])
    m = model_of([h.make_node("If", ["c"], ["y"], then_branch=one, else_branch=two)], **base, outputs=[vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="then branch yields 1 output, the else branch 2, the node names 1"):
        dt.from_onnx(m)
    m = model_of([h.make_node("If", ["c"], ["y", "z"], then_branch=one, else_branch=one)], **base,
                 outputs=[vi("y", FL, None), vi("z", FL, None)])
    with pytest.raises(OnnxImportError, match="the node names 2"):
        dt.from_onnx(m)


def test_scan_bodies_num_scan_inputs_and_axes_are_checked():
    body = h.make_graph([h.make_node("Add", ["s", "r"], ["so"]), h.make_node("Identity", ["so"], ["y"])], "sb",
                        [vi("s", FL, [2]), vi("r", FL, [2])], [vi("so", FL, [2]), vi("y", FL, [2])])
    outs_ = [vi("sf", FL, None), vi("ys", FL, None)]
    m = model_of([h.make_node("Scan", ["s0", "xs"], ["sf", "ys"], body=body, num_scan_inputs=3)],
                 [vi("s0", FL, [2]), vi("xs", FL, ["T", 2])], outs_)
    with pytest.raises(OnnxImportError, match="num_scan_inputs 3"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Scan", ["s0", "q", "xs"], ["sf", "ys"], body=body, num_scan_inputs=1)],
                 [vi("s0", FL, [2]), vi("q", FL, [2]), vi("xs", FL, ["T", 2])], outs_)
    with pytest.raises(OnnxImportError, match="body has 2 inputs, the Scan gives it 3"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Scan", ["s0", "xs"], ["sf", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[5])],
                 [vi("s0", FL, [2]), vi("xs", FL, ["T", 2])], outs_)
    with pytest.raises(OnnxImportError, match="axis 5 is out of range"):
        dt.from_onnx(m)


# -------------------------------------------------------------------------------------- sequences
def test_sequences_and_optionals_fed_to_tensor_ops_are_refused_by_name():
    """Were 'the numpy value of a traced tensor is not known while tracing' / 'unsupported dtype object'."""
    m = model_of([h.make_node("SequenceConstruct", ["x"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
                 [vi("x", FL, [2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="Relu.*input 0 is a sequence"):
        dt.from_onnx(m)
    m = model_of([h.make_node("Optional", [], ["o"], type=h.make_tensor_type_proto(FL, [2])),
                  h.make_node("Add", ["x", "o"], ["y"])], [vi("x", FL, [2])], [vi("y", FL, None)])
    with pytest.raises(OnnxImportError, match="input 1 is an empty optional"):
        dt.from_onnx(m)


@pytest.mark.parametrize("split, why", [(np.array(2.5, np.float32), r"input 1 \('split'\) is tensor\(float\); the "
                                                                    r"spec allows tensor\(int32\), tensor\(int64\)"),
                                        (np.array([[2], [2]]), "split must be")])
def test_split_to_sequence_refuses_non_integer_or_2d_splits(split, why):
    """A float split was truncated (2.5 -> 2), a 2-d one flattened."""
    m = model_of([h.make_node("SplitToSequence", ["x", "sp"], ["s"]),
                  h.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)],
                 [vi("x", FL, [4])], [vi("y", FL, None)], {"sp": split})
    with pytest.raises(OnnxImportError, match=why):
        dt.from_onnx(m)


# ---------------------------------------------------------------------------------- run-time values
def test_topk_puts_nans_first_when_largest_as_onnx_does():
    """ONNX's reference and onnxruntime treat NaN as the largest value; dyntvm's F.topk sorts NaN last in both
    directions, so TopK(largest=1) dropped the NaNs in favour of smaller numbers."""
    for largest in (1, 0):
        m = model_of([h.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest)], [vi("x", FL, ["N"])],
                     [vi("v", FL, None), vi("i", I64, None)], {"k": np.array([3])})
        g = dt.from_onnx(m)
        compiled = dt.compile(g)
        for x in (np.array([1, np.nan, 3, np.inf, np.nan, -np.inf], np.float32), np.array([np.nan] * 3, np.float32),
                  np.array([2, 1, np.nan], np.float32), f32(5)):
            want = ort_run(m, {"x": x})
            for got in (compiled(x), dt.run_reference(g, x)):
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])


def _slice_loop_model():
    """A Loop whose body slices a window [i, i + w) of a table (slice_dyn in a loop) and Unique's its values."""
    body = h.make_graph(
        [h.make_node("Add", ["i", "w"], ["end"]), h.make_node("Unsqueeze", ["i", "zero"], ["s"]),
         h.make_node("Unsqueeze", ["end", "zero"], ["e"]), h.make_node("Slice", ["table", "s", "e"], ["win"]),
         h.make_node("ReduceSum", ["win"], ["ws"], keepdims=1), h.make_node("Add", ["acc", "ws"], ["acc_out"]),
         h.make_node("Identity", ["c"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c", B, []), vi("acc", FL, [1])],
        [vi("c_out", B, []), vi("acc_out", FL, [1]), vi("ws", FL, [1])],
        initializer=[nh.from_array(np.array([0], np.int64), "zero")])
    return model_of([h.make_node("Loop", ["n", "", "acc0"], ["acc", "sums"], body=body),
                     h.make_node("Unique", ["table"], ["u", "ui", "uv", "uc"], sorted=0),
                     h.make_node("SplitToSequence", ["m"], ["seq"], axis=0),
                     h.make_node("SequenceAt", ["seq", "one"], ["row1"]),
                     h.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=1)],
                    [vi("n", I64, []), vi("w", I64, []), vi("acc0", FL, [1]), vi("table", FL, ["R"]),
                     vi("m", FL, [3, "K"])],
                    [vi("acc", FL, None), vi("sums", FL, None), vi("u", FL, None), vi("ui", I64, None),
                     vi("uv", I64, None), vi("uc", I64, None), vi("row1", FL, None), vi("cat", FL, None)],
                    {"one": np.array(1)}, opset=13)


def _slice_loop_feeds(rng, k):
    n, w, r = int(rng.integers(0, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
    table = rng.integers(0, 4, size=r).astype(np.float32)
    return {"n": np.array(n, np.int64), "w": np.array(w, np.int64), "acc0": f32(1), "table": table,
            "m": rng.standard_normal((3, int(rng.integers(0, 4)))).astype(np.float32)}


def test_random_variants_against_onnxruntime_and_eager():
    """slice_dyn in a Loop, Unique (unsorted), sequences: compiled == eager == onnxruntime on random sizes."""
    m = _slice_loop_model()
    g = dt.from_onnx(m)
    compiled = dt.compile(g)
    rng = np.random.default_rng(3)
    for k in range(25):
        feeds = _slice_loop_feeds(rng, k)
        got = compiled(*feeds.values())
        assert_same(got, dt.run_reference(g, *feeds.values()))
        if int(feeds["n"]):             # onnxruntime's Loop cannot stack zero scan outputs
            assert_same(got, ort_run(m, feeds))


def test_one_compiled_model_called_from_several_threads():
    m = _slice_loop_model()
    compiled = dt.compile(dt.from_onnx(m))
    rng = np.random.default_rng(5)
    feeds = [_slice_loop_feeds(rng, k) for k in range(24)]
    want = [outs(compiled(*f.values())) for f in feeds]
    got, errors = [None] * len(feeds), []

    def worker(ks):
        try:
            for _ in range(3):
                for k in ks:
                    got[k] = outs(compiled(*feeds[k].values()))
                    for a, b in zip(got[k], want[k]):
                        np.testing.assert_array_equal(a, b)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(list(range(t, len(feeds), 4)),)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads) and not errors, errors
