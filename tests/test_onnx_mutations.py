"""The ONNX importer against corrupt and deeply nested models: random byte mutations and random field mutations
of small valid models (fixed seeds), and If / Loop / Scan nested deeper than the importer supports. Each import
must end in a graph or a dyntvm error (OnnxImportError, InputError, TraceError, UnsupportedOpError), never a
raw Python exception (TypeError, KeyError, RecursionError...)."""
import collections
import warnings

import numpy as np
import pytest

import dyntvm as dt
from dyntvm.frontend.onnx import OnnxImportError
from dyntvm.frontend.onnx_load import MAX_SUBGRAPH_DEPTH

from google.protobuf.descriptor import FieldDescriptor as FD  # noqa: E402
from onnx import AttributeProto as AP  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402


def vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits: dict):
    g = h.make_graph(nodes, "m", inputs, outputs,
                     initializer=[nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def mlp():
    return model([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
                  h.make_node("Relu", ["a"], ["r"]), h.make_node("Reshape", ["r", "shape"], ["y"]),
                  h.make_node("Softmax", ["y"], ["z"], axis=1)],
                 [vi("x", TP.FLOAT, ["N", 4])], [vi("z", TP.FLOAT, ["N", 3])],
                 {"w": np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32),
                  "shape": np.array([-1, 3])})


def control_flow():
    then = h.make_graph([h.make_node("Neg", ["x"], ["t"])], "then", [], [vi("t", TP.FLOAT, [2])])
    other = h.make_graph([h.make_node("Abs", ["x"], ["e"])], "else", [], [vi("e", TP.FLOAT, [2])])
    body = h.make_graph([h.make_node("Identity", ["c"], ["co"]), h.make_node("Add", ["v", "one"], ["vo"]),
                         h.make_node("Mul", ["vo", "vo"], ["so"])], "body",
                        [vi("i", TP.INT64, []), vi("c", TP.BOOL, []), vi("v", TP.FLOAT, [2])],
                        [vi("co", TP.BOOL, []), vi("vo", TP.FLOAT, [2]), vi("so", TP.FLOAT, [2])])
    return model([h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["p"]),
                  h.make_node("If", ["p"], ["yi"], then_branch=then, else_branch=other),
                  h.make_node("Loop", ["n", "", "yi"], ["yl", "scan"], body=body)],
                 [vi("x", TP.FLOAT, [2])], [vi("yl", TP.FLOAT, [2]), vi("scan", TP.FLOAT, [3, 2])],
                 {"one": np.float32(1), "zero": np.float32(0), "n": np.int64(3)})


def shape_chain():
    return model([h.make_node("Shape", ["x"], ["sh"]), h.make_node("Gather", ["sh", "i0"], ["d0"], axis=0),
                  h.make_node("Unsqueeze", ["d0", "ax"], ["d0u"]),
                  h.make_node("Concat", ["d0u", "m1"], ["tgt"], axis=0),
                  h.make_node("Reshape", ["x", "tgt"], ["r"]), h.make_node("Slice", ["r", "st", "en", "ax1"], ["sl"]),
                  h.make_node("Cast", ["sl"], ["c"], to=TP.DOUBLE), h.make_node("Concat", ["c", "c"], ["y"], axis=1),
                  h.make_node("Transpose", ["y"], ["yt"], perm=[1, 0])],
                 [vi("x", TP.FLOAT, ["B", 2, 3])], [vi("yt", TP.DOUBLE, [8, "B"])],
                 {"i0": np.int64(0), "ax": np.array([0]), "m1": np.array([-1]), "st": np.array([1]),
                  "en": np.array([5]), "ax1": np.array([1])})


MODELS = [mlp, control_flow, shape_chain]


def test_the_models_to_mutate_import():
    for make in MODELS:
        dt.from_onnx(make())


