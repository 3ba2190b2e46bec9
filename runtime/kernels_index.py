"""Numpy kernels of `ir/ops_index.py`'s ops (`cumsum`, `scatter_flat`, `roi_align`, `nms`), registered by
`kernels.py`. `roi_align` and `nms` follow ONNX's reference (and onnxruntime's CPU kernels) step by step, in the
boxes' dtype: RoiAlign's bilinear taps (a sample outside [-1, size] counts 0; max mode takes the largest of the
four weighted taps), NonMaxSuppression's greedy selection per batch and class (score descending, the lower
index first among equal scores; a box is dropped when its IoU with a kept one is above the threshold)."""
from __future__ import annotations

import numpy as np

from .kernels_shape import allocatable

_AT = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def cumsum(attrs, x):
    return (np.cumsum(x, axis=attrs.axis, dtype=x.dtype),)


def scatter_flat(attrs, data, idx, upd):
    n = data.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)][0]
        raise IndexError(f"scatter: index {bad} is out of range for {n} positions")
    out = data.copy()
    if attrs.reduction == "none":
        out[idx] = upd                      # numpy assigns in order: the last of duplicate indices wins
    else:
        _AT[attrs.reduction].at(out, idx, upd)
    return (out,)


# ------------------------------------------------------------------------------------------------- RoiAlign
def _window(start, bin_size, grid: int, out: int, size: int):
    """The samples of each output bin that can have weights: ``k0[o] + arange(n)`` of the bin's `grid`, every
    sample in [-1, size] among them (with a margin), and whether any sample is left out. An
    adaptive grid follows the box's size, so a huge box (a coordinate of 1e9 from the data) would otherwise
    allocate [out, grid] arrays of billions of samples nearly all outside the image."""
    span = float(bin_size) / grid if grid else 0.0
    if not span > 0 or grid <= (size + 2) / span + 8:
        allocatable((8, out, grid), "float64", "RoiAlign sampling grid")     # (its working arrays)
        return np.zeros(out, np.int64), grid, False
    n = min(grid, int((size + 2) / span) + 8)
    first = (-1.0 - float(start) - np.arange(out) * float(bin_size)) / span - 0.5     # the first k >= -1
    k0 = np.clip(np.floor(first).astype(np.int64) - 3, 0, grid - n)
    return k0, n, n < grid


def _taps(start, bin_size, grid: int, out: int, size: int, dt):
    """The bilinear taps along one axis of the samples of every output bin that `_window` keeps: (low, high,
    w_low, w_high), each of shape [out, n], and whether samples (all outside, weightless) were left out; a
    sample outside [-1, size] has zero weights."""
    k0, n, dropped = _window(start, bin_size, grid, out, size)
    kk = (k0[:, None] + np.arange(n)[None, :]).astype(dt)
    k = np.arange(out, dtype=dt)[:, None] * bin_size + (kk + dt.type(0.5)) * (bin_size / dt.type(grid))
    p = start + k
    outside = (p < -1) | (p > size)
    p = np.maximum(p, dt.type(0))
    low = p.astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    p = np.where(at_end, low.astype(dt), p)
    lw = p - low.astype(dt)
    w_low, w_high = dt.type(1) - lw, lw
    w_low, w_high = np.where(outside, 0, w_low).astype(dt), np.where(outside, 0, w_high).astype(dt)
    return np.clip(low, 0, None), np.clip(high, 0, None), w_low, w_high, dropped


