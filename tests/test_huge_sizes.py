"""Static sizes no machine can hold are refused where the shape is made, with a dyntvm error naming the op, the
shape and the limit, before anything is allocated.

`ConstantOfShape([2**40])` (a 181-byte ONNX file) or `F.zeros((2**40,))` used to drive `dt.compile` to 11 GB
(constant folding materialized the fill) and SIGABRT; a 2**62 dim gave a raw ValueError at compile, a 2**40
ONNX `Range` a raw MemoryError. Each case runs `dt.compile` (or `dt.from_onnx`) in a subprocess whose address
space is capped (RLIMIT_AS), so the old behaviour fails there instead of eating the machine.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.runtime import fold

ADDRESS_SPACE = 6 * 2 ** 30     # TVM and LLVM reserve a few GB of address space; the 4 TiB fills need far more

# name -> code run in the child (dt, F, np, onnx, helper imported); it must raise
CASES = {
    "zeros": "dt.compile(lambda x: x + F.zeros((2**40,)), dt.TensorSpec(('N',)))",
    "full": "dt.compile(lambda x: x + F.full((2**40,), 2.0), dt.TensorSpec(('N',)))",
    "ones_2d": "dt.compile(lambda x: x + F.ones((2**20, 2**20)), dt.TensorSpec(('N', 1)))",
    "arange": "dt.compile(lambda x: x + F.arange(0, 2**40), dt.TensorSpec(('N',)))",
    "spec_dim_2_62": "dt.compile(lambda x: x * 2.0, dt.TensorSpec((2**62,)))",
    "spec_symbolic_and_2_62": "dt.compile(lambda x: x * 2.0, dt.TensorSpec(('N', 2**62)))",
    "spec_dim_over_int64": "dt.compile(lambda x: x * 2.0, dt.TensorSpec((2**63,)))",
    "onnx_constant_of_shape": """
        shape = helper.make_tensor("shape", onnx.TensorProto.INT64, [1], [2**40])
        node = helper.make_node("ConstantOfShape", ["shape"], ["y"])
        out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2**40])
        model = helper.make_model(helper.make_graph([node], "g", [], [out], [shape]))
        dt.compile(dt.from_onnx(model))""",
    "onnx_range": """
        consts = [helper.make_tensor(n, onnx.TensorProto.INT64, [], [v]) for n, v in
                  (("start", 0), ("limit", 2**40), ("delta", 1))]
        node = helper.make_node("Range", ["start", "limit", "delta"], ["y"])
        out = helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [None])
        model = helper.make_model(helper.make_graph([node], "g", [], [out], consts))
        dt.compile(dt.from_onnx(model))""",
    "onnx_expand": """
        shape = helper.make_tensor("shape", onnx.TensorProto.INT64, [2], [2**20, 2**20])
        node = helper.make_node("Expand", ["x", "shape"], ["y"])
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
        out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, None])
        model = helper.make_model(helper.make_graph([node], "g", [x], [out], [shape]))
        dt.compile(dt.from_onnx(model))""",
    # a size known only at run time (2**40 elements from a data value): an ExecutionError when it runs
    "run_time_arange": """
        m = dt.compile(lambda n: F.arange(np.int64(0), n, np.int64(1)), dt.TensorSpec((), "int64"))
        assert list(m(np.int64(3))) == [0, 1, 2]
        m(np.int64(2**40))""",
}

EXPECTED = {      # the error class, and what the message must say
    "zeros": ("TraceError", "zeros: a tensor of shape (1099511627776,) and dtype float32 needs 4.0 TiB"),
    "full": ("TraceError", "full: a tensor of shape (1099511627776,) and dtype float32 needs 4.0 TiB"),
    "ones_2d": ("TraceError", "ones: a tensor of shape (1048576, 1048576) and dtype float32 needs 4.0 TiB"),
    "arange": ("TraceError", "arange: a tensor of shape (1099511627776,) and dtype int64 needs 8.0 TiB"),
    "spec_dim_2_62": ("TraceError", "TensorSpec: a tensor of shape (4611686018427387904,) and dtype float32"),
    "spec_symbolic_and_2_62": ("TraceError", "needs at least (with its symbolic dims 1)"),
    "spec_dim_over_int64": ("TraceError", "a dim must fit int64 (at most 2**63 - 1), got 9223372036854775808"),
    "onnx_constant_of_shape": ("OnnxImportError", "(ConstantOfShape): ConstantOfShape: a tensor of shape "
                               "(1099511627776,) and dtype float32 needs 4.0 TiB"),
    "onnx_range": ("OnnxImportError", "(Range): Range: a tensor of shape (1099511627776,) and dtype int64 needs"),
    "onnx_expand": ("OnnxImportError", "(Expand): expand: a tensor of shape (1048576, 1048576)"),
    "run_time_arange": ("ExecutionError", "failed: the arange length [1099511627776]: a tensor of shape "
                        "(1099511627776,) and dtype int64 needs 8.0 TiB"),
}

CHILD = """
import json, sys, textwrap
import numpy as np, onnx
from onnx import helper
import dyntvm as dt
from dyntvm import F
results = {}
for name, code in json.loads(sys.argv[1]).items():
    try:
        exec(textwrap.dedent(code))
        results[name] = ["no error", ""]
    except BaseException as e:  # noqa: BLE001 - what escapes is the finding
        results[name] = [type(e).__name__, str(e)]
print(json.dumps(results))
"""


def _cap_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.fixture(scope="module")
def child_results():
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], capture_output=True, text=True,
                          timeout=600, env=env, preexec_fn=_cap_address_space)
    assert proc.returncode == 0, f"the capped child died (rc {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_huge_static_size_is_refused(child_results, name):
    cls, message = child_results[name]
    want_cls, want = EXPECTED[name]
    assert cls == want_cls, f"{name}: {cls}: {message}"
    assert want in message
    if "needs" in want:
        assert "more than this machine's memory" in message


def test_limit_is_this_machines_memory():
    import psutil
    from dyntvm.ir.types import memory_limit
    assert memory_limit() == psutil.virtual_memory().total


def test_eager_mode_refuses_too():
    with pytest.raises(dt.TraceError, match=r"zeros: a tensor of shape \(1099511627776,\)"):
        F.zeros((2 ** 40,))


def test_large_fills_stay_unfolded(monkeypatch):
    """A fill within memory but over the fold limit stays a region that runs per call (folding would hold it
    all now and write it into the artifact)."""
    monkeypatch.setattr(fold, "FOLD_LIMIT", 4000)
    m = dt.compile(lambda x: (x * 2.0, F.ones((2000,))), dt.TensorSpec((3,)))
    assert [n.op for n in m.graph.nodes if n.op in ("constant", "region")] == ["region", "region"]
    np.testing.assert_array_equal(m(np.zeros(3, np.float32))[1], np.ones(2000, np.float32))
    small = dt.compile(lambda x: (x * 2.0, F.ones((100,))), dt.TensorSpec((3,)))
    assert sorted(n.op for n in small.graph.nodes if n.op in ("constant", "region")) == ["constant", "region"]
