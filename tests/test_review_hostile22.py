"""Issue 22 (shapes) and issue 23's new ONNX converters tried as a hostile user: crafted ONNX models whose inputs
break the ops' contracts at run time. Each case here once ran silently (a wrong or made-up answer), raised a raw
message, or got the process killed by the OOM killer; now each is a clear dyntvm error, and the valid inputs
next to it still match onnxruntime."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm.errors import ExecutionError
from dyntvm.frontend.onnx import OnnxImportError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

_TYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
RNG = np.random.default_rng(22)


def _model(op, inputs, consts=None, out_type=None, **attrs):
    """One `op` node over graph inputs [(name, dtype, dims)] then initializers {name: array}."""
    consts = consts or {}
    order = attrs.pop("order", [n for n, _, _ in inputs] + list(consts))
    node = helper.make_node(op, order, ["y"], **attrs)
    g = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, _TYPES[t], list(d)) for n, t, d in inputs],
        [helper.make_tensor_value_info("y", _TYPES[out_type or inputs[0][1]], None)],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def _ort(model, *args):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(model.graph.input, args)})[0]


def _r(*shape):
    return RNG.standard_normal(shape).astype("float32")


# ------------------------------------------------------------------------- sizes known only when it runs
def test_a_region_too_large_for_memory_is_refused_before_it_allocates(monkeypatch):
    """Resize by 1e9 on symbolic H, W imported fine, and running it got the process OOM-killed (TVM allocated
    24 GB intermediates one by one). Checked here with the memory limit lowered, so a failure cannot hurt."""
    import dyntvm.runtime.region_sizes as region_sizes
    m = _model("Resize", [("x", "float32", ("N", "C", "H", "W"))],
               consts={"sc": np.array([1, 1, 4, 4], np.float32)}, order=["x", "", "sc"], mode="linear")
    compiled = dt.compile(dt.from_onnx(m))
    x = _r(1, 2, 3, 4)
    np.testing.assert_allclose(compiled(x), _ort(m, x), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(region_sizes, "memory_limit", lambda: 4096)     # bytes: a [1, 2, 12, 16] float32 fits
    np.testing.assert_allclose(compiled(x), _ort(m, x), rtol=1e-5, atol=1e-5)      # the same sizes: not re-checked
    with pytest.raises(ExecutionError, match="more than this machine's memory.*nothing was allocated"):
        compiled(_r(1, 2, 30, 40))
    np.testing.assert_allclose(compiled(x), _ort(m, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_resize_to_static_sizes_from_symbolic_ones(mode):
    """SSDlite's transform resizes every image to 320 x 320: comparing the static size with the symbolic input
    dim ('H' == 320) was an undecidable Python comparison, and the import failed."""
    m = _model("Resize", [("x", "float32", (1, 2, "H", "W"))], consts={"sz": np.array([1, 2, 6, 6], np.int64)},
               order=["x", "", "", "sz"], mode=mode)
    compiled = dt.compile(dt.from_onnx(m))
    for h, w in [(6, 6), (3, 9), (1, 1), (12, 5)]:
        x = _r(1, 2, h, w)
        np.testing.assert_allclose(compiled(x), _ort(m, x), rtol=1e-5, atol=1e-5)


def test_range_checks_its_length_and_step_before_numpy(monkeypatch):
    m = _model("Range", [("a", "int64", ()), ("b", "int64", ()), ("d", "int64", ())])
    compiled = dt.compile(dt.from_onnx(m))
    args = [np.array(v, np.int64) for v in (0, 10, 3)]
    np.testing.assert_array_equal(compiled(*args), _ort(m, *args))
    with pytest.raises(ExecutionError, match="the step is 0"):
        compiled(*[np.array(v, np.int64) for v in (0, 10, 0)])
    import dyntvm.ir.types as types
    monkeypatch.setattr(types, "memory_limit", lambda: 4096)
    with pytest.raises(ExecutionError, match="arange length.*more than this machine's memory"):
        compiled(*[np.array(v, np.int64) for v in (0, 1 << 20, 1)])


# -------------------------------------------------------------------------- shapes the ONNX spec requires
def test_gather_nd_batch_axes_must_be_equal_not_just_in_range():
    """Indices with 1 batch row for data with 2 read the first data batch: a made-up answer (onnxruntime
    refuses; the spec requires equal batch dims)."""
    m = _model("GatherND", [("x", "float32", ("B", "N", "M")), ("i", "int64", ("B2", "K", 1))], batch_dims=1)
    compiled = dt.compile(dt.from_onnx(m))
    x = _r(2, 3, 4)
    idx = np.array([[[0], [2]], [[1], [-1]]], np.int64)
    np.testing.assert_array_equal(compiled(x, idx), _ort(m, x, idx))
    with pytest.raises(ExecutionError, match="ONNX .* requires them equal"):
        compiled(x, idx[:1])


def test_scatter_nd_updates_of_the_wrong_shape_but_the_right_count():
    m = _model("ScatterND", [("x", "float32", ("N", "M")), ("i", "int64", ("K", 1)), ("u", "float32", ("K2", "M2"))])
    compiled = dt.compile(dt.from_onnx(m))
    x, idx = _r(3, 4), np.array([[0], [2]], np.int64)
    u = _r(2, 4)
    np.testing.assert_array_equal(compiled(x, idx, u), _ort(m, x, idx, u))
    with pytest.raises(ExecutionError, match="ONNX .* requires them equal"):
        compiled(x, idx, _r(4, 2))           # 8 updates, as [2, 4] has, in the wrong shape


def test_scatter_elements_indices_and_updates_with_their_own_symbols():
    """Refused at import (``(A * B)`` vs ``(C * D)``, a hint to F.assert_dims_equal an ONNX user cannot follow);
    the spec requires the shapes equal: now checked axis by axis when it runs."""
    m = _model("ScatterElements", [("x", "float32", ("N", "M")), ("i", "int64", ("A", "B")),
                                   ("u", "float32", ("C", "D"))], axis=1)
    compiled = dt.compile(dt.from_onnx(m))
    x, idx, u = _r(3, 4), np.array([[0, -1], [2, 3]], np.int64), _r(2, 2)
    np.testing.assert_array_equal(compiled(x, idx, u), _ort(m, x, idx, u))
    with pytest.raises(ExecutionError, match="ONNX .* requires them equal"):
        compiled(x, np.array([[0, 1, 2]], np.int64), _r(3, 1))        # the same count, transposed


# ------------------------------------------------------------------------------------- detection ops
def test_nms_iou_threshold_outside_zero_one_is_an_execution_error():
    m = _model("NonMaxSuppression", [("b", "float32", ("B", "N", 4)), ("s", "float32", ("B", "C", "N")),
                                     ("k", "int64", (1,)), ("iou", "float32", (1,)), ("st", "float32", (1,))],
               out_type="int64")
    g = dt.compile(dt.from_onnx(m))
    boxes = RNG.random((1, 6, 4)).astype("float32")
    boxes[..., 2:] += boxes[..., :2]
    scores = RNG.random((1, 2, 6)).astype("float32")
    args = [boxes, scores, np.array([3], np.int64), np.array([0.5], np.float32), np.array([0.1], np.float32)]
    np.testing.assert_array_equal(g(*args), _ort(m, *args))
    for iou in (np.nan, 1.5, -0.5):
        with pytest.raises(ExecutionError, match="iou_threshold must be in"):
            g(*args[:3], np.array([iou], np.float32), args[4])


def test_roi_align_non_finite_boxes_are_named():
    m = _model("RoiAlign", [("x", "float32", ("N", "C", "H", "W")), ("r", "float32", ("R", 4)),
                            ("bi", "int64", ("R",))], output_height=2, output_width=2)
    g = dt.compile(dt.from_onnx(m))
    for bad in (np.nan, np.inf):
        with pytest.raises(ExecutionError, match="must be finite"):
            g(_r(1, 2, 5, 5), np.array([[0, 0, bad, 3]], np.float32), np.zeros(1, np.int64))


def test_conv_transpose_attributes_the_spec_refuses_are_import_errors():
    """output_padding not below the stride, and negative pads: onnxruntime and the spec refuse them; dyntvm
    made up an output."""
    w = _r(4, 6, 3, 3)
    for attrs, what in ((dict(strides=[2, 2], output_padding=[2, 2]), "output_padding"),
                        (dict(output_padding=[1, 1]), "output_padding"),
                        (dict(strides=[2, 2], output_padding=[-1, 0]), "output_padding"),
                        (dict(pads=[-1, -1, 0, 0]), "must not be negative")):
        m = _model("ConvTranspose", [("x", "float32", ("N", "C", "H", "W"))], consts={"w": w}, **attrs)
        with pytest.raises(OnnxImportError, match=what):
            dt.from_onnx(m)


@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (3, 4), (1, 1)])
def test_reduce_log_sum_exp_over_a_symbolic_axis_that_is_empty_when_it_runs(shape):
    """log(sum(exp([]))) is -inf (onnxruntime, ONNX's reference); dyntvm raised "zero-size array to reduction
    operation maximum" from its overflow shift where the axis was symbolic."""
    m = _model("ReduceLogSumExp", [("x", "float32", ("N", "M"))], consts={"a": np.array([1], np.int64)},
               keepdims=0)
    x = _r(*shape)
    x.reshape(-1)[:1] = 80.0            # exp(80) overflows float32: the shift must still be there
    np.testing.assert_allclose(dt.compile(dt.from_onnx(m))(x), _ort(m, x), rtol=1e-5)


def test_einsum_output_without_the_ellipsis_of_its_operands_is_an_import_error():
    """'i...i->i' on a [3, 2, 3] operand: numpy (ONNX's reference) and onnxruntime refuse it; dyntvm summed the
    '...' axes away. An ellipsis of no axes stays allowed, as in numpy."""
    m = _model("Einsum", [("x", "float32", (3, 2, 3))], equation="i...i->i")
    with pytest.raises(OnnxImportError, match="no '...'"):
        dt.from_onnx(m)
    m = _model("Einsum", [("x", "float32", (3, 3))], equation="i...i->i")
    x = _r(3, 3)
    np.testing.assert_allclose(dt.run_reference(dt.from_onnx(m), x), np.einsum("i...i->i", x), rtol=1e-6)


def test_a_loop_body_region_too_large_for_memory_is_refused(monkeypatch):
    """A while loop doubling its carried tensor: its one-region body runs without a plan (the direct path), and
    the size guard covers it too."""
    import dyntvm.runtime.region_sizes as region_sizes
    from dyntvm import F

    def doubling(x, n):
        def body(i, y):
            return i + 1, F.concat([y, y], 0) * 1.5
        return F.while_loop(lambda i, y: i < n, body, [np.int64(0), x])[1]
    model = dt.compile(dt.trace(doubling, dt.TensorSpec(("N", 4)), dt.TensorSpec((), "int64")))
    x = _r(1, 4)
    want = np.concatenate([x] * 8) * np.float32(1.5 ** 3)
    np.testing.assert_allclose(model(x, np.array(3, np.int64)), want, rtol=1e-5)
    monkeypatch.setattr(region_sizes, "memory_limit", lambda: 4096)      # bytes: [256, 4] float32 fits, no more
    np.testing.assert_allclose(model(x, np.array(3, np.int64)), want, rtol=1e-5)
    with pytest.raises(ExecutionError, match="more than this machine's memory"):
        model(x, np.array(12, np.int64))      # 4096 rows: 64 KiB


def test_a_loop_body_that_only_appends_has_no_size_guard():
    """A while loop growing a sequence by one token per step (the decoder example) re-checked its body's sizes at
    every step; a value no larger than the body's inputs plus `SLACK_BYTES` cannot amplify, so that body has no
    guard, while one that doubles its carry keeps its guard (the test above)."""
    from dyntvm import F
    from dyntvm.runtime.region_sizes import size_guard

    def appending(x, n):
        def body(i, y):
            return i + 1, F.concat([y, F.reshape(F.sum(y), (1,))], 0)
        return F.while_loop(lambda i, y: i < n, body, [np.int64(0), x])[1]

    def doubling(x, n):
        def body(i, y):
            return i + 1, F.concat([y, y], 0)
        return F.while_loop(lambda i, y: i < n, body, [np.int64(0), x])[1]
    guarded, models = {}, {}
    for fn in (appending, doubling):
        model = models[fn.__name__] = dt.compile(dt.trace(fn, dt.TensorSpec(("N",)), dt.TensorSpec((), "int64")))
        bodies = [n for n in model.graph.walk() if n.op == "region" and "body" in n.attrs.name]
        assert bodies, model.regions
        guarded[fn.__name__] = [size_guard(n) is not None for n in bodies]
    assert guarded == {"appending": [False] * len(guarded["appending"]), "doubling": [True] * len(guarded["doubling"])}
    x = _r(3)
    want = list(x)
    for _ in range(4):
        want.append(np.float32(sum(want, np.float32(0))))
    np.testing.assert_allclose(models["appending"](x, np.array(4, np.int64)), np.array(want, np.float32), rtol=1e-5)


def test_roi_align_huge_boxes_sample_only_inside_the_image(monkeypatch):
    """The adaptive sampling grid follows the box's size: one box of 1e9 from the data made [out, 5e8] arrays
    (gigabytes, then the OOM killer), and max mode made [c, oh, gh, 2, ow, gw, 2] at once (2 GiB for a box of
    400 on 64 channels). Now only the samples that can fall on the image are made; results equal the full
    grid's exactly, and onnxruntime's in avg mode."""
    from dyntvm.ir.ops_index import RoiAlignAttrs
    from dyntvm.runtime import kernels_index as K
    k0, n, dropped = K._window(np.float32(0), np.float32(5e8), 500_000_000, 2, 8)
    assert n < 30 and dropped and k0.tolist() == [0, 0]
    m = _model("RoiAlign", [("x", "float32", ("N", "C", "H", "W")), ("r", "float32", ("R", 4)),
                            ("bi", "int64", ("R",))], output_height=2, output_width=3)
    x = _r(2, 3, 8, 7)
    rois = np.array([[0, 0, 300, 200], [-50, -20, 40, 90], [3, 2, 5, 6]], np.float32)
    bi = np.array([0, 1, 1], np.int64)
    np.testing.assert_allclose(dt.compile(dt.from_onnx(m))(x, rois, bi), _ort(m, x, rois, bi), rtol=1e-4, atol=1e-6)
    cases = []
    for mode in ("avg", "max"):
        for half in (True, False):
            a = RoiAlignAttrs(2, 3, 0, 0.5, mode, half)
            cases.append((a, K.roi_align(a, -np.abs(x), rois, bi)[0]))
    monkeypatch.setattr(K, "_window", lambda start, bin_size, grid, out, size: (np.zeros(out, np.int64), grid, False))
    for a, got in cases:                                        # the full grid: every sample made
        np.testing.assert_array_equal(got, K.roi_align(a, -np.abs(x), rois, bi)[0])
