"""ONNX importer (`dt.from_onnx`, frontend/onnx.py): models built with `onnx.helper`, imported, compiled and
run at several sizes (1 and 0 included where meaningful), compared with ONNX's own reference evaluator."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm.frontend.onnx import OnnxImportError

import onnx  # noqa: E402  (a dependency of dyntvm: dt.from_onnx)
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

RNG = np.random.default_rng(0)


def vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def model_of(nodes, inputs, outputs, inits=(), opset=17, name="m"):
    g = h.make_graph(nodes, name, inputs, outputs, initializer=[nh.from_array(v, k) for k, v in dict(inits).items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def check(m, feeds_list, rtol=1e-5, atol=1e-5):
    """Import + compile `m`, run each feed dict, compare every output with ONNX's reference evaluator."""
    compiled = dt.compile(dt.from_onnx(m))
    ref = ReferenceEvaluator(m)
    for feeds in feeds_list:
        want = ref.run(None, feeds)
        got = compiled(*feeds.values())
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            a = np.asarray(a)
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return compiled


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_an_mlp_with_symbolic_batch():
    W1, b1, W2 = f32(8, 16), f32(16), f32(16, 4)
    m = model_of([h.make_node("Gemm", ["x", "W1", "b1"], ["y"]), h.make_node("Tanh", ["y"], ["t"]),
                  h.make_node("MatMul", ["t", "W2"], ["z"]), h.make_node("Softmax", ["z"], ["s"], axis=-1)],
                 [vi("x", TP.FLOAT, ["batch", 8])], [vi("s", TP.FLOAT, ["batch", 4])],
                 {"W1": W1, "b1": b1, "W2": W2})
    g = dt.from_onnx(m)
    assert g.inputs[0].type.shape == ("batch", 8)
    check(m, [{"x": f32(n, 8)} for n in (1, 7, 0)])


def test_unsupported_ops_are_listed_at_once_subgraphs_included():
    then = h.make_graph([h.make_node("ConvTranspose", ["x", "x"], ["y"])], "t", [], [vi("y", TP.FLOAT, None)])
    els = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "e", [], [vi("y", TP.FLOAT, None)])
    m = model_of([h.make_node("Frobnicate", ["x"], ["z"]), h.make_node("LpPool", ["z"], ["p"]),
                  h.make_node("If", ["c"], ["o"], then_branch=then, else_branch=els)],
                 [vi("x", TP.FLOAT, [2]), vi("c", TP.BOOL, [])], [vi("o", TP.FLOAT, [2])])
    with pytest.raises(dt.UnsupportedOpError, match="ConvTranspose, Frobnicate, LpPool"):
        dt.from_onnx(m)


def test_if_with_captured_outer_values():
    then = h.make_graph([h.make_node("Mul", ["x", "x"], ["y"])], "then", [], [vi("y", TP.FLOAT, ["N"])])
    els = h.make_graph([h.make_node("Neg", ["x"], ["y"])], "else", [], [vi("y", TP.FLOAT, ["N"])])
    m = model_of([h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                  h.make_node("Greater", ["s", "zero"], ["c"]),
                  h.make_node("If", ["c"], ["o"], then_branch=then, else_branch=els)],
                 [vi("x", TP.FLOAT, ["N"])], [vi("o", TP.FLOAT, ["N"])], {"zero": np.zeros((), np.float32)})
    check(m, [{"x": np.abs(f32(5))}, {"x": -np.abs(f32(3))}, {"x": f32(1)}])


