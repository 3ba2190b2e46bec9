"""A buffer sliced to the sequence length, then broadcast against the sequence (BERT's position ids and token
types: ``buffer[:, :seq].expand(batch, seq)``, ``embeddings + positions``): the slice has ``min(seq, 64)``
entries, which broadcasts with ``seq`` in every run that broadcasts at all, so the importer keeps ``seq`` and
checks at run time. Compared with onnxruntime at several sizes (0 and 1 included); a sequence longer than the
buffer is an ExecutionError naming the dims, as it is an error in onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyntvm as dt

ort = pytest.importorskip("onnxruntime")

LIMIT = 64


def _model(path):
    buffer = numpy_helper.from_array(np.arange(LIMIT, dtype=np.float32)[None, :] * 0.5, "buffer")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              [("one", [1]), ("zero", [0]), ("axis1", [1])]]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Slice", ["buffer", "zero", "seq", "axis1"], ["sliced"]),        # [1, min(seq, 64)]
        helper.make_node("Expand", ["sliced", "shape"], ["expanded"]),                    # [batch, seq]
        helper.make_node("Add", ["x", "sliced"], ["added"]),                              # broadcast add
        helper.make_node("Mul", ["added", "expanded"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "sliced_buffer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])],
                              initializer=[buffer, *consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def test_buffer_sliced_to_the_sequence_broadcasts_as_in_onnxruntime(tmp_path):
    path = _model(str(tmp_path / "sliced.onnx"))
    compiled = dt.compile(dt.from_onnx(path), cache_dir=str(tmp_path / "cache"), use_cache=False)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch, seq in [(1, 1), (3, 5), (2, 0), (1, LIMIT), (4, 17)]:
        x = rng.standard_normal((batch, seq)).astype(np.float32)
        (want,) = session.run(None, {"x": x})
        got = np.asarray(compiled(x))
        assert got.shape == want.shape == (batch, seq)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    x = np.ones((2, LIMIT + 3), np.float32)
    with pytest.raises(Exception):
        session.run(None, {"x": x})
    with pytest.raises(dt.ExecutionError, match="must be equal"):
        compiled(x)


def test_only_a_dim_that_is_0_and_1_with_its_symbol_is_kept_as_the_symbol():
    from dyntvm.ir.dim_checks import recording_checks
    from dyntvm.ir.shapes import broadcast_dims
    from dyntvm.ir.types import ShapeError
    with recording_checks() as checks:
        assert broadcast_dims("min(T, 64)", "T") == "T" and broadcast_dims("T", "min(T, 3)") == "T"
    assert [(c.kept, c.what) for c in checks] == [("T", "broadcast"), ("T", "broadcast")]
    for other in ("T - 1", "T // 2", "min(T, M)", "2 * T"):     # not 0 and 1 where T is: refused as before
        with recording_checks(), pytest.raises(ShapeError, match="differ|not known to be equal"):
            broadcast_dims(other, "T")
    with pytest.raises(ShapeError, match="not known to be equal"):          # outside tracing: refused
        broadcast_dims("min(T, 64)", "T")
