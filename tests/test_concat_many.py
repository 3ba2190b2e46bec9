"""concat / stack of many inputs: joined in a tree of kernels of at most CONCAT_FANIN inputs (one kernel of 90 inputs
took 100 s to lower), with the same results as numpy."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.converters.shape import CONCAT_FANIN


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


@pytest.mark.parametrize("k", [CONCAT_FANIN, CONCAT_FANIN + 1, 3 * CONCAT_FANIN + 2])
def test_concat_of_many_inputs(cache_dir, k):
    def fn(x, y):
        return F.concat([x * float(i) if i % 2 else y + float(i) for i in range(k)], axis=1)
    model = dt.compile(fn, dt.TensorSpec(("B", "N")), dt.TensorSpec(("B", "M")), cache_dir=cache_dir)
    rng = np.random.default_rng(k)
    for b, n, m in [(2, 3, 1), (1, 1, 5), (0, 2, 2), (3, 0, 4)]:
        x = rng.standard_normal((b, n)).astype("float32")
        y = rng.standard_normal((b, m)).astype("float32")
        want = np.concatenate([x * np.float32(i) if i % 2 else y + np.float32(i) for i in range(k)], axis=1)
        np.testing.assert_allclose(model(x, y), want, rtol=1e-6)


def test_stack_of_many_inputs(cache_dir):
    k = 2 * CONCAT_FANIN + 3

    def fn(x):
        return F.stack([x - float(i) for i in range(k)], axis=1)
    model = dt.compile(fn, dt.TensorSpec(("N", 2)), cache_dir=cache_dir)
    for n in (0, 1, 4):
        x = np.arange(2 * n, dtype="float32").reshape(n, 2)
        np.testing.assert_allclose(model(x), np.stack([x - np.float32(i) for i in range(k)], axis=1))