def _loop_model(with_trip=True, with_cond=True):
    # body: (i, cond, acc) -> (acc + x * i < limit, acc + x * i, scan: acc * 2)
    body = h.make_graph(
        [h.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
         h.make_node("Mul", ["x", "fi"], ["xi"]),
         h.make_node("Add", ["acc", "xi"], ["acc2"]),
         h.make_node("ReduceSum", ["acc2"], ["tot"], keepdims=0),
         h.make_node("Less", ["tot", "limit"], ["c2"]),
         h.make_node("Mul", ["acc2", "two"], ["sc"])],
        "body", [vi("i", TP.INT64, []), vi("c", TP.BOOL, []), vi("acc", TP.FLOAT, ["N"])],
        [vi("c2", TP.BOOL, []), vi("acc2", TP.FLOAT, ["N"]), vi("sc", TP.FLOAT, ["N"])],
        initializer=[nh.from_array(np.asarray(2, np.float32), "two")])
    return model_of([h.make_node("Loop", ["M" if with_trip else "", "c0" if with_cond else "", "a0"],
                                 ["final", "scans"], body=body)],
                    ([vi("M", TP.INT64, [])] if with_trip else []) + ([vi("c0", TP.BOOL, [])] if with_cond else [])
                    + [vi("a0", TP.FLOAT, ["N"]), vi("x", TP.FLOAT, ["N"])],
                    [vi("final", TP.FLOAT, ["N"]), vi("scans", TP.FLOAT, ["T", "N"])],
                    {"limit": np.asarray(40.0, np.float32)})


def test_loop_with_trip_count_condition_and_scan_outputs():
    x = np.abs(f32(4)) + 0.5
    feeds = [{"M": np.asarray(m, np.int64), "c0": np.asarray(c), "a0": np.zeros(4, np.float32), "x": x}
             for m, c in ((10, True), (3, True), (1, True))]
    compiled = check(_loop_model(), feeds)
    a0 = f32(4)
    for m, c in ((0, True), (10, False)):       # no iteration (ONNX's reference evaluator fails on these)
        final, scans = compiled(np.asarray(m, np.int64), np.asarray(c), a0, x)
        np.testing.assert_array_equal(final, a0)
        assert scans.shape == (0, 4) and scans.dtype == np.float32


def test_loop_with_only_a_condition():
    x = np.abs(f32(3)) + 0.5
    compiled = check(_loop_model(with_trip=False), [{"c0": np.asarray(True), "a0": np.zeros(3, np.float32), "x": x}])
    final, scans = compiled(np.asarray(False), np.ones(3, np.float32), x)
    np.testing.assert_array_equal(final, np.ones(3, np.float32))
    assert scans.shape == (0, 3)


