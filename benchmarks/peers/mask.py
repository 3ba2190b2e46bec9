"""c. Boolean mask then an MLP (dyntvm: F.boolean_mask).

    x[N,4] -> relu(sel @ W1[4,256] + b1) @ W2[256,64]     sel = rows of x whose sum is > 0 (about half)
"""
from __future__ import annotations

import numpy as np

from . import Workload
from .common import (OnnxGraph, onnx_model, standard_builders)

D, H, O, SEED = 4, 256, 64, 5
_rng = np.random.default_rng(SEED)
W1 = (_rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32)
b1 = (0.1 * _rng.standard_normal(H)).astype(np.float32)
W2 = (_rng.standard_normal((H, O)) / np.sqrt(H)).astype(np.float32)


def numpy_mask_mlp(x):
    sel = x[x.sum(axis=1) > 0]
    return np.maximum(sel @ W1 + b1, 0) @ W2


def torch_mask_mlp(inputs):
    import torch
    W1t, b1t, W2t = (torch.from_numpy(a) for a in (W1, b1, W2))

    def mask_mlp(x):
        sel = x[x.sum(dim=1) > 0]
        return torch.relu(sel @ W1t + b1t) @ W2t
    return mask_mlp, (torch.from_numpy(inputs[0]),)


def dyntvm_mask_mlp(x):
    from dyntvm import F
    sel = F.boolean_mask(x, F.sum(x, axis=1) > 0)
    return F.matmul(F.relu(F.matmul(sel, W1) + b1), W2)


def onnx_compress():
    from onnx import TensorProto as TP
    g = OnnxGraph()
    keep = g.op("Greater", g.op("ReduceSum", "x", g.const(np.array([1], np.int64)), keepdims=0),
                g.const(np.array(0, np.float32)))
    sel = g.op("Compress", "x", keep, axis=0)
    hid = g.op("Relu", g.op("Add", g.op("MatMul", sel, g.const(W1, hint="W1")), g.const(b1, hint="b1")))
    g.op("MatMul", hid, g.const(W2, hint="W2"), outputs=["y"])
    return onnx_model(g.graph("mask_mlp", [("x", TP.FLOAT, ["N", D])], [("y", TP.FLOAT, ["K", O])]))


def workload(N):
    import dyntvm as dt
    inputs = (np.random.default_rng(0).standard_normal((N, D)).astype(np.float32),)
    builders = standard_builders(inputs, numpy_mask_mlp, torch_mask_mlp, onnx_compress, dyntvm_mask_mlp, (dt.TensorSpec(("N", D), name="x"),))
    kept = int((inputs[0].sum(axis=1) > 0).sum())
    return Workload(f"mask_N{N}", f"mask N{N} (K={kept}) -> MLP {D}x{H}x{O}", "c", inputs, builders,
                    rtol=1e-4, atol=1e-4)


def workloads(quick, smallest):
    return [workload(50 if smallest else 2000)]
