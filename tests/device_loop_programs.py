"""Loop programs for the device loop tests (`test_device_loops.py` on the CPU's device path, `test_cuda_loops.py`
on a GPU), each with an independent numpy reference, and the counts the device loop must keep."""
from __future__ import annotations

import numpy as np

import dyntvm as dt
from dyntvm import F
from dyntvm.examples import lstm as lstm_example
from dyntvm.examples.plain_numpy import numpy_lstm
from dyntvm.ir.compiled_loop import compiled_loop_name, foreach_loop_plan, while_loop_plan
from dyntvm.runtime.loop_calls import _device_chunk
from test_compiled_loops import END, greedy, greedy_weights

_rng = np.random.default_rng(7)
W = (_rng.standard_normal((16, 16)) / 4).astype(np.float32)


# ------------------------------------------------------------------------------------------ foreach
def small_rows(xs, n):
    """Rows of 3 floats (not 64-byte multiples: copied through buffers of their own) and a 0-d state, both
    stacked; a softmax makes a second kernel and an intermediate."""
    def step(x, st):
        y = F.softmax(x, axis=-1) * st[0]
        m = st[0] * 0.5 + F.sum(y)
        return (y, m), [m]
    (ys, ms), (m,) = F.foreach(step, xs, [n])
    return ys, ms, m


def numpy_small_rows(xs, n):
    ys, ms = [], []
    for x in xs:
        e = np.exp(x - x.max())
        y = (e / e.sum() * n).astype(np.float32)
        n = np.float32(n * 0.5 + y.sum())
        ys.append(y)
        ms.append(n)
    return np.array(ys, np.float32).reshape(len(xs), 3), np.array(ms, np.float32), np.asarray(n, np.float32)


def rnn(xs, h):
    """A per-step output that is not a state, a state that is not stacked (two alternating buffers)."""
    def step(x, st):
        h = F.tanh(F.matmul(x, W) + st[0] * 0.5)
        return h * 2.0, [h]
    ys, (h,) = F.foreach(step, xs, [h])
    return ys, h


def numpy_rnn(xs, h):
    ys = np.empty(xs.shape, np.float32)
    for t in range(xs.shape[0]):
        h = np.tanh(xs[t] @ W + h * 0.5).astype(np.float32)
        ys[t] = h * 2.0
    return ys, h


# ----------------------------------------------------------------------------------------- while_loop
def count(x, limit):
    """Runs `limit` iterations (the condition on a captured tensor), stacking a row and the counter."""
    (rows, idx), (i, s) = F.while_loop(lambda i, s: i < limit, lambda i, s: ((s, i), [i + 1, s * 0.999 + 1.0]),
                                       [F.zeros((), "int64"), x])
    return rows, idx, i, s


def numpy_count(x, limit):
    rows, idx, s = [], [], x
    for i in range(int(limit)):
        rows.append(s)
        idx.append(i)
        s = (s * np.float32(0.999) + np.float32(1.0)).astype(np.float32)
    n = len(rows)
    return (np.array(rows, np.float32).reshape((n,) + x.shape), np.array(idx, np.int64), np.asarray(n, np.int64),
            s)


# test_compiled_loops's decode loop (0-d token and step states, the token stacked, the condition in the body)
E, WH, WOUT, BIAS = greedy_weights()


def numpy_greedy(start, h0, limit):
    tok, h, toks = int(start), h0, []
    for step in range(int(limit)):
        if tok == END:
            break
        h = np.tanh(E[tok] + h @ WH).astype(np.float32)
        tok = int(np.argmax(h @ WOUT + np.float32(step) * BIAS))
        toks.append(tok)
    return np.array(toks, np.int64), h, np.asarray(len(toks), np.int64)


# --------------------------------------------------------------------------------------------- helpers
def device_loops(model) -> list:
    """Regions of the model's loops whose device loop function the library has."""
    found = []
    for n in model.graph.walk():
        if n.op in ("foreach", "while_loop"):
            plan = foreach_loop_plan(n) if n.op == "foreach" else while_loop_plan(n)
            if plan is not None:
                try:
                    model.vm[compiled_loop_name(plan[0].attrs.name, device=True)]
                    found.append(plan[0].attrs.name)
                except Exception:  # noqa: BLE001 - declined by codegen
                    pass
    return found


class LazyModels(dict):
    """name -> ``make(name)``, made on first use (a test run on a few xdist workers compiles only what it uses)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, name):
        self[name] = model = self.make(name)
        return model


def expected_chunks(steps: int, limit=None) -> int:
    """Calls of a device while_loop running `steps` iterations (`loop_calls._device_chunk`)."""
    done = chunks = 0
    while done < steps:
        done += min(_device_chunk(done, limit, None), steps - done)
        chunks += 1
    return chunks


def call_counting(model, args):
    """(result, host->device copies, device->host copies, region calls) of one call of `model`."""
    before, calls = dict(model.device_copies), model.kernel_calls
    out = model(*args)
    after = model.device_copies
    return (out, after["host_to_device"] - before.get("host_to_device", 0),
            after["device_to_host"] - before.get("device_to_host", 0), model.kernel_calls - calls)


SPECS = {
    "lstm": (lstm_example.lstm, (dt.TensorSpec(("T", "B", 128)), dt.TensorSpec(("B", 256)), dt.TensorSpec(("B", 256)))),
    "small_rows": (small_rows, (dt.TensorSpec(("T", 3)), dt.TensorSpec(()))),
    "rnn": (rnn, (dt.TensorSpec(("T", "B", 16)), dt.TensorSpec(("B", 16)))),
    "count": (count, (dt.TensorSpec((4,)), dt.TensorSpec((), "int64"))),
    "greedy": (greedy, (dt.TensorSpec((), "int64"), dt.TensorSpec((16,)), dt.TensorSpec((), "int64"))),
}
REFERENCE = {"lstm": numpy_lstm, "small_rows": numpy_small_rows, "rnn": numpy_rnn, "count": numpy_count,
             "greedy": numpy_greedy}
