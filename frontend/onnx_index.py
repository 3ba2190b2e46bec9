"""The ONNX converters of the gather / scatter family and the scans: GatherElements, GatherND, ScatterElements (and
the deprecated Scatter), ScatterND, CumSum, Trilu; registered into `onnx_ops.CONVERTERS` like the others.

The gathers and scatters compute, for every element they read or write, its flat position in the data
(``((p0 * d1 + p1) * d2 + p2) ...``), each per-axis position checked against its axis and wrapped when negative
(``take(arange(d), p)``: an index out of range is the run-time error of that `take`, naming the node); then a
gather is one `take` of the flattened data, a scatter one `scatter_flat` (`ir/ops_index.py`) of it. So they
compile to static regions at every size, symbolic dims included."""
from __future__ import annotations

import numpy as np

from ..ir.ops_checks import DimPairAttrs
from ..ir.ops_index import ScatterAttrs
from ..ir.types import dim_mul, is_static_dim, same_dim
from . import F
from .onnx_ops import OnnxImportError, _c, _ints, _is_const, _rank, _shape, converter
from .ops import apply


def _dim(x, k: int):
    """Axis k's size of `x` as an int64 scalar (a constant where it is static)."""
    d = _shape(x)[k]
    return np.int64(d) if is_static_dim(d) else F.take(F.shape_of(x), np.int64(k))


def _checked(idx, n):
    """Integer positions `idx` along an axis of size `n` (a dim), negative ones wrapped, int64; one out of
    [-n, n) is a run-time error (of the `take`)."""
    idx = idx if np.dtype(idx.dtype) == np.int64 else F.astype(idx, "int64")
    return F.take(F.arange(0, n), idx)


def _along(n, k: int, rank: int):
    """0 .. n - 1 along axis k of a rank-`rank` shape (ones elsewhere): the positions of an axis not indexed."""
    return F.reshape(F.arange(0, n), tuple(n if j == k else 1 for j in range(rank)))


def _flat(data, positions: list):
    """The flat position in `data` of per-axis positions ``positions[k]`` (broadcasting int64 tensors) of its
    first len(positions) axes."""
    flat = positions[0]
    for k, p in enumerate(positions[1:], start=1):
        flat = flat * _dim(data, k) + p
    return flat


def _within(n_idx, n_data, k, node):
    """Positions 0 .. n_idx - 1 along axis k, checked against the data's size there (ONNX: indices may be
    shorter than the data on the axes they do not index)."""
    if is_static_dim(n_idx) and is_static_dim(n_data):
        if n_idx > n_data:
            raise OnnxImportError(f"{node.op_type}: the indices have {n_idx} entries along axis {k}, the data only "
                                  f"{n_data}")
        return F.arange(0, n_idx)
    return F.arange(0, n_idx) if n_idx == n_data else _checked(F.arange(0, n_idx), n_data)


def _same_dim(a, axis_a: int, b, axis_b: int, rule: str):
    """`b` with its axis `axis_b` checked (at run time, where tracing cannot tell) to equal `a`'s axis `axis_a`:
    a shape the ONNX spec requires (`rule` says which), which nothing else would check (a flattened position
    stays in range)."""
    return apply("assert_dims_equal", "assert_dims_equal", [a, b], DimPairAttrs(axis_a, axis_b, f"ONNX {rule}"))[0]


def _element_positions(data, idx, axis: int, node) -> list:
    """GatherElements' / ScatterElements' per-axis positions: `idx` along `axis`, its own coordinates elsewhere."""
    r = _rank(data)
    if _rank(idx) != r:
        raise OnnxImportError(f"{node.op_type}: the indices have rank {_rank(idx)}, the data {r} (they must be equal)")
    if not -r <= axis < r:
        raise OnnxImportError(f"{node.op_type}: axis {axis} is out of range for rank {r}")
    axis %= r
    out = []
    for k in range(r):
        if k == axis:
            out.append(_checked(idx, _shape(data)[k]))
        else:
            pos = _within(_shape(idx)[k], _shape(data)[k], k, node)
            out.append(F.reshape(pos, tuple(_shape(idx)[k] if j == k else 1 for j in range(r))))
    return out