def test_scan_running_sum_forward_and_reverse():
    body = h.make_graph([h.make_node("Add", ["s", "r"], ["s2"]), h.make_node("Identity", ["s2"], ["y"])], "b",
                        [vi("s", TP.FLOAT, [3]), vi("r", TP.FLOAT, [3])],
                        [vi("s2", TP.FLOAT, [3]), vi("y", TP.FLOAT, [3])])
    for dirs in ([0], [1]):
        m = model_of([h.make_node("Scan", ["s0", "xs"], ["fin", "ys"], body=body, num_scan_inputs=1,
                                  scan_input_directions=dirs)],
                     [vi("s0", TP.FLOAT, [3]), vi("xs", TP.FLOAT, ["T", 3])],
                     [vi("fin", TP.FLOAT, [3]), vi("ys", TP.FLOAT, ["T", 3])])
        if dirs == [0]:
            check(m, [{"s0": f32(3), "xs": f32(t, 3)} for t in (5, 1)])
            continue
        compiled = dt.compile(dt.from_onnx(m))     # reverse: ONNX's reference evaluator does not implement it
        for t in (5, 1, 0):
            s0, xs = f32(3), f32(t, 3)
            fin, ys = compiled(s0, xs)
            np.testing.assert_allclose(ys, s0 + np.cumsum(xs[::-1], axis=0), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(fin, s0 + xs.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_dynamic_shape_ops():
    m = model_of([h.make_node("Greater", ["x", "zero"], ["pos"]),
                  h.make_node("NonZero", ["pos"], ["nz"]),
                  h.make_node("Compress", ["x", "pos"], ["kept"], axis=0),
                  h.make_node("Shape", ["kept"], ["ks"]),
                  h.make_node("ReduceMin", ["ks"], ["kmin"], keepdims=1),
                  h.make_node("Min", ["kmin", "three"], ["k"]),
                  h.make_node("TopK", ["kept", "k"], ["tv", "ti"], axis=0),
                  h.make_node("Where", ["pos", "x", "zero"], ["relu"])],
                 [vi("x", TP.FLOAT, ["N"])],
                 [vi("nz", TP.INT64, [1, "K"]), vi("kept", TP.FLOAT, ["K"]), vi("tv", TP.FLOAT, ["k"]),
                  vi("ti", TP.INT64, ["k"]), vi("relu", TP.FLOAT, ["N"])],
                 {"zero": np.zeros((), np.float32), "three": np.asarray([3], np.int64)})
    check(m, [{"x": f32(n)} for n in (9, 2, 1)])


def test_reshape_from_a_computed_shape_and_static_shape_chains():
    m = model_of([h.make_node("Shape", ["x"], ["s"]),
                  h.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
                  h.make_node("Unsqueeze", ["d0", "ax0"], ["d0v"]),
                  h.make_node("Concat", ["d0v", "m1"], ["shape"], axis=0),
                  h.make_node("Reshape", ["x", "shape"], ["y"]),
                  h.make_node("Transpose", ["y"], ["yt"], perm=[1, 0]),
                  h.make_node("Unsqueeze", ["yt", "ax0"], ["yu"]),
                  h.make_node("Squeeze", ["yu", "ax0"], ["ys"]),
                  h.make_node("Slice", ["ys", "st", "en"], ["sl"]),
                  h.make_node("Split", ["sl", "sp"], ["p1", "p2"], axis=0)],
                 [vi("x", TP.FLOAT, ["N", 3, 4])],
                 [vi("yt", TP.FLOAT, [12, "N"]), vi("p1", TP.FLOAT, [None, None]),
                  vi("p2", TP.FLOAT, [None, None])],
                 {"i0": np.asarray(0, np.int64), "ax0": np.asarray([0], np.int64), "m1": np.asarray([-1], np.int64),
                  "st": np.asarray([1], np.int64), "en": np.asarray([2 ** 63 - 1], np.int64),
                  "sp": np.asarray([4, 7], np.int64)})
    check(m, [{"x": f32(n, 3, 4)} for n in (2, 5)])


def test_range_expand_constant_of_shape_and_casts():
    m = model_of([h.make_node("Range", ["start", "n", "one"], ["r"]),
                  h.make_node("Cast", ["r"], ["rf"], to=TP.FLOAT),
                  h.make_node("Expand", ["b", "shp"], ["e"]),
                  h.make_node("ConstantOfShape", ["shp"], ["c"], value=nh.from_array(np.asarray([1.5], np.float32))),
                  h.make_node("Add", ["e", "c"], ["ec"]),
                  h.make_node("ReduceMean", ["ec"], ["mean"], axes=[1], keepdims=0)],
                 [vi("n", TP.INT64, [])], [vi("rf", TP.FLOAT, ["R"]), vi("mean", TP.FLOAT, [2])],
                 {"start": np.asarray(0, np.int64), "one": np.asarray(1, np.int64), "b": f32(2, 1),
                  "shp": np.asarray([2, 5], np.int64)}, opset=13)
    check(m, [{"n": np.asarray(n, np.int64)} for n in (4, 1, 0)])


def test_input_shapes_override_and_bad_inputs():
    m = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", TP.FLOAT, ["N", 4])], [vi("y", TP.FLOAT, ["N", 4])])
    g = dt.from_onnx(m, input_shapes={"x": (3, 4)})
    assert g.inputs[0].type.shape == (3, 4)
    with pytest.raises(dt.InputError, match="not an input"):
        dt.from_onnx(m, input_shapes={"nope": (1,)})
    with pytest.raises(dt.InputError, match="no such file"):
        dt.from_onnx("/nonexistent/model.onnx")
    with pytest.raises(dt.InputError, match="expected a path or an onnx.ModelProto"):
        dt.from_onnx(42)


def test_a_model_file_round_trip(tmp_path):
    m = model_of([h.make_node("Sigmoid", ["x"], ["y"])], [vi("x", TP.FLOAT, ["N"])], [vi("y", TP.FLOAT, ["N"])])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    compiled = dt.compile(dt.from_onnx(str(path)))
    x = f32(6)
    np.testing.assert_allclose(compiled(x), 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)
    (tmp_path / "bad.onnx").write_bytes(b"not a protobuf \x00\xff")
    with pytest.raises(dt.InputError, match="not a readable ONNX model"):
        dt.from_onnx(str(tmp_path / "bad.onnx"))


def test_the_cli_compiles_and_inspects_an_onnx_file(tmp_path):
    import subprocess
    import sys
    m = model_of([h.make_node("Greater", ["x", "z"], ["p"]), h.make_node("Compress", ["x", "p"], ["y"], axis=0)],
                 [vi("x", TP.FLOAT, ["N"])], [vi("y", TP.FLOAT, ["K"])], {"z": np.zeros((), np.float32)},
                 name="posmask")
    onnx.save(m, str(tmp_path / "m.onnx"))
    run = lambda *a: subprocess.run([sys.executable, "-m", "dyntvm", *a], capture_output=True, text=True,  # noqa
                                    cwd=tmp_path)
    r = run("inspect", "m.onnx")
    assert r.returncode == 0 and "boolean_mask" in r.stdout, r.stderr
    r = run("compile", "m.onnx", "-o", "art")
    assert r.returncode == 0, r.stderr
    x = np.asarray([1.0, -2.0, 3.0], np.float32)
    np.testing.assert_array_equal(dt.load(str(tmp_path / "art"))(x), [1.0, 3.0])
    r = run("compile", "m.onnx", "--input", "x:N:float32", "-o", "art2")
    assert r.returncode != 0 and "an ONNX model has its own inputs" in r.stderr
    np.save(tmp_path / "x.npy", x)
    r = run("run", "m.onnx", "--input", "x=x.npy")
    assert r.returncode == 0 and "float32[2]" in r.stdout, (r.stdout, r.stderr)
    r = run("run", "m.onnx", "--random", "--dim", "N=7")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("op,direction,extra", [("LSTM", "forward", {}), ("LSTM", "bidirectional", {}),
                                                ("GRU", "reverse", {}), ("GRU", "forward", {"linear_before_reset": 1})])
def test_recurrent_layers_with_symbolic_length_and_batch(op, direction, extra):
    gates, hidden, inp = (4 if op == "LSTM" else 3), 5, 3
    nd = 2 if direction == "bidirectional" else 1
    inits = {"W": f32(nd, gates * hidden, inp), "R": f32(nd, gates * hidden, hidden), "B": f32(nd, 2 * gates * hidden)}
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    m = model_of([h.make_node(op, ["X", "W", "R", "B"], outs, hidden_size=hidden, direction=direction, **extra)],
                 [vi("X", TP.FLOAT, ["T", "B", inp])],
                 [vi("Y", TP.FLOAT, ["T", nd, "B", hidden])] + [vi(o, TP.FLOAT, [nd, "B", hidden]) for o in outs[1:]],
                 inits, opset=14)
    check(m, [{"X": f32(t, b, inp)} for t, b in ((6, 2), (1, 1), (3, 4))], rtol=1e-4, atol=1e-5)


def test_malformed_models_get_a_clear_import_error():
    from dyntvm.frontend.onnx import OnnxImportError
    bad = [([h.make_node("Concat", ["x", "x"], ["y"])], "malformed node"),                 # no axis
           ([h.make_node("Relu", ["nope"], ["y"])], "'nope' is not defined"),
           ([h.make_node("Relu", ["x"], ["z"])], "graph output 'y' is not computed")]
    for nodes, match in bad:
        m = model_of(nodes, [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [4])])
        with pytest.raises(OnnxImportError, match=match):
            dt.from_onnx(m)


def test_softmax_before_opset_13_with_a_negative_axis():
    # opset < 13: the softmax of x flattened to 2-d at `axis`; a negative axis counts from the end
    x = f32(2, 3, 4)
    for op, ax in (("Softmax", -2), ("LogSoftmax", -2), ("Softmax", -3)):
        m = model_of([h.make_node(op, ["x"], ["y"], axis=ax)], [vi("x", TP.FLOAT, ["A", 3, 4])],
                     [vi("y", TP.FLOAT, ["A", 3, 4])], opset=11)
        fl = x.reshape(int(np.prod(x.shape[:ax % 3])), -1)
        e = np.exp(fl - fl.max(axis=1, keepdims=True))
        want = (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)   # ONNX's reference evaluator: opset 13's
        got = dt.compile(dt.from_onnx(m))(x)
        np.testing.assert_allclose(got, want if op == "Softmax" else np.log(want), rtol=1e-5, atol=1e-6)


def test_files_that_are_not_onnx_models(tmp_path):
    m = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", TP.FLOAT, ["N"])], [vi("y", TP.FLOAT, ["N"])])
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "graph.onnx").write_bytes(m.graph.SerializeToString())    # a protobuf, but not a ModelProto
    for name in ("empty.onnx", "graph.onnx"):
        with pytest.raises(dt.InputError, match="not an ONNX model .*no graph"):
            dt.from_onnx(str(tmp_path / name))
    (tmp_path / "d.onnx").mkdir()
    with pytest.raises(dt.InputError, match="is a directory"):
        dt.from_onnx(str(tmp_path / "d.onnx"))
    with pytest.raises(dt.InputError, match="no graph"):
        dt.from_onnx(onnx.ModelProto())


