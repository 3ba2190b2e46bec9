"""A branchy model: data-dependent routing with `F.cond` and `F.case`, nested in `F.foreach`/`F.case`.

    fn(x[B,64]) -> (y[B,W], row_sums[B])      B >= 1; W in {48, 16, 32, 24} is known only at run time

1. Each row goes through one of two sub-networks, chosen by the sign of its sum (a cond in a foreach).
2. The batch mean picks the head (a case); the heads have different output widths, so the width W
   of the result is an unknown dim. The default head holds another cond.
"""
import numpy as np

import dyntvm as dt
from dyntvm import F

from . import Example

D, H, SEED = 64, 32, 3

_rng = np.random.default_rng(SEED)
_w = lambda i, o: (_rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32)
W_pos, W_neg = _w(D, H), _w(D, H)                           # per-row sub-networks
W_wide, W_narrow, W_mid, W_small = _w(H, 48), _w(H, 16), _w(H, 32), _w(H, 24)   # heads
b_wide = np.full(48, 0.1, np.float32)


def branchy(x):
    def route_row(row, states):
        y = F.cond(F.sum(row) > 0,
                   lambda: F.relu(F.matmul(row, W_pos)),    # [H]
                   lambda: F.tanh(F.matmul(row, W_neg)))    # [H]
        return y, []

    h, _ = F.foreach(route_row, x, [])                      # [B, H]

    m = F.mean(x)
    y = F.case([(m > 0.5, lambda: F.relu(F.matmul(h, W_wide) + b_wide)),     # [B, 48]
                (m < -0.5, lambda: F.tanh(F.matmul(h, W_narrow)))],          # [B, 16]
               default=lambda: F.cond(F.max(F.abs(h)) > 1.0,
                                      lambda: F.sigmoid(F.matmul(h, W_mid)),  # [B, 32]
                                      lambda: F.matmul(h, W_small)))         # [B, 24]
    return y, F.sum(y, axis=1)


def make_inputs(rng, B=8, shift=0.0, scale=1.0):
    """`shift` and `scale` move the batch statistics, which decides the branches taken."""
    return (scale * rng.standard_normal((B, D)) + shift).astype(np.float32),


EXAMPLE = Example(
    name="branchy",
    description="branchy model: F.cond per row inside F.foreach, F.case heads of different widths, nested cond",
    fn=branchy,
    specs=(dt.TensorSpec(("B", D), name="x"),),
    make_inputs=make_inputs,
    sizes={"B": 8},
    test_sizes=({"B": 1}, {"B": 8}, {"B": 16, "shift": 1.0}, {"B": 4, "shift": -1.0},
                {"B": 8, "scale": 0.05}),
)
