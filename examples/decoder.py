"""Greedy decoding to an end token (`F.while_loop`) with a GRU cell and a growing output sequence.

    fn(prompt int64[P], max_steps int64[]) -> (tokens int64[L], logits float32[n, 64])

The prompt (P >= 0 tokens; an empty one means "start from BOS") is encoded with `F.foreach`. Then
each loop step embeds the last token, updates the hidden state, appends the argmax token, and stops
once END is produced or `max_steps` steps ran: L = P + n. A prompt ending with END decodes zero
steps. A bias on the END logit grows with the sequence length, so every sequence ends, at a length
that depends on the data.
"""
import numpy as np

import dyntvm as dt
from dyntvm import F

from . import Example

VOCAB, EMBED, HIDDEN, END, BOS, SEED = 64, 64, 128, 0, 1, 1
END_BIAS_PER_TOKEN = 0.25

_rng = np.random.default_rng(SEED)
_w = lambda *shape: (_rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
E = _rng.standard_normal((VOCAB, EMBED)).astype(np.float32)         # embedding table
Wx, Wh = _w(EMBED, 3 * HIDDEN), _w(HIDDEN, 3 * HIDDEN)               # GRU gates r, z, n fused
bx, bh = np.zeros(3 * HIDDEN, np.float32), np.zeros(3 * HIDDEN, np.float32)
Wout, bout = 2.0 * _w(HIDDEN, VOCAB), np.zeros(VOCAB, np.float32)
END_ONEHOT = (np.arange(VOCAB) == END).astype(np.float32) * END_BIAS_PER_TOKEN


def gru_cell(token, h):
    """One GRU step (PyTorch gate layout) on a 0-d token id and h[1, HIDDEN]."""
    x = F.reshape(F.take(E, token), (1, EMBED))
    xr, xz, xn = F.split(F.matmul(x, Wx) + bx, 3, axis=-1)
    hr, hz, hn = F.split(F.matmul(h, Wh) + bh, 3, axis=-1)
    r, z = F.sigmoid(xr + hr), F.sigmoid(xz + hz)
    n = F.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h


def decoder(prompt, max_steps):
    # Encode the prompt: a scan with no per-step outputs; the states are h and the last token.
    def encode(tok, states):
        h, _last = states
        return [], [gru_cell(tok, h), tok]

    _, (h, last) = F.foreach(encode, prompt, [F.zeros((1, HIDDEN)), np.int64(BOS)])

    def not_done(tokens, h, last):
        return last != END

    def step(tokens, h, last):
        h = gru_cell(last, h)
        logits = F.reshape(F.matmul(h, Wout), (VOCAB,)) + bout
        logits = logits + F.cast(F.shape_of(tokens), "float32") * END_ONEHOT    # length bias on END
        nxt = F.argmax(logits)                                                  # int64[]
        return logits, [F.concat([tokens, F.reshape(nxt, (1,))]), h, nxt]

    logits, (tokens, _h, _last) = F.while_loop(not_done, step, [prompt, h, last],
                                               max_iterations=max_steps)
    return tokens, logits


def make_inputs(rng, P=3, max_steps=32):
    prompt = rng.integers(1, VOCAB, size=P).astype(np.int64)   # no END inside the prompt
    return prompt, np.asarray(max_steps, np.int64)


EXAMPLE = Example(
    name="decoder",
    description="GRU greedy decoder (vocab 64, hidden 128): F.while_loop to an end token, growing output",
    fn=decoder,
    specs=(dt.TensorSpec(("P",), "int64", name="prompt"), dt.TensorSpec((), "int64", name="max_steps")),
    make_inputs=make_inputs,
    sizes={"P": 3},
    test_sizes=({"P": 0}, {"P": 1}, {"P": 2}, {"P": 5}, {"P": 3, "max_steps": 0}, {"P": 4, "max_steps": 2}),
)
