"""Attrs: one frozen dataclass per kind of op parameters, and their JSON codec.

Attrs normalise what they are given in ``__post_init__`` (an int axis becomes a 1-tuple, a dtype its numpy
name), so a frontend can build them straight from user arguments and a graph read back from JSON compares
equal to the one written. Normalising is idempotent.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np


def _set(obj, **kv):
    for k, v in kv.items():
        object.__setattr__(obj, k, v)


def _int(v, what="axis") -> int:
    """An integer argument (numpy's rule: anything with __index__, but not a bool or a float)."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {v!r}") from None


def _bool(v, what) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{what} must be a bool, got {v!r}")
    return bool(v)


def _int_tuple(v, what="axis"):
    if v is None:
        return None
    if np.ndim(v) == 0:
        return (_int(v, what),)
    return tuple(_int(x, what) for x in v)


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True, eq=False)
class ConstantAttrs:
    value: np.ndarray


@dataclass(frozen=True)
class ReduceAttrs:
    axis: tuple | None = None
    keepdims: bool = False

    def __post_init__(self):
        _set(self, axis=_int_tuple(self.axis), keepdims=_bool(self.keepdims, "keepdims"))


@dataclass(frozen=True)
class ArgReduceAttrs:
    axis: int | None = None
    keepdims: bool = False

    def __post_init__(self):
        _set(self, axis=None if self.axis is None else _int(self.axis), keepdims=_bool(self.keepdims, "keepdims"))


@dataclass(frozen=True)
class ShapeAttrs:
    """A target shape (reshape, broadcast_to): ints, -1 (reshape only) or symbolic dims."""
    shape: tuple


@dataclass(frozen=True)
class TransposeAttrs:
    axes: tuple | None = None

    def __post_init__(self):
        _set(self, axes=_int_tuple(self.axes, "axes"))


@dataclass(frozen=True)
class AxisAttrs:
    axis: int = 0

    def __post_init__(self):
        _set(self, axis=_int(self.axis))


@dataclass(frozen=True)
class AxesAttrs:
    axis: tuple | None = None

    def __post_init__(self):
        _set(self, axis=_int_tuple(self.axis))


@dataclass(frozen=True)
class SplitAttrs:
    sections: Any            # int (equal parts) or tuple of split indices
    axis: int = 0

    def __post_init__(self):
        sec = self.sections
        _set(self, sections=_int(sec, "sections") if np.ndim(sec) == 0 else _int_tuple(sec, "sections"),
             axis=_int(self.axis))


@dataclass(frozen=True)
class SliceAttrs:
    axes: tuple
    starts: tuple            # int or None per axis
    stops: tuple
    steps: tuple


@dataclass(frozen=True)
class TileAttrs:
    reps: tuple

    def __post_init__(self):
        _set(self, reps=_int_tuple(self.reps, "reps"))


@dataclass(frozen=True)
class PadAttrs:
    pad_width: tuple         # ((before, after), ...) per axis
    value: float = 0.0


def _positive_ints(v, what) -> tuple:
    out = _int_tuple(v, what)
    if not out or any(x < 1 for x in out):
        raise ValueError(f"{what} must be integers >= 1, one per spatial axis, got {v!r}")
    return out


def _pad_pairs(v) -> tuple:
    """((lo, hi), ...) per spatial axis, each >= 0."""
    try:
        pairs = tuple((_int(lo, "pads"), _int(hi, "pads")) for lo, hi in v)
    except (TypeError, ValueError):
        raise TypeError(f"pads must be one (before, after) pair of integers per spatial axis, got {v!r}") from None
    if any(x < 0 for p in pairs for x in p):
        raise ValueError(f"pads must be >= 0, got {v!r}")
    return pairs


def _same_lengths(obj, names):
    lens = {n: len(getattr(obj, n)) for n in names}
    if len(set(lens.values())) != 1 or not 1 <= next(iter(lens.values())) <= 3:
        raise ValueError("strides, dilations and pads (and the kernel size) need one entry per spatial axis, 1 to "
                         f"3 axes; got {', '.join(f'{n}={getattr(obj, n)}' for n in names)}")


