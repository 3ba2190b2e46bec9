"""d. examples/branchy.py: a cond per row inside a foreach, then a case on the batch mean between heads of
different widths (the default head holds another cond). Batch 1 and 16.

    x[B,64] -> (y[B,W], row_sums[B])      W in {48, 16, 32, 24}, known only at run time

The peers follow the model as written: a Python loop over rows with an `if` (numpy, torch), Scan with an
If per row and nested Ifs for the heads (ONNX).
"""
from __future__ import annotations

import numpy as np

from dyntvm.examples import branchy as ex
from dyntvm.examples.plain_numpy import numpy_branchy

from . import Workload
from .common import (OnnxGraph, onnx_model, standard_builders)

D, H = ex.D, ex.H


def torch_branchy(inputs):
    import torch
    W_pos, W_neg, W_wide, W_narrow, W_mid, W_small, b_wide = (torch.from_numpy(a) for a in (
        ex.W_pos, ex.W_neg, ex.W_wide, ex.W_narrow, ex.W_mid, ex.W_small, ex.b_wide))

    def branchy(x):
        h = torch.stack([torch.relu(row @ W_pos) if row.sum() > 0 else torch.tanh(row @ W_neg) for row in x])
        m = x.mean()
        if m > 0.5:
            y = torch.relu(h @ W_wide + b_wide)
        elif m < -0.5:
            y = torch.tanh(h @ W_narrow)
        elif h.abs().max() > 1.0:
            y = torch.sigmoid(h @ W_mid)
        else:
            y = h @ W_small
        return y, y.sum(dim=1)
    return branchy, (torch.from_numpy(inputs[0]),)


def onnx_scan_if():
    from onnx import TensorProto as TP
    F32 = TP.FLOAT
    g = OnnxGraph()
    Wp, Wn = g.const(ex.W_pos, hint="W_pos"), g.const(ex.W_neg, hint="W_neg")
    zero = g.const(np.array(0.0, np.float32))

    def branch(name, build, shape):
        b = OnnxGraph()
        out = build(b)
        b.op("Identity", out, outputs=[f"{name}_out"])
        return b.graph(name, [], [(f"{name}_out", F32, shape)])

    row = OnnxGraph()
    pos = branch("pos", lambda b: b.op("Relu", b.op("MatMul", "row", Wp)), [H])
    neg = branch("neg", lambda b: b.op("Tanh", b.op("MatMul", "row", Wn)), [H])
    row.op("If", row.op("Greater", row.op("ReduceSum", "row", keepdims=0), zero), outputs=["row_out"],
           then_branch=pos, else_branch=neg)
    row_g = row.graph("route_row", [("row", F32, [D])], [("row_out", F32, [H])])
    h = g.op("Scan", "x", num_scan_inputs=1, body=row_g)

    Ww, bw, Wna, Wm, Ws = (g.const(a, hint=n) for a, n in ((ex.W_wide, "W_wide"), (ex.b_wide, "b_wide"),
                                                          (ex.W_narrow, "W_narrow"), (ex.W_mid, "W_mid"),
                                                          (ex.W_small, "W_small")))
    m = g.op("ReduceMean", "x", keepdims=0)
    wide = branch("wide", lambda b: b.op("Relu", b.op("Add", b.op("MatMul", h, Ww), bw)), ["B", 48])
    narrow = branch("narrow", lambda b: b.op("Tanh", b.op("MatMul", h, Wna)), ["B", 16])
    mid = branch("mid", lambda b: b.op("Sigmoid", b.op("MatMul", h, Wm)), ["B", 32])
    small = branch("small", lambda b: b.op("MatMul", h, Ws), ["B", 24])

    def nested_if(name, cond_fn, then_g, else_g):
        b = OnnxGraph()
        b.op("If", cond_fn(b), outputs=[f"{name}_out"], then_branch=then_g, else_branch=else_g)
        return b.graph(name, [], [(f"{name}_out", F32, ["B", None])])

    default = nested_if("default", lambda b: b.op("Greater", b.op("ReduceMax", b.op("Abs", h), keepdims=0),
                                                  b.const(np.array(1.0, np.float32))), mid, small)
    not_wide = nested_if("not_wide", lambda b: b.op("Less", m, b.const(np.array(-0.5, np.float32))),
                         narrow, default)
    y = g.op("If", g.op("Greater", m, g.const(np.array(0.5, np.float32))), outputs=["y"],
             then_branch=wide, else_branch=not_wide)
    g.op("ReduceSum", y, g.const(np.array([1], np.int64)), keepdims=0, outputs=["row_sums"])
    return onnx_model(g.graph("branchy", [("x", F32, ["B", D])],
                              [("y", F32, ["B", None]), ("row_sums", F32, ["B"])]))


def workload(B):
    inputs = ex.make_inputs(np.random.default_rng(0), B=B)
    builders = standard_builders(inputs, numpy_branchy, torch_branchy, onnx_scan_if, ex.branchy, ex.EXAMPLE.specs)
    width = numpy_branchy(*inputs)[0].shape[1]
    return Workload(f"ex_branchy_B{B}", f"ex. branchy B{B} (W={width})", "d", inputs, builders,
                    rtol=1e-4, atol=1e-4)


def workloads(quick, smallest):
    return [workload(3)] if smallest else [workload(16)] if quick else [workload(1), workload(16)]
