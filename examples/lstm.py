"""LSTM over a variable-length sequence (`F.foreach`), gates fused into one matmul pair.

    fn(xs[T,B,128], h0[B,256], c0[B,256]) -> (hs[T,B,256], h_T[B,256])
"""
import numpy as np

import dyntvm as dt
from dyntvm import F

from . import Example

INPUT, HIDDEN, SEED = 128, 256, 0

_rng = np.random.default_rng(SEED)
# Gate order i, f, g, o; one [in, 4H] and one [H, 4H] matrix so each step is two matmuls.
W = (_rng.standard_normal((INPUT, 4 * HIDDEN)) / np.sqrt(INPUT)).astype(np.float32)
U = (_rng.standard_normal((HIDDEN, 4 * HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
b = np.zeros(4 * HIDDEN, np.float32)
b[HIDDEN:2 * HIDDEN] = 1.0                  # forget-gate bias 1 (the usual initialization)


def cell(x, states, W, U, b):
    """One LSTM step with weights W [in, 4H], U [H, 4H], b [4H]: (x_t, [h, c]) -> (h, [h, c])."""
    h, c = states
    i, f, g, o = F.split(F.matmul(x, W) + F.matmul(h, U) + b, 4, axis=-1)
    c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
    h = F.sigmoid(o) * F.tanh(c)
    return h, [h, c]


def step(x, states):
    """One LSTM step of this example's weights: (x_t, [h, c]) -> (h, [h, c])."""
    return cell(x, states, W, U, b)


def lstm(xs, h0, c0):
    hs, (h, _c) = F.foreach(step, xs, [h0, c0])
    return hs, h


def make_inputs(rng, T=64, B=1):
    xs = rng.standard_normal((T, B, INPUT)).astype(np.float32)
    h0 = np.zeros((B, HIDDEN), np.float32)
    c0 = np.zeros((B, HIDDEN), np.float32)
    return xs, h0, c0


EXAMPLE = Example(
    name="lstm",
    description="LSTM (input 128, hidden 256) over a variable-length sequence with F.foreach",
    fn=lstm,
    specs=(dt.TensorSpec(("T", "B", INPUT), name="xs"), dt.TensorSpec(("B", HIDDEN), name="h0"),
           dt.TensorSpec(("B", HIDDEN), name="c0")),
    make_inputs=make_inputs,
    sizes={"T": 64, "B": 1},
    test_sizes=({"T": 0, "B": 1}, {"T": 1, "B": 1}, {"T": 7, "B": 16}, {"T": 64, "B": 1}),
)
