"""Beam search written as one would write it: two loop vars, the hidden states ``h[k, H]`` and the scores
``score[k]``, shrink together (a boolean mask prunes dead beams, top-k keeps the best) inside `F.while_loop`.

Tracing cannot prove that their row counts stay equal (each loop var gets its own dim that changes between
iterations), so ``score + f(h)`` unifies the two dims and checks them at run time (ir/dim_checks.py). Compiled
once, it must equal eager execution and an independent numpy loop at several beam widths, step counts and
numbers of live beams, 0 included."""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

from helpers import assert_same

S = dt.TensorSpec
H = 6


def beam_search(h0, score0, w, steps, beam):
    def live(h, score, i):
        return i < steps

    def step(h, score, i):
        h = F.tanh(h @ w)
        score = score + F.mean(h, axis=1)          # h's rows and score's entries: one dim, checked when run
        alive = score > 0.0
        h, score = F.boolean_mask(h, alive), F.boolean_mask(score, alive)
        k = F.minimum(F.shape_of(score)[0], beam)
        score, best = F.topk(score, k)
        return F.take(h, best, axis=0), score, i + 1

    h, score, _ = F.while_loop(live, step, [h0, score0, np.int64(0)])
    return h, score


def beam_search_numpy(h, score, w, steps, beam):
    """The same search, written independently in numpy."""
    for _ in range(int(steps)):
        h = np.tanh(h @ w)
        score = score + h.mean(axis=1)
        alive = score > 0
        h, score = h[alive], score[alive]
        best = np.argsort(-score, kind="stable")[:min(len(score), int(beam))]
        h, score = h[best], score[best]
    return h, score


SPECS = (S(("K", H)), S(("K",)), S((H, H)), S((), "int64"), S((), "int64"))


@pytest.fixture(scope="module")
def compiled():
    return dt.compile(beam_search, *SPECS)


def test_the_two_loop_vars_are_unified_with_one_check():
    g = dt.trace(beam_search, *SPECS)
    checked = [n for n in g.walk() if n.checks]
    assert [n.op for n in checked] == ["add"] and checked[0].checks[0].what == "broadcast"


@pytest.mark.parametrize("k, steps, beam", [(4, 0, 2), (4, 1, 2), (5, 3, 3), (1, 2, 1), (8, 5, 4), (0, 3, 2),
                                            (3, 4, 8)])
def test_beam_search_compiled_equals_eager_and_numpy(compiled, k, steps, beam):
    rng = np.random.default_rng(100 * k + 10 * steps + beam)
    w = (rng.standard_normal((H, H)) * 0.8).astype(np.float32)
    h0 = rng.standard_normal((k, H)).astype(np.float32)
    s0 = rng.standard_normal(k).astype(np.float32)
    args = (h0, s0, w, np.int64(steps), np.int64(beam))
    want = beam_search_numpy(*args)
    assert_same(beam_search(*args), want, rtol=1e-5, atol=1e-6)
    assert_same(compiled(*args), want, rtol=1e-4, atol=1e-5)
    assert_same(dt.run_reference(compiled.graph, *args), want, rtol=1e-5, atol=1e-6)


def test_no_live_beams_left(compiled):
    """All scores fall below 0 in the first step: every later step runs on 0 beams."""
    w = np.eye(H, dtype=np.float32)
    h0 = -np.ones((3, H), np.float32)
    s0 = np.zeros(3, np.float32)
    args = (h0, s0, w, np.int64(3), np.int64(2))
    h, score = compiled(*args)
    assert np.shape(h) == (0, H) and np.shape(score) == (0,)
    assert_same((h, score), beam_search_numpy(*args))
