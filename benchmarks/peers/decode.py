"""b. Greedy decoding with an RNN cell, hidden 256, vocabulary 1000 (dyntvm: F.while_loop).

    (start int64[], h0[256], max_steps int64[]) -> tokens int64[n]

Each step embeds the last token (a row of E[1000,256]), updates h = tanh(x @ Wx + h @ Wh + b) (two
256x256 GEMVs), computes logits = h @ Wout (256x1000) plus a bias on END that grows with the step
number, and appends argmax(logits); the loop stops after END or max_steps steps. The weights (seed 17)
and the bias slope were picked so that the sequence ends after exactly 56 steps, and every step's best
logit leads the runner-up by > 0.02 (float32 rounding differences between systems cannot flip a token).
"""
from __future__ import annotations

import numpy as np

from . import Workload
from .common import (OnnxGraph, onnx_model, standard_builders)

V, H, END, START, SEED = 1000, 256, 0, 1, 17
END_SLOPE = 0.0755                 # END's logit bias is END_SLOPE * step (step = 0, 1, ...)
STEPS = 56                         # what these weights decode to (checked when the workload is built)

_rng = np.random.default_rng(SEED)
E = _rng.standard_normal((V, H)).astype(np.float32)
Wx = (_rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)
Wh = (_rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)
b = (0.1 * _rng.standard_normal(H)).astype(np.float32)
Wout = (2.0 * _rng.standard_normal((H, V)) / np.sqrt(H)).astype(np.float32)
Wout[:, END] = 0.0                 # END's logit is the bias alone
END_BIAS = np.where(np.arange(V) == END, END_SLOPE, 0.0).astype(np.float32)   # times the step number


def numpy_decode(start, h0, max_steps):
    tok, h, tokens = int(start), h0, []
    for step in range(int(max_steps)):
        h = np.tanh(E[tok] @ Wx + h @ Wh + b)
        logits = h @ Wout + np.float32(step) * END_BIAS
        tok = int(np.argmax(logits))
        tokens.append(tok)
        if tok == END:
            break
    return np.array(tokens, np.int64)


def torch_decode(inputs):
    import torch
    Et, Wxt, Wht, bt, Wot, endt = (torch.from_numpy(a) for a in (E, Wx, Wh, b, Wout, END_BIAS))

    def decode(tok, h, max_steps: int):
        tokens = []
        for step in range(max_steps):
            h = torch.tanh(torch.nn.functional.embedding(tok, Et) @ Wxt + h @ Wht + bt)
            tok = torch.argmax(h @ Wot + step * endt)
            tokens.append(tok)
            if tok.item() == END:
                break
        return torch.stack(tokens)
    start, h0, max_steps = inputs
    return decode, (torch.from_numpy(start), torch.from_numpy(h0), int(max_steps))


def dyntvm_decode(start, h0, max_steps):
    from dyntvm import F

    def not_end(tok, h, step):
        return tok != END

    def body(tok, h, step):
        h = F.tanh(F.matmul(F.take(E, tok), Wx) + F.matmul(h, Wh) + b)
        tok = F.argmax(F.matmul(h, Wout) + F.cast(step, "float32") * END_BIAS)
        return tok, [tok, h, step + 1]

    tokens, _ = F.while_loop(not_end, body, [start, h0, F.zeros((), "int64")], max_iterations=max_steps)
    return tokens


def onnx_loop():
    """Loop(trip count max_steps, cond = tok != END); the token of each step is a scan output."""
    from onnx import TensorProto as TP
    g = OnnxGraph()
    Ec, Wxc, Whc, bc, Woc, endc = (g.const(a, hint=n) for a, n in
                                   ((E, "E"), (Wx, "Wx"), (Wh, "Wh"), (b, "b"), (Wout, "Wout"), (END_BIAS, "endb")))
    endtok = g.const(np.array(END, np.int64), hint="END")
    body = OnnxGraph()
    pre = body.op("Add", body.op("Add", body.op("MatMul", body.op("Gather", Ec, "tok_in"), Wxc),
                                 body.op("MatMul", "h_in", Whc)), bc)
    body.op("Tanh", pre, outputs=["h_out"])
    logits = body.op("Add", body.op("MatMul", "h_out", Woc),
                     body.op("Mul", body.op("Cast", "step", to=TP.FLOAT), endc))
    body.op("ArgMax", logits, outputs=["tok_out"], axis=0, keepdims=0)
    body.op("Not", body.op("Equal", "tok_out", endtok), outputs=["cond_out"])
    body.op("Identity", "tok_out", outputs=["tok_t"])
    body_g = body.graph("decode_step",
                        [("step", TP.INT64, []), ("cond_in", TP.BOOL, []), ("tok_in", TP.INT64, []),
                         ("h_in", TP.FLOAT, [H])],
                        [("cond_out", TP.BOOL, []), ("tok_out", TP.INT64, []), ("h_out", TP.FLOAT, [H]),
                         ("tok_t", TP.INT64, [])])
    true = g.const(np.array(True))
    g.op("Loop", "max_steps", true, "start", "h0", outputs=["tok_last", "h_last", "tokens"], body=body_g)
    return onnx_model(g.graph("greedy_decode",
                              [("start", TP.INT64, []), ("h0", TP.FLOAT, [H]), ("max_steps", TP.INT64, [])],
                              [("tokens", TP.INT64, ["n"])]))


def workload(max_steps=100):
    import dyntvm as dt
    inputs = (np.array(START, np.int64), np.zeros(H, np.float32), np.array(max_steps, np.int64))
    n = len(numpy_decode(*inputs))
    assert n == min(STEPS, max_steps), f"decode ran {n} steps, expected {STEPS}"
    specs = (dt.TensorSpec((), "int64", name="start"), dt.TensorSpec((H,), name="h0"),
             dt.TensorSpec((), "int64", name="max_steps"))
    builders = standard_builders(inputs, numpy_decode, torch_decode, onnx_loop, dyntvm_decode, specs)
    label = f"greedy decode h{H} V{V} ({n} steps)"
    return Workload(f"decode_{n}", label, "b", inputs, builders, exact=(0,))


def workloads(quick, smallest):
    return [workload(8 if smallest else 100)]
