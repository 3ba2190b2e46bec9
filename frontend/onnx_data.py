"""The ONNX converters of the indexing ops with data-dependent or mode-dependent forms (`Pad` in its four modes,
`Slice` with computed bounds, `Split`, `Unique`), registered into `onnx_ops.CONVERTERS` like the others."""
from __future__ import annotations

import numpy as np

from ..ir.types import dim_add, dim_floordiv, dim_min, dim_mul, is_static_dim
from . import F
from .shape_values import known_array, known_of
from .tracer import source_hint
from .onnx_ops import INT_MAX, OnnxImportError, _check_size, _const, _ints, _is_const, _rank, _shape, converter

PAD_MODES = ("constant", "edge", "reflect", "wrap")


def _pymod(a, m):
    """Python's ``a % m`` of int64 tensors for m > 0 (a nonnegative result)."""
    r = F.fmod(a, m)
    return F.where(F.less(r, np.int64(0)), r + m, r)


def _pad_index(x, axis: int, lo: int, hi: int, mode: str):
    """The int64 positions of axis `axis` of x that ``np.pad(x, (lo, hi), mode)`` reads, one per position of
    the padded axis: from numpy itself for a static dim, else computed from the run-time size n (edge: clamped
    to [0, n - 1]; wrap: modulo n; reflect: a triangle wave of period 2 (n - 1), so pads longer than the axis
    reflect again, as numpy's do)."""
    n = _shape(x)[axis]
    if isinstance(n, (int, np.integer)):
        if n == 0:
            raise OnnxImportError(f"Pad mode {mode!r} cannot pad axis {axis}: it is empty")
        _check_size((int(n) + lo + hi,), np.int64, f"Pad mode {mode!r}")     # its index vector, made here
        return np.pad(np.arange(n, dtype=np.int64), (lo, hi), mode=mode)
    i = F.arange(0, dim_add(n, lo + hi)) - np.int64(lo)
    size = F.take(F.shape_of(x), np.int64(axis))
    if mode == "edge":
        return F.minimum(F.maximum(i, np.int64(0)), size - np.int64(1))
    if mode == "wrap":
        return _pymod(i, size)
    period = F.maximum((size - np.int64(1)) * np.int64(2), np.int64(1))     # one row reflects onto itself
    m = _pymod(i, period)
    return F.where(F.less(m, size), m, period - m)


def _run_time_pad(x, pads, axes, mode: str, value):
    """Pad with pads computed at run time (torchvision's detectors pad images to a multiple of 32 of sizes that
    depend on the image): per padded axis, a gather of the positions ``arange(lo, n + hi) `` (a run-time length),
    those outside [0, n) taking `value`; a negative pad reads fewer positions, so it crops as Pad's does."""
    if mode != "constant":
        raise OnnxImportError(f"Pad mode {mode!r}: the pads must be known when the model is imported (pads computed "
                              "at run time: only the constant mode)")
    if _rank(pads) != 1 or _shape(pads)[0] != 2 * len(axes):
        raise OnnxImportError(f"Pad: pads of shape {list(_shape(pads))} for {len(axes)} axes (it needs two per axis)")
    known = known_of(pads) or [None] * (2 * len(axes))
    pads = F.astype(pads, "int64")
    for k, ax in enumerate(axes):
        if known[k] == 0 and known[k + len(axes)] == 0:
            continue                                   # an axis known not to be padded
        lo, hi = F.take(pads, np.int64(k)), F.take(pads, np.int64(k + len(axes)))
        size = F.take(F.shape_of(x), np.int64(ax))
        i = F.arange(np.int64(0) - lo, size + hi)
        inside = F.logical_and(F.greater_equal(i, np.int64(0)), F.less(i, size))
        taken = F.take(x, F.minimum(F.maximum(i, np.int64(0)), F.maximum(size - np.int64(1), np.int64(0))), axis=ax)
        shape = tuple(-1 if d == ax else 1 for d in range(_rank(x)))
        x = F.where(F.reshape(inside, shape), taken, np.asarray(value, x.dtype))
    return x


