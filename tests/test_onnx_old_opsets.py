"""ONNX ops in the forms of old opsets: the legacy broadcasting of opsets 1-6 (`broadcast=1`, `axis`) checked
against numpy expressions of the spec (neither onnx's reference evaluator nor onnxruntime applies `axis`), and
opset 1's Concat with its default axis."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm.frontend.onnx import OnnxImportError

from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402

RNG = np.random.default_rng(3)

# the ops with broadcast / axis attributes before opset 7, the numpy function of each and its operand dtype
LEGACY_BINARY = {"Add": (np.add, TP.FLOAT), "Sub": (np.subtract, TP.FLOAT), "Mul": (np.multiply, TP.FLOAT),
                 "Div": (np.divide, TP.FLOAT), "Pow": (np.power, TP.FLOAT), "And": (np.logical_and, TP.BOOL),
                 "Or": (np.logical_or, TP.BOOL), "Xor": (np.logical_xor, TP.BOOL), "Equal": (np.equal, TP.INT64),
                 "Greater": (np.greater, TP.FLOAT), "Less": (np.less, TP.FLOAT)}
NP_OF = {TP.FLOAT: np.float32, TP.BOOL: np.bool_, TP.INT64: np.int64}


def binary_model(op, a_shape, b_shape, opset, **attrs):
    elem = LEGACY_BINARY[op][1]
    out = TP.BOOL if op in ("And", "Or", "Xor", "Equal", "Greater", "Less") else elem
    g = h.make_graph([h.make_node(op, ["a", "b"], ["y"], **attrs)], "m",
                     [h.make_tensor_value_info("a", elem, a_shape), h.make_tensor_value_info("b", elem, b_shape)],
                     [h.make_tensor_value_info("y", out, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def operand(elem, shape):
    if elem == TP.BOOL:
        return RNG.random(shape) < 0.5
    if elem == TP.INT64:
        return RNG.integers(0, 3, shape).astype(np.int64)
    return RNG.uniform(0.5, 2.0, shape).astype(np.float32)


def run(m, *xs):
    return dt.run_reference(dt.from_onnx(m), *xs)


@pytest.mark.parametrize("op", sorted(LEGACY_BINARY))
@pytest.mark.parametrize("opset", [1, 6])
def test_legacy_broadcast_aligns_b_at_axis(op, opset):
    """B of shape (3,) at axis 1 of A (2, 3, 3): B[j] meets A[:, j, :]. Was read as numpy's suffix matching
    (B[k] met A[:, :, k]): the same shapes, other values. (And, Pow, Equal... have a version 1 only: it
    holds up to opset 6.)"""
    fn, elem = LEGACY_BINARY[op]
    for _ in range(20):             # operands that tell the two readings apart (comparisons of few values may not)
        a, b = operand(elem, (2, 3, 3)), operand(elem, (3,))
        want = fn(a, b[None, :, None])
        if not np.array_equal(want, fn(a, b)):
            break
    assert not np.array_equal(want, fn(a, b))
    got = run(binary_model(op, [2, 3, 3], [3], opset, broadcast=1, axis=1), a, b)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("a_shape, b_shape, axis, b_view", [
    ((2, 3, 4, 5), (3, 4), 1, (1, 3, 4, 1)),       # the spec's examples
    ((2, 3, 4, 5), (2,), 0, (2, 1, 1, 1)),
    ((2, 3, 4, 5), (4, 5), 2, (4, 5)),
    ((2, 3, 4, 5), (4, 5), None, (4, 5)),           # no axis: suffix matching
    ((2, 3, 4, 5), (), None, ()),                   # a scalar B
    ((2, 3, 4, 5), (1, 1), 3, (1, 1)),              # a one-element B, wherever the axis
])
def test_legacy_broadcast_shapes_of_the_spec(a_shape, b_shape, axis, b_view):
    a, b = operand(TP.FLOAT, a_shape), operand(TP.FLOAT, b_shape)
    attrs = dict(broadcast=1) if axis is None else dict(broadcast=1, axis=axis)
    got = run(binary_model("Mul", list(a_shape), list(b_shape), 6, **attrs), a, b)
    np.testing.assert_allclose(got, a * b.reshape(b_view), rtol=1e-6)


def test_legacy_broadcast_with_a_symbolic_dim():
    a, b = operand(TP.FLOAT, (4, 3, 2)), operand(TP.FLOAT, (3,))
    got = run(binary_model("Add", ["N", 3, 2], [3], 6, broadcast=1, axis=1), a, b)
    np.testing.assert_allclose(got, a + b[None, :, None], rtol=1e-6)


def test_legacy_broadcast_of_a_constant_b():
    b = np.arange(3, dtype=np.float32)
    g = h.make_graph([h.make_node("Constant", [], ["b"], value=h.make_tensor("b", TP.FLOAT, [3], b)),
                      h.make_node("Sub", ["a", "b"], ["y"], broadcast=1, axis=0)], "m",
                     [h.make_tensor_value_info("a", TP.FLOAT, [3, 2])], [h.make_tensor_value_info("y", TP.FLOAT, None)])
    a = operand(TP.FLOAT, (3, 2))
    got = run(h.make_model(g, opset_imports=[h.make_opsetid("", 6)]), a)
    np.testing.assert_allclose(got, a - b[:, None], rtol=1e-6)


@pytest.mark.parametrize("b_shape, attrs, why", [
    ([3], dict(), "without broadcast=1: before opset 7 the shapes must be equal"),
    ([2, 3], dict(broadcast=1, axis=2), r"axis must be in \[0, 1\]"),
    ([3], dict(broadcast=1, axis=-1), r"axis must be in \[0, 2\]"),
])
def test_legacy_broadcast_misuse_is_refused(b_shape, attrs, why):
    with pytest.raises(OnnxImportError, match=why):
        dt.from_onnx(binary_model("Add", [2, 3, 3], b_shape, 6, **attrs))


def test_opset_7_broadcasts_both_ways():
    a, b = operand(TP.FLOAT, (3, 1)), operand(TP.FLOAT, (1, 4))
    np.testing.assert_allclose(run(binary_model("Add", [3, 1], [1, 4], 7), a, b), a + b, rtol=1e-6)


def test_concat_of_opset_1_defaults_to_axis_1():
    """Concat-1's axis is optional (default 1); the converter required it, so a valid opset-1 model was refused
    as malformed."""
    g = h.make_graph([h.make_node("Concat", ["a", "b"], ["y"])], "m",
                     [h.make_tensor_value_info("a", TP.FLOAT, [2, 3]), h.make_tensor_value_info("b", TP.FLOAT, [2, 1])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 4])])
    a, b = operand(TP.FLOAT, (2, 3)), operand(TP.FLOAT, (2, 1))
    got = run(h.make_model(g, opset_imports=[h.make_opsetid("", 1)]), a, b)
    np.testing.assert_array_equal(got, np.concatenate([a, b], axis=1))