@converter("GatherElements")
def _gather_elements(ins, a, ctx, env, node):
    data, idx = ins
    if _rank(data) == 0:
        raise OnnxImportError("GatherElements of a 0-d tensor")
    flat = _flat(data, _element_positions(data, idx, int(a.get("axis", 0)), node))
    return F.take(F.reshape(data, (-1,)), flat)


def _nd_positions(data, idx, b: int, node):
    """GatherND's / ScatterND's per-axis positions of the first b + m data axes (b batch axes, m = the
    indices' last dim), each of the shape idx.shape[:-1] (broadcast)."""
    q, r = _rank(idx), _rank(data)
    m = _shape(idx)[-1] if q else None
    if q < 1 or not is_static_dim(m):
        raise OnnxImportError(f"{node.op_type}: the indices' last dim must be static (the number of indexed axes), "
                              f"got indices of shape {_shape(idx)}")
    m = int(m)
    if not 0 <= b < min(q, r) or b + m > r or m < 1:
        raise OnnxImportError(f"{node.op_type}: batch_dims {b} and {m} indexed axes do not fit data of rank {r} and "
                              f"indices of rank {q}")
    lead = q - 1
    pos = []
    for k in range(b):
        n_idx, n_data = _shape(idx)[k], _shape(data)[k]
        if is_static_dim(n_idx) and is_static_dim(n_data) and n_idx != n_data:
            raise OnnxImportError(f"{node.op_type}: batch axis {k} has {n_idx} entries in the indices, {n_data} in "
                                  "the data")
        if not same_dim(n_idx, n_data):         # the spec wants them equal (not merely in range): checked when it runs
            idx = _same_dim(data, k, idx, k, f"GatherND: batch axis {k} of the indices and the data")
        pos.append(F.reshape(F.arange(0, n_data), tuple(n_data if j == k else 1 for j in range(lead))))
    if _is_const(idx):
        idx = np.asarray(idx, np.int64)
    for j in range(m):
        comp = idx[..., j] if _is_const(idx) else F.take(idx, np.int64(j), axis=-1)
        pos.append(_checked(comp, _shape(data)[b + j]))
    return pos, m


@converter("GatherND")
def _gather_nd(ins, a, ctx, env, node):
    data, idx = ins
    b = int(a.get("batch_dims", 0))
    pos, m = _nd_positions(data, idx, b, node)
    rest = _shape(data)[b + m:]
    return F.take(F.reshape(data, (-1,) + rest), _flat(data, pos), axis=0)


def _reduction(a, node) -> str:
    red = a.get("reduction", b"none")
    red = red.decode() if isinstance(red, bytes) else str(red)
    try:
        return ScatterAttrs(red).reduction
    except ValueError as e:
        raise OnnxImportError(f"{node.op_type}: {e}") from None


def _scatter(data, flat, updates, reduction, node):
    upd = updates if np.dtype(updates.dtype) == np.dtype(data.dtype) else F.astype(updates, np.dtype(data.dtype).name)
    out = apply(node.op_type, "scatter_flat", [F.reshape(data, (-1,)), F.reshape(flat, (-1,)), F.reshape(upd, (-1,))],
                ScatterAttrs(reduction))[0]
    return F.reshape(out, _shape(data))


