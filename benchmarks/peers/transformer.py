"""d. examples/transformer.py: one post-norm encoder layer (d_model 128, 4 heads, FFN 512, exact GELU) with
an additive key mask; batch 1 and 16 at the example's S=128. Static control flow, symbolic B and S.

    (x[B,S,128], mask[B,S]) -> y[B,S,128]
"""
from __future__ import annotations

import numpy as np

from dyntvm.examples import transformer as ex
from dyntvm.examples.plain_numpy import numpy_encoder_layer

from . import Workload
from .common import (OnnxGraph, onnx_model, standard_builders)

D, NH, DH, FF = ex.D_MODEL, ex.HEADS, ex.D_HEAD, ex.D_FF


def torch_encoder_layer(inputs):
    import torch
    import torch.nn.functional as tF
    W_qkv, b_qkv, W_o, b_o, W_1, b_1, W_2, b_2, g1, be1, g2, be2 = (torch.from_numpy(a) for a in (
        ex.W_qkv, ex.b_qkv, ex.W_o, ex.b_o, ex.W_1, ex.b_1, ex.W_2, ex.b_2,
        ex.ln1_g, ex.ln1_b, ex.ln2_g, ex.ln2_b))

    def encoder_layer(x, mask):
        B, S, _ = x.shape
        heads = lambda t: t.reshape(B, S, NH, DH).transpose(1, 2)
        q, k, v = (heads(t) for t in (x @ W_qkv + b_qkv).chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) * DH ** -0.5 + mask[:, None, None, :]
        attn = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, S, D)
        x = tF.layer_norm(x + attn @ W_o + b_o, (D,), g1, be1)
        ff = tF.gelu(x @ W_1 + b_1) @ W_2 + b_2
        return tF.layer_norm(x + ff, (D,), g2, be2)
    return encoder_layer, tuple(torch.from_numpy(a) for a in inputs)


def onnx_layer():
    from onnx import TensorProto as TP
    g = OnnxGraph()
    c = lambda a, n: g.const(a, hint=n)
    qkv = g.op("Add", g.op("MatMul", "x", c(ex.W_qkv, "W_qkv")), c(ex.b_qkv, "b_qkv"))
    head_shape = c(np.array([0, 0, NH, DH], np.int64), "head_shape")
    q, k, v = (g.op("Transpose", g.op("Reshape", t, head_shape), perm=[0, 2, 1, 3])
               for t in g.op("Split", qkv, n_out=3, axis=-1, num_outputs=3))
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                  c(np.array(DH ** -0.5, np.float32), "scale"))
    scores = g.op("Add", scores, g.op("Unsqueeze", "mask", c(np.array([1, 2], np.int64), "ax12")))
    attn = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    attn = g.op("Reshape", g.op("Transpose", attn, perm=[0, 2, 1, 3]), c(np.array([0, 0, -1], np.int64), "merge"))
    x1 = g.op("LayerNormalization", g.op("Add", g.op("Add", "x", g.op("MatMul", attn, c(ex.W_o, "W_o"))),
                                         c(ex.b_o, "b_o")),
              c(ex.ln1_g, "ln1_g"), c(ex.ln1_b, "ln1_b"), axis=-1, epsilon=1e-5)
    pre = g.op("Add", g.op("MatMul", x1, c(ex.W_1, "W_1")), c(ex.b_1, "b_1"))
    erf = g.op("Erf", g.op("Mul", pre, c(np.array(2 ** -0.5, np.float32), "rsqrt2")))
    gelu = g.op("Mul", g.op("Mul", pre, c(np.array(0.5, np.float32), "half")),
                g.op("Add", erf, c(np.array(1.0, np.float32), "one")))
    ff = g.op("Add", g.op("MatMul", gelu, c(ex.W_2, "W_2")), c(ex.b_2, "b_2"))
    g.op("LayerNormalization", g.op("Add", x1, ff), c(ex.ln2_g, "ln2_g"), c(ex.ln2_b, "ln2_b"), axis=-1,
         epsilon=1e-5, outputs=["y"])
    return onnx_model(g.graph("encoder_layer", [("x", TP.FLOAT, ["B", "S", D]), ("mask", TP.FLOAT, ["B", "S"])],
                              [("y", TP.FLOAT, ["B", "S", D])]))


def workload(B, S=128):
    inputs = ex.make_inputs(np.random.default_rng(0), B=B, S=S)
    builders = standard_builders(inputs, numpy_encoder_layer, torch_encoder_layer, onnx_layer, ex.encoder_layer, ex.EXAMPLE.specs)
    return Workload(f"ex_transformer_B{B}_S{S}", f"ex. transformer B{B} S{S}", "d", inputs, builders,
                    rtol=1e-3, atol=1e-3)


def workloads(quick, smallest):
    if smallest:
        return [workload(2, 7)]
    return [workload(1, 32)] if quick else [workload(1), workload(16)]