def outcome(m) -> str:
    """'ok' or the dyntvm error's class name; any other exception propagates (fails the test)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dt.from_onnx(m)
        return "ok"
    except dt.DyntvmError as e:
        return type(e).__name__


def test_byte_mutations_end_in_a_graph_or_a_dyntvm_error(tmp_path):
    """1-3 random bytes of the serialized model overwritten, read from a file. Gave raw TypeErrors (names that
    are not UTF-8 come back from protobuf as bytes) and KeyErrors (unknown element types)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "m.onnx"
    seen = collections.Counter()
    for k in range(240):
        data = bytearray(MODELS[k % len(MODELS)]().SerializeToString())
        for _ in range(rng.integers(1, 4)):
            data[rng.integers(len(data))] = rng.integers(256)
        path.write_bytes(bytes(data))
        seen[outcome(path)] += 1
    assert seen["ok"] and seen["OnnxImportError"], seen       # the mutations reach the importer's checks


def _slots(msg, out: list) -> list:
    """(message, field, index) of every scalar value of `msg` and its submessages; index "del" for a repeated
    field (an element is dropped), None for a singular one."""
    for field, value in msg.ListFields():
        repeated = field.label == FD.LABEL_REPEATED if not hasattr(field, "is_repeated") else field.is_repeated
        if field.type == FD.TYPE_MESSAGE:
            for v in (value if repeated else [value]):
                _slots(v, out)
        elif not repeated:
            out.append((msg, field, None))
        else:
            out.extend((msg, field, i) for i in range(len(value)))
        if repeated:
            out.append((msg, field, "del"))
    return out


def _field_mutation(m, rng) -> None:
    msg, field, index = (s := _slots(m, []))[rng.integers(len(s))]
    values = getattr(msg, field.name)
    if index == "del":
        del values[rng.integers(len(values))]
        return
    kind = field.type
    if kind == FD.TYPE_STRING:
        v = str(rng.choice(["", "x", "c", "w", "one", "n", "Add", "If", "zz", "axis", "to"]))
    elif kind == FD.TYPE_BYTES:
        v = rng.integers(0, 256, rng.integers(0, 12)).astype(np.uint8).tobytes()
    elif kind in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        v = float(rng.choice([np.nan, np.inf, -1.0, 0.0, 1e30, 0.5]))
    elif kind == FD.TYPE_ENUM:
        v = int(rng.integers(0, 30))
    else:
        v = int(rng.choice([-1, 0, 1, 2, 3, 7, 100, 2 ** 31 - 1, -2 ** 62, 2 ** 40, int(rng.integers(-3, 12))]))
        v = abs(v) if kind in (FD.TYPE_UINT32, FD.TYPE_UINT64) else min(v, 2 ** 31 - 1) if kind == FD.TYPE_INT32 else v
    try:
        if index is None:
            setattr(msg, field.name, v)
        else:
            values[index] = v
    except (ValueError, TypeError):         # a value the field cannot hold (an enum it lacks, say): unchanged
        pass


def test_field_mutations_end_in_a_graph_or_a_dyntvm_error():
    """One or two fields of the model (any depth: names, dims, dtypes, attributes, tensors' data) set to odd
    values, or an element of a repeated field dropped."""
    rng = np.random.default_rng(1)
    seen = collections.Counter()
    for k in range(200):
        m = MODELS[k % len(MODELS)]()
        for _ in range(rng.integers(1, 3)):
            _field_mutation(m, rng)
        seen[outcome(m)] += 1
    assert seen["ok"] and seen["OnnxImportError"], seen


def test_a_name_that_is_not_utf8_is_refused():
    m = mlp()
    data = m.SerializeToString().replace(b"MatMul", b"M\xfftMul")
    with pytest.raises(OnnxImportError, match=r"'op_type' holds b'M\\xfftMul', which is not UTF-8"):
        dt.from_onnx(type(m).FromString(data))


@pytest.mark.parametrize("where", ["input", "initializer", "cast"])
def test_unknown_element_types_are_refused_by_name(where):
    """An input's or initializer's element type ONNX does not define was a KeyError."""
    m = mlp()
    if where == "input":
        m.graph.input[0].type.tensor_type.elem_type = 99
    elif where == "initializer":
        m.graph.initializer[0].data_type = 99
    else:
        m.graph.node.append(h.make_node("Cast", ["z"], ["zc"], to=99))
    with pytest.raises(OnnxImportError, match="element type 99"):
        dt.from_onnx(m)


