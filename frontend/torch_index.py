"""`from_torch`'s converters of indexing and data-dependent ATen ops: `index` (integer and boolean), `gather`,
`nonzero`, `masked_select`, `unique`, `topk`, `sort`; registered into `torch_ops.CONVERTERS` like the others.
The data-dependent ones give their results dyntvm's data-dependent dims (torch's unbacked sizes)."""
from __future__ import annotations

import numpy as np

from ..ir.types import dim_mul, is_static_dim
from . import F
from . import onnx_index
from .torch_ops import TorchImportError, _as, _axis, _rank, converter, dim_tensor


# ---------------------------------------------------------------------------------- indexing, data
@converter("aten.index.Tensor")
def _index(x, indices):
    given = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(given) == 1:
        k, idx = given[0]
        if np.dtype(idx.dtype) == np.bool_:         # x[mask]: the mask's axes flattened into one
            m = _rank(idx)
            if m > 1:
                merged = 1
                for d in x.shape[k:k + m]:
                    merged = dim_mul(merged, d)
                x = F.reshape(x, tuple(x.shape[:k]) + (merged,) + tuple(x.shape[k + m:]))
                idx = F.reshape(idx, (-1,))
            return F.boolean_mask(x, idx, k)
        return F.take(x, _as(idx, "int64"), axis=k)
    ks = [k for k, _ in given]
    if ks != list(range(ks[0], ks[0] + len(ks))) or any(np.dtype(i.dtype) == np.bool_ for _, i in given):
        raise TorchImportError("index: several index tensors must be integer ones on adjacent axes")
    k0 = ks[0]
    flat = None
    for k, i in given:                  # the flat position in the indexed axes, broadcast between the indices
        pos = onnx_index._checked(i, x.shape[k])
        flat = pos if flat is None else flat * onnx_index._dim(x, k) + pos
    merged = 1
    for k in ks:
        merged = dim_mul(merged, x.shape[k])
    x = F.reshape(x, tuple(x.shape[:k0]) + (merged,) + tuple(x.shape[ks[-1] + 1:]))
    return F.take(x, flat, axis=k0)


@converter("aten.gather.default")
def _gather(x, dim, index, sparse_grad=False):
    return onnx_index._gather_elements([x, index], {"axis": dim}, None, None, None)


@converter("aten.nonzero.default")
def _nonzero(x):
    if _rank(x):
        return F.transpose(F.nonzero(x), (1, 0))
    # a 0-d x: torch gives shape (1, 0) where x is non-zero, (0, 0) where not (one hit, no coordinates)
    hits = F.transpose(F.nonzero(F.reshape(x, (1,))), (1, 0))                       # (0 or 1, 1)
    return F.slice(hits, [0], [0], [1], [1])


@converter("aten.masked_select.default")
def _masked_select(x, mask):
    if tuple(x.shape) != tuple(mask.shape):
        x, mask = F.broadcast_to(x, _shape_of_both(x, mask)), F.broadcast_to(mask, _shape_of_both(x, mask))
    return F.boolean_mask(F.reshape(x, (-1,)), F.reshape(mask, (-1,)))


def _shape_of_both(a, b):
    from ..ir.shapes import broadcast_shapes
    return broadcast_shapes(tuple(a.shape), tuple(b.shape))


def _unique_outputs(x, return_inverse, return_counts, axis=None):
    values, inverse, counts = F.unique(x, return_inverse=True, return_counts=True, axis=axis)
    none = F.zeros((0,), "int64")       # torch's empty tensor for an output not asked for
    return values, inverse if return_inverse else none, counts if return_counts else none


@converter("aten._unique2.default")
def _unique2(x, sorted=True, return_inverse=False, return_counts=False):
    return _unique_outputs(x, return_inverse, return_counts)


@converter("aten._unique.default")
def _unique(x, sorted=True, return_inverse=False):
    return _unique_outputs(x, return_inverse, False)[:2]


@converter("aten.unique_dim.default")
def _unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    """The unique sub-tensors along `dim` (`torch.unique(x, dim=d)`)."""
    return _unique_outputs(x, return_inverse, return_counts, axis=dim)


def _length(n):
    return int(n) if is_static_dim(n) else dim_tensor(n)


def _torch_topk(x, k, ax: int, largest: bool):
    """torch's topk / sort order: NaN ranks above inf, so the largest first puts NaN first. F.topk (numpy's
    order) puts NaN last either way: for floats, the whole axis sorted so, then stably the NaNs to the front
    (a second sort, of the NaN flags; review 33 #13)."""
    if not largest or np.dtype(x.dtype).kind != "f":
        return F.topk(x, k, ax, largest)
    values, indices = F.topk(x, _length(x.shape[ax]), ax, True)
    _, order = F.topk(F.astype(F.isnan(values), "int32"), k, ax, True)

    def gather(t):
        return onnx_index._gather_elements([t, order], {"axis": ax}, None, None, None)
    return gather(values), gather(indices)


@converter("aten.topk.default")
def _topk(x, k, dim=-1, largest=True, sorted=True):
    return _torch_topk(x, k if isinstance(k, (int, np.integer)) else dim_tensor(k), _axis(dim, _rank(x)), largest)


@converter("aten.sort.default", "aten.sort.stable")
def _sort(x, dim=-1, descending=False, *, stable=None):
    ax = _axis(dim, _rank(x))
    return _torch_topk(x, _length(x.shape[ax]), ax, descending)