def test_input_shapes_are_checked_against_the_model():
    m = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", TP.FLOAT, ["N", 4])], [vi("y", TP.FLOAT, ["N", 4])])
    assert dt.from_onnx(m, input_shapes={"x": (1, 4)}).inputs[0].type.shape == (1, 4)   # a fixed dim may change
    for bad, match in [((3,), "rank 1, .*rank 2"), ((3, 4, 5), "rank 3, .*rank 2"), ("NC", "a tuple of dims"),
                       (5, "a tuple of dims"), (None, "a tuple of dims")]:
        with pytest.raises(dt.InputError, match=match):
            dt.from_onnx(m, input_shapes={"x": bad})
    with pytest.raises(dt.InputError, match="input_shapes must be a dict"):
        dt.from_onnx(m, input_shapes=[(3, 4)])
    # an input of unknown rank (no shape in the model) is not a scalar: it needs input_shapes
    m = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", TP.FLOAT, None)], [vi("y", TP.FLOAT, None)])
    with pytest.raises(OnnxImportError, match="'x' has no shape .*input_shapes"):
        dt.from_onnx(m)
    compiled = dt.compile(dt.from_onnx(m, input_shapes={"x": ("N",)}))
    np.testing.assert_array_equal(compiled(np.asarray([-1.0, 2.0], np.float32)), [0.0, 2.0])


