"""The ONNX converters of the image and detection ops: DepthToSpace, SpaceToDepth, ConvTranspose (a convolution of
the stride-dilated input with the flipped kernel), RoiAlign and NonMaxSuppression (host ops with numpy kernels,
`ir/ops_index.py`); Resize is in `onnx_resize.py`. Registered into `onnx_ops.CONVERTERS` like the others."""
from __future__ import annotations

import numpy as np

from ..ir.ops_index import NmsAttrs, RoiAlignAttrs
from ..ir.types import dim_floordiv, dim_mul
from . import F
from .onnx_ops import OnnxImportError, _const, _is_const, _rank, _shape, converter
from .onnx_vision import _AUTO_PADS, _per_axis, _spatial
from .ops import apply


def _text(a, name, default) -> str:
    v = a.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def _blocks(x, a, node):
    if _rank(x) != 4:
        raise OnnxImportError(f"{node.op_type} takes data of rank 4 (N, C, H, W), got rank {_rank(x)}")
    b = int(a.get("blocksize", 0))
    if b < 1:
        raise OnnxImportError(f"{node.op_type}: blocksize must be >= 1, got {b}")
    return b


@converter("DepthToSpace")
def _depth_to_space(ins, a, ctx, env, node):
    x = ins[0]
    b = _blocks(x, a, node)
    n, c, h, w = _shape(x)
    if not isinstance(c, (int, np.integer)) or c % (b * b):
        raise OnnxImportError(f"DepthToSpace: {c} channels (a static count is needed) do not split into blocks of "
                              f"{b} x {b}")
    mode = _text(a, "mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise OnnxImportError(f"DepthToSpace: mode must be DCR or CRD, got {mode!r}")
    c2 = c // (b * b)
    if mode == "DCR":
        y = F.transpose(F.reshape(x, (n, b, b, c2, h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = F.transpose(F.reshape(x, (n, c2, b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return F.reshape(y, (n, c2, dim_mul(h, b), dim_mul(w, b)))


@converter("SpaceToDepth")
def _space_to_depth(ins, a, ctx, env, node):
    x = ins[0]
    b = _blocks(x, a, node)
    n, c, h, w = _shape(x)
    for d in (h, w):
        if isinstance(d, (int, np.integer)) and d % b:
            raise OnnxImportError(f"SpaceToDepth: spatial size {d} is not a multiple of blocksize {b}")
    mode = _text(a, "mode", "DCR")              # (opset 28's; before, DCR)
    if mode not in ("DCR", "CRD"):
        raise OnnxImportError(f"SpaceToDepth: mode must be DCR or CRD, got {mode!r}")
    hb, wb = dim_floordiv(h, b), dim_floordiv(w, b)       # (a symbolic size that is no multiple: the reshape fails)
    y = F.transpose(F.reshape(x, (n, c, hb, b, wb, b)), (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4))
    return F.reshape(y, (n, dim_mul(c, b * b), hb, wb))


# ---------------------------------------------------------------------------------------------- ConvTranspose
def _dilate(x, axis: int, s: int):
    """x with s - 1 zeros between neighbours along `axis` (size (n - 1) s + 1)."""
    if s == 1:
        return x
    r = _rank(x)
    y = F.pad(F.expand_dims(x, axis + 1), tuple((0, s - 1) if k == axis + 1 else (0, 0) for k in range(r + 1)), 0)
    shape = _shape(y)
    y = F.reshape(y, shape[:axis] + (dim_mul(shape[axis], s),) + shape[axis + 2:])
    return F.slice(y, [0], [-(s - 1)], [1], [axis])


def _transpose_pads(a, x, kernel, strides, dilations, out_pad, node) -> list:
    """(begin, end) padding per spatial axis: `pads`, or from `output_shape` / `auto_pad` (ONNX's formulas)."""
    nsp = len(kernel)
    auto = _text(a, "auto_pad", "NOTSET")
    if auto not in _AUTO_PADS:
        raise OnnxImportError(f"ConvTranspose: unknown auto_pad {auto!r} (one of {', '.join(_AUTO_PADS)})")
    out_shape = a.get("output_shape")
    if out_shape is None and auto in ("NOTSET", "VALID"):
        p = [int(v) for v in a.get("pads", [0] * 2 * nsp)] if auto == "NOTSET" else [0] * 2 * nsp
        if len(p) != 2 * nsp:
            raise OnnxImportError(f"ConvTranspose: pads {p} needs a begin and an end per spatial axis ({2 * nsp})")
        if min(p) < 0:
            raise OnnxImportError(f"ConvTranspose: pads {p} must not be negative")
        return list(zip(p[:nsp], p[nsp:]))
    spatial = _shape(x)[2:]
    if not all(isinstance(d, (int, np.integer)) for d in spatial):
        raise OnnxImportError(f"ConvTranspose with output_shape / auto_pad {auto} over the symbolic spatial dims "
                              f"{spatial}: the padding depends on the size; give it with input_shapes=")
    if out_shape is not None:
        out_shape = [int(v) for v in out_shape][-nsp:]
    else:
        out_shape = [int(n) * s for n, s in zip(spatial, strides)]
    pads = []
    for n, k, s, d, op, o in zip(spatial, kernel, strides, dilations, out_pad, out_shape):
        total = s * (int(n) - 1) + op + (k - 1) * d + 1 - o       # negative: the output grows (a negative pad)
        pads.append((total // 2, total - total // 2) if auto == "SAME_UPPER" else (total - total // 2, total // 2))
    return pads


@converter("ConvTranspose")
def _conv_transpose(ins, a, ctx, env, node):
    x, w = ins[:2]
    bias = ins[2] if len(ins) > 2 else None
    nsp = _spatial(x, node)
    if _rank(w) != nsp + 2 or not all(isinstance(d, (int, np.integer)) for d in _shape(w)):
        raise OnnxImportError(f"ConvTranspose: the weight {_shape(w)} must be static, of rank {nsp + 2}")
    g = int(a.get("group", 1))
    cin, mg, *kernel = (int(d) for d in _shape(w))
    if "kernel_shape" in a and [int(k) for k in a["kernel_shape"]] != kernel:
        raise OnnxImportError(f"ConvTranspose: kernel_shape {list(a['kernel_shape'])} differs from the weight's "
                              f"{kernel}")
    if g < 1 or cin % g:
        raise OnnxImportError(f"ConvTranspose: {cin} input channels do not split into {g} groups")
    strides = _per_axis(a, "strides", nsp, 1, node)
    dilations = _per_axis(a, "dilations", nsp, 1, node)
    out_pad = _per_axis(a, "output_padding", nsp, 0, node)
    if any(not 0 <= op < max(s, d) for op, s, d in zip(out_pad, strides, dilations)):
        raise OnnxImportError(f"ConvTranspose: output_padding {out_pad} must be >= 0 and less than the stride (or "
                              f"the dilation, if larger) on each axis: strides {strides}, dilations {dilations}")
    pads = _transpose_pads(a, x, kernel, strides, dilations, out_pad, node)
    # the weight as a convolution's: [C, M / g, K] -> per group transposed -> [M, C / g, K], the kernel flipped
    flip = (slice(None), slice(None)) + (slice(None, None, -1),) * nsp
    if _is_const(w):
        wt = np.asarray(w)[flip].reshape(g, cin // g, mg, *kernel).swapaxes(1, 2).reshape(g * mg, cin // g, *kernel)
    else:
        wt = F.slice(w, [None] * nsp, [None] * nsp, [-1] * nsp, list(range(2, nsp + 2)))
        wt = F.reshape(F.transpose(F.reshape(wt, (g, cin // g, mg, *kernel)), (0, 2, 1) + tuple(range(3, nsp + 3))),
                       (g * mg, cin // g, *kernel))
    y = x
    width = []
    for i, (s, k, d, (lo, hi), op) in enumerate(zip(strides, kernel, dilations, pads, out_pad)):
        y = _dilate(y, 2 + i, s)
        width.append((d * (k - 1) - lo, d * (k - 1) - hi + op))
    if any(p < 0 for w_ in width for p in w_):          # pads beyond the kernel's reach crop the output
        crop = [i for i, (lo, hi) in enumerate(width) if lo < 0 or hi < 0]
        y = F.slice(y, [max(-width[i][0], 0) for i in crop], [width[i][1] if width[i][1] < 0 else None for i in crop],
                    [1] * len(crop), [2 + i for i in crop])
        width = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
    y = F.pad(y, ((0, 0), (0, 0)) + tuple(width), 0) if any(p for w_ in width for p in w_) else y
    return F.conv(y, wt, bias, stride=1, padding=0, dilation=dilations, groups=g)


# ------------------------------------------------------------------------------------------- RoiAlign, NMS
def _scalar(v, dtype, default, what, node):
    """An optional 1-element input as a 0-d value (`default` where it is not given)."""
    if v is None:
        return np.asarray(default, dtype)
    if _is_const(v):
        arr = np.asarray(_const(v, what, node))
        if arr.size == 0:
            return np.asarray(default, dtype)
        if arr.size != 1:
            raise OnnxImportError(f"{node.op_type}: {what} must have one element, got shape {arr.shape}")
        return arr.reshape(()).astype(dtype)
    t = F.reshape(v, ())
    return t if np.dtype(t.dtype) == np.dtype(dtype) else F.astype(t, np.dtype(dtype).name)


@converter("RoiAlign")
def _roi_align(ins, a, ctx, env, node):
    x, rois, batch = ins
    mode = _text(a, "mode", "avg")
    ctm = _text(a, "coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise OnnxImportError(f"RoiAlign: coordinate_transformation_mode must be half_pixel or output_half_pixel, "
                              f"got {ctm!r}")
    try:
        attrs = RoiAlignAttrs(int(a.get("output_height", 1)), int(a.get("output_width", 1)),
                              int(a.get("sampling_ratio", 0)), float(a.get("spatial_scale", 1.0)), mode,
                              ctm == "half_pixel")
    except ValueError as e:
        raise OnnxImportError(f"RoiAlign: {e}") from None
    if _rank(x) != 4 or _rank(rois) != 2 or _rank(batch) != 1:
        raise OnnxImportError(f"RoiAlign takes X [N, C, H, W], rois [R, 4] and batch_indices [R], got shapes "
                              f"{_shape(x)}, {_shape(rois)}, {_shape(batch)}")
    return apply("RoiAlign", "roi_align", [x, rois, batch], attrs)[0]


@converter("NonMaxSuppression")
def _nms(ins, a, ctx, env, node):
    boxes, scores = ins[:2]
    rest = list(ins[2:]) + [None] * (5 - len(ins))
    if _rank(boxes) != 3 or _rank(scores) != 3:
        raise OnnxImportError(f"NonMaxSuppression takes boxes [batch, n, 4] and scores [batch, classes, n], got "
                              f"shapes {_shape(boxes)}, {_shape(scores)}")
    center = int(a.get("center_point_box", 0))
    if center not in (0, 1):
        raise OnnxImportError(f"NonMaxSuppression: center_point_box must be 0 or 1, got {center}")
    limit = _scalar(rest[0], np.int64, 0, "max_output_boxes_per_class", node)
    iou = _scalar(rest[1], boxes.dtype, 0, "iou_threshold", node)
    given = rest[2] is not None and not (_is_const(rest[2]) and np.size(rest[2]) == 0)
    score = _scalar(rest[2], scores.dtype, 0, "score_threshold", node)
    return apply("NonMaxSuppression", "nms", [boxes, scores, limit, iou, score], NmsAttrs(bool(center), given))[0]
