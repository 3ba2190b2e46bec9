"""Train a small LSTM with Adam, compiled forward + backward (`dt.compile(dt.value_and_grad(...))`).

The task (synthetic): read a sequence of 4 features and predict the mean of feature 0 over its steps. Batches
have random lengths: one build serves every T and B. Run::

    python -m dyntvm.examples.train_lstm --steps 150 --plot lstm_loss.png
"""
from __future__ import annotations

import argparse

import numpy as np

import dyntvm as dt
from dyntvm import F
from dyntvm.examples.lstm import cell

INPUT, HIDDEN = 4, 16


def loss(W, U, b, V, xs, h0, y):
    """Mean squared error of a linear read-out of the LSTM's last hidden state."""
    _, (h, _) = F.foreach(lambda x, states: cell(x, states, W, U, b), xs, [h0, h0])
    err = F.matmul(h, V) - y
    return F.mean(err * err)


def init_params(rng):
    W = rng.standard_normal((INPUT, 4 * HIDDEN)) / np.sqrt(INPUT)
    U = rng.standard_normal((HIDDEN, 4 * HIDDEN)) / np.sqrt(HIDDEN)
    b = np.zeros(4 * HIDDEN)
    b[HIDDEN:2 * HIDDEN] = 1.0
    V = rng.standard_normal((HIDDEN, 1)) / np.sqrt(HIDDEN)
    return [p.astype(np.float32) for p in (W, U, b, V)]


def batch(rng, B=16):
    T = int(rng.integers(5, 16))
    xs = rng.standard_normal((T, B, INPUT)).astype(np.float32)
    return xs, np.zeros((B, HIDDEN), np.float32), xs[:, :, :1].mean(axis=0)


def compiled_step():
    S = dt.TensorSpec
    specs = (S((INPUT, 4 * HIDDEN)), S((HIDDEN, 4 * HIDDEN)), S((4 * HIDDEN,)), S((HIDDEN, 1)),
             S(("T", "B", INPUT)), S(("B", HIDDEN)), S(("B", 1)))
    return dt.compile(dt.value_and_grad(loss, argnums=(0, 1, 2, 3)), *specs)


def train(steps=150, seed=0, lr=0.02, model=None):
    """Adam on fresh random batches; returns the loss of every step."""
    rng = np.random.default_rng(seed)
    params = init_params(rng)
    model = model or compiled_step()
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    losses = []
    for t in range(1, steps + 1):
        value, grads = model(*params, *batch(rng))
        losses.append(float(value))
        for k, g in enumerate(grads):
            m[k] = 0.9 * m[k] + 0.1 * g
            v[k] = 0.999 * v[k] + 0.001 * g * g
            params[k] = params[k] - lr * (m[k] / (1 - 0.9 ** t)) / (np.sqrt(v[k] / (1 - 0.999 ** t)) + 1e-8)
    return losses


def plot(losses, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=1, label="loss per batch")
    k = max(1, len(losses) // 15)
    ax.plot(np.arange(k - 1, len(losses)), np.convolve(losses, np.ones(k) / k, "valid"), lw=2, label=f"mean of {k}")
    ax.set_xlabel("step")
    ax.set_ylabel("mean squared error")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("LSTM trained with dt.compile(dt.value_and_grad(...))")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--plot", default="lstm_loss.png", help="where to save the loss curve")
    a = ap.parse_args(argv)
    losses = train(a.steps)
    print(f"loss: first 10 steps {np.mean(losses[:10]):.4f}, last 10 steps {np.mean(losses[-10:]):.4f}")
    plot(losses, a.plot)
    print(f"saved {a.plot}")


if __name__ == "__main__":
    main()
