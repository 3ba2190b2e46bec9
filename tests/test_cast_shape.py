"""`converters.common.cast_shape`: a tensor whose dim is an expression of a var (``min(d1 + d2, W)``) given the dim
``W`` itself. TVM 0.27's FuseTIR (its CanonicalizeBindings) recursed without end on such a match_cast - a segfault
while compiling Mask R-CNN's mask pasting - so the build runs in a child process; results against numpy, and a
run-time mismatch of the dims raises dyntvm's message."""
import json
import subprocess
import sys

CHILD = r"""
import json
import numpy as np
import tvm
from tvm import relax, te, tirx, topi
from dyntvm.codegen.converters.common import DIMS_DIFFER, cast_shape
from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu

n, d1, d2, W = (tirx.Var(s, "int64") for s in ("n", "d1", "d2", "W"))
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType([n, d1], "float32"))
z = relax.Var("z", relax.TensorType([n, d2], "float32"))
y = relax.Var("y", relax.TensorType([n, W], "float32"))
with bb.function("f", [x, z, y]):
    with bb.dataflow():
        c = bb.emit_te(lambda a, b: topi.concatenate((a, b), 1), x, z)
        s = bb.emit_te(lambda c: te.compute((n, tirx.min(d1 + d2, W)), lambda i, j: c[i, j]), c)
        m = cast_shape(bb, s, [n, W])
        gv = bb.emit_output(bb.emit(relax.op.add(m, y)))
    bb.emit_func_output(gv)
vm = relax.VirtualMachine(build_cpu(bb.get()), tvm.cpu())
rng = np.random.default_rng(0)
out = {"match": [], "refused": None}
for rows, a, b, w in [(2, 3, 4, 5), (1, 1, 0, 1), (0, 2, 2, 3), (3, 4, 4, 8)]:
    xs, zs, ys = (rng.standard_normal((rows, k)).astype("float32") for k in (a, b, w))
    got = vm["f"](*(tvm.runtime.tensor(v) for v in (xs, zs, ys))).numpy()
    out["match"].append(bool(np.array_equal(got, np.concatenate([xs, zs], 1)[:, :w] + ys)))
try:       # d1 + d2 = 3 < W = 5: the dims differ
    vm["f"](*(tvm.runtime.tensor(np.ones(s, "float32")) for s in ((2, 1), (2, 2), (2, 5))))
except Exception as e:
    out["refused"] = DIMS_DIFFER in str(e)
print(json.dumps(out))
"""


def test_a_dim_cast_to_a_var_it_is_an_expression_of_builds_and_checks():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"child failed ({done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"match": [True] * 4, "refused": True}, result