@dataclass(frozen=True)
class ConvAttrs:
    """`conv` over the spatial axes of NC<spatial> data (1 to 3 axes): per axis a stride, a dilation and
    (before, after) zero padding; `groups` splits the channels (groups == channels: depthwise)."""
    strides: tuple
    dilations: tuple
    pads: tuple
    groups: int = 1

    def __post_init__(self):
        _set(self, strides=_positive_ints(self.strides, "strides"), dilations=_positive_ints(self.dilations, "dilations"),
             pads=_pad_pairs(self.pads), groups=_int(self.groups, "groups"))
        if self.groups < 1:
            raise ValueError(f"groups must be >= 1, got {self.groups}")
        _same_lengths(self, ("strides", "dilations", "pads"))


@dataclass(frozen=True)
class PoolAttrs:
    """`max_pool` / `avg_pool` windows over the spatial axes of NC<spatial> data: per axis a kernel size, a
    stride, a dilation and (before, after) padding (never part of a max; counted in an average only with
    `count_include_pad`). `ceil_mode` rounds the output size up, but a window must start inside the input or
    its before-padding (ONNX's and PyTorch's rule)."""
    kernel: tuple
    strides: tuple
    dilations: tuple
    pads: tuple
    ceil_mode: bool = False
    count_include_pad: bool = False

    def __post_init__(self):
        _set(self, kernel=_positive_ints(self.kernel, "kernel_size"), strides=_positive_ints(self.strides, "strides"),
             dilations=_positive_ints(self.dilations, "dilations"), pads=_pad_pairs(self.pads),
             ceil_mode=_bool(self.ceil_mode, "ceil_mode"),
             count_include_pad=_bool(self.count_include_pad, "count_include_pad"))
        _same_lengths(self, ("kernel", "strides", "dilations", "pads"))


@dataclass(frozen=True)
class DtypeAttrs:
    """A result dtype (cast, arange_dyn), as its numpy name."""
    dtype: str

    def __post_init__(self):
        from .types import normalize_dtype
        _set(self, dtype=normalize_dtype(self.dtype))


@dataclass(frozen=True)
class LayerNormAttrs:
    eps: float = 1e-5

    def __post_init__(self):
        _set(self, eps=float(self.eps))


@dataclass(frozen=True)
class ClipAttrs:
    """Scalar bounds of `clip`; None leaves that side open."""
    a_min: float | int | None = None
    a_max: float | int | None = None

    def __post_init__(self):
        for name in ("a_min", "a_max"):
            v = getattr(self, name)
            if isinstance(v, (np.generic, np.ndarray)) and np.size(v) == 1:
                v = v.item()
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise TypeError(f"{name} must be a Python or numpy scalar or None, got {v!r}")
            if isinstance(v, float) and np.isnan(v):
                raise ValueError(f"{name} must not be NaN")
            _set(self, **{name: v})

    def bounds(self, dtype) -> tuple:
        """(lo, hi) as scalars of `dtype` (None where open): what the kernel and the converter clip to.
        For integer and bool tensors the bounds round inward (ceil a_min, floor a_max) and saturate to the
        dtype's range, so the result is numpy's clip of the values, kept in `dtype`."""
        dt = np.dtype(dtype)
        if dt.kind == "f":
            return tuple(None if b is None else dt.type(b) for b in (self.a_min, self.a_max))
        lo_lim, hi_lim = (0, 1) if dt.kind == "b" else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))

        def to_int(b, rnd):
            if b is None:
                return None
            b = min(max(b, lo_lim), hi_lim)          # saturate first: inf and huge ints stay in range
            return dt.type(min(max(int(rnd(b)), lo_lim), hi_lim))
        return to_int(self.a_min, np.ceil), to_int(self.a_max, np.floor)


def check_fill(value, dtype) -> None:
    """A ValueError where numpy's ``np.full(..., value, dtype)`` raises: a Python int out of an integer
    dtype's range (NEP 50), or too large for a float."""
    dt = np.dtype(dtype)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if dt.kind in "iu" and not int(np.iinfo(dt).min) <= int(value) <= int(np.iinfo(dt).max) or \
                dt.kind == "f" and abs(int(value)) >= 2 ** 1024:
            text = str(value) if len(str(value)) <= 40 else f"{str(value)[:12]}... ({len(str(abs(value)))} digits)"
            raise ValueError(f"fill value {text} does not fit {dt.name}")


