"""d. examples/decoder.py: GRU greedy decoder (vocab 64, hidden 128), prompt encoded by a foreach, then a
while_loop to END with a growing token sequence. No batch dim: one row at the example's sizes (P=3,
max_steps=32).

    (prompt int64[P], max_steps int64[]) -> (tokens int64[P+n], logits float32[n,64])
"""
from __future__ import annotations

import numpy as np

from dyntvm.examples import decoder as ex
from dyntvm.examples.plain_numpy import numpy_decoder

from . import Workload
from .common import (OnnxGraph, onnx_model, standard_builders)

V, EMB, H, END, BOS = ex.VOCAB, ex.EMBED, ex.HIDDEN, ex.END, ex.BOS


def torch_decoder(inputs):
    import torch
    E, Wx, Wh, bx, bh, Wout, bout, end1 = (torch.from_numpy(a) for a in (
        ex.E, ex.Wx, ex.Wh, ex.bx, ex.bh, ex.Wout, ex.bout, ex.END_ONEHOT))

    def gru(tok, h):
        xr, xz, xn = (torch.nn.functional.embedding(tok[None], E) @ Wx + bx).chunk(3, dim=-1)
        hr, hz, hn = (h @ Wh + bh).chunk(3, dim=-1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return (1.0 - z) * n + z * h

    def decoder(prompt, max_steps: int):
        h, last = torch.zeros(1, H), torch.tensor(BOS)
        for tok in prompt:
            h, last = gru(tok, h), tok
        tokens, all_logits = [prompt], []
        length = prompt.shape[0]
        for _ in range(max_steps):
            if last.item() == END:
                break
            h = gru(last, h)
            logits = (h @ Wout).reshape(V) + bout + length * end1
            last = torch.argmax(logits)
            tokens.append(last[None])
            all_logits.append(logits)
            length += 1
        return torch.cat(tokens), (torch.stack(all_logits) if all_logits else torch.zeros(0, V))
    prompt, max_steps = inputs
    return decoder, (torch.from_numpy(prompt), int(max_steps))


def onnx_scan_loop():
    """Scan over the prompt (GRU cell body), then Loop(max_steps, tok != END) with the cell again."""
    from onnx import TensorProto as TP
    g = OnnxGraph()
    E, Wx, Wh, bx, bh, Wout, bout, end1 = (g.const(a, hint=n) for a, n in (
        (ex.E, "E"), (ex.Wx, "Wx"), (ex.Wh, "Wh"), (ex.bx, "bx"), (ex.bh, "bh"), (ex.Wout, "Wout"),
        (ex.bout, "bout"), (ex.END_ONEHOT, "end1")))
    endtok = g.const(np.array(END, np.int64), hint="END")

    def gru(b, tok, h, out):
        x = b.op("Unsqueeze", b.op("Gather", E, tok), b.const(np.array([0], np.int64)))   # [1, EMB]
        xr, xz, xn = b.op("Split", b.op("Add", b.op("MatMul", x, Wx), bx), n_out=3, axis=-1, num_outputs=3)
        hr, hz, hn = b.op("Split", b.op("Add", b.op("MatMul", h, Wh), bh), n_out=3, axis=-1, num_outputs=3)
        r, z = b.op("Sigmoid", b.op("Add", xr, hr)), b.op("Sigmoid", b.op("Add", xz, hz))
        n = b.op("Tanh", b.op("Add", xn, b.op("Mul", r, hn)))
        one_minus_z = b.op("Sub", b.const(np.array(1.0, np.float32)), z)
        return b.op("Add", b.op("Mul", one_minus_z, n), b.op("Mul", z, h), outputs=[out])

    enc = OnnxGraph()
    gru(enc, "e_tok", "e_h", "e_h_out")
    enc.op("Identity", "e_tok", outputs=["e_last_out"])
    enc_g = enc.graph("encode", [("e_h", TP.FLOAT, [1, H]), ("e_last", TP.INT64, []), ("e_tok", TP.INT64, [])],
                      [("e_h_out", TP.FLOAT, [1, H]), ("e_last_out", TP.INT64, [])])
    h0 = g.const(np.zeros((1, H), np.float32))
    h, last = g.op("Scan", h0, g.const(np.array(BOS, np.int64)), "prompt", n_out=2, num_scan_inputs=1, body=enc_g)

    P = g.op("Squeeze", g.op("Shape", "prompt"), g.const(np.array([0], np.int64)))    # int64[]
    dec = OnnxGraph()
    h2 = gru(dec, "d_last", "d_h", "d_h_out")
    length = dec.op("Cast", dec.op("Add", P, "d_i"), to=TP.FLOAT)
    logits = dec.op("Add", dec.op("Add", dec.op("Reshape", dec.op("MatMul", h2, Wout),
                                                dec.const(np.array([V], np.int64))), bout),
                    dec.op("Mul", length, end1), outputs=["d_logits"])
    dec.op("ArgMax", logits, axis=0, keepdims=0, outputs=["d_last_out"])
    dec.op("Not", dec.op("Equal", "d_last_out", endtok), outputs=["d_cond_out"])
    dec.op("Identity", "d_last_out", outputs=["d_tok"])
    dec_g = dec.graph("decode_step",
                      [("d_i", TP.INT64, []), ("d_cond", TP.BOOL, []), ("d_h", TP.FLOAT, [1, H]),
                       ("d_last", TP.INT64, [])],
                      [("d_cond_out", TP.BOOL, []), ("d_h_out", TP.FLOAT, [1, H]), ("d_last_out", TP.INT64, []),
                       ("d_tok", TP.INT64, []), ("d_logits", TP.FLOAT, [V])])
    cond0 = g.op("Not", g.op("Equal", last, endtok))
    _h, _l, toks, logits_all = g.op("Loop", "max_steps", cond0, h, last, n_out=4, body=dec_g)
    g.op("Concat", "prompt", toks, axis=0, outputs=["tokens"])
    g.op("Identity", logits_all, outputs=["logits"])
    return onnx_model(g.graph("gru_decoder", [("prompt", TP.INT64, ["P"]), ("max_steps", TP.INT64, [])],
                              [("tokens", TP.INT64, ["L"]), ("logits", TP.FLOAT, ["n", V])]))


def workload(P=3, max_steps=32):
    inputs = ex.make_inputs(np.random.default_rng(0), P=P, max_steps=max_steps)
    builders = standard_builders(inputs, numpy_decoder, torch_decoder, onnx_scan_loop, ex.decoder, ex.EXAMPLE.specs)
    n = len(numpy_decoder(*inputs)[1])
    return Workload(f"ex_decoder_P{P}", f"ex. decoder P{P} ({n} steps)", "d", inputs, builders, exact=(0,),
                    rtol=1e-4, atol=1e-4)


def workloads(quick, smallest):
    return [workload(2, 4) if smallest else workload()]
