"""The ONNX converters of the vision layers: Conv, MaxPool, AveragePool (dyntvm's `conv` / `max_pool` /
`avg_pool` ops, `ir/ops_nn.py`), GlobalAveragePool and GlobalMaxPool (`mean` / `max` over the spatial axes),
registered into `onnx_ops.CONVERTERS` like the others."""
from __future__ import annotations

import numpy as np

from . import F
from .onnx_ops import OnnxImportError, _rank, _shape, converter

_AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def _spatial(x, node) -> int:
    if not 3 <= _rank(x) <= 5:
        raise OnnxImportError(f"{node.op_type} over {_rank(x) - 2} spatial axes: dyntvm supports 1 to 3 (data of "
                              f"rank 3 to 5), got rank {_rank(x)}")
    return _rank(x) - 2


def _per_axis(a, name, nsp, default, node) -> tuple:
    v = tuple(int(i) for i in a.get(name, [default] * nsp))
    if len(v) != nsp:
        raise OnnxImportError(f"{node.op_type}: {name} {list(v)} needs one entry per spatial axis ({nsp})")
    return v


def _pads(a, x, kernel, strides, dilations, node) -> tuple:
    """((before, after), ...) per spatial axis from `pads` or `auto_pad` (SAME_*: the output size is
    ceil(size / stride); with a stride above 1 that needs static spatial sizes)."""
    nsp = len(kernel)
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto not in _AUTO_PADS:
        raise OnnxImportError(f"{node.op_type}: unknown auto_pad {auto!r} (one of {', '.join(_AUTO_PADS)})")
    if auto == "NOTSET":
        p = [int(i) for i in a.get("pads", [0] * 2 * nsp)]
        if len(p) != 2 * nsp:
            raise OnnxImportError(f"{node.op_type}: pads {p} needs a begin and an end per spatial axis ({2 * nsp})")
        return tuple(zip(p[:nsp], p[nsp:]))
    if a.get("ceil_mode", 0):
        raise OnnxImportError(f"{node.op_type}: ceil_mode with auto_pad {auto} (the ONNX reference refuses it too)")
    if auto == "VALID":
        return ((0, 0),) * nsp
    pads = []
    for n, k, s, d in zip(_shape(x)[2:], kernel, strides, dilations):
        if s > 1 and not isinstance(n, (int, np.integer)):
            raise OnnxImportError(f"{node.op_type}: auto_pad {auto} with stride {s} over the symbolic spatial dim "
                                  f"{n!r}: the padding depends on the size; give it with input_shapes=")
        total = max((-(-int(n) // s) - 1) * s + d * (k - 1) + 1 - int(n), 0) if s > 1 else d * (k - 1)
        small = total // 2
        pads.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    return tuple(pads)


@converter("Conv")
def _conv(ins, a, ctx, env, node):
    x, w = ins[:2]
    b = ins[2] if len(ins) > 2 else None
    nsp = _spatial(x, node)
    if _rank(w) != nsp + 2:
        raise OnnxImportError(f"Conv: the weight of rank {_rank(w)} does not fit data of rank {_rank(x)}")
    kernel = tuple(_shape(w)[2:])
    if "kernel_shape" in a and tuple(int(k) for k in a["kernel_shape"]) != kernel:
        raise OnnxImportError(f"Conv: kernel_shape {list(a['kernel_shape'])} differs from the weight's "
                              f"{list(kernel)}")
    strides = _per_axis(a, "strides", nsp, 1, node)
    dilations = _per_axis(a, "dilations", nsp, 1, node)
    pads = _pads(a, x, kernel, strides, dilations, node)
    return F.conv(x, w, b, stride=strides, padding=pads, dilation=dilations, groups=int(a.get("group", 1)))


def _pool_args(ins, a, node):
    x = ins[0]
    nsp = _spatial(x, node)
    if "kernel_shape" not in a:
        raise OnnxImportError(f"{node.op_type}: the kernel_shape attribute is required")
    kernel = _per_axis(a, "kernel_shape", nsp, 1, node)
    strides = _per_axis(a, "strides", nsp, 1, node)
    dilations = _per_axis(a, "dilations", nsp, 1, node)
    return x, dict(kernel_size=kernel, stride=strides, padding=_pads(a, x, kernel, strides, dilations, node),
                   dilation=dilations, ceil_mode=bool(a.get("ceil_mode", 0)))


@converter("MaxPool")
def _max_pool(ins, a, ctx, env, node):
    if len(node.output) > 1 and node.output[1]:
        raise OnnxImportError("MaxPool's Indices output (argmax positions) is not supported")
    x, kw = _pool_args(ins, a, node)
    return F.max_pool(x, **kw)          # storage_order only orders the Indices output


@converter("AveragePool")
def _avg_pool(ins, a, ctx, env, node):
    x, kw = _pool_args(ins, a, node)
    return F.avg_pool(x, count_include_pad=bool(a.get("count_include_pad", 0)), **kw)


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ins, a, ctx, env, node):
    x = ins[0]
    if _rank(x) < 3:
        raise OnnxImportError(f"{node.op_type} needs data of rank 3 or more (N, C, spatial...), got rank {_rank(x)}")
    axes = tuple(range(2, _rank(x)))
    return (F.mean if node.op_type == "GlobalAveragePool" else F.max)(x, axis=axes, keepdims=True)
