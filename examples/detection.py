"""Detection post-processing: keep confident boxes (`F.boolean_mask`), then compute on the kept rows.

    fn(scores[N,16], boxes[N,4]) -> (boxes[K,4], scores[K], classes int64[K], areas[K],
                                     kept_index int64[K], top_scores[k], top_index int64[k])

A box is kept when its best class score exceeds THRESHOLD; K (how many) is known only at run time
and may be 0. Kept boxes are refined by a small MLP on [class scores, box]; the best min(K, 5) are
returned by score (`F.topk` with a tensor k).
"""
import numpy as np

import dyntvm as dt
from dyntvm import F

from . import Example

CLASSES, HIDDEN, THRESHOLD, TOP, SEED = 16, 64, 0.5, 5, 2

_rng = np.random.default_rng(SEED)
W1 = (_rng.standard_normal((CLASSES + 4, HIDDEN)) / np.sqrt(CLASSES + 4)).astype(np.float32)
b1 = np.zeros(HIDDEN, np.float32)
W2 = (0.1 * _rng.standard_normal((HIDDEN, 4)) / np.sqrt(HIDDEN)).astype(np.float32)
b2 = np.zeros(4, np.float32)


def detection(scores, boxes):
    best = F.max(scores, axis=1)                                   # [N]
    keep = best > THRESHOLD                                        # bool[N]
    boxes, scores, best = (F.boolean_mask(t, keep) for t in (boxes, scores, best))  # K rows each
    kept_index = F.nonzero(keep)[0]                                # original row of each kept box

    # Refine the kept boxes with an MLP on (class scores, box); boxes are (x1, y1, x2, y2).
    feats = F.concat([scores, boxes], axis=1)                      # [K, CLASSES + 4]
    boxes = boxes + F.matmul(F.relu(F.matmul(feats, W1) + b1), W2) + b2
    x1, y1, x2, y2 = F.split(boxes, 4, axis=1)
    areas = F.reshape(F.relu(x2 - x1) * F.relu(y2 - y1), (-1,))   # [K]
    classes = F.argmax(scores, axis=1)                             # int64[K]

    k = F.minimum(F.shape_of(best)[0], TOP)                        # min(K, TOP): a 0-d tensor
    top_scores, top_index = F.topk(best, k)
    return boxes, best, classes, areas, kept_index, top_scores, top_index


def make_inputs(rng, N=200, keep_fraction=0.1):
    logits = rng.standard_normal((N, CLASSES)).astype(np.float32)
    confident = rng.random(N) < keep_fraction                      # make ~keep_fraction rows peaked
    logits[confident, rng.integers(0, CLASSES, size=int(confident.sum()))] += 6.0
    scores = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    xy = rng.random((N, 2)).astype(np.float32) * 100
    wh = rng.random((N, 2)).astype(np.float32) * 20
    return scores.astype(np.float32), np.concatenate([xy, xy + wh], axis=1)


EXAMPLE = Example(
    name="detection",
    description="detection post-processing: threshold with F.boolean_mask, MLP box refinement and F.topk",
    fn=detection,
    specs=(dt.TensorSpec(("N", CLASSES), name="scores"), dt.TensorSpec(("N", 4), name="boxes")),
    make_inputs=make_inputs,
    sizes={"N": 200},
    test_sizes=({"N": 0}, {"N": 1}, {"N": 1, "keep_fraction": 1.0}, {"N": 50, "keep_fraction": 0.0},
                {"N": 200}, {"N": 1000, "keep_fraction": 0.3}),
)
