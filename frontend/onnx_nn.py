"""The ONNX converters of neural-network layers made of elementwise ops (the activations, inference
BatchNormalization), registered into `onnx_ops.CONVERTERS` like the others."""
from __future__ import annotations

import numpy as np

from . import F
from .onnx_ops import OnnxImportError, _c, _rank, converter


@converter("LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "HardSigmoid", "HardSwish", "Softplus",
           "Softsign", "Mish", "PRelu")
def _activation(ins, a, ctx, env, node):
    x, op = ins[0], node.op_type
    zero = _c(0, x)
    if op == "LeakyRelu":
        return F.where(F.less(x, zero), x * _c(a.get("alpha", 0.01), x), x)
    if op == "PRelu":
        return F.where(F.less(x, zero), x * ins[1], x)
    if op in ("Elu", "Celu"):
        alpha = _c(a.get("alpha", 1.0), x)
        inner = F.exp(x / alpha) if op == "Celu" else F.exp(x)
        return F.where(F.greater(x, zero), x, alpha * (inner - _c(1, x)))
    if op == "Selu":
        alpha, gamma = _c(a.get("alpha", 1.67326319217681884765625), x), _c(a.get("gamma", 1.05070102214813232421875), x)
        return gamma * F.where(F.greater(x, zero), x, alpha * (F.exp(x) - _c(1, x)))
    if op == "ThresholdedRelu":
        return F.where(F.greater(x, _c(a.get("alpha", 1.0), x)), x, zero)
    if op in ("HardSigmoid", "HardSwish"):
        alpha, beta = (a.get("alpha", 0.2), a.get("beta", 0.5)) if op == "HardSigmoid" else (1 / 6, 0.5)
        hs = F.minimum(F.maximum(x * _c(alpha, x) + _c(beta, x), zero), _c(1, x))
        return hs if op == "HardSigmoid" else x * hs
    softplus = F.where(F.greater(x, _c(20, x)), x, F.log(F.exp(F.minimum(x, _c(20, x))) + _c(1, x)))
    if op == "Softplus":
        return softplus
    if op == "Mish":
        return x * F.tanh(softplus)
    return x / (_c(1, x) + F.abs(x))                                                    # Softsign


@converter("Swish")
def _swish(ins, a, ctx, env, node):
    x = ins[0]
    return x * F.sigmoid(x * _c(a.get("alpha", 1.0), x))


@converter("CastLike")
def _cast_like(ins, a, ctx, env, node):
    return F.astype(ins[0], np.dtype(ins[1].dtype).name)


@converter("BatchNormalization")
def _batch_norm(ins, a, ctx, env, node):
    x, scale, bias, mean, var = ins[:5]
    if a.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
        raise OnnxImportError("BatchNormalization in training mode (or its running statistics outputs) is not "
                              "supported")
    shape = (-1,) + (1,) * (_rank(x) - 2)            # per channel (axis 1), broadcast over the spatial axes
    inv = F.reshape(scale / F.sqrt(var + _c(a.get("epsilon", 1e-5), var)), shape)
    return (x - F.reshape(mean, shape)) * inv + F.reshape(bias, shape)
