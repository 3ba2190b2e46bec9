"""Registry entries of the ops the ONNX index, scan and detection converters need that no composition of the other
ops computes exactly (`frontend/onnx_index.py`, `frontend/onnx_image.py`):

* ``cumsum(x, axis)``: `np.cumsum` along one axis in x's dtype (static: a Relax ``cumsum``).
* ``scatter_flat(data [n], indices [m], updates [m], reduction)``: a copy of 1-d `data` with ``data[indices[j]]``
  replaced by (``"none"``) or combined with (``"add"``, ``"mul"``, ``"max"``, ``"min"``) ``updates[j]``, in order
  of j (a duplicate index with ``"none"``: the last update wins). Indices must be in [0, n). ONNX's
  ScatterElements and ScatterND flatten to it (the converters compute the flat positions, checked per axis).
* ``roi_align(x [N, C, H, W], rois [R, 4], batch [R]) -> [R, C, oh, ow]`` and
  ``nms(boxes [B, n, 4], scores [B, c, n], max_per_class [], iou [], score []) -> [k, 3]``: ONNX's RoiAlign and
  NonMaxSuppression. Host ops (DYNAMIC_SHAPE: the executor runs their numpy kernels, `runtime/kernels_index.py`):
  RoiAlign's adaptive sampling ratio reads a box's size, and NonMaxSuppression's row count depends on the data.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attrs import AxisAttrs
from .ops import DYNAMIC_SHAPE, register
from .shapes import ShapeError, norm_axis, unify_dims
from .types import TensorType, fresh_dim

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")
ROI_ALIGN_MODES = ("avg", "max")


@dataclass(frozen=True)
class ScatterAttrs:
    reduction: str = "none"

    def __post_init__(self):
        if self.reduction not in SCATTER_REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(SCATTER_REDUCTIONS)}, got {self.reduction!r}")


@dataclass(frozen=True)
class RoiAlignAttrs:
    output_height: int = 1
    output_width: int = 1
    sampling_ratio: int = 0          # 0: adaptive, ceil(roi size / output size) per roi
    spatial_scale: float = 1.0
    mode: str = "avg"
    half_pixel: bool = True          # coordinate_transformation_mode half_pixel (opset 16's default)

    def __post_init__(self):
        if self.mode not in ROI_ALIGN_MODES:
            raise ValueError(f"mode must be one of {', '.join(ROI_ALIGN_MODES)}, got {self.mode!r}")
        if int(self.output_height) < 1 or int(self.output_width) < 1 or int(self.sampling_ratio) < 0:
            raise ValueError(f"output sizes must be >= 1 and sampling_ratio >= 0, got {self.output_height}, "
                             f"{self.output_width}, {self.sampling_ratio}")


@dataclass(frozen=True)
class NmsAttrs:
    center_point_box: bool = False   # boxes as (x_center, y_center, width, height), else two corners (y1, x1, y2, x2)
    score_threshold_given: bool = False     # else every box is a candidate (the score input is not read)


def _cumsum(ts, a):
    x = ts[0]
    norm_axis(a.axis, x.ndim)
    if x.dtype == "bool":
        raise ShapeError("cumsum of bools (cast first)")
    return [x]


register("cumsum", AxisAttrs, _cumsum, num_inputs=1, api="cumsum",
         doc="`np.cumsum(x, axis, dtype=x.dtype)`: running sums along one axis, in x's dtype.")


def _scatter_flat(ts, a):
    data, idx, upd = ts
    if data.ndim != 1 or idx.ndim != 1 or upd.ndim != 1:
        raise ShapeError(f"scatter_flat takes 1-d data, indices and updates, got {data}, {idx}, {upd}")
    if idx.dtype != "int64":
        raise ShapeError(f"indices must be int64, got {idx.dtype}")
    if upd.dtype != data.dtype:
        raise ShapeError(f"updates ({upd.dtype}) must have the data's dtype ({data.dtype})")
    unify_dims(idx.shape[0], upd.shape[0], "scatter_flat")
    if a.reduction != "none" and data.dtype == "bool":
        raise ShapeError(f"reduction {a.reduction!r} of bools")
    return [data]


register("scatter_flat", ScatterAttrs, _scatter_flat, num_inputs=3)


def _roi_align(ts, a):
    x, rois, batch = ts
    if x.ndim != 4 or rois.ndim != 2 or batch.ndim != 1:
        raise ShapeError(f"roi_align takes x [N, C, H, W], rois [R, 4] and batch indices [R], got {x}, {rois}, "
                         f"{batch}")
    if np.dtype(x.dtype).kind != "f" or rois.dtype != x.dtype:
        raise ShapeError(f"roi_align takes float x and rois of the same dtype, got {x.dtype}, {rois.dtype}")
    if np.dtype(batch.dtype).kind not in "iu":
        raise ShapeError(f"batch indices must be integers, got {batch.dtype}")
    unify_dims(rois.shape[1], 4, "roi_align's boxes")
    r = unify_dims(rois.shape[0], batch.shape[0], "roi_align (rois and batch indices)")
    return [TensorType((r, x.shape[1], int(a.output_height), int(a.output_width)), x.dtype)]


register("roi_align", RoiAlignAttrs, _roi_align, kind=DYNAMIC_SHAPE, num_inputs=3)


def _nms(ts, a):
    boxes, scores = ts[:2]
    if boxes.ndim != 3 or scores.ndim != 3:
        raise ShapeError(f"nms takes boxes [B, n, 4] and scores [B, classes, n], got {boxes}, {scores}")
    unify_dims(boxes.shape[2], 4, "nms boxes")
    unify_dims(boxes.shape[0], scores.shape[0], "nms batch")
    unify_dims(boxes.shape[1], scores.shape[2], "nms boxes and scores")
    for what, t in zip(("max_output_boxes_per_class", "iou_threshold", "score_threshold"), ts[2:]):
        if t.ndim != 0:
            raise ShapeError(f"nms {what} must be 0-d, got {t}")
    return [TensorType((fresh_dim(), 3), "int64")]


register("nms", NmsAttrs, _nms, kind=DYNAMIC_SHAPE, num_inputs=5)