def test_constant_inputs_are_checked_against_the_model():
    m = model_of([h.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", TP.FLOAT, ["N", 4]), vi("s", TP.INT64, [2])],
                 [vi("y", TP.FLOAT, None)])
    compiled = dt.compile(dt.from_onnx(m, constant_inputs={"s": [2, -1]}))       # a list is fine: it is int64[2]
    assert compiled(f32(4, 4)).shape == (2, 8)
    for bad, match in [(np.asarray([2.0, -1.0], np.float32), "is float32, but the model declares .s. as int64"),
                       (np.asarray([2, -1, 1], np.int64), r"shape \(3,\).* declares .s. as int64\[2\]"),
                       (np.asarray([[2, -1]], np.int64), r"shape \(1, 2\)"), ("ab", "declares .s. as int64"),
                       (None, "declares .s. as int64")]:
        with pytest.raises(OnnxImportError, match=match):
            dt.from_onnx(m, constant_inputs={"s": bad})
    with pytest.raises(OnnxImportError, match=r"'x'.*shape \(2, 5\).* float32\[N, 4\]"):
        dt.from_onnx(m, constant_inputs={"x": np.ones((2, 5), np.float32), "s": [2, -1]})


def test_a_value_defined_twice_is_refused():
    m = model_of([h.make_node("Relu", ["x"], ["y"]), h.make_node("Neg", ["x"], ["y"])],
                 [vi("x", TP.FLOAT, ["N"])], [vi("y", TP.FLOAT, ["N"])])
    with pytest.raises(OnnxImportError, match="'y' is already defined"):
        dt.from_onnx(m)


def test_input_names_that_sanitize_to_the_same_symbol():
    m = model_of([h.make_node("Sub", ["x.1", "x_1"], ["y"])], [vi("x.1", TP.FLOAT, ["N"]), vi("x_1", TP.FLOAT, ["N"])],
                 [vi("y", TP.FLOAT, ["N"])])
    check(m, [{"x.1": f32(3), "x_1": f32(3)}])


def test_an_opset_newer_than_onnx_knows_is_refused():
    from dyntvm.frontend.onnx import OnnxImportError
    m = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [2])], opset=99)
    with pytest.raises(OnnxImportError, match="opset 99"):
        dt.from_onnx(m)


