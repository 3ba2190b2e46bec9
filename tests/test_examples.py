"""Bundled examples: each traces, lints, and the reference interpreter matches eager numpy."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import examples
from dyntvm.ir.tree import tree_flatten

CASES = [(name, i) for name in examples.NAMES for i in range(len(examples.get(name).test_sizes))]


@pytest.fixture(scope="module")
def traced():
    """One trace per example, shared by every test in this module."""
    cache = {}

    def get(name):
        if name not in cache:
            ex = examples.get(name)
            cache[name] = (ex, dt.trace(ex.fn, *ex.specs).lint())
        return cache[name]
    return get


def assert_same(eager, ref):
    e_leaves, e_spec = tree_flatten(eager)
    r_leaves, r_spec = tree_flatten(ref)
    assert e_spec == r_spec
    for a, b in zip(e_leaves, r_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def check(traced, name, *inputs):
    ex, graph = traced(name)
    eager = ex.fn(*inputs)
    assert_same(eager, dt.run_reference(graph, *inputs))
    return eager


def test_contract():
    for name in examples.NAMES:
        ex = examples.get(name)
        assert ex.name == name and ex.description and "\n" not in ex.description
        assert len(ex.specs) == len(ex.make_inputs(np.random.default_rng(0), **ex.sizes))
        assert ex.test_sizes
    with pytest.raises(KeyError):
        examples.get("nope")


@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_reference_matches_eager(traced, name, i):
    ex, graph = traced(name)
    sizes = ex.test_sizes[i]
    inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
    for spec, x in zip(ex.specs, inputs):
        assert np.asarray(x).dtype == np.dtype(spec.dtype) and np.ndim(x) == len(spec.shape)
    check(traced, name, *inputs)


def test_lstm_outputs_and_zero_length(traced):
    from dyntvm.examples import lstm
    ex, _ = traced("lstm")
    xs, h0, c0 = ex.make_inputs(np.random.default_rng(0), T=0, B=3)
    hs, h = check(traced, "lstm", xs, h0, c0)
    assert hs.shape == (0, 3, lstm.HIDDEN) and np.array_equal(h, h0)
    xs, h0, c0 = ex.make_inputs(np.random.default_rng(0), T=5, B=2)
    hs, h = check(traced, "lstm", xs, h0, c0)
    np.testing.assert_array_equal(hs[-1], h)
    assert 0.01 < np.abs(hs).mean() < 0.9          # neither dead nor saturated


def test_decoder_lengths(traced):
    from dyntvm.examples import decoder as d
    steps = set()
    for start in range(d.VOCAB):                   # every one-token prompt; the END prompt stops at once
        prompt = np.array([start], np.int64)
        tokens, logits = check(traced, "decoder", prompt, np.asarray(32, np.int64))
        n = logits.shape[0]
        steps.add(n)
        assert tokens.shape == (1 + n,) and np.array_equal(tokens[:1], prompt)
        if n:
            assert np.array_equal(tokens[1:], logits.argmax(axis=1))
        if n < 32:
            assert tokens[-1] == d.END and d.END not in tokens[1:-1]
    assert 0 in steps and len(steps) >= 5, sorted(steps)
    # a tensor max_iterations caps the loop; an empty prompt decodes from BOS
    tokens, logits = check(traced, "decoder", np.array([5, 9, 7], np.int64), np.asarray(1, np.int64))
    assert logits.shape[0] == 1 and tokens.shape == (4,)
    tokens, logits = check(traced, "decoder", np.zeros(0, np.int64), np.asarray(32, np.int64))
    assert tokens.shape[0] == logits.shape[0] >= 1


def test_detection_empty_and_full(traced):
    from dyntvm.examples import detection as det
    ex, _ = traced("detection")
    for n in (0, 1, 20):
        scores, boxes = ex.make_inputs(np.random.default_rng(n), N=n)
        scores[:] = 1.0 / det.CLASSES                   # nothing confident: empty mask
        out = check(traced, "detection", scores, boxes)
        assert all(np.shape(o)[0] == 0 for o in out)
        assert out[0].shape == (0, 4)
    scores, boxes = ex.make_inputs(np.random.default_rng(1), N=30, keep_fraction=1.0)
    kept, best, classes, areas, index, top_scores, top_index = check(traced, "detection", scores, boxes)
    k = int((scores.max(axis=1) > det.THRESHOLD).sum())
    assert kept.shape == (k, 4) and k >= 20 and top_scores.shape == (min(k, det.TOP),)
    np.testing.assert_array_equal(index, np.nonzero(scores.max(axis=1) > det.THRESHOLD)[0])
    np.testing.assert_array_equal(classes, scores[index].argmax(axis=1))
    np.testing.assert_array_equal(top_scores, best[top_index])
    assert (areas >= 0).all()


def test_branchy_every_branch(traced):
    ex, _ = traced("branchy")
    widths, row_signs = set(), set()
    inputs = [ex.make_inputs(np.random.default_rng(i), **s) for i, s in enumerate(ex.test_sizes)]
    for (x,) in inputs:
        y, sums = check(traced, "branchy", x)
        widths.add(y.shape[1])
        row_signs |= set((x.sum(axis=1) > 0).tolist())
        np.testing.assert_allclose(sums, y.sum(axis=1), rtol=1e-5, atol=1e-5)
    assert widths == {48, 16, 32, 24}               # both case heads, and both sides of the nested cond
    assert row_signs == {True, False}               # both sides of the per-row cond in the foreach


def test_transformer_mask_and_sizes(traced):
    from dyntvm.examples import transformer as tr
    ex, graph = traced("transformer")
    assert graph.inputs[0].type.shape == ("B", "S", tr.D_MODEL)
    x, mask = ex.make_inputs(np.random.default_rng(0), B=2, S=9)
    mask[:] = 0.0
    mask[0, 4:] = -1e9
    y = check(traced, "transformer", x, mask)
    # row 0 attends to its first 4 tokens only: changing padded tokens leaves those outputs unchanged
    x2 = x.copy()
    x2[0, 4:] += 1.0
    y2 = check(traced, "transformer", x2, mask)
    np.testing.assert_allclose(y2[0, :4], y[0, :4], rtol=1e-5, atol=1e-5)
    assert not np.allclose(y2[0, 4:], y[0, 4:])
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-4)   # ends in a layer norm


@pytest.mark.parametrize("name,i", CASES)
def test_plain_numpy_version_matches(name, i):
    """examples/plain_numpy.py (the baseline of `dyntvm demo` and bench_peers' numpy peer) computes the example."""
    from dyntvm.examples.plain_numpy import BY_EXAMPLE
    ex = examples.get(name)
    inputs = ex.make_inputs(np.random.default_rng(i), **ex.test_sizes[i])
    e_leaves, _ = tree_flatten(ex.fn(*inputs))
    n_leaves, _ = tree_flatten(BY_EXAMPLE[name](*inputs))
    assert len(e_leaves) == len(n_leaves)
    for a, b in zip(e_leaves, n_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
