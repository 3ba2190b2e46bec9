"""The elementwise epilogue of a flattened matmul (issue 24): ``[..., M, K] @ [K, N]`` runs as one 2-D GEMM,
and the bias / activation / scale after it run on the 2-D result (`converters.sink_flat`), so that FuseOps puts
them into the matmul's kernel (the reshape back is injective: FuseOps stopped at it, and the transformer's FF
bias + GELU was a kernel of its own). Results against independent numpy expressions at symbolic, odd, 1 and 0
sizes; the transformer example's kernel count."""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples

pytest.importorskip("tvm")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import profile_kernels as pk  # noqa: E402

RNG = np.random.default_rng(24)
K, N = 37, 53
W = (RNG.standard_normal((K, N)) / np.sqrt(K)).astype("float32")
W2 = (RNG.standard_normal((N, K)) / np.sqrt(N)).astype("float32")
BIAS = RNG.standard_normal(N).astype("float32")
BIAS2 = RNG.standard_normal(K).astype("float32")
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(v):
    v = v.astype(np.float64)
    return 0.5 * v * (1 + _erf(v / math.sqrt(2)))


def ff(x, r):
    """bias + GELU + second matmul + bias + scale, a residual, and the first projection as a second output."""
    h = F.matmul(x, W) + BIAS
    y = (F.matmul(F.gelu(h), W2) + BIAS2) * 0.5
    return F.relu(y + r), h


def ff_numpy(x, r):
    h = x.astype(np.float64) @ W + BIAS
    y = (_gelu(h) @ W2 + BIAS2) * 0.5
    return np.maximum(y + r, 0), h


@pytest.fixture(scope="module")
def compiled():
    return dt.compile(ff, dt.TensorSpec(("B", "S", K)), dt.TensorSpec(("B", "S", K)), use_cache=False)


@pytest.mark.parametrize("b, s", [(1, 1), (2, 7), (1, 128), (3, 33), (2, 0), (0, 5)])
def test_flattened_matmul_epilogue_matches_numpy(compiled, b, s):
    x, r = RNG.standard_normal((b, s, K)).astype("float32"), RNG.standard_normal((b, s, K)).astype("float32")
    got = compiled(x, r)
    for g, w in zip(got, ff_numpy(x, r)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_epilogue_with_a_full_operand_or_4d_input():
    """Operands that do not broadcast along the last axis alone (a [B, S, N] tensor, a [S, 1] column) keep the
    3-D op; a 4-d input flattens three leading dims."""
    col = RNG.standard_normal((5, 1)).astype("float32")

    def fn(x, y, z):
        m = F.matmul(x, W)
        return m * y + col, F.tanh(F.matmul(z, W) - BIAS)
    m = dt.compile(fn, dt.TensorSpec(("B", 5, K)), dt.TensorSpec(("B", 5, N)), dt.TensorSpec(("A", 2, "C", K)),
                   use_cache=False)
    for b, a, c in [(1, 1, 1), (3, 2, 9), (0, 1, 0)]:
        x, y = RNG.standard_normal((b, 5, K)).astype("float32"), RNG.standard_normal((b, 5, N)).astype("float32")
        z = RNG.standard_normal((a, 2, c, K)).astype("float32")
        got = m(x, y, z)
        np.testing.assert_allclose(got[0], (x.astype(np.float64) @ W) * y + col, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got[1], np.tanh(z.astype(np.float64) @ W - BIAS), rtol=1e-4, atol=1e-4)


def test_transformer_ff_bias_gelu_in_the_matmul_kernel():
    """The transformer example: every projection's bias (and the FF's GELU) is in its matmul's kernel, and no
    reshape between them is a copy kernel: 18 kernel calls per model call (22 before)."""
    tf = examples.get("transformer")
    with pk.Observed() as observed:
        m = dt.compile(tf.fn, *tf.specs, use_cache=False)
    x, mask = tf.make_inputs(np.random.default_rng(0), B=2, S=9)
    want = m(x, mask)
    stats = pk.profile_model(m, (x, mask), observed, rounds=1)
    np.testing.assert_allclose(m(x, mask), want, rtol=1e-6)
    names = sorted(stats)
    assert any("matmul" in n and "gelu" in n for n in names), names
    assert not any(n.startswith(("dt_gelu", "reshape", "add4", "add5")) for n in names), names
    assert sum(s.calls for s in stats.values()) <= 18, names
