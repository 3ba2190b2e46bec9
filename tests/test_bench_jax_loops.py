"""benchmarks/bench_jax_loops.py: its `nested` program (a cond in a foreach in a while_loop) compiled equals a
plain Python loop over numpy rows, at several sizes; with JAX installed, each JAX version equals dyntvm's eager
result (the benchmark's timings mean nothing if the two programs differ)."""
import os
import sys

import numpy as np
import pytest

import dyntvm as dt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_jax_loops as bjl  # noqa: E402


def _plain(x, n):
    for _ in range(n):
        x = np.stack([np.tanh(r @ bjl._W) if r.sum() > 0 else r * 0.5 for r in x]) if len(x) else x
    return x


def test_nested_program_compiled_equals_a_plain_loop():
    model = dt.compile(bjl.nested, dt.TensorSpec(("N", bjl.D)), dt.TensorSpec((), "int64"))
    rng = np.random.default_rng(1)
    for rows, steps in ((16, 6), (1, 3), (0, 2), (5, 0), (7, 1)):
        x = rng.standard_normal((rows, bjl.D)).astype(np.float32)
        np.testing.assert_allclose(model(x, np.int64(steps)), _plain(x, steps), rtol=1e-5, atol=1e-5)


def test_the_jax_versions_equal_eager():
    pytest.importorskip("jax", reason='the JAX peer is optional: pip install "jax[cpu]"')
    for name, (fn, _specs, inputs, make_jax) in bjl.cases().items():
        want, got = bjl._leaves(fn(*inputs)), bjl._leaves(make_jax()(*inputs))
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-3, atol=2e-3, err_msg=name)
