"""Slices with static bounds on symbolic axes (issue 8, item 6): typed exactly as numpy clamps them
(`x[:2]` has ``min(N, 2)`` rows), so eager, the reference interpreter and compiled code agree at every size,
including sizes below the bounds; and everything downstream of such a dim (broadcasting, concat, stack,
matmul, reshape, flatten, control flow, dim attrs) works with it."""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.shapes import slice_length
from helpers import assert_same

X = dt.TensorSpec(("N", 4))


def slices(x):
    head, tail = x[:2], x[-3:]
    return {
        "head": head * 2.0,
        "tail": tail + 1.0,
        "middle": x[1:3] - 1.0,
        "cond": F.cond(F.greater(F.sum(x), 0.0), lambda: head * 2.0, lambda: head - 1.0),
        "flatten": F.flatten(head),
        "empty_flatten": F.flatten(x[:, 1:1] * 2.0),      # a 0 in a Relax reshape target copied N (fuzzer)
        "flatten_in_cond": F.cond(F.greater(F.sum(x), 0.0), lambda: F.flatten(tail), lambda: F.flatten(tail) * 2.0),
        "steps": (x[::2] * 1.0, x[::-1] + 0.0, x[3:0:-1] + 0.0, x[1::-1] + 0.0, x[-1::-2] + 0.0),
        "split": F.split(x, [1, 3], axis=0),
        "concat": F.concat([head, tail], axis=0),
        "broadcast": head + x[-2:],
        "first_row": x - x[:1],                  # min(N, 1) rows broadcast against N: N
        "second_row": x[1:2] + x,                # 0 or 1 rows against N: (N * max((min(N, 2) - 1), 0))
        "stack": F.stack([head, x[-2:] * 2.0]),
        "matmul": F.matmul(head, F.transpose(tail)),
        "reshape": F.reshape(head, (-1, 2)),
        "foreach": F.foreach(lambda r, s: (r * 2.0, [s[0] + r]), head, [F.zeros((4,))]),
        "dim_attr": F.broadcast_to(F.sum(head, axis=1, keepdims=True), (head.shape[0], 4)),
    }


def test_static_bounds_on_a_symbolic_axis_are_typed_exactly():
    g = dt.trace(lambda x: (x[:2], x[-3:], x[1:3], x[::2], x[1::-1], x - x[-1:], x[1:2] * x), X)
    assert [str(v.type) for v in g.outputs] == [
        "float32[min(N, 2),4]", "float32[min(N, 3),4]", "float32[max((min(N, 3) - 1), 0),4]",
        "float32[((N + 1) // 2),4]", "float32[min(N, 2),4]", "float32[N,4]",
        "float32[(N * max((min(N, 2) - 1), 0)),4]"]
    assert slice_length(5, None, 2, 1) == 2 and slice_length("N", 3, 1, 1) == 0


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    graph = dt.trace(slices, X)
    return graph, dt.compile(graph, cache_dir=str(tmp_path_factory.mktemp("dyntvm-cache")))


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_eager_reference_and_compiled_agree_below_and_above_the_bounds(traced, n):
    graph, model = traced
    x = (np.arange(n * 4, dtype=np.float32).reshape(n, 4) - 3.0) / 2.0
    want = slices(x)
    assert want["head"].shape == (min(n, 2), 4)
    assert_same(dt.run_reference(graph, x), want, what=f"reference at N={n}")
    assert_same(model(x), want, what=f"compiled at N={n}")


@pytest.mark.parametrize("fn", [lambda x: F.squeeze(x[:, -1:], 1) * 1.0, lambda x: F.squeeze(x[:, 1:2], 1) * 1.0,
                                lambda x: F.reshape(x[:, -1:], (x.shape[0],)) * 1.0],
                         ids=["squeeze_last", "squeeze_middle", "reshape"])
def test_reshape_of_a_symbolic_slice_then_elementwise(fn):
    """Found by the hostile-review fixes: a reshape Relax cannot prove (here of a [N, min(M, 1)] slice) was
    checked with a match_cast, and fused with a following elementwise op it crashed TVM's fusion passes with a
    segfault. Now a run-time checked copy (`te_kernels.same_size_primfunc`): results as numpy, same errors."""
    model = dt.compile(fn, dt.TensorSpec(("N", "M")), use_cache=False)
    for shape in ((3, 2), (1, 5), (0, 3), (2, 7)):
        x = np.random.default_rng(0).random(shape).astype(np.float32)
        np.testing.assert_array_equal(model(x), fn(x))
    with pytest.raises(dt.ExecutionError):
        model(np.ones((3, 0), np.float32))
    with pytest.raises(dt.DyntvmError):        # eager: a TraceError from the type rule on the concrete shapes
        fn(np.ones((3, 0), np.float32))
