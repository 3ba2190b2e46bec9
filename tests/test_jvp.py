"""`dt.jvp` (forward mode, as the vjp of the vjp): against central finite differences in float64 along a random
direction, through elementwise / matmul / reductions, cond, foreach, a while_loop with a data-dependent trip
count and boolean_mask, at several sizes incl. 1 and 0; against torch.func.jvp; compiled == eager; errors."""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

S = dt.TensorSpec


def r(*shape, seed=0):
    return np.random.default_rng(seed + 11 * sum(shape)).uniform(-1.0, 1.0, shape)


def _leaves(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check_jvp(fn, primals, tangents, rtol=1e-6, atol=1e-8, eps=1e-6):
    """dt.jvp of fn equals (fn(p + eps t) - fn(p - eps t)) / 2 eps for each float output; returns the tangents."""
    out, tan = dt.jvp(fn, tuple(primals), tuple(tangents))
    hi = fn(*[p + eps * t if t is not None else p for p, t in zip(primals, tangents)])
    lo = fn(*[p - eps * t if t is not None else p for p, t in zip(primals, tangents)])
    for k, (o, d, a, b) in enumerate(zip(_leaves(out), _leaves(tan), _leaves(hi), _leaves(lo))):
        if np.asarray(o).dtype.kind != "f":
            assert d is None, k
            continue
        np.testing.assert_allclose(np.asarray(o), np.asarray(fn(*primals) if len(_leaves(out)) == 1 else
                                                             _leaves(fn(*primals))[k]), rtol=1e-12)
        assert np.shape(d) == np.shape(o), (k, np.shape(d), np.shape(o))
        np.testing.assert_allclose(d, (np.asarray(a) - np.asarray(b)) / (2 * eps), rtol=rtol, atol=atol,
                                   err_msg=f"tangent of output {k}")
    return tan


def mlp(x, W, b):
    return F.tanh(F.matmul(x, W) + b) * F.sigmoid(F.sum(x, axis=1, keepdims=True))


@pytest.mark.parametrize("n", (0, 1, 5))
def test_mlp_against_finite_differences(n):
    check_jvp(mlp, [r(n, 3), r(3, 4, seed=1), r(4, seed=2)], [r(n, 3, seed=3), r(3, 4, seed=4), r(4, seed=5)])


def test_reductions_softmax_and_an_integer_output():
    def f(x):
        return F.max(x, axis=1), F.softmax(x, axis=-1), F.argmax(x, axis=1), F.mean(x * x)
    check_jvp(f, [r(4, 6)], [r(4, 6, seed=1)])


@pytest.mark.parametrize("shift", (-3.0, 3.0))
def test_cond_takes_the_branch(shift):
    def f(x, w):
        return F.cond(F.sum(x) > 0, lambda: F.tanh(x * w), lambda: F.sin(x) * w * w)
    check_jvp(f, [r(3) + shift, r(3, seed=1)], [r(3, seed=2), r(3, seed=3)])


@pytest.mark.parametrize("T", (0, 1, 4))
def test_foreach_rnn(T):
    def rnn(xs, h0, U):
        def step(x, st):
            h = F.tanh(x + F.matmul(st[0], U))
            return h * 2.0, [h]
        hs, (h,) = F.foreach(step, xs, [h0])
        return hs, h
    check_jvp(rnn, [r(T, 2, 3), r(2, 3, seed=1), r(3, 3, seed=2)],
              [r(T, 2, 3, seed=3), r(2, 3, seed=4), r(3, 3, seed=5)])


@pytest.mark.parametrize("start", (0.5, 3.0, 20.0))
def test_while_loop_with_a_data_dependent_count(start):
    def f(x, w):
        steps, (y, _) = F.while_loop(lambda x, k: F.sum(x) < 10.0,
                                     lambda x, k: (F.sum(x * w), [x * w + F.sin(x), k + 1]), [x, np.int64(0)])
        return y, steps
    check_jvp(f, [np.full(3, start) + r(3) * 0.1, 1.3 + r(3, seed=1) * 0.1], [r(3, seed=2), r(3, seed=3)])


def test_boolean_mask_and_take():
    def f(x, w):
        kept = F.boolean_mask(x, F.sum(x, axis=1) > 0)
        return F.sum(F.take(kept * w, np.array([0, 0], np.int64), axis=1) ** 2, axis=0)
    x = r(6, 3)
    x[0] = np.abs(x[0])
    check_jvp(f, [x, r(3, seed=1)], [r(6, 3, seed=2), r(3, seed=3)])


def test_none_tangent_is_zero_and_integer_primals_are_ignored():
    def f(x, k):
        return F.tanh(x) * F.cast(k, "float64")
    x, k = r(4), np.int64(3)
    _, with_none = dt.jvp(f, (x, k), (r(4, seed=1), None))
    np.testing.assert_allclose(with_none, (1 - np.tanh(x) ** 2) * r(4, seed=1) * 3, rtol=1e-12)
    _, zero = dt.jvp(f, (x, k), (None, None))
    np.testing.assert_array_equal(zero, np.zeros(4))


def test_matches_torch_func_jvp():
    torch = pytest.importorskip("torch")
    x, W, b = r(5, 3), r(3, 4, seed=1), r(4, seed=2)
    tx, tW, tb = r(5, 3, seed=3), r(3, 4, seed=4), r(4, seed=5)
    _, ours = dt.jvp(mlp, (x, W, b), (tx, tW, tb))

    def torch_mlp(x, W, b):
        return torch.tanh(x @ W + b) * torch.sigmoid(x.sum(1, keepdim=True))
    _, theirs = torch.func.jvp(torch_mlp, tuple(map(torch.tensor, (x, W, b))), tuple(map(torch.tensor, (tx, tW, tb))))
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-12, atol=1e-14)


def test_compiled_equals_eager_at_several_sizes():
    def f(xs, h0, U):
        def step(x, st):
            h = F.tanh(x + F.matmul(st[0], U))
            return h, [h]
        hs, _ = F.foreach(step, xs, [h0])
        return F.sum(hs * hs, axis=0)
    model = dt.compile(lambda xs, h0, U, txs: dt.jvp(f, (xs, h0, U), (txs, None, None))[1],
                       S(("T", "B", 3), "float64"), S(("B", 3), "float64"), S((3, 3), "float64"),
                       S(("T", "B", 3), "float64"))
    for T, B in ((0, 2), (1, 1), (5, 3)):
        args = (r(T, B, 3), r(B, 3, seed=1), r(3, 3, seed=2), r(T, B, 3, seed=3))
        eager = dt.jvp(f, args[:3], (args[3], None, None))[1]
        np.testing.assert_allclose(model(*args), eager, rtol=1e-12, atol=1e-14)


def test_bad_calls_are_clear_errors():
    with pytest.raises(dt.TraceError, match="primals and tangents must be tuples"):
        dt.jvp(F.tanh, r(3), r(3))
    with pytest.raises(dt.TraceError, match="1 primal\\(s\\) but 2 tangent\\(s\\)"):
        dt.jvp(F.tanh, (r(3),), (r(3), r(3)))
    with pytest.raises(dt.TraceError, match="tangent 0 is"):
        dt.jvp(F.tanh, (r(3),), (r(2, 2),))
    for bad in (r(1), r(4), np.arange(3), np.ones(3, bool)):     # same rank: a size or the dtype differs
        with pytest.raises(dt.TraceError, match="tangent 0 is .*a float tangent of the primal's shape"):
            dt.jvp(F.tanh, (r(3),), (bad,))
    with pytest.raises(dt.TraceError, match="expected a function"):
        dt.jvp(3, (r(3),), (r(3),))