@converter("Pad")
def _pad(ins, a, ctx, env, node):
    x = ins[0]
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in PAD_MODES:
        raise OnnxImportError(f"Pad mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    if ctx.opset < 11:
        pads, value = a.get("pads", a.get("paddings")), a.get("value", 0.0)
    else:
        value = 0 if len(ins) < 3 or ins[2] is None else np.asarray(_const(ins[2], "Pad's constant value",
                                                                          node)).item()
        pads = ins[1] if not _is_const(ins[1]) and known_array(ins[1]) is None else _ints(ins[1], "Pad's pads", node)
    axes = list(range(_rank(x)))
    if len(ins) > 3 and ins[3] is not None:
        axes = [ax % _rank(x) for ax in _ints(ins[3], "Pad's axes", node)]
    n = len(axes)
    if not isinstance(pads, list):
        return _run_time_pad(x, pads, axes, mode, value)
    if len(pads) != 2 * n:
        raise OnnxImportError(f"Pad: {len(pads)} pads for {n} axes (it needs two per axis: all the befores, then "
                              "all the afters)")
    width = [(0, 0)] * _rank(x)
    for k, ax in enumerate(axes):
        width[ax] = (int(pads[k]), int(pads[k + n]))
    if any(p < 0 for w in width for p in w):        # negative pads crop (first, as onnxruntime)
        crop = [ax for ax, (lo, hi) in enumerate(width) if lo < 0 or hi < 0]
        for ax in crop:
            n, cut = _shape(x)[ax], -min(width[ax][0], 0) - min(width[ax][1], 0)
            if isinstance(n, (int, np.integer)) and cut > n:
                raise OnnxImportError(f"Pad: pads {list(pads)} crop {cut} from axis {ax} of size {n}")
        x = F.slice(x, [max(-width[ax][0], 0) for ax in crop], [width[ax][1] if width[ax][1] < 0 else None
                                                                for ax in crop], [1] * len(crop), crop)
        width = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
    if mode == "constant":
        return F.pad(x, tuple(width), value)
    for ax, (lo, hi) in enumerate(width):
        if lo or hi:
            x = F.take(x, _pad_index(x, ax, lo, hi, mode), axis=ax)
    return x


def _slice_axes(axes, n, x) -> list:
    """Slice's axes (default 0 .. n - 1), each in [-rank, rank), none twice, normalized."""
    r = _rank(x)
    axes = list(range(n)) if axes is None else [int(ax) for ax in axes]
    for ax in axes:
        if not -r <= ax < r:
            raise OnnxImportError(f"Slice: axis {ax} is out of range for a rank-{r} tensor")
    axes = [ax % r for ax in axes]
    if len(set(axes)) != len(axes):
        raise OnnxImportError(f"Slice: axes {axes} repeat an axis")
    return axes


def _bound_lengths(node, **bounds):
    """The starts / ends / axes / steps given (known lengths) must have one entry per sliced axis."""
    known = {k: n for k, n in bounds.items() if isinstance(n, int)}
    if len(set(known.values())) > 1:
        raise OnnxImportError("Slice: " + ", ".join(f"{n} {k}" for k, n in known.items()) + " (one of each per "
                              "sliced axis)")


@converter("Slice")
def _slice(ins, a, ctx, env, node):
    x = ins[0]
    if ctx.opset < 10:
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends = ins[1], ins[2]
        axes = ins[3] if len(ins) > 3 and ins[3] is not None else None
        if axes is not None and (_is_const(axes) or known_array(axes) is not None):
            axes = _ints(axes, "Slice's axes", node)
        steps = ins[4] if len(ins) > 4 and ins[4] is not None else None
        if not all(_is_const(v) for v in (starts, ends, steps, axes)):     # computed: a data-dependent slice
            n = _len(axes) if axes is not None else _len(starts)
            if not isinstance(n, int):
                raise OnnxImportError("Slice with computed starts of unknown length and no axes: the sliced axes "
                                      "must be known when the model is imported")
            _bound_lengths(node, starts=_len(starts), ends=_len(ends), axes=n, steps=_len(steps))
            axes = _slice_axes(axes, n, x) if axes is None or _is_const(axes) else F.astype(axes, "int64")
            return F.slice(x, _vec(starts), _vec(ends), [1] * n if steps is None else _vec(steps), axes)
        starts, ends = _ints(starts, "Slice's starts", node), _ints(ends, "Slice's ends", node)
        steps = None if steps is None else _ints(steps, "Slice's steps", node)
    _bound_lengths(node, starts=len(starts), ends=len(ends), axes=None if axes is None else len(axes),
                   steps=None if steps is None else len(steps))
    clamp = lambda v: None if abs(v) >= INT_MAX else v     # noqa: E731
    steps = steps or [1] * len(starts)
    ends = [None if (e <= -INT_MAX and s < 0) else clamp(e) for e, s in zip(ends, steps)]
    return F.slice(x, [clamp(s) for s in starts], ends, steps, _slice_axes(axes, len(starts), x))


def _len(v):
    """The number of entries of a Slice bound (None when not given or not known at import)."""
    if v is None:
        return None
    n = np.size(v) if _is_const(v) else (_shape(v)[0] if _rank(v) == 1 else None)
    return n if isinstance(n, (int, np.integer)) else None


def _vec(v):
    """A Slice bound as a 1-d int64 tensor or array (ONNX takes int32 or int64)."""
    return F.astype(v, "int64") if not _is_const(v) else np.asarray(v, dtype=np.int64).reshape(-1)


@converter("Split")
def _split(ins, a, ctx, env, node):
    x, axis = ins[0], a.get("axis", 0) % _rank(ins[0])
    sizes = a.get("split")
    if len(ins) > 1 and ins[1] is not None:
        sizes = _ints(ins[1], "Split's sizes", node)
    n = len(node.output)
    dim = _shape(x)[axis]
    if sizes is not None:
        return _split_sizes(x, [int(v) for v in sizes], axis, n, dim, node)
    if isinstance(dim, (int, np.integer)):      # chunks of ceil(dim / n); the last smaller, or empty (as ONNX's)
        if int(dim) % n and ctx.opset < 18:
            raise OnnxImportError(f"Split: a dim of {dim} does not split into {n} equal parts (before opset 18)")
        chunk = -(-int(dim) // n)
        return F.split(x, [chunk * k for k in range(1, n)], axis=axis)
    # a symbolic dim: chunk k is positions [min(k c, dim), min((k + 1) c, dim)) with c = ceil(dim / n)
    chunk = dim_floordiv(dim_add(dim, n - 1), n)
    bounds = [0] + [dim_min(dim_mul(chunk, k), dim) for k in range(1, n)] + [dim]
    return [F.take(x, F.arange(lo, hi), axis=axis) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _split_sizes(x, sizes: list, axis: int, n: int, dim, node):
    """Split into parts of the given sizes: one per output, none negative, adding up to the axis' size (checked
    when the model is imported for a static dim; for a symbolic one each part is reshaped to its size, a
    reshape that fails at run time where the dim does not fit)."""
    if len(sizes) != n:
        raise OnnxImportError(f"Split: {len(sizes)} sizes for {n} outputs ({sizes})")
    if any(v < 0 for v in sizes):
        raise OnnxImportError(f"Split: sizes {sizes} has a negative size")
    static = isinstance(dim, (int, np.integer))
    if static and sum(sizes) != dim:
        raise OnnxImportError(f"Split: sizes {sizes} add up to {sum(sizes)}, not the axis' {dim}")
    parts = F.split(x, [int(v) for v in np.cumsum(sizes)[:-1]], axis=axis)
    parts = list(parts) if isinstance(parts, (list, tuple)) else [parts]
    if static or any(is_static_dim(d, 0) for k, d in enumerate(_shape(x)) if k != axis):
        return parts            # (a part with another axis of size 0 would reshape to any size: not checked)
    out = []
    for j, (p, s) in enumerate(zip(parts, sizes)):
        with source_hint(f"ONNX node {node.name or 'Split'!r} (Split): sizes {sizes} along axis {axis} (part {j} "
                         f"must have {s}; a reshape checks it)"):
            out.append(F.reshape(p, tuple(s if k == axis else d for k, d in enumerate(_shape(p)))))
    return out


@converter("Unique")
def _unique(ins, a, ctx, env, node):
    x = ins[0]
    axis = a.get("axis")
    if axis is None:
        x = F.flatten(x)
    outs = list(node.output) + [""] * (4 - len(node.output))
    res = F.unique(x, return_index=bool(outs[1]), return_inverse=bool(outs[2]), return_counts=bool(outs[3]),
                   axis=axis, sorted=bool(a.get("sorted", 1)))
    res = list(res) if isinstance(res, (list, tuple)) else [res]
    return [res.pop(0) if k == 0 or outs[k] else None for k in range(4)]