def test_shapes_built_from_symbolic_dims_keep_the_symbols():
    """Shape(x) -> ConstantOfShape / Expand / Reshape chains over symbolic dims type-check against x (the
    symbols are tracked through Gather / Unsqueeze / Concat), and a shape read from input data still works."""
    m = model_of([h.make_node("Shape", ["x"], ["s"]),
                  h.make_node("ConstantOfShape", ["s"], ["c"], value=nh.from_array(np.asarray([2.5], np.float32))),
                  h.make_node("Add", ["x", "c"], ["y"]),
                  h.make_node("Expand", ["b", "s"], ["e"]),
                  h.make_node("Mul", ["e", "y"], ["z"]),
                  h.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
                  h.make_node("Unsqueeze", ["d1", "ax0"], ["d1v"]),
                  h.make_node("Concat", ["m1", "d1v"], ["tgt"], axis=0),
                  h.make_node("Reshape", ["z", "tgt"], ["r"]),
                  h.make_node("ConstantOfShape", ["n"], ["dd"], value=nh.from_array(np.asarray([7], np.int64)))],
                 [vi("x", TP.FLOAT, ["N", "M"]), vi("n", TP.INT64, [2])],
                 [vi("r", TP.FLOAT, [None, "M"]), vi("dd", TP.INT64, [None, None])],
                 {"b": np.full((1, 3), 2.0, np.float32), "i1": np.asarray(1, np.int64),
                  "ax0": np.asarray([0], np.int64), "m1": np.asarray([-1], np.int64)})
    g = dt.from_onnx(m)
    assert g.outputs[0].type.shape[1] == "M"          # the Reshape target (-1, M) kept the symbol
    check(m, [{"x": f32(n, 3), "n": np.asarray(k, np.int64)} for n, k in ((4, (2, 3)), (1, (1, 1)), (0, (0, 5)))])


def test_a_loop_without_a_condition_input_runs_its_trip_count():
    """ONNX: with the condition input omitted the body's condition output is ignored (a for loop); ONNX's
    reference evaluator runs no iteration there, so the expected values are computed here."""
    x = np.abs(f32(4)) + 0.5
    compiled = dt.compile(dt.from_onnx(_loop_model(with_cond=False)))
    for m in (0, 1, 9):            # 9 steps go past the body's `tot < limit` condition
        a0 = np.zeros(4, np.float32)
        final, scans = compiled(np.asarray(m, np.int64), a0, x)
        acc, want = a0.copy(), []
        for i in range(m):
            acc = acc + x * np.float32(i)
            want.append(acc * 2)
        np.testing.assert_allclose(final, acc, rtol=1e-6)
        assert scans.shape == (m, 4)
        if m:
            np.testing.assert_allclose(scans, np.stack(want), rtol=1e-6)


