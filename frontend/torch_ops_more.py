"""More of `from_torch`'s converters (`torch_ops.py` holds the core of them): inference-mode normalisation and
pooling (what torchvision's CNNs need after `run_decompositions`), the elementwise math dyntvm has no single op
for (composed from `F` ops with torch's semantics), index / repeat forms, and linear algebra (matmuls,
embedding, layer norm, convolution, pooling); registered into `torch_ops.CONVERTERS` like the others."""
from __future__ import annotations

import numpy as np

from . import F
from .torch_ops import CONVERTERS, TorchImportError, _as, _axis, _binary, _bool_only, _rank, _unary, converter

__all__: list = []


# ----------------------------------------------------------------------------- normalisation, pooling
@converter("aten._native_batch_norm_legit_no_training.default")
def _batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    """BatchNorm in eval mode over axis 1: (x - mean) / sqrt(var + eps) * weight + bias; torch also returns the
    (empty) saved statistics, which nothing reads in inference."""
    shape = (-1,) + (1,) * (_rank(x) - 2)
    scale = F.rsqrt(F.reshape(running_var, shape) + np.float32(eps))
    y = (x - F.reshape(running_mean, shape)) * scale
    if weight is not None:
        y = y * F.reshape(weight, shape)
    if bias is not None:
        y = y + F.reshape(bias, shape)
    return y, None, None


@converter("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default", "aten.adaptive_avg_pool1d.default")
def _adaptive_avg_pool(x, output_size):
    """Global average pooling (output size 1 on every pooled axis: what classifiers' heads use)."""
    if any(int(s) != 1 for s in output_size):
        raise TorchImportError(f"adaptive_avg_pool: output size {tuple(output_size)} (only global pooling, "
                               "output size 1 per axis, is supported)")
    rank = _rank(x)
    return F.mean(x, tuple(range(rank - len(output_size), rank)), True)


# ------------------------------------------------------------------------- elementwise math, composed
for _name, _fn in {
        "sinh": lambda x: (F.exp(x) - F.exp(-x)) * 0.5,
        "cosh": lambda x: (F.exp(x) + F.exp(-x)) * 0.5,
        "asinh": lambda x: F.sign(x) * F.log(F.abs(x) + F.sqrt(x * x + 1.0)),   # odd: no cancellation for x < 0
        "acosh": lambda x: F.log(x + F.sqrt(x * x - 1.0)),
        "atanh": lambda x: F.log((1.0 + x) / (1.0 - x)) * 0.5,
        "log2": lambda x: F.log(x) * np.float32(1 / np.log(2)),
        "log10": lambda x: F.log(x) * np.float32(1 / np.log(10))}.items():
    converter(f"aten.{_name}.default")(_unary(_fn, floats=True))


@converter("aten.elu.default")
def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return F.where(x > 0, x * scale, (F.exp(x * input_scale) - 1.0) * (alpha * scale))


@converter("aten.trunc.default")
def _trunc(x):
    return F.where(x < 0, F.ceil(x), F.floor(x)) if np.dtype(x.dtype).kind == "f" else x


@converter("aten.isinf.default")
def _isinf(x):
    if np.dtype(x.dtype).kind != "f":
        return F.not_equal(x, x)                      # all False, in x's shape
    return F.equal(F.abs(x), _as(np.inf, x.dtype))


converter("aten.logical_xor.default")(_binary(lambda a, b: F.not_equal(F.cast(a, "bool"), F.cast(b, "bool"))))
CONVERTERS["aten.bitwise_xor.Tensor"] = _bool_only("bitwise_xor", F.not_equal)


# ---------------------------------------------------------------------------- indexing, repeating
@converter("aten.index_select.default")
def _index_select(x, dim, index):
    return F.take(x, index, axis=_axis(dim, _rank(x)))


@converter("aten.repeat.default")
def _repeat(x, repeats):
    extra = len(repeats) - _rank(x)
    if extra < 0:
        raise TorchImportError(f"repeat: {len(repeats)} repeats for a rank-{_rank(x)} tensor (at least its rank)")
    if extra:
        x = F.reshape(x, (1,) * extra + tuple(x.shape))
    return F.tile(x, tuple(int(r) for r in repeats))


@converter("aten.fill.Scalar")
def _fill(x, value):
    return F.full_like(x, value)


@converter("aten.copy.default")
def _copy(x, src, non_blocking=False):
    """`x.copy_(src)` as a value: src broadcast to x's shape, in x's dtype."""
    return F.broadcast_to(_as(src, np.dtype(x.dtype).name), tuple(x.shape))


@converter("aten.native_dropout.default")
def _dropout(x, p, train):
    if train:
        raise TorchImportError("native_dropout in training mode (random): export the model in eval() mode")
    return x, F.ones_like(x, dtype="bool")              # eval: every element kept


# ------------------------------------------------------------------------------------ linear algebra
@converter("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _mm(a, b):
    return F.matmul(a, b)


@converter("aten.addmm.default")
def _addmm(bias, a, b, *, beta=1, alpha=1):
    y = F.matmul(a, b)
    y = y if alpha == 1 else y * alpha
    return y + (bias if beta == 1 else bias * beta)


@converter("aten.linear.default")
def _linear(x, w, b=None):
    y = F.matmul(x, F.transpose(w, (1, 0)))
    return y if b is None else y + b


@converter("aten.embedding.default")
def _embedding(weight, indices, *rest):
    return F.take(weight, indices, axis=0)


@converter("aten.native_layer_norm.default")
def _layer_norm(x, shape, weight, bias, eps):
    k = len(shape)
    axes = tuple(range(_rank(x) - k, _rank(x)))
    mean = F.mean(x, axes, True)
    dev = x - mean
    rstd = F.rsqrt(F.mean(dev * dev, axes, True) + eps)
    y = dev * rstd
    y = y if weight is None else y * weight
    return (y if bias is None else y + bias), mean, rstd


@converter("aten.convolution.default")
def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise TorchImportError("convolution: transposed convolution (ConvTranspose) is not supported")
    return F.conv(x, w, b, tuple(stride), tuple(padding), tuple(dilation), groups)


@converter("aten.max_pool2d_with_indices.default", "aten.max_pool1d_with_indices.default",
           "aten.max_pool3d_with_indices.default")
def _max_pool(x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    # the indices output: None here; `torch_export.refused_forms` refuses a program that uses it, by name
    return F.max_pool(x, tuple(kernel), tuple(stride) or None, padding if isinstance(padding, int) else
                      tuple(padding), dilation if isinstance(dilation, int) else tuple(dilation), ceil_mode), None


@converter("aten.avg_pool2d.default", "aten.avg_pool1d.default", "aten.avg_pool3d.default")
def _avg_pool(x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        raise TorchImportError("avg_pool: divisor_override is not supported")
    return F.avg_pool(x, tuple(kernel), tuple(stride) or None, padding if isinstance(padding, int) else
                      tuple(padding), 1, ceil_mode, count_include_pad)
