"""ONNX importer (`dt.from_onnx`, frontend/onnx.py): models built with `onnx.helper`, imported, compiled and
run at several sizes (1 and 0 included where meaningful), compared with ONNX's own reference evaluator."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
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
    then = h.make_graph([h.make_node("MaxUnpool", ["x", "x"], ["y"])], "t", [], [vi("y", TP.FLOAT, None)])
    els = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "e", [], [vi("y", TP.FLOAT, None)])
    m = model_of([h.make_node("Frobnicate", ["x"], ["z"]), h.make_node("LpPool", ["z"], ["p"]),
                  h.make_node("If", ["c"], ["o"], then_branch=then, else_branch=els)],
                 [vi("x", TP.FLOAT, [2]), vi("c", TP.BOOL, [])], [vi("o", TP.FLOAT, [2])])
    with pytest.raises(dt.UnsupportedOpError, match="Frobnicate, LpPool, MaxUnpool"):
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
    bad = [([h.make_node("Concat", ["x", "x"], ["y"])], "required attribute .axis. is missing"),  # no axis
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


def test_split_into_num_outputs_of_a_symbolic_dim():
    """Opset 18's `num_outputs` on a dim known only at run time: parts of ceil(N / n), the last smaller (was an
    equal split, failing at run time unless n divides N); before opset 18 an uneven static split is refused."""
    m = model_of([h.make_node("Split", ["x"], ["a", "b", "c"], axis=0, num_outputs=3)],
                 [vi("x", TP.FLOAT, ["N", 2])], [vi(n, TP.FLOAT, None) for n in "abc"], opset=18)
    compiled = check(m, [{"x": f32(n, 2)} for n in (7, 6, 4, 2, 0)])
    got = compiled(f32(7, 2))
    assert [p.shape[0] for p in got] == [3, 3, 1]
    m13 = model_of([h.make_node("Split", ["x"], ["a", "b"], axis=0)], [vi("x", TP.FLOAT, [5])],
                   [vi(n, TP.FLOAT, None) for n in "ab"], opset=13)
    with pytest.raises(OnnxImportError, match="does not split into 2 equal parts"):
        dt.from_onnx(m13)


def test_compress_with_a_condition_of_another_run_time_length():
    """Compress whose condition's length differs from the axis only at run time: the slices past the condition
    are dropped, and condition entries past the axis ignored (as onnxruntime); was a boolean_mask failure."""
    m = model_of([h.make_node("Compress", ["x", "c"], ["y"])], [vi("x", TP.FLOAT, ["N", 2]), vi("c", TP.BOOL, ["K"])],
                 [vi("y", TP.FLOAT, None)])
    compiled = dt.compile(dt.from_onnx(m))
    for n, k in ((3, 5), (3, 6), (4, 8), (2, 9), (1, 1), (0, 3)):
        x, c = f32(n, 2), RNG.random(k) < 0.5
        flat = x.reshape(-1)
        want = flat[np.nonzero(c)[0][np.nonzero(c)[0] < flat.size]]
        np.testing.assert_array_equal(compiled(x, c), want)
# ------------------------------------------------------------------ Mod, Pad modes, Unique, dynamic Slice, Scan-8, Split
@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint64", "float16", "float32", "float64"])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_of_every_width_both_remainders(dtype, fmod):
    """Mod is exact at 64 bits (an integer remainder op, F.fmod, not a float64 quotient); floats follow np.fmod
    (fmod=1) and np.mod (fmod=0: y's sign, +-0, inf / nan as numpy), checked against ONNX's reference."""
    if np.dtype(dtype).kind == "f":
        x = np.array([0.0, -0.0, 5.5, -5.5, np.inf, 1.0, np.nan, 1.0, -3.0, 7.25, 4.0, -4.0], dtype)
        y = np.array([-2.0, 2.0, -2.0, 2.0, 2.0, 0.0, 1.0, np.inf, np.inf, -0.5, -2.0, 2.0], dtype)
    else:
        info = np.iinfo(dtype)
        x = np.array([info.min, info.max, 7, info.max - 3, 0, 13, info.max, info.min + 1], dtype)
        y = np.array([-1 if info.min else 3, 7, 3, info.max, 5, info.max, 2, 3 if info.min else 1], dtype)
        if info.min:
            x[2], y[1] = -7, -7
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = model_of([h.make_node("Mod", ["x", "y"], ["z"], fmod=fmod)], [vi("x", elem, ["N"]), vi("y", elem, ["N"])],
                 [vi("z", elem, ["N"])], opset=13)
    with np.errstate(all="ignore"):
        compiled = check(m, [{"x": x[:n], "y": y[:n]} for n in (len(x), 1, 0)], rtol=0, atol=0)
        if np.dtype(dtype).kind == "f":           # signed zeros too
            want = (np.fmod if fmod else np.mod)(x, y)
            np.testing.assert_array_equal(np.signbit(compiled(x, y)), np.signbit(want))


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
def test_pad_modes_on_static_and_symbolic_dims(mode):
    """Pad edge / reflect / wrap as np.pad does them (the ONNX reference), pads longer than the axis included;
    on a symbolic axis the read positions are computed at run time (sizes 1..7), on a static one by numpy."""
    for pads in ([1, 0, 2, 1], [0, 2, 0, 3], [3, 1, 7, 9]):
        m = model_of([h.make_node("Pad", ["x", "p"], ["y"], mode=mode)], [vi("x", TP.FLOAT, ["N", 3])],
                     [vi("y", TP.FLOAT, None)], {"p": np.array(pads, np.int64)}, opset=19)
        check(m, [{"x": f32(n, 3)} for n in (1, 2, 3, 7)], rtol=0, atol=0)
    axes = model_of([h.make_node("Pad", ["x", "p", "", "axes"], ["y"], mode=mode)], [vi("x", TP.INT32, [2, "N", 3])],
                    [vi("y", TP.INT32, None)], {"p": np.array([2, 1, 3, 0], np.int64), "axes": np.array([-1, 0])},
                    opset=19)
    check(axes, [{"x": RNG.integers(-9, 9, (2, n, 3)).astype(np.int32)} for n in (1, 4, 0)], rtol=0, atol=0)
    m = model_of([h.make_node("Pad", ["x", "p"], ["y"], mode=mode)], [vi("x", TP.FLOAT, ["N"])],
                 [vi("y", TP.FLOAT, None)], {"p": np.array([1, 1], np.int64)}, opset=19)
    with pytest.raises(dt.ExecutionError, match="out of range"):         # numpy cannot pad an empty axis either
        dt.compile(dt.from_onnx(m))(np.zeros(0, np.float32))
    m = model_of([h.make_node("Pad", ["x", "p"], ["y"], mode=mode)], [vi("x", TP.FLOAT, [0, 2])],
                 [vi("y", TP.FLOAT, None)], {"p": np.array([1, 0, 1, 0], np.int64)}, opset=19)
    with pytest.raises(OnnxImportError, match="empty"):
        dt.from_onnx(m)


def test_pad_refuses_unknown_modes_and_bad_pads():
    for mode, pads, msg in (("mirror", [1, 1], "not one of"), ("edge", [1], "two per axis"),
                            ("reflect", [-2, -2], "crop")):
        m = model_of([h.make_node("Pad", ["x", "p"], ["y"], mode=mode)], [vi("x", TP.FLOAT, [3])],
                     [vi("y", TP.FLOAT, None)], {"p": np.array(pads, np.int64)}, opset=19)
        with pytest.raises(OnnxImportError, match=msg):
            dt.from_onnx(m)


@pytest.mark.parametrize("axis,is_sorted", [(None, 1), (None, 0), (0, 1), (0, 0), (1, 1), (-1, 1)])
def test_unique_all_outputs_sorted_or_not_along_an_axis(axis, is_sorted):
    """Unique's four outputs (values, first-occurrence indices, inverse, counts), sorted or in order of first
    occurrence, of the flattened input or of its sub-tensors along an axis, on symbolic sizes 1, several and 0."""
    kw = {} if axis is None else {"axis": axis}
    flat = axis is None and not is_sorted      # ONNX's reference takes unsorted values from x unflattened: 1-d x
    m = model_of([h.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], sorted=is_sorted, **kw)],
                 [vi("x", TP.INT64, ["N"] if flat else ["N", 3])],
                 [vi(k, TP.INT64, None) for k in ("y", "idx", "inv", "cnt")], opset=11)
    feeds = [{"x": RNG.integers(0, 3, (n, 3)).astype(np.int64)} for n in (5, 1, 0)]
    feeds.append({"x": np.array([[2, 1, 2], [0, 1, 0], [2, 1, 2], [2, 1, 1]], np.int64)})
    check(m, [{"x": f["x"].reshape(-1)} for f in feeds] if flat else feeds, rtol=0, atol=0)
    only_y = model_of([h.make_node("Unique", ["x"], ["y", "", "inv"], **kw)], [vi("x", TP.FLOAT, [4, "M"])],
                      [vi("y", TP.FLOAT, None), vi("inv", TP.INT64, None)], opset=11)
    check(only_y, [{"x": np.round(f32(4, n)).astype(np.float32)} for n in (3, 1)], rtol=0, atol=0)


def test_F_unique_in_first_occurrence_order_along_an_axis():
    """F.unique(sorted=False, axis=1) against numpy: the columns in the order they first appear; the old
    positional form (x, return_inverse, return_counts) unchanged; a 0-d input refuses an axis by name."""
    x = np.array([[3, 1, 3, 0, 1], [2, 5, 2, 9, 5]], np.int64)
    def f(x):
        return F.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=1, sorted=False)
    g = dt.trace(f, dt.TensorSpec((2, "N"), "int64", name="x"))
    for arg in (x, x[:, :1], x[:, :0]):
        y, idx, inv, cnt = dt.compile(g)(arg)
        _, first, s_inv, s_cnt = np.unique(arg, return_index=True, return_inverse=True, return_counts=True, axis=1)
        order = np.argsort(first)
        np.testing.assert_array_equal(idx, first[order])
        np.testing.assert_array_equal(y, arg[:, first[order]])
        np.testing.assert_array_equal(cnt, s_cnt[order])
        np.testing.assert_array_equal(y[:, inv], arg)
    u, inv, cnt = F.unique(np.array([2, 1, 2]), True, True)
    assert u.tolist() == [1, 2] and inv.tolist() == [1, 0, 1] and cnt.tolist() == [1, 2]
    with pytest.raises(dt.TraceError, match="unique along axis 0"):
        dt.trace(lambda x: F.unique(x, axis=0), dt.TensorSpec((), "int64", name="x"))


def test_slice_with_bounds_computed_from_the_inputs():
    """Slice whose starts / ends / steps are inputs: a data-dependent slice (slice_dyn) with ONNX's clamping,
    negative steps, INT64 sentinels, on symbolic sizes 1, several and 0; a zero step is a clear run-time error."""
    m = model_of([h.make_node("Slice", ["x", "s", "e", "axes", "st"], ["y"])],
                 [vi("x", TP.FLOAT, ["N", 5]), vi("s", TP.INT64, [2]), vi("e", TP.INT64, [2]),
                  vi("st", TP.INT64, [2])], [vi("y", TP.FLOAT, None)], {"axes": np.array([1, -2], np.int64)})
    big = np.iinfo(np.int64).max
    feeds = []
    for n in (4, 1, 0):
        for s, e, st in (([1, 0], [4, 3], [1, 1]), ([-1, -1], [-big, -big], [-2, -1]), ([0, 2], [big, 9], [2, 3]),
                         ([7, 1], [9, 1], [1, 1])):
            feeds.append({"x": f32(n, 5), "s": np.array(s, np.int64), "e": np.array(e, np.int64),
                          "st": np.array(st, np.int64)})
    compiled = check(m, feeds, rtol=0, atol=0)
    with pytest.raises(dt.ExecutionError, match="step is 0"):
        compiled(f32(3, 5), np.array([0, 0], np.int64), np.array([2, 2], np.int64), np.array([1, 0], np.int64))
    i32 = model_of([h.make_node("Slice", ["x", "s", "e"], ["y"])], [vi("x", TP.FLOAT, [6]), vi("s", TP.INT32, [1])],
                   [vi("y", TP.FLOAT, None)], {"e": np.array([5], np.int32)})
    check(i32, [{"x": f32(6), "s": np.array([k], np.int32)} for k in (0, 4, -2, 9)], rtol=0, atol=0)


def test_slice_from_the_iteration_counter_inside_a_loop():
    """test_loop11's form with a symbolic trip count and table: each iteration slices entry i of a table by the
    counter; the carried value keeps its declared static shape (pinned by a checked reshape), the scan outputs
    stack; 0, 1 and several iterations."""
    body = h.make_graph(
        [h.make_node("Add", ["i", "one"], ["end"]), h.make_node("Unsqueeze", ["i", "zero"], ["s"]),
         h.make_node("Unsqueeze", ["end", "zero"], ["e"]), h.make_node("Slice", ["table", "s", "e"], ["row"]),
         h.make_node("Add", ["y_in", "row"], ["y_out"]), h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Mul", ["row", "row"], ["scan"])],
        "body", [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("y_in", TP.FLOAT, [1])],
        [vi("c_out", TP.BOOL, []), vi("y_out", TP.FLOAT, [1]), vi("scan", TP.FLOAT, [1])],
        initializer=[nh.from_array(np.int64(1), "one"), nh.from_array(np.array([0], np.int64), "zero")])
    m = model_of([h.make_node("Loop", ["n", "c", "y"], ["y_final", "rows"], body=body)],
                 [vi("n", TP.INT64, []), vi("c", TP.BOOL, []), vi("y", TP.FLOAT, [1]), vi("table", TP.FLOAT, ["R"])],
                 [vi("y_final", TP.FLOAT, None), vi("rows", TP.FLOAT, None)], opset=13)
    t = np.bool_(True)
    compiled = check(m, [{"n": np.int64(k), "c": t, "y": f32(1), "table": f32(r)} for k, r in ((3, 5), (1, 1), (4, 4))])
    y = f32(1)                      # no iteration (ONNX's reference cannot stack zero scan outputs)
    y_final, rows = compiled(np.int64(0), t, y, f32(2))
    np.testing.assert_array_equal(y_final, y)
    assert np.asarray(rows).shape == (0, 1)
    with pytest.raises(dt.ExecutionError, match=r"Loop.*subgraph output .y_out., declared \(1,\)"):
        compiled(np.int64(3), t, f32(1), f32(2))


def test_a_data_dependent_slice_makes_a_loop_run_step_by_step():
    """A loop body holding slice_dyn is not one region, so codegen compiles no whole-loop function for it
    (ir.compiled_loop: no plan) and the executor runs it step by step, matching eager mode."""
    from dyntvm.ir.compiled_loop import foreach_loop_plan, while_loop_plan

    def f(xs, k):
        def step(x, st):
            head = F.slice(x, F.reshape(k, (1,)), np.array([9], np.int64), None, [0])
            return F.sum(head), [st[0] + F.sum(head * 2.0)]
        ys, (s,) = F.foreach(step, xs, [F.zeros(())])
        _, (w,) = F.while_loop(lambda v: F.sum(v) < 20.0,
                               lambda v: (F.sum(v), [v + F.sum(F.slice(v, F.reshape(k, (1,)), F.reshape(k, (1,))
                                                                          + np.int64(2))) + 1.0]),
                               [F.ones((4,))], max_iterations=6)
        return ys, s, w
    specs = (dt.TensorSpec(("T", 6), name="xs"), dt.TensorSpec((), "int64", name="k"))
    model = dt.compile(f, *specs)
    loops = [n for n in model.graph.walk() if n.op in ("foreach", "while_loop")]
    assert len(loops) == 2 and all((foreach_loop_plan(n) if n.op == "foreach" else while_loop_plan(n)) is None
                                   for n in loops)
    for T, k in ((3, 1), (1, 0), (0, 2), (4, -2)):
        args = (f32(T, 6), np.int64(k))
        for a, b in zip(model(*args), f(*args)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_scan_opset_8_batch_form():
    """Scan of opset 8 (batch axis 0, sequence axis 1; one scan input reversed by `directions`): an outer
    foreach over the batch around opset 9's foreach; compared with a numpy loop at batch and length 1, several
    and 0. sequence_lens is refused by name."""
    body = h.make_graph([h.make_node("Add", ["s_in", "a"], ["s_out"]), h.make_node("Mul", ["s_out", "b"], ["p"]),
                         h.make_node("Identity", ["s_out"], ["y"])], "body",
                        [vi("s_in", TP.FLOAT, [2]), vi("a", TP.FLOAT, [2]), vi("b", TP.FLOAT, [2])],
                        [vi("s_out", TP.FLOAT, [2]), vi("p", TP.FLOAT, [2]), vi("y", TP.FLOAT, [2])])
    node = h.make_node("Scan", ["", "s0", "xa", "xb"], ["s", "ps", "ys"], body=body, num_scan_inputs=2,
                       directions=[0, 1])
    m = model_of([node], [vi("s0", TP.FLOAT, ["B", 2]), vi("xa", TP.FLOAT, ["B", "T", 2]),
                          vi("xb", TP.FLOAT, ["B", "T", 2])], [vi(k, TP.FLOAT, None) for k in ("s", "ps", "ys")],
                 opset=8)
    compiled = dt.compile(dt.from_onnx(m))
    for B, T in ((2, 3), (1, 1), (3, 0), (0, 2)):
        s0, xa, xb = f32(B, 2), f32(B, T, 2), f32(B, T, 2)
        s, ps, ys = (np.asarray(v) for v in compiled(s0, xa, xb))
        want_s, want_p, want_y = s0.copy(), np.zeros((B, T, 2), np.float32), np.zeros((B, T, 2), np.float32)
        for b in range(B):
            for t in range(T):
                want_s[b] = want_s[b] + xa[b, t]
                want_p[b, t], want_y[b, t] = want_s[b] * xb[b, T - 1 - t], want_s[b]
        for got, want in ((s, want_s), (ps, want_p), (ys, want_y)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    lens = model_of([h.make_node("Scan", ["L", "s0", "xa", "xb"], ["s", "ps", "ys"], body=body, num_scan_inputs=2)],
                    [vi("L", TP.INT64, ["B"]), vi("s0", TP.FLOAT, ["B", 2]), vi("xa", TP.FLOAT, ["B", "T", 2]),
                     vi("xb", TP.FLOAT, ["B", "T", 2])], [vi(k, TP.FLOAT, None) for k in ("s", "ps", "ys")], opset=8)
    with pytest.raises(OnnxImportError, match="sequence_lens"):
        dt.from_onnx(lens)


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_split_num_outputs_on_a_symbolic_dim(parts):
    """Opset-18 Split into `num_outputs` chunks of ceil(N / parts) on a symbolic N, the last smaller or empty
    (as ONNX's reference), at sizes that divide and that do not, 1 and 0; chunks stay compiled (static ops)."""
    m = model_of([h.make_node("Split", ["x"], [f"o{k}" for k in range(parts)], axis=1, num_outputs=parts)],
                 [vi("x", TP.FLOAT, [2, "N"])], [vi(f"o{k}", TP.FLOAT, None) for k in range(parts)], opset=18)
    check(m, [{"x": f32(2, n)} for n in (0, 1, 2, 3, 4, 5, 6, 7, 9, 12)], rtol=0, atol=0)
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
             (h.make_node("AveragePool", ["x"], ["y"]), "required attribute .kernel_shape. is missing"),
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