def test_a_small_cnn_with_symbolic_batch():
    """Conv (bias, SAME_UPPER with stride 2, groups, dilations, asymmetric pads) / MaxPool (ceil_mode) /
    AveragePool (count_include_pad, SAME_LOWER) / GlobalAveragePool / GlobalMaxPool, against ONNX's reference
    evaluator at several batch sizes."""
    W1, b1, W2, W3 = f32(8, 3, 3, 3), f32(8), f32(8, 4, 3, 3), f32(6, 8, 2, 2)
    Wf, bf = f32(14, 5), f32(5)
    nodes = [h.make_node("Conv", ["x", "W1", "b1"], ["c1"], pads=[1, 0, 2, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             h.make_node("Conv", ["p1", "W2"], ["c2"], group=2, auto_pad="SAME_UPPER", strides=[2, 2]),
             h.make_node("Conv", ["p1", "W3"], ["c3"], dilations=[2, 1], kernel_shape=[2, 2]),
             h.make_node("AveragePool", ["c2"], ["a2"], kernel_shape=[2, 2], auto_pad="SAME_LOWER",
                         count_include_pad=1),
             h.make_node("GlobalAveragePool", ["a2"], ["g2"]), h.make_node("GlobalMaxPool", ["c3"], ["g3"]),
             h.make_node("Concat", ["g2", "g3"], ["g"], axis=1), h.make_node("Flatten", ["g"], ["f"]),
             h.make_node("Gemm", ["f", "Wf", "bf"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, ["batch", 3, 12, 11])], [vi("y", TP.FLOAT, ["batch", 5])],
                 {"W1": W1, "b1": b1, "W2": W2, "W3": W3, "Wf": Wf, "bf": bf}, opset=19)
    assert dt.from_onnx(m).outputs[0].type.shape == ("batch", 5)
    check(m, [{"x": f32(n, 3, 12, 11)} for n in (1, 2, 5)], rtol=1e-4, atol=1e-4)


def test_pools_and_convs_the_importer_refuses_by_name():
    x = vi("x", TP.FLOAT, [1, 1, 5, 5])
    cases = [(h.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2]), "Indices output"),
             (h.make_node("AveragePool", ["x"], ["y"]), "kernel_shape attribute is required"),
             (h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], auto_pad="SAME_UPPER", ceil_mode=1),
              "ceil_mode with auto_pad SAME_UPPER"),
             (h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1]), "pads .* needs a begin and an end"),
             (h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], auto_pad="SAME"), "unknown auto_pad 'SAME'")]
    for node, msg in cases:
        m = model_of([node], [x], [vi(o, TP.FLOAT, None) for o in node.output])
        with pytest.raises(OnnxImportError, match=msg):
            dt.from_onnx(m)
    sym = model_of([h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER")],
                   [vi("x", TP.FLOAT, ["N", 1, "H", 5])], [vi("y", TP.FLOAT, None)])
    with pytest.raises(OnnxImportError, match="auto_pad SAME_UPPER with stride 2 over the symbolic spatial dim 'H'"):
        dt.from_onnx(sym)
    assert dt.from_onnx(sym, input_shapes={"x": ("N", 1, 6, 5)}).outputs[0].type.shape == ("N", 1, 3, 3)
    x6 = vi("x", TP.FLOAT, [1, 1, 5, 5, 5, 5])
    with pytest.raises(OnnxImportError, match="MaxPool over 4 spatial axes: dyntvm supports 1 to 3"):
        dt.from_onnx(model_of([h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1] * 4)], [x6],
                              [vi("y", TP.FLOAT, None)]))
