"""The bundled examples written in plain numpy, as a numpy user would write them (Python loops and `if`s).

They are the baseline of `dyntvm demo` and the numpy peer of `benchmarks/bench_peers.py`; each takes the
example's inputs (`Example.make_inputs`) and returns what the example returns.
"""
from __future__ import annotations

import numpy as np

from . import branchy as _branchy
from . import decoder as _decoder
from . import detection as _detection
from . import lstm as _lstm
from . import transformer as _transformer

try:                                   # numpy has no erf; a numpy user takes scipy's (installed with xgboost)
    from scipy.special import erf as _erf
except ImportError:                    # pragma: no cover
    import math
    _erf = np.vectorize(math.erf, otypes=[np.float32])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(eps)) * g + b


def numpy_lstm(xs, h0, c0):
    ex = _lstm
    h, c = h0, c0
    hs = np.empty((xs.shape[0],) + h0.shape, np.float32)
    for t in range(xs.shape[0]):
        i, f, g, o = np.split(xs[t] @ ex.W + h @ ex.U + ex.b, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        hs[t] = h
    return hs, h


def numpy_decoder(prompt, max_steps):
    ex = _decoder

    def gru(tok, h):
        xr, xz, xn = np.split(ex.E[tok][None] @ ex.Wx + ex.bx, 3, axis=-1)
        hr, hz, hn = np.split(h @ ex.Wh + ex.bh, 3, axis=-1)
        r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
        n = np.tanh(xn + r * hn)
        return (1.0 - z) * n + z * h

    h, last = np.zeros((1, ex.HIDDEN), np.float32), ex.BOS
    for tok in prompt:
        h, last = gru(tok, h), int(tok)
    tokens, all_logits = list(prompt), []
    for _ in range(int(max_steps)):
        if last == ex.END:
            break
        h = gru(last, h)
        logits = (h @ ex.Wout).reshape(ex.VOCAB) + ex.bout + np.float32(len(tokens)) * ex.END_ONEHOT
        last = int(np.argmax(logits))
        tokens.append(last)
        all_logits.append(logits)
    return np.array(tokens, np.int64), np.array(all_logits, np.float32).reshape(-1, ex.VOCAB)


def numpy_detection(scores, boxes):
    ex = _detection
    best = scores.max(axis=1)
    keep = best > ex.THRESHOLD
    boxes, scores, best = boxes[keep], scores[keep], best[keep]
    kept_index = np.nonzero(keep)[0]
    feats = np.concatenate([scores, boxes], axis=1)
    boxes = boxes + np.maximum(feats @ ex.W1 + ex.b1, 0) @ ex.W2 + ex.b2
    x1, y1, x2, y2 = boxes.T
    areas = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    classes = scores.argmax(axis=1)
    top_index = np.argsort(-best, kind="stable")[:min(len(best), ex.TOP)]
    return boxes, best, classes, areas, kept_index, best[top_index], top_index


def numpy_branchy(x):
    ex = _branchy
    h = np.stack([np.maximum(row @ ex.W_pos, 0) if row.sum() > 0 else np.tanh(row @ ex.W_neg) for row in x])
    m = x.mean()
    if m > 0.5:
        y = np.maximum(h @ ex.W_wide + ex.b_wide, 0)
    elif m < -0.5:
        y = np.tanh(h @ ex.W_narrow)
    elif np.abs(h).max() > 1.0:
        y = _sigmoid(h @ ex.W_mid)
    else:
        y = h @ ex.W_small
    return y, y.sum(axis=1)


def numpy_encoder_layer(x, mask):
    ex = _transformer
    B, S, _ = x.shape
    NH, DH, D = ex.HEADS, ex.D_HEAD, ex.D_MODEL
    heads = lambda t: t.reshape(B, S, NH, DH).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = (heads(t) for t in np.split(x @ ex.W_qkv + ex.b_qkv, 3, axis=-1))
    scores = q @ k.transpose(0, 1, 3, 2) * np.float32(DH ** -0.5) + mask[:, None, None, :]
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v
    attn = attn.transpose(0, 2, 1, 3).reshape(B, S, D)
    x = _layer_norm(x + attn @ ex.W_o + ex.b_o, ex.ln1_g, ex.ln1_b)
    pre = x @ ex.W_1 + ex.b_1
    gelu = 0.5 * pre * (1.0 + _erf(pre * np.float32(2 ** -0.5)))
    return _layer_norm(x + gelu @ ex.W_2 + ex.b_2, ex.ln2_g, ex.ln2_b)


# example name -> its plain numpy version
BY_EXAMPLE = {"lstm": numpy_lstm, "decoder": numpy_decoder, "detection": numpy_detection,
              "branchy": numpy_branchy, "transformer": numpy_encoder_layer}
