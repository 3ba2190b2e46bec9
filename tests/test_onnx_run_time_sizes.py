"""Resize and Pad whose sizes / pads are computed from the input at run time, as torchvision's detectors do it
(the image resized by a float scale of its shape, then padded up to a multiple of 32): imported, compiled once
and equal to onnxruntime at several sizes; and the partitioner binding the symbols of an `arange` whose bounds are
different expressions of run-time sizes."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm.frontend.onnx_ops import OnnxImportError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _scaled_sizes(prefix: str, source: str, scale: float) -> list:
    """Nodes computing `sizes` = floor(shape(source)[1:] * scale) as int64, through floats (the exporters' chain)."""
    return [
        helper.make_node("Shape", [source], [f"{prefix}shape"]),
        _const(f"{prefix}lo", np.array([1], np.int64)), _const(f"{prefix}hi", np.array([3], np.int64)),
        helper.make_node("Slice", [f"{prefix}shape", f"{prefix}lo", f"{prefix}hi"], [f"{prefix}hw"]),
        helper.make_node("Cast", [f"{prefix}hw"], [f"{prefix}hwf"], to=TensorProto.FLOAT),
        _const(f"{prefix}scale", np.array(scale, np.float32)),
        helper.make_node("Mul", [f"{prefix}hwf", f"{prefix}scale"], [f"{prefix}scaled"]),
        helper.make_node("Floor", [f"{prefix}scaled"], [f"{prefix}floor"]),
        helper.make_node("Cast", [f"{prefix}floor"], [f"{prefix}sizes"], to=TensorProto.INT64),
    ]


def _model(nodes, out_rank=3):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["C", "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * out_rank)
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    return m


def _resize_model(mode: str):
    nodes = _scaled_sizes("s_", "x", 1.37) + [
        _const("zero", np.array([0], np.int64)),
        helper.make_node("Unsqueeze", ["x", "zero"], ["x4"]),
        helper.make_node("Shape", ["x4"], ["x4shape"]),
        _const("two", np.array([2], np.int64)),
        helper.make_node("Slice", ["x4shape", "zero", "two"], ["nc"]),
        helper.make_node("Concat", ["nc", "s_sizes"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x4", "", "", "sizes"], ["r"], mode=mode,
                         coordinate_transformation_mode="half_pixel"),
        helper.make_node("Squeeze", ["r", "zero"], ["y"]),
    ]
    return _model(nodes)


def _pad_model(value: float):
    # pads every spatial axis up to the next multiple of 8 (after only), as torchvision's batch_images does
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shapef"], to=TensorProto.FLOAT),
        _const("eight", np.array(8.0, np.float32)),
        helper.make_node("Div", ["shapef", "eight"], ["q"]),
        helper.make_node("Ceil", ["q"], ["qc"]),
        helper.make_node("Mul", ["qc", "eight"], ["up"]),
        helper.make_node("Sub", ["up", "shapef"], ["extra"]),
        helper.make_node("Cast", ["extra"], ["after"], to=TensorProto.INT64),
        _const("spatial", np.array([0, 1, 1], np.int64)),           # no padding on C: 0 * extra
        helper.make_node("Mul", ["after", "spatial"], ["after_hw"]),
        _const("before", np.array([0, 1, 0], np.int64)),
        helper.make_node("Concat", ["before", "after_hw"], ["pads"], axis=0),
        _const("value", np.array(value, np.float32)),
        helper.make_node("Pad", ["x", "pads", "value"], ["y"], mode="constant"),
    ]
    return _model(nodes)


SIZES = [(2, 5, 7), (1, 1, 1), (3, 16, 9), (2, 8, 8)]


@pytest.mark.parametrize("make", [lambda: _resize_model("linear"), lambda: _resize_model("cubic"),
                                  lambda: _pad_model(0.0), lambda: _pad_model(-2.5)],
                         ids=["resize-linear", "resize-cubic", "pad-0", "pad-value"])
def test_run_time_sizes_match_onnxruntime(make):
    model = make()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = dt.compile(dt.from_onnx(model), use_cache=False)
    rng = np.random.default_rng(0)
    for shape in SIZES:
        x = rng.standard_normal(shape).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        got = np.asarray(compiled(x))
        assert got.shape == want.shape, (shape, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(shape))


def test_run_time_resize_nearest_is_a_clear_error():
    with pytest.raises(OnnxImportError, match="with mode nearest the sizes must be known when the model is imported"):
        dt.from_onnx(_resize_model("nearest"))


def test_run_time_pad_rejects_other_modes():
    m = _pad_model(0.0)
    for n in m.graph.node:
        if n.op_type == "Pad":
            n.attribute[0].s = b"reflect"
    with pytest.raises(OnnxImportError, match="reflect.*computed at run time"):
        dt.from_onnx(m)


def test_region_binds_every_symbol_of_an_arange_between_two_expressions():
    """arange(15 * X, 30 * X) alone in a region, with a value of dim 15 * X at hand: the whole expression binds
    15 * X, but 30 * X still needs X's symbols (before: a GraphError from the region's lint)."""
    from dyntvm import F
    from dyntvm.partition.partitioner import _symbol_carriers

    def fn(x):
        n = x.shape[0]
        wide = F.concat([x] * 15, axis=0)                     # dim 15 * N
        return wide, F.arange(15 * n, 30 * n)

    g = dt.trace(fn, dt.TensorSpec(("N",)))
    producer = {v: i for i, n in enumerate(g.nodes) for v in n.outputs}
    arange = next(i for i, n in enumerate(g.nodes) if n.op == "arange")
    carriers = _symbol_carriers(g, [arange], producer)
    assert any("N" in v.type.shape for v in carriers), carriers
    assert not _symbol_carriers(g, [arange], producer, unbound=True)
    compiled = dt.compile(g, use_cache=False)
    for n in (1, 3, 8):
        wide, r = compiled(np.arange(n, dtype=np.float32))
        np.testing.assert_array_equal(np.asarray(r), np.arange(15 * n, 30 * n))
        assert np.asarray(wide).shape == (15 * n,)