def roi_align(attrs, x, rois, batch):
    a = attrs
    n, c, h, w = x.shape
    oh, ow = int(a.output_height), int(a.output_width)
    r = rois.shape[0]
    if batch.shape[0] != r:
        raise ValueError(f"roi_align: {r} boxes but {batch.shape[0]} batch indices")
    if r and (batch.min() < 0 or batch.max() >= n):
        raise IndexError(f"roi_align: a batch index ({int(batch[(batch < 0) | (batch >= n)][0])}) is out of range "
                         f"for a batch of {n}")
    if not np.all(np.isfinite(rois)):
        raise ValueError("roi_align: every box coordinate must be finite, got " + str(rois[~np.isfinite(rois).all(1)][0]))
    dt = np.dtype(x.dtype)
    out = np.zeros((r, c, oh, ow), dt)
    if not (h and w):
        return (out,)
    offset = dt.type(0.5 if a.half_pixel else 0.0)
    scale = dt.type(a.spatial_scale)
    for k in range(r):
        x0, y0, x1, y1 = (rois[k].astype(dt) * scale - offset)
        rw, rh = x1 - x0, y1 - y0
        if not a.half_pixel:
            rw, rh = max(rw, dt.type(1)), max(rh, dt.type(1))
        bh, bw = rh / dt.type(oh), rw / dt.type(ow)
        gh = int(a.sampling_ratio) or int(np.ceil(rh / dt.type(oh)))
        gw = int(a.sampling_ratio) or int(np.ceil(rw / dt.type(ow)))
        if gh <= 0 or gw <= 0:
            continue                        # an empty (or inverted) box samples nothing: zeros
        yl, yh, wyl, wyh, y_dropped = _taps(y0, bh, gh, oh, h, dt)
        xl, xh, wxl, wxh, x_dropped = _taps(x0, bw, gw, ow, w, dt)
        img = x[int(batch[k])]
        if a.mode == "avg":
            ay = np.zeros((oh, h), dt)       # out = Ay @ img @ Ax^T / count: the taps are separable
            ax = np.zeros((ow, w), dt)
            for o in range(oh):
                np.add.at(ay[o], yl[o], wyl[o])
                np.add.at(ay[o], yh[o], wyh[o])
            for o in range(ow):
                np.add.at(ax[o], xl[o], wxl[o])
                np.add.at(ax[o], xh[o], wxh[o])
            out[k] = (ay @ img @ ax.T) / dt.type(max(gh * gw, 1))
        else:       # max of the four weighted taps of each sample, then of the samples; one output row at a time
            ys = np.stack([yl, yh], -1)          # [oh, gh, 2]
            xs = np.stack([xl, xh], -1)          # [ow, gw, 2]
            wy = np.stack([wyl, wyh], -1)
            wx = np.stack([wxl, wxh], -1)
            for o in range(oh):
                v = img[:, ys[o, :, :, None, None, None], xs[None, None]]       # [c, gh, 2, ow, gw, 2]
                v = v * wy[o][None, :, :, None, None, None] * wx[None, None, None]
                out[k, :, o] = v.max(axis=(5, 2)).max(axis=(1, 3))
            if y_dropped or x_dropped:       # the samples left out weigh 0: a 0 the reference's max sees
                np.maximum(out[k], dt.type(0), out=out[k])
    return (out,)


# -------------------------------------------------------------------------------------- NonMaxSuppression
def _corners(boxes, center: bool):
    """(y_min, x_min, y_max, x_max) of each box."""
    if center:
        xc, yc, bw, bh = boxes.T
        two = boxes.dtype.type(2)
        return yc - bh / two, xc - bw / two, yc + bh / two, xc + bw / two
    return (np.minimum(boxes[:, 0], boxes[:, 2]), np.minimum(boxes[:, 1], boxes[:, 3]),
            np.maximum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 1], boxes[:, 3]))


def _suppresses(corners, i: int, kept: np.ndarray, iou: float) -> bool:
    """Whether box i overlaps any box of `kept` by an IoU above `iou` (ONNX's rule: no overlap, or an empty box,
    never suppresses)."""
    y0, x0, y1, x1 = corners
    iy0, ix0 = np.maximum(y0[kept], y0[i]), np.maximum(x0[kept], x0[i])
    iy1, ix1 = np.minimum(y1[kept], y1[i]), np.minimum(x1[kept], x1[i])
    overlap = (ix1 > ix0) & (iy1 > iy0)
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_i = (x1[i] - x0[i]) * (y1[i] - y0[i])
    area_k = (x1[kept] - x0[kept]) * (y1[kept] - y0[kept])
    union = area_i + area_k - inter
    ok = overlap & (inter > 0) & (area_i > 0) & (area_k > 0) & (union > 0)
    with np.errstate(all="ignore"):
        return bool(np.any(ok & (inter / np.where(ok, union, 1) > iou)))


def nms(attrs, boxes, scores, max_per_class, iou, score):
    b, n = boxes.shape[:2]
    if scores.shape[0] != b or scores.shape[2] != n:
        raise ValueError(f"nms: boxes {boxes.shape} and scores {scores.shape} do not match (batch, boxes)")
    if not 0 <= float(iou) <= 1:        # (NaN included) ONNX's range; onnxruntime refuses the others too
        raise ValueError(f"nms: iou_threshold must be in [0, 1], got {float(iou)}")
    limit = max(int(max_per_class), 0)
    iou, score = boxes.dtype.type(iou), scores.dtype.type(score)
    rows = []
    for bi in range(b):
        corners = _corners(boxes[bi], bool(attrs.center_point_box))
        for ci in range(scores.shape[1]):
            s = scores[bi, ci]
            cand = np.nonzero(s > score)[0] if attrs.score_threshold_given else np.arange(n)
            order = cand[np.argsort(-s[cand], kind="stable")]
            kept: list = []
            for i in order:
                if len(kept) >= limit:
                    break
                if not kept or not _suppresses(corners, int(i), np.asarray(kept), iou):
                    kept.append(int(i))
            rows.extend((bi, ci, i) for i in kept)
    return (np.asarray(rows, np.int64).reshape(-1, 3),)
