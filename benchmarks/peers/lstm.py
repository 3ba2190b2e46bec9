"""a. LSTM (input 128, hidden 256; examples/lstm.py's weights and model) over xs[T,B,128] (dyntvm: F.foreach).

    (xs[T,B,128], h0[B,256], c0[B,256]) -> (hs[T,B,256], h_T[B,256])
"""
from __future__ import annotations

import numpy as np

from dyntvm.examples import lstm as ex
from dyntvm.examples.plain_numpy import numpy_lstm

from . import Workload
from .common import (OnnxGraph, onnx_model, ort_builder, standard_builders, torch_builder)

IN, H = ex.INPUT, ex.HIDDEN
W, U, b = ex.W, ex.U, ex.b                    # gates i, f, g, o along the 4H axis


def torch_loop(inputs):
    import torch
    Wt, Ut, bt = (torch.from_numpy(a) for a in (W, U, b))

    def lstm(xs, h, c):
        hs = []
        for x in xs:
            i, f, g, o = (x @ Wt + h @ Ut + bt).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            hs.append(h)
        return torch.stack(hs), h
    return lstm, tuple(torch.from_numpy(a) for a in inputs)


def torch_nn_lstm(inputs):
    """torch.nn.LSTM with the same weights (PyTorch's gate order is also i, f, g, o)."""
    import torch
    m = torch.nn.LSTM(IN, H)
    with torch.no_grad():
        m.weight_ih_l0.copy_(torch.from_numpy(W.T.copy()))
        m.weight_hh_l0.copy_(torch.from_numpy(U.T.copy()))
        m.bias_ih_l0.copy_(torch.from_numpy(b))
        m.bias_hh_l0.zero_()
    m.eval()

    def lstm(xs, h0, c0):
        hs, (h, _c) = m(xs, (h0[None], c0[None]))
        return hs, h[0]
    return lstm, tuple(torch.from_numpy(a) for a in inputs)


def onnx_scan():
    """Scan over T; the body is the cell (two MatMuls, Split, gate math), weights from the outer graph."""
    from onnx import TensorProto as TP
    g = OnnxGraph()
    Wc, Uc, bc = g.const(W, hint="W"), g.const(U, hint="U"), g.const(b, hint="b")
    body = OnnxGraph()
    h, c, x = "h_in", "c_in", "x_t"
    gates = body.op("Add", body.op("Add", body.op("MatMul", x, Wc), body.op("MatMul", h, Uc)), bc)
    i, f, gg, o = body.op("Split", gates, n_out=4, axis=-1, num_outputs=4)
    c2 = body.op("Add", body.op("Mul", body.op("Sigmoid", f), c),
                 body.op("Mul", body.op("Sigmoid", i), body.op("Tanh", gg)), outputs=["c_out"])
    body.op("Mul", body.op("Sigmoid", o), body.op("Tanh", c2), outputs=["h_out"])
    body.op("Identity", "h_out", outputs=["h_t"])
    F32 = TP.FLOAT
    body_g = body.graph("lstm_cell", [(h, F32, ["B", H]), (c, F32, ["B", H]), (x, F32, ["B", IN])],
                        [("h_out", F32, ["B", H]), ("c_out", F32, ["B", H]), ("h_t", F32, ["B", H])])
    g.op("Scan", "h0", "c0", "xs", outputs=["h_T", "c_T", "hs"], num_scan_inputs=1, body=body_g)
    return onnx_model(g.graph("lstm_scan", [("xs", F32, ["T", "B", IN]), ("h0", F32, ["B", H]),
                                            ("c0", F32, ["B", H])],
                              [("hs", F32, ["T", "B", H]), ("h_T", F32, ["B", H])]))


def onnx_lstm_op():
    """The fused ONNX `LSTM` op: gates reordered to ONNX's i, o, f, c; weights as [1, 4H, in]."""
    from onnx import TensorProto as TP
    g = OnnxGraph()
    perm = np.concatenate([np.arange(0, H), np.arange(3 * H, 4 * H), np.arange(H, 2 * H), np.arange(2 * H, 3 * H)])
    Wo = g.const(W[:, perm].T[None].copy(), hint="W")
    Ro = g.const(U[:, perm].T[None].copy(), hint="R")
    Bo = g.const(np.concatenate([b[perm], np.zeros(4 * H, np.float32)])[None], hint="B")
    ax0 = g.const(np.array([0], np.int64))
    h0 = g.op("Unsqueeze", "h0", ax0)
    c0 = g.op("Unsqueeze", "c0", ax0)
    y, yh = g.op("LSTM", "xs", Wo, Ro, Bo, None, h0, c0, n_out=2, hidden_size=H)
    g.op("Squeeze", y, g.const(np.array([1], np.int64)), outputs=["hs"])
    g.op("Squeeze", yh, ax0, outputs=["h_T"])
    F32 = TP.FLOAT
    return onnx_model(g.graph("lstm_op", [("xs", F32, ["T", "B", IN]), ("h0", F32, ["B", H]),
                                          ("c0", F32, ["B", H])],
                              [("hs", F32, ["T", "B", H]), ("h_T", F32, ["B", H])]))


def workload(B, T):
    inputs = ex.make_inputs(np.random.default_rng(0), T=T, B=B)
    builders = standard_builders(inputs, numpy_lstm, torch_loop, onnx_scan, ex.lstm, ex.EXAMPLE.specs)
    builders["torch_lstm"] = torch_builder(torch_nn_lstm, inputs)
    builders["ort_lstm"] = ort_builder(onnx_lstm_op, inputs)
    return Workload(f"lstm_B{B}_T{T}", f"LSTM B{B} T{T}", "a", inputs, builders, rtol=1e-3, atol=1e-4,
                    note="examples/lstm.py (also group d's lstm at batch 1 and 16)")


def workloads(quick, smallest):
    if smallest:
        return [workload(2, 3)]
    if quick:
        return [workload(1, 16)]
    return [workload(1, 64), workload(16, 64), workload(1, 256)]
