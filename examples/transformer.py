"""One transformer encoder layer (post-norm) with symbolic batch B and sequence length S.

    fn(x[B,S,128], mask[B,S]) -> y[B,S,128]

Multi-head self-attention (4 heads of 32) then a GELU feed-forward (512), each followed by a residual
and `F.layer_norm`. `mask` is additive over keys: 0 to attend, -1e9 to ignore (padding); pass zeros
for no mask. Head reshapes use the symbolic dims from `x.shape`, so one trace serves every B and S.
"""
import numpy as np

import dyntvm as dt
from dyntvm import F

from . import Example

D_MODEL, HEADS, D_FF, SEED = 128, 4, 512, 4
D_HEAD = D_MODEL // HEADS

_rng = np.random.default_rng(SEED)
_w = lambda i, o: (_rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32)
_b = lambda n: (0.02 * _rng.standard_normal(n)).astype(np.float32)
W_qkv, b_qkv = _w(D_MODEL, 3 * D_MODEL), _b(3 * D_MODEL)   # q, k, v projections fused
W_o, b_o = _w(D_MODEL, D_MODEL), _b(D_MODEL)
W_1, b_1, W_2, b_2 = _w(D_MODEL, D_FF), _b(D_FF), _w(D_FF, D_MODEL), _b(D_MODEL)
ln1_g, ln1_b = np.ones(D_MODEL, np.float32), np.zeros(D_MODEL, np.float32)
ln2_g, ln2_b = np.ones(D_MODEL, np.float32), np.zeros(D_MODEL, np.float32)


def encoder_layer(x, mask):
    B, S = x.shape[0], x.shape[1]                      # symbols while tracing, ints when eager

    def heads(t):                                      # [B, S, D_MODEL] -> [B, HEADS, S, D_HEAD]
        return F.transpose(F.reshape(t, (B, S, HEADS, D_HEAD)), (0, 2, 1, 3))

    q, k, v = (heads(t) for t in F.split(F.matmul(x, W_qkv) + b_qkv, 3, axis=-1))
    scores = F.matmul(q, F.transpose(k, (0, 1, 3, 2))) * D_HEAD ** -0.5   # [B, HEADS, S, S]
    scores = scores + F.reshape(mask, (B, 1, 1, S))
    attn = F.matmul(F.softmax(scores, axis=-1), v)     # [B, HEADS, S, D_HEAD]
    attn = F.reshape(F.transpose(attn, (0, 2, 1, 3)), (B, S, -1))
    x = F.layer_norm(x + F.matmul(attn, W_o) + b_o, ln1_g, ln1_b)

    ff = F.matmul(F.gelu(F.matmul(x, W_1) + b_1), W_2) + b_2
    return F.layer_norm(x + ff, ln2_g, ln2_b)


def make_inputs(rng, B=1, S=128):
    x = rng.standard_normal((B, S, D_MODEL)).astype(np.float32)
    lengths = rng.integers(1, S + 1, size=B)          # >= 1 real token per row
    mask = np.where(np.arange(S)[None, :] < lengths[:, None], 0.0, -1e9).astype(np.float32)
    return x, mask


EXAMPLE = Example(
    name="transformer",
    description="transformer encoder layer (d_model 128, 4 heads, FFN 512) with symbolic batch and sequence length",
    fn=encoder_layer,
    specs=(dt.TensorSpec(("B", "S", D_MODEL), name="x"), dt.TensorSpec(("B", "S"), name="mask")),
    make_inputs=make_inputs,
    sizes={"B": 1, "S": 128},
    test_sizes=({"B": 1, "S": 1}, {"B": 2, "S": 7}, {"B": 1, "S": 128}, {"B": 4, "S": 33}),
)