def test_malformed_initializers_are_refused_by_name():
    m = mlp()
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:12]     # 3 float32s for 4 x 3 dims
    with pytest.raises(OnnxImportError, match=r"initializer 'w' is malformed: its data does not decode as \[4, 3\]"):
        dt.from_onnx(m)
    m = mlp()
    m.graph.initializer[1].dims[0] = -3
    with pytest.raises(OnnxImportError, match=r"initializer 'b' has negative dims \[-3\]"):
        dt.from_onnx(m)


# ------------------------------------------------------------------------------------------ nesting
def nested(kind: str, depth: int):
    """x -> Neg(x) through `depth` nested Ifs (on input c, else branch: x) or Loops (run while c, negating
    nothing else). Built in place from the outside in: protobuf's parser and onnx.helper stop near 32 levels,
    a model made in memory does not."""
    m = h.make_model(h.make_graph([], "m", [vi("x", TP.FLOAT, [2]), vi("c", TP.BOOL, [])], [vi("r0", TP.FLOAT, [2])]),
                     opset_imports=[h.make_opsetid("", 17)])
    g = m.graph
    for d in range(depth):
        if kind == "If":
            node = g.node.add(op_type="If", input=["c"], output=[f"r{d}"])
            other = node.attribute.add(name="else_branch", type=AP.GRAPH)
            other.g.CopyFrom(h.make_graph([h.make_node("Identity", ["x"], [f"e{d}"])], "e", [],
                                          [vi(f"e{d}", TP.FLOAT, [2])]))
            g = node.attribute.add(name="then_branch", type=AP.GRAPH).g
        else:
            node = g.node.add(op_type="Loop", input=["", "c", "x"], output=[f"r{d}"])
            g = node.attribute.add(name="body", type=AP.GRAPH).g
            g.input.extend([vi(f"i{d}", TP.INT64, []), vi(f"c{d}", TP.BOOL, []), vi(f"x{d}", TP.FLOAT, [2])])
            g.node.append(h.make_node("Not", [f"c{d}"], [f"c{d}o"]))
            g.output.append(vi(f"c{d}o", TP.BOOL, []))
        g.name = f"level{d + 1}"
        g.output.append(vi(f"r{d + 1}", TP.FLOAT, [2]))
    g.node.append(h.make_node("Neg", ["x"], [f"r{depth}"]))
    return m


@pytest.mark.parametrize("kind", ["If", "Loop"])
def test_subgraphs_nested_too_deep_are_refused_before_python_recursion_fails(kind):
    """Nested 100 deep was a RecursionError; up to MAX_SUBGRAPH_DEPTH imports and runs."""
    g = dt.from_onnx(nested(kind, MAX_SUBGRAPH_DEPTH))
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(dt.run_reference(g, x, np.array(True)), -x)
    for depth in (MAX_SUBGRAPH_DEPTH + 1, 100, 400):
        with pytest.raises(OnnxImportError, match=f"nests a subgraph {MAX_SUBGRAPH_DEPTH + 1} levels deep; at most "
                                                  f"{MAX_SUBGRAPH_DEPTH}"):
            dt.from_onnx(nested(kind, depth))


def test_subgraphs_nested_too_deep_in_a_function_are_refused():
    """The model's functions are walked too (onnx's recursive walk over the model's tensors reaches them)."""
    m = mlp()
    f = m.functions.add(name="deep", domain="local")
    f.opset_import.append(h.make_opsetid("", 17))
    g = f
    for d in range(1000):
        node = g.node.add(op_type="If", input=["c"], output=[f"r{d}"])
        g = node.attribute.add(name="then_branch", type=AP.GRAPH).g
    with pytest.raises(OnnxImportError, match=f"nests a subgraph {MAX_SUBGRAPH_DEPTH + 1} levels deep"):
        dt.from_onnx(m)
