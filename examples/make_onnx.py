"""Write a small ONNX model to try `dt.from_onnx` / `dyntvm run model.onnx` on.

    python -m dyntvm.examples.make_onnx model.onnx

    x[N, 4] -> y = tanh(y @ W) three times (an ONNX Loop) -> the rows of y with a positive sum (Compress)

`N` is a `dim_param`, so it stays symbolic; the output's row count is known only at run time.
"""
from __future__ import annotations

import sys

import numpy as np

OPSET, IR_VERSION = 18, 9              # what every onnxruntime since 1.15 reads


def make_model():
    from onnx import TensorProto, helper, numpy_helper
    W = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    f32 = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["y_in", "W"], ["yW"]),
         helper.make_node("Tanh", ["yW"], ["y_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_in", f32, ["N", 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", f32, ["N", 4])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "true", "x"], ["y"], body=body),
         helper.make_node("ReduceSum", ["y", "axis1"], ["row_sums"], keepdims=0),
         helper.make_node("Greater", ["row_sums", "zero"], ["keep"]),
         helper.make_node("Compress", ["y", "keep"], ["z"], axis=0)],
        "loop_then_compress",
        [helper.make_tensor_value_info("x", f32, ["N", 4])],
        [helper.make_tensor_value_info("z", f32, [None, 4])],
        initializer=[numpy_helper.from_array(W, "W"),
                     numpy_helper.from_array(np.array(3, np.int64), "trips"),
                     numpy_helper.from_array(np.array(True), "true"),
                     numpy_helper.from_array(np.array([1], np.int64), "axis1"),
                     numpy_helper.from_array(np.array(0, np.float32), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def main(argv=None) -> int:
    import onnx
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    model = make_model()
    onnx.checker.check_model(model)
    onnx.save(model, argv[0])
    print(f"wrote {argv[0]}: x[N, 4] -> Loop (3 x tanh(y @ W)) -> Compress (rows with a positive sum)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
