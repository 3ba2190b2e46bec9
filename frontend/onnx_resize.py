"""The ONNX Resize converter (opset 11 on): nearest (its four rounding modes), linear and cubic interpolation, every
coordinate_transformation_mode, output sizes from `scales` or `sizes` (constant, or a shape vector whose entries
are known at import: the `Shape -> Slice -> Concat` chains exporters emit for `interpolate(size=...)`), `axes`,
`keep_aspect_ratio_policy`, `exclude_outside`, `cubic_coeff_a`, `extrapolation_value`.

Separable, one axis at a time as ONNX's reference: each output position's source coordinate (float64, the
reference's arithmetic) gives its taps (1 nearest, 2 linear, 4 cubic; clamped to the axis, the reference's edge
padding) and their weights; the axis is then ``sum_j w_j * take(x, tap_j)``. Every step is a `dyntvm.F` op, so
symbolic sizes compile to one static region. Sizes computed from data (not known at import) give the resized
axes a run-time length (a data-dependent `arange`). Not supported (OnnxImportError): `antialias`, scales computed
from the inputs, scales that are no simple fraction on a symbolic axis."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..ir.types import dim_floordiv, dim_mul, is_static_dim, same_dim
from . import F
from .onnx_image import _text
from .onnx_ops import OnnxImportError, _const, _is_const, _rank, _shape, converter
from .shape_values import as_dim, known_of

MODES = ("nearest", "linear", "cubic")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_crop_and_resize")


def _given(v) -> bool:
    return v is not None and not (_is_const(v) and np.size(v) == 0)


def _scaled_dim(n, s: float, axis: int):
    """floor(n * s) as a dim: exact for a static n; for a symbolic one where s is a simple fraction p / q."""
    if is_static_dim(n):
        return int(np.floor(np.float64(n) * np.float64(s)))
    f = Fraction(s).limit_denominator(64)
    if float(f) != s:
        raise OnnxImportError(f"Resize: scale {s} on axis {axis} of symbolic size {n!r}: dyntvm sizes the output "
                              "when the model is imported, which needs an integer scale or a simple fraction; give "
                              "sizes, or the input's size with input_shapes=")
    return dim_floordiv(dim_mul(n, f.numerator), f.denominator) if f.denominator != 1 else dim_mul(n, f.numerator)


def _plan(x, ins, a, ctx, node):
    """(axes, output dims, scales): per resized axis its output dim and its scale (a float, or None where the
    scale is output / input at run time: sizes on a symbolic axis)."""
    r = _rank(x)
    axes = [int(v) % r for v in a.get("axes", range(r))]
    if len(set(axes)) != len(axes):
        raise OnnxImportError(f"Resize: axes {list(a['axes'])} repeat an axis")
    roi, scales, sizes = (list(ins[1:4]) + [None] * 3)[:3]
    if _given(scales) == _given(sizes):
        raise OnnxImportError("Resize needs exactly one of scales and sizes")
    dims = _shape(x)
    if _given(scales):
        s = [float(v) for v in np.asarray(_const(scales, "Resize's scales", node)).reshape(-1)]
        if len(s) != len(axes):
            raise OnnxImportError(f"Resize: {len(s)} scales for {len(axes)} axes")
        if any(not v > 0 for v in s):
            raise OnnxImportError(f"Resize: scales {s} must be positive")
        return axes, [_scaled_dim(dims[ax], v, ax) for ax, v in zip(axes, s)], s
    entries = np.asarray(sizes).reshape(-1).tolist() if _is_const(sizes) else known_of(sizes)
    policy = _text(a, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise OnnxImportError(f"Resize: keep_aspect_ratio_policy must be stretch, not_larger or not_smaller, got "
                              f"{policy!r}")
    if entries is None or any(as_dim(e) is None for e in entries):
        if _text(a, "mode", "nearest") == "nearest":
            # its kernel fails TVM's build (a division by zero in its bound analysis); linear / cubic build
            raise OnnxImportError("Resize: with mode nearest the sizes must be known when the model is imported "
                                  "(sizes computed at run time: modes linear and cubic only)")
        return axes, _data_sizes(sizes, axes, policy), [None] * len(axes)
    out = [as_dim(e) for e in entries]
    if len(out) != len(axes):
        raise OnnxImportError(f"Resize: {len(out)} sizes for {len(axes)} axes")
    if policy == "stretch":
        return axes, out, [None] * len(axes)
    if not all(is_static_dim(d) for d in out) or not all(is_static_dim(dims[ax]) for ax in axes):
        raise OnnxImportError(f"Resize: keep_aspect_ratio_policy {policy} needs static sizes and input dims")
    ratios = [o / dims[ax] for o, ax in zip(out, axes)]
    s = min(ratios) if policy == "not_larger" else max(ratios)
    return axes, [int(s * dims[ax] + 0.5) for ax in axes], [s] * len(axes)


def _data_sizes(sizes, axes, policy) -> list:
    """Sizes computed from data (torchvision's detectors size their input from float arithmetic on its shape):
    per axis a scalar int64 tensor, so the axis gets a run-time length (a data-dependent `arange`)."""
    if policy != "stretch":
        raise OnnxImportError(f"Resize: with keep_aspect_ratio_policy {policy} the sizes must be known when the "
                              "model is imported (sizes computed at run time: stretch only)")
    if _rank(sizes) != 1 or _shape(sizes)[0] != len(axes):
        raise OnnxImportError(f"Resize: sizes of shape {list(_shape(sizes))} for {len(axes)} axes")
    sizes = F.astype(sizes, "int64")
    return [_RunTimeSize(F.take(sizes, np.int64(k))) for k in range(len(axes))]


class _RunTimeSize:
    """An output size known only at run time: a scalar int64 tensor (never equal to an input dim at import)."""
    def __init__(self, tensor):
        self.tensor = tensor


def _f64(v):
    return np.float64(v) if is_static_dim(v) else F.astype(v, "float64")


def _size(x, axis: int):
    d = _shape(x)[axis]
    return np.int64(d) if is_static_dim(d) else F.take(F.shape_of(x), np.int64(axis))


def _coords(mode: str, y, n, o, scale, roi):
    """Source coordinates (float64) of output positions y (float64) for an input size n, an output size o and a
    scale (float64 scalars or tensors); `roi` (lo, hi) for tf_crop_and_resize. Returns (x, extrapolated mask)."""
    if mode == "asymmetric":
        return y / scale, None
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    width = scale * n                                          # the reference's "output_width": a float
    if mode == "half_pixel_symmetric":
        offset = (n / 2.0) * (1.0 - o / width)
        return offset + (y + 0.5) / scale - 0.5, None
    one = F.equal(width, np.float64(1))                        # a one-position output: the mode's fixed point
    den = F.where(one, np.float64(1), width - np.float64(1))
    if mode == "pytorch_half_pixel":
        return F.where(one, F.full_like(y, -0.5), (y + 0.5) / scale - 0.5), None
    if mode == "align_corners":
        return F.where(one, F.full_like(y, 0.0), y * (n - 1.0) / den), None
    lo, hi = roi
    xo = F.where(one, F.full_like(y, 0.0) + (hi - lo) * (n - 1.0) / 2.0, y * (hi - lo) * (n - 1.0) / den)
    xo = xo + lo * (n - 1.0)
    return xo, F.logical_or(F.less(xo, np.float64(0)), F.greater(xo, n - 1.0))


def _cubic(t, A: float):
    """The cubic convolution weights of the four taps floor(x) - 1 .. floor(x) + 2 at fraction t (float64)."""
    def near(d):          # |d| <= 1
        return ((A + 2) * d - (A + 3)) * d * d + 1
    def far(d):           # 1 < |d| < 2
        return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A
    one = np.float64(1)
    return [far(t + one), near(t), near(one - t), far(2.0 - t)]


def _resize_axis(x, axis: int, o, scale, a, roi, work: str):
    """x resized along `axis` to o positions."""
    mode = _text(a, "mode", "nearest")
    ctm = _text(a, "coordinate_transformation_mode", "half_pixel")
    n_t = _f64(_size(x, axis))
    run_time = isinstance(o, _RunTimeSize)
    y = F.astype(F.arange(0, o.tensor if run_time else o), "float64")
    o_t = _f64(o) if not run_time and is_static_dim(o) else F.astype(F.reshape(F.shape_of(y), ()), "float64")
    if run_time:
        o = -1                                     # in the reshapes below: the length of y
    s_t = np.float64(scale) if scale is not None else o_t / n_t
    xo, outside = _coords(ctm, y, n_t, o_t, s_t, roi)
    last = _size(x, axis) - np.int64(1)
    fl = F.floor(xo)
    if mode == "nearest":
        t = xo - fl
        nm = _text(a, "nearest_mode", "round_prefer_floor")
        idx = F.astype(fl, "int64")
        if nm != "floor":               # round up from above one half (prefer floor), at it (ceil), above 0 (ceil)
            up = F.greater_equal(t, np.float64(0.5)) if nm == "round_prefer_ceil" else \
                F.greater(t, np.float64(0.5 if nm == "round_prefer_floor" else 0))
            idx = idx + F.astype(up, "int64")
        out = F.take(x, F.minimum(F.maximum(idx, np.int64(0)), last), axis=axis)
    else:
        t = xo - fl
        base = F.astype(fl, "int64")
        if mode == "linear":
            taps, weights = [base, base + np.int64(1)], [np.float64(1) - t, t]
        else:
            taps = [base + np.int64(k) for k in (-1, 0, 1, 2)]
            weights = _cubic(t, float(a.get("cubic_coeff_a", -0.75)))
        if a.get("exclude_outside", 0):
            inside = [F.logical_and(F.greater_equal(i, np.int64(0)), F.less_equal(i, last)) for i in taps]
            weights = [F.where(m, w, np.float64(0)) for m, w in zip(inside, weights)]
            total = weights[0]
            for w in weights[1:]:
                total = total + w
            total = F.where(F.equal(total, np.float64(0)), np.float64(1), total)
            weights = [w / total for w in weights]
        shape = tuple(o if k == axis else 1 for k in range(_rank(x)))
        out = None
        for i, w in zip(taps, weights):
            term = F.take(x, F.minimum(F.maximum(i, np.int64(0)), last), axis=axis) * \
                F.reshape(F.astype(w, work), shape)
            out = term if out is None else out + term
    if outside is not None:
        shape = tuple(o if k == axis else 1 for k in range(_rank(x)))
        out = F.where(F.reshape(outside, shape), np.asarray(a.get("extrapolation_value", 0.0), out.dtype), out)
    return out


@converter("Resize")
def _resize(ins, a, ctx, env, node):
    x = ins[0]
    if ctx.opset < 11:
        raise OnnxImportError("Resize before opset 11 (its own coordinate rules) is not supported")
    mode, ctm = _text(a, "mode", "nearest"), _text(a, "coordinate_transformation_mode", "half_pixel")
    if mode not in MODES or ctm not in TRANSFORMS or _text(a, "nearest_mode", "round_prefer_floor") not in NEAREST:
        raise OnnxImportError(f"Resize: mode {mode!r} / coordinate_transformation_mode {ctm!r} / nearest_mode "
                              f"{_text(a, 'nearest_mode', 'round_prefer_floor')!r}: one of {MODES}, {TRANSFORMS}, "
                              f"{NEAREST}")
    if a.get("antialias", 0):
        raise OnnxImportError("Resize with antialias=1 is not supported")
    dtype = np.dtype(x.dtype)
    if mode != "nearest" and dtype.kind != "f":
        raise OnnxImportError(f"Resize mode {mode} of {dtype.name} data: float data only (nearest takes any dtype)")
    axes, outs, scales = _plan(x, ins, a, ctx, node)
    r = _rank(x)
    roi = None
    if ctm == "tf_crop_and_resize":
        if not _given(ins[1]):
            raise OnnxImportError("Resize: tf_crop_and_resize needs the roi input")
        rv = [float(v) for v in np.asarray(_const(ins[1], "Resize's roi", node)).reshape(-1)]
        if len(rv) not in (2 * r, 2 * len(axes)):
            raise OnnxImportError(f"Resize: roi of {len(rv)} entries, expected 2 per axis")
        k = len(rv) // 2
        pos = list(range(r)) if k == r else axes
        roi = {ax: (rv[pos.index(ax)], rv[k + pos.index(ax)]) for ax in axes}
    work = "float64" if dtype == np.float64 else "float32"
    y = x if mode == "nearest" or dtype.name == work else F.astype(x, work)
    for ax, o, s in zip(axes, outs, scales):
        trivial = roi is None or roi[ax] == (0.0, 1.0)
        if not isinstance(o, _RunTimeSize) and same_dim(o, _shape(x)[ax]) and (s is None or s == 1.0) and trivial:
            continue                                 # the reference skips an axis it does not resize
        y = _resize_axis(y, ax, o, s, a, None if roi is None else tuple(np.float64(v) for v in roi[ax]), work)
    if y.dtype != dtype:
        y = F.astype(y, dtype.name)
    return y
