"""The ONNX converters of issue 23 (GatherND, CumSum, GatherElements, ScatterElements, ScatterND, ConvTranspose,
Resize, RoiAlign, NonMaxSuppression, Trilu, Einsum, ReduceL2 and friends, LpNormalization, InstanceNormalization,
GroupNormalization, DepthToSpace, SpaceToDepth, Pad with negative pads) on models with symbolic input dims: each
imported and compiled ONCE, then run at several sizes (1 and 0 included where the op allows them) and compared
with onnxruntime on the same model; NonMaxSuppression with score thresholds selecting no box, some and all (its
output rows depend on the data). Malformed nodes and bad inputs: a clear OnnxImportError / ExecutionError."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm.errors import ExecutionError
from dyntvm.frontend.onnx import OnnxImportError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

OPSET = 21
_TYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64,
          "int32": TensorProto.INT32, "bool": TensorProto.BOOL, "uint8": TensorProto.UINT8}


def _model(op, inputs, n_out=1, consts=None, opset=OPSET, out_types=None, **attrs):
    """One `op` node; `inputs`: [(name, dtype, dims)] graph inputs (dims: ints or symbol names), `consts`:
    {name: array} initializers, in the node's input order given by `order` (inputs then consts, or names)."""
    consts = consts or {}
    order = attrs.pop("order", [n for n, _, _ in inputs] + list(consts))
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, order, outs, **attrs)
    g = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, _TYPES[t], list(d)) for n, t, d in inputs],
        [helper.make_tensor_value_info(o, _TYPES[(out_types or {}).get(o, inputs[0][1])], None) for o in outs],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _check(model, feeds, rtol=1e-5, atol=1e-5, exact=False):
    """Import and compile once; every feed (a dict) run by the compiled model and onnxruntime, outputs equal."""
    compiled = dt.compile(dt.from_onnx(model))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in model.graph.input]
    for feed in feeds:
        want = sess.run(None, feed)
        got = compiled(*[feed[n] for n in names])
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype, feed)
            if exact:
                assert np.array_equal(g, w), (g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return compiled


RNG = np.random.default_rng(23)


def _r(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------------------- gather / scatter
def test_gather_elements_and_negative_indices():
    m = _model("GatherElements", [("x", "float32", ("N", 4)), ("i", "int64", ("N", "K"))], axis=1)
    _check(m, [{"x": _r(n, 4), "i": RNG.integers(-4, 4, (n, k))} for n, k in ((1, 1), (3, 5), (6, 2), (0, 3))],
           exact=True)
    m = _model("GatherElements", [("x", "float32", ("N", 3)), ("i", "int64", ("K", 3))], axis=0)
    _check(m, [{"x": _r(n, 3), "i": RNG.integers(-n, n, (k, 3))} for n, k in ((1, 1), (4, 6), (5, 2))], exact=True)


def test_gather_elements_index_out_of_range_is_an_execution_error():
    m = _model("GatherElements", [("x", "float32", ("N", 4)), ("i", "int64", ("N", "K"))], axis=1)
    compiled = dt.compile(dt.from_onnx(m))
    with pytest.raises(ExecutionError):
        compiled(_r(2, 4), np.array([[0, 4], [1, 1]], np.int64))


def test_scatter_index_out_of_range_is_an_execution_error():
    m = _model("ScatterND", [("x", "float32", ("N", 2)), ("i", "int64", ("K", 1)), ("u", "float32", ("K", 2))])
    compiled = dt.compile(dt.from_onnx(m))
    assert np.array_equal(compiled(np.zeros((3, 2), np.float32), np.array([[-1]]), np.ones((1, 2), np.float32)),
                          [[0, 0], [0, 0], [1, 1]])          # a negative index counts from the end
    with pytest.raises(ExecutionError, match="ScatterND"):
        compiled(np.zeros((3, 2), np.float32), np.array([[3]]), np.ones((1, 2), np.float32))


def test_gather_nd_batch_dims():
    m = _model("GatherND", [("x", "float32", ("N", "M", 3)), ("i", "int64", ("K", 2))])
    _check(m, [{"x": _r(n, mm, 3), "i": np.stack([RNG.integers(-n, n, k), RNG.integers(0, mm, k)], -1)}
               for n, mm, k in ((1, 1, 1), (3, 4, 5), (5, 2, 0))], exact=True)
    m = _model("GatherND", [("x", "float32", ("B", "M", 3)), ("i", "int64", ("B", "K", 1))], batch_dims=1)
    _check(m, [{"x": _r(b, mm, 3), "i": RNG.integers(0, mm, (b, k, 1))} for b, mm, k in ((1, 1, 1), (2, 5, 3),
                                                                                        (4, 3, 6))], exact=True)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction):
    m = _model("ScatterElements", [("x", "float32", ("N", "M")), ("i", "int64", ("K", "M")), ("u", "float32", ("K", "M"))],
               axis=0, reduction=reduction)
    feeds = []
    for n, mm, k in ((1, 1, 1), (4, 3, 2), (6, 5, 4)):
        # distinct rows per column for "none" (ONNX leaves duplicate writes unordered)
        i = np.stack([RNG.permutation(n)[:min(k, n)] for _ in range(mm)], -1) if reduction == "none" else \
            RNG.integers(-n, n, (k, mm))
        feeds.append({"x": _r(n, mm), "i": i.astype(np.int64), "u": _r(i.shape[0], mm)})
    _check(m, feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    m = _model("ScatterND", [("x", "float32", ("N", "M", 2)), ("i", "int64", ("K", 1)), ("u", "float32", ("K", "M", 2))],
               reduction=reduction)
    feeds = []
    for n, mm, k in ((1, 1, 1), (5, 3, 3), (4, 2, 0)):
        i = RNG.permutation(n)[:k] if reduction == "none" else RNG.integers(0, n, k)
        feeds.append({"x": _r(n, mm, 2), "i": i.reshape(-1, 1).astype(np.int64), "u": _r(len(i), mm, 2)})
    _check(m, feeds)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    m = _model("CumSum", [("x", "float32", ("N", "M"))], consts={"axis": np.array(1, np.int64)},
               exclusive=exclusive, reverse=reverse)
    _check(m, [{"x": _r(n, mm)} for n, mm in ((1, 1), (3, 7), (2, 0), (0, 3))])
    m = _model("CumSum", [("x", "int64", ("N",))], consts={"axis": np.array(0, np.int64)})
    _check(m, [{"x": RNG.integers(-5, 5, n)} for n in (1, 4, 0)], exact=True)


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu(upper):
    m = _model("Trilu", [("x", "float32", ("B", "N", "M")), ("k", "int64", ())], upper=upper)
    _check(m, [{"x": _r(b, n, mm), "k": np.array(k, np.int64)} for b, n, mm, k in
               ((1, 1, 1, 0), (2, 3, 5, 1), (1, 4, 2, -1), (2, 0, 3, 0))], exact=True)


@pytest.mark.parametrize("eq,shapes", [
    ("bij,bjk->bik", [("B", "N", 3), ("B", 3, "M")]),
    ("bhqd,bhkd->bhqk", [("B", 2, "Q", 4), ("B", 2, "K", 4)]),
    ("ij->ji", [("N", "M")]),
    ("...ii->...i", [("B", 3, 3)]),
    ("i,j->ij", [("N",), ("M",)]),
    ("ij,ij->", [("N", 3), ("N", 3)]),
    ("abc,cd,de->abe", [("A", 2, 3), (3, 4), (4, "E")]),
])
def test_einsum(eq, shapes):
    m = _model("Einsum", [(f"x{k}", "float32", s) for k, s in enumerate(shapes)], equation=eq)
    feeds = []
    for size in (1, 3, 5):
        feeds.append({f"x{k}": _r(*[size if isinstance(d, str) else d for d in s]) for k, s in enumerate(shapes)})
    _check(m, feeds, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- norms
@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"])
def test_reduce_norms(op):
    m = _model(op, [("x", "float32", ("N", "M"))], consts={"axes": np.array([1], np.int64)}, keepdims=0)
    _check(m, [{"x": np.abs(_r(n, mm)) + 0.1} for n, mm in ((1, 1), (3, 4), (5, 2))], rtol=1e-5)


def test_lp_normalization():
    for p in (1, 2):
        m = _model("LpNormalization", [("x", "float32", ("N", "M"))], axis=-1, p=p)
        zero_row = _r(3, 4)
        zero_row[1] = 0                      # a zero vector stays zero (no 0 / 0)
        _check(m, [{"x": _r(n, mm)} for n, mm in ((1, 1), (3, 4), (0, 5))] + [{"x": zero_row}])


def test_instance_and_group_normalization():
    m = _model("InstanceNormalization", [("x", "float32", ("N", 3, "H", "W"))],
               consts={"s": _r(3), "b": _r(3)}, epsilon=1e-4)
    _check(m, [{"x": _r(n, 3, h, w)} for n, h, w in ((1, 1, 2), (2, 4, 5), (3, 7, 1))], rtol=1e-4, atol=1e-4)
    m = _model("GroupNormalization", [("x", "float32", ("N", 6, "H"))], consts={"s": _r(6), "b": _r(6)},
               num_groups=3, epsilon=1e-5)
    _check(m, [{"x": _r(n, 6, h)} for n, h in ((1, 1), (2, 4), (3, 9))], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode):
    m = _model("DepthToSpace", [("x", "float32", ("N", 8, "H", "W"))], blocksize=2, mode=mode)
    _check(m, [{"x": _r(n, 8, h, w)} for n, h, w in ((1, 1, 1), (2, 3, 4), (0, 2, 2))], exact=True)
    m = _model("SpaceToDepth", [("x", "float32", ("N", 2, "H", "W"))], blocksize=2, opset=28, mode=mode)
    _check(m, [{"x": _r(n, 2, h, w)} for n, h, w in ((1, 2, 2), (2, 4, 6), (0, 2, 4))], exact=True)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_negative(mode):
    m = _model("Pad", [("x", "float32", ("N", "M"))], consts={"pads": np.array([-1, 1, 1, -1], np.int64)}, mode=mode)
    _check(m, [{"x": _r(n, mm)} for n, mm in ((3, 4), (4, 5), (6, 7))], exact=True)     # >= 2 left after cropping


# --------------------------------------------------------------------------------------------- images
@pytest.mark.parametrize("strides,pads,out_pad,group", [((1, 1), (0, 0, 0, 0), (0, 0), 1),
                                                        ((2, 2), (1, 0, 1, 0), (1, 0), 1),
                                                        ((2, 1), (0, 1, 0, 2), (0, 0), 2)])
def test_conv_transpose(strides, pads, out_pad, group):
    w = _r(4, 6 // group, 3, 2)
    m = _model("ConvTranspose", [("x", "float32", ("N", 4, "H", "W"))], consts={"w": w, "b": _r(6)}, strides=strides,
               pads=pads, output_padding=out_pad, group=group)
    _check(m, [{"x": _r(n, 4, h, ww)} for n, h, ww in ((1, 1, 3), (2, 3, 4), (1, 5, 6))], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode,ctm,extra", [
    ("nearest", "asymmetric", {"nearest_mode": "floor"}),
    ("nearest", "half_pixel", {"nearest_mode": "round_prefer_ceil"}),
    ("nearest", "align_corners", {"nearest_mode": "round_prefer_floor"}),
    ("linear", "half_pixel", {}),
    ("linear", "pytorch_half_pixel", {}),
    ("linear", "align_corners", {}),
    ("cubic", "half_pixel", {"cubic_coeff_a": -0.5}),
    ("cubic", "asymmetric", {"exclude_outside": 1}),
])
def test_resize_scales(mode, ctm, extra):
    m = _model("Resize", [("x", "float32", ("N", 2, "H", "W"))],
               consts={"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 0.5], np.float32)},
               mode=mode, coordinate_transformation_mode=ctm, **extra)
    # an odd W: floor(W / 2) positions. align_corners / pytorch_half_pixel then read the output length as ONNX's
    # reference does (scale * W, fractional: the conformance tests' figures), onnxruntime as the integer floor(...)
    odd = 6 if ctm in ("align_corners", "pytorch_half_pixel") else 7
    _check(m, [{"x": _r(n, 2, h, w)} for n, h, w in ((1, 1, 2), (2, 3, 4), (1, 5, odd))], rtol=1e-4, atol=1e-5)


def test_resize_sizes_from_another_tensor():
    """torchvision's FPN: the size of a feature map to upsample to comes from another input's shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, "H", "W"])
    ref = helper.make_tensor_value_info("ref", TensorProto.FLOAT, ["N", 2, "H2", "W2"])
    nodes = [helper.make_node("Shape", ["ref"], ["s"], start=2),
             helper.make_node("Shape", ["x"], ["nc"], end=2),
             helper.make_node("Concat", ["nc", "s"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    g = helper.make_graph(nodes, "fpn", [x, ref], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 10
    _check(m, [{"x": _r(n, 2, h, w), "ref": _r(n, 2, h2, w2)} for n, h, w, h2, w2 in
               ((1, 1, 1, 2, 2), (2, 3, 4, 6, 8), (1, 4, 4, 5, 7))], exact=True)


@pytest.mark.parametrize("mode,ratio", [("avg", 2), ("avg", 0), ("max", 2)])
def test_roi_align(mode, ratio):
    m = _model("RoiAlign", [("x", "float32", ("N", 3, "H", "W")), ("rois", "float32", ("R", 4)),
                            ("bi", "int64", ("R",))], output_height=2, output_width=3, sampling_ratio=ratio,
               spatial_scale=0.5, mode=mode)
    feeds = []
    for n, h, w, r in ((1, 4, 4, 1), (2, 8, 6, 3), (2, 5, 7, 0)):
        xy = RNG.uniform(0, 2 * min(h, w), (r, 2))
        rois = np.concatenate([xy, xy + RNG.uniform(1, 2 * min(h, w), (r, 2))], 1).astype(np.float32)
        feeds.append({"x": _r(n, 3, h, w), "rois": rois, "bi": RNG.integers(0, n, r)})
    _check(m, feeds, rtol=1e-4, atol=1e-5)


def _boxes(n):
    c = RNG.uniform(0, 10, (1, n, 2))
    return np.concatenate([c, c + RNG.uniform(0.5, 4, (1, n, 2))], -1).astype(np.float32)


def test_nms_rows_depend_on_the_data():
    m = _model("NonMaxSuppression", [("boxes", "float32", (1, "N", 4)), ("scores", "float32", (1, 2, "N")),
                                     ("st", "float32", (1,))],
               consts={"mx": np.array([100], np.int64), "iou": np.array([0.4], np.float32)},
               order=["boxes", "scores", "mx", "iou", "st"], out_types={"y0": "int64"})
    compiled = None
    rows = set()
    for n in (1, 5, 12):
        b, s = _boxes(n), RNG.uniform(0.1, 0.9, (1, 2, n)).astype(np.float32)
        feeds = [{"boxes": b, "scores": s, "st": np.array([t], np.float32)} for t in (0.95, 0.5, 0.0)]
        compiled = _check(m, feeds, exact=True)
        rows |= {compiled(b, s, np.array([t], np.float32)).shape[0] for t in (0.95, 0.0)}
    assert 0 in rows and max(rows) > 1
    # no suppression (IoU never above 1) and no threshold: every box of every class, in score order
    m = _model("NonMaxSuppression", [("boxes", "float32", (1, "N", 4)), ("scores", "float32", (1, 1, "N"))],
               consts={"mx": np.array([100], np.int64), "iou": np.array([1.0], np.float32)},
               order=["boxes", "scores", "mx", "iou"], out_types={"y0": "int64"}, center_point_box=1)
    out = _check(m, [{"boxes": _boxes(n), "scores": _r(1, 1, n)} for n in (1, 4, 0)], exact=True)
    assert out(_boxes(7), _r(1, 1, 7)).shape == (7, 3)


# ------------------------------------------------------------------------------------------ bad input
def test_malformed_nodes_are_import_errors():
    bad = [
        _model("GatherND", [("x", "float32", (3, 4)), ("i", "int64", (2, "K"))]),              # index depth unknown
        _model("ScatterElements", [("x", "float32", (3, 4)), ("i", "int64", (2, 4)), ("u", "float32", (2, 4))],
               reduction="avg"),
        _model("Resize", [("x", "float32", (1, 1, 2, 2))], consts={"roi": np.zeros(0, np.float32),
                                                               "scales": np.array([1, 1, 2, 2], np.float32)},
               antialias=1, mode="linear"),
        _model("DepthToSpace", [("x", "float32", (1, 6, 2, 2))], blocksize=2),
        _model("LpNormalization", [("x", "float32", (2, 3))], p=3),
        _model("Einsum", [("x", "float32", (2, 3))], equation="ijk->i"),
    ]
    for m in bad:
        with pytest.raises(OnnxImportError):
            dt.from_onnx(m)


def test_roi_align_bad_batch_index_is_an_execution_error():
    m = _model("RoiAlign", [("x", "float32", ("N", 1, 4, 4)), ("rois", "float32", ("R", 4)), ("bi", "int64", ("R",))])
    compiled = dt.compile(dt.from_onnx(m))
    with pytest.raises(ExecutionError, match="batch index"):
        compiled(_r(1, 1, 4, 4), np.array([[0, 0, 2, 2]], np.float32), np.array([3], np.int64))
