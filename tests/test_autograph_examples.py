"""Bundled examples rewritten with plain Python `if` / `for` / `while` and compiled through autograph
(`dt.compile(..., autograph=True)`): each equals the example's own `F` version (run eagerly on numpy, the
reference) at the example's test sizes, 0-length sequences included."""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.examples import branchy as B, decoder as D, lstm as L
from helpers import ops_in


def branchy_plain(x):
    hs = []
    for row in x:
        if F.sum(row) > 0:
            y = F.relu(F.matmul(row, B.W_pos))
        else:
            y = F.tanh(F.matmul(row, B.W_neg))
        hs.append(y)
    h = F.stack(hs)
    m = F.mean(x)
    if m > 0.5:
        y = F.relu(F.matmul(h, B.W_wide) + B.b_wide)
    elif m < -0.5:
        y = F.tanh(F.matmul(h, B.W_narrow))
    elif F.max(F.abs(h)) > 1.0:
        y = F.sigmoid(F.matmul(h, B.W_mid))
    else:
        y = F.matmul(h, B.W_small)
    return y, F.sum(y, axis=1)


def lstm_plain(xs, h, c):
    hs = []
    for x in xs:
        h, (h, c) = L.step(x, [h, c])
        hs.append(h)
    return F.stack(hs), h


def decoder_plain(prompt, max_steps):
    h = F.zeros((1, D.HIDDEN))
    last = np.int64(D.BOS)
    for tok in prompt:
        h = D.gru_cell(tok, h)
        last = tok
    tokens, steps = prompt, 0
    all_logits = []
    while last != D.END and steps < max_steps:
        h = D.gru_cell(last, h)
        logits = F.reshape(F.matmul(h, D.Wout), (D.VOCAB,)) + D.bout
        logits = logits + F.cast(F.shape_of(tokens), "float32") * D.END_ONEHOT
        last = F.argmax(logits)
        tokens = F.concat([tokens, F.reshape(last, (1,))])
        steps = steps + 1
        all_logits.append(logits)
    return tokens, F.stack(all_logits)


@pytest.mark.parametrize("plain, example, ops", [pytest.param(branchy_plain, B.EXAMPLE, {"foreach", "cond"},
                                                              marks=pytest.mark.slow),     # ~24 s on 2 busy cores
                                                 (lstm_plain, L.EXAMPLE, {"foreach"}),
                                                 (decoder_plain, D.EXAMPLE, {"foreach", "while_loop"})],
                         ids=["branchy", "lstm", "decoder"])
def test_plain_python_example_equals_the_F_version(plain, example, ops):
    assert ops <= ops_in(dt.trace(dt.autograph(plain), *example.specs))
    model = dt.compile(plain, *example.specs, autograph=True)
    for i, size in enumerate(example.test_sizes):
        inputs = example.make_inputs(np.random.default_rng(i), **size)
        got, want = model(*inputs), example.fn(*inputs)
        for g, w in zip(got, want):
            assert np.shape(g) == np.shape(w), (size, np.shape(g), np.shape(w))
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4, err_msg=str(size))


@pytest.mark.parametrize("name", ["detection", "transformer", "lstm"])
def test_code_without_python_control_flow_traces_to_the_same_graph(name):
    from dyntvm.examples import get
    from dyntvm.ir.serialize import graphs_equal
    example = get(name)
    assert graphs_equal(dt.trace(dt.autograph(example.fn), *example.specs), dt.trace(example.fn, *example.specs))