@dataclass(frozen=True)
class FullAttrs:
    shape: tuple
    fill_value: Any
    dtype: str

    def __post_init__(self):
        check_fill(self.fill_value, self.dtype)


@dataclass(frozen=True)
class FullLikeAttrs:
    fill_value: Any
    dtype: str | None = None

    def __post_init__(self):
        if self.dtype is not None:
            check_fill(self.fill_value, self.dtype)


@dataclass(frozen=True)
class ArangeAttrs:
    start: Any
    stop: Any
    step: Any
    dtype: str


@dataclass(frozen=True)
class UniqueAttrs:
    """`np.unique`'s outputs (the values, then each one asked for: first-occurrence indices, inverse, counts)
    of the flattened input (`axis` None) or of its sub-tensors along `axis`; `sorted` False: in the order
    of first occurrence instead of ascending."""
    return_inverse: bool = False
    return_counts: bool = False
    return_index: bool = False
    axis: int | None = None
    sorted: bool = True

    def __post_init__(self):
        _set(self, return_inverse=bool(self.return_inverse), return_counts=bool(self.return_counts),
             return_index=bool(self.return_index), axis=None if self.axis is None else _int(self.axis),
             sorted=bool(self.sorted))


@dataclass(frozen=True)
class TopkAttrs:
    k: int | None = None      # None: k comes from the second input (dynamic)
    axis: int = -1
    largest: bool = True

    def __post_init__(self):
        k = None if self.k is None else _int(self.k, "k")
        if k is not None and k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        _set(self, k=k, axis=_int(self.axis), largest=bool(self.largest))


@dataclass(frozen=True)
class CondAttrs:
    num_outputs: int


@dataclass(frozen=True)
class CaseAttrs:
    num_cases: int            # subgraphs: pred_0, fn_0, ..., pred_{n-1}, fn_{n-1}, default
    num_outputs: int
    # every predicate runs; more than one holding is an error (added later: see `attrs_to_json`)
    exclusive: bool = field(default=False, metadata={"omit_default": True})


@dataclass(frozen=True)
class ForeachAttrs:
    num_data: int
    num_states: int
    num_outputs: int          # stacked per-step outputs
    has_valid_length: bool = False      # input[num_data + num_states] is valid_length (lengths of the batch rows)
    # False: only loop-invariant body nodes are hoisted, none that reads the step's rows (a gradient's
    # reverse loop under memory="recompute": lifted over all steps, the recomputed forward would be held for
    # every step at once, which is what that strategy exists to avoid)
    hoist_rows: bool = field(default=True, metadata={"omit_default": True})


@dataclass(frozen=True)
class WhileAttrs:
    num_vars: int
    num_outputs: int
    max_iterations: int | None = None   # static bound; a tensor bound is input[num_vars]
    has_max_tensor: bool = False
    cond_in_body: bool = False          # the body's last output is the condition on its new vars (partition.loops)


@dataclass(frozen=True)
class RegionAttrs:
    name: str          # the compiled function's name (deterministic; regions of one name compute the same
                       # function: codegen/shared_regions.py)


# ------------------------------------------------------------------------------------- JSON
def attrs_to_json(attrs) -> dict:
    """The JSON form of `attrs`. A field added after graphs were saved and hashed (metadata `omit_default`) is
    written only when it is not at its default, so a graph that does not use it keeps its JSON and its hash
    (artifacts, and the tuning logs keyed by a model's hash, stay valid)."""
    return {f.name: _jsonable(getattr(attrs, f.name)) for f in fields(attrs)
            if not (f.metadata.get("omit_default") and getattr(attrs, f.name) == f.default)}


def _jsonable(v):
    if isinstance(v, tuple):
        return {"tuple": [_jsonable(x) for x in v]}
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, float) and not np.isfinite(v):
        return {"float": repr(v)}
    return v


def attrs_from_json(cls, obj: dict):
    return cls(**{k: _from_jsonable(v) for k, v in obj.items()})


def _from_jsonable(v):
    if isinstance(v, dict) and "tuple" in v:
        return tuple(_from_jsonable(x) for x in v["tuple"])
    if isinstance(v, dict) and "float" in v:
        return float(v["float"])
    if isinstance(v, list):
        return [_from_jsonable(x) for x in v]
    return v