@converter("ScatterElements", "Scatter")
def _scatter_elements(ins, a, ctx, env, node):
    data, idx, upd = ins
    if _rank(data) == 0:
        raise OnnxImportError(f"{node.op_type} into a 0-d tensor")
    if len(_shape(upd)) != len(_shape(idx)) or any(is_static_dim(p) and is_static_dim(q) and p != q
                                                    for p, q in zip(_shape(upd), _shape(idx))):
        raise OnnxImportError(f"{node.op_type}: updates of shape {_shape(upd)} and indices of shape {_shape(idx)} "
                              "differ")
    for k, (p, q) in enumerate(zip(_shape(idx), _shape(upd))):
        if not same_dim(p, q):
            upd = _same_dim(idx, k, upd, k, f"{node.op_type}: axis {k} of the updates and the indices")
    flat = _flat(data, _element_positions(data, idx, int(a.get("axis", 0)), node))
    return _scatter(data, flat, upd, _reduction(a, node), node)


@converter("ScatterND")
def _scatter_nd(ins, a, ctx, env, node):
    data, idx, upd = ins
    pos, m = _nd_positions(data, idx, 0, node)
    rest = _shape(data)[m:]
    want = tuple(_shape(idx)[:-1]) + tuple(rest)
    if len(_shape(upd)) != len(want) or any(is_static_dim(p) and is_static_dim(q) and p != q
                                            for p, q in zip(_shape(upd), want)):
        raise OnnxImportError(f"ScatterND: updates of shape {_shape(upd)}, expected indices.shape[:-1] + "
                              f"data.shape[{m}:] = {want}")
    for k in range(len(want)):          # the updates' shape, axis by axis (a reshape checks only their count)
        if not same_dim(_shape(upd)[k], want[k]):
            rule = f"ScatterND: the updates' shape, indices.shape[:-1] + data.shape[{m}:]"
            upd = _same_dim(idx, k, upd, k, rule) if k < _rank(idx) - 1 else \
                _same_dim(data, k - _rank(idx) + 1 + m, upd, k, rule)
    rows = _flat(data, pos)                           # [idx.shape[:-1]]: the row of each update slice
    width = 1
    for d in rest:
        width = dim_mul(width, d)
    n = np.int64(width) if is_static_dim(width) else \
        F.reshape(F.prod(F.slice(F.shape_of(data), [m], [_rank(data)])), ())
    elems = F.expand_dims(rows, -1) * n + F.arange(0, width)      # [idx.shape[:-1], width]
    upd = F.reshape(upd, tuple(_shape(idx)[:-1]) + (width,))
    return _scatter(data, elems, upd, _reduction(a, node), node)


@converter("CumSum")
def _cumsum(ins, a, ctx, env, node):
    x = ins[0]
    axes = _ints(ins[1], "CumSum's axis", node)
    if len(axes) != 1 or not -_rank(x) <= axes[0] < _rank(x):
        raise OnnxImportError(f"CumSum: axis {axes} must be one axis of the rank-{_rank(x)} input")
    axis = axes[0] % _rank(x)
    reverse = bool(a.get("reverse", 0))
    if reverse:
        x = F.slice(x, [None], [None], [-1], [axis])
    if a.get("exclusive", 0):       # the sums of the entries before each: shifted by one, a zero first
        width = tuple((1, 0) if k == axis else (0, 0) for k in range(_rank(x)))
        x = F.slice(F.pad(x, width, 0), [0], [-1], [1], [axis])
    y = F.cumsum(x, axis=axis)
    return F.slice(y, [None], [None], [-1], [axis]) if reverse else y


@converter("Trilu")
def _trilu(ins, a, ctx, env, node):
    x = ins[0]
    if _rank(x) < 2:
        raise OnnxImportError(f"Trilu needs a tensor of rank 2 or more, got rank {_rank(x)}")
    k = np.int64(0) if len(ins) < 2 or ins[1] is None else (
        np.int64(_ints(ins[1], "Trilu's k", node)[0]) if _is_const(ins[1]) else F.reshape(F.astype(ins[1], "int64"), ()))
    n, m = _shape(x)[-2:]
    diag = F.reshape(F.arange(0, m), (1, m)) - F.reshape(F.arange(0, n), (n, 1))      # column - row
    keep = F.greater_equal(diag, k) if a.get("upper", 1) else F.less_equal(diag, k)
    return F.where(keep, x, _c(0, x))
