"""d. examples/detection.py: threshold boxes (boolean_mask, nonzero), MLP refinement, topk with k = min(K, 5).
No batch dim: one row at the example's size (N=200, ~10% confident rows).

    (scores[N,16], boxes[N,4]) -> (boxes[K,4], best[K], classes int64[K], areas[K], kept_index int64[K],
                                   top_scores[k], top_index int64[k])
"""
from __future__ import annotations

import numpy as np

from dyntvm.examples import detection as ex
from dyntvm.examples.plain_numpy import numpy_detection

from . import Workload
from .common import (OnnxGraph, onnx_model, standard_builders)

C, TOP = ex.CLASSES, ex.TOP


def torch_detection(inputs):
    import torch
    W1, b1, W2, b2 = (torch.from_numpy(a) for a in (ex.W1, ex.b1, ex.W2, ex.b2))

    def detection(scores, boxes):
        best = scores.amax(dim=1)
        keep = best > ex.THRESHOLD
        boxes, scores, best = boxes[keep], scores[keep], best[keep]
        kept_index = torch.nonzero(keep)[:, 0]
        feats = torch.cat([scores, boxes], dim=1)
        boxes = boxes + torch.relu(feats @ W1 + b1) @ W2 + b2
        x1, y1, x2, y2 = boxes.unbind(dim=1)
        areas = torch.relu(x2 - x1) * torch.relu(y2 - y1)
        classes = scores.argmax(dim=1)
        top_scores, top_index = torch.topk(best, min(best.shape[0], TOP))
        return boxes, best, classes, areas, kept_index, top_scores, top_index
    return detection, tuple(torch.from_numpy(a) for a in inputs)


def onnx_compress():
    """Compress for the mask, NonZero for the kept rows' indices, TopK with K computed in the graph."""
    from onnx import TensorProto as TP
    g = OnnxGraph()
    i1 = g.const(np.array([1], np.int64))
    best = g.op("ReduceMax", "scores", i1, keepdims=0)
    keep = g.op("Greater", best, g.const(np.array(ex.THRESHOLD, np.float32)))
    boxes, scores = g.op("Compress", "boxes", keep, axis=0), g.op("Compress", "scores", keep, axis=0)
    g.op("Compress", best, keep, axis=0, outputs=["best"])
    g.op("Reshape", g.op("NonZero", keep), g.const(np.array([-1], np.int64)), outputs=["kept_index"])
    feats = g.op("Concat", scores, boxes, axis=1)
    hid = g.op("Relu", g.op("Add", g.op("MatMul", feats, g.const(ex.W1, hint="W1")), g.const(ex.b1, hint="b1")))
    refined = g.op("Add", g.op("Add", boxes, g.op("MatMul", hid, g.const(ex.W2, hint="W2"))),
                   g.const(ex.b2, hint="b2"), outputs=["boxes_out"])
    x1, y1, x2, y2 = g.op("Split", refined, n_out=4, axis=1, num_outputs=4)
    areas = g.op("Mul", g.op("Relu", g.op("Sub", x2, x1)), g.op("Relu", g.op("Sub", y2, y1)))
    g.op("Reshape", areas, g.const(np.array([-1], np.int64)), outputs=["areas"])
    g.op("ArgMax", scores, axis=1, keepdims=0, outputs=["classes"])
    k = g.op("Min", g.op("Shape", "best"), g.const(np.array([TOP], np.int64)))
    g.op("TopK", "best", k, axis=0, largest=1, sorted=1, outputs=["top_scores", "top_index"])
    F32, I64 = TP.FLOAT, TP.INT64
    return onnx_model(g.graph("detection", [("scores", F32, ["N", C]), ("boxes", F32, ["N", 4])],
                              [("boxes_out", F32, ["K", 4]), ("best", F32, ["K"]), ("classes", I64, ["K"]),
                               ("areas", F32, ["K"]), ("kept_index", I64, ["K"]), ("top_scores", F32, ["k"]),
                               ("top_index", I64, ["k"])]))


def workload(N=200):
    inputs = ex.make_inputs(np.random.default_rng(0), N=N)
    builders = standard_builders(inputs, numpy_detection, torch_detection, onnx_compress, ex.detection, ex.EXAMPLE.specs)
    kept = len(numpy_detection(*inputs)[1])
    return Workload(f"ex_detection_N{N}", f"ex. detection N{N} (K={kept})", "d", inputs, builders,
                    exact=(2, 4, 6), rtol=1e-4, atol=1e-4)


def workloads(quick, smallest):
    return [workload(40 if smallest else 200)]
