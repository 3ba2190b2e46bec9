"""vjp rules of the elementwise, matmul, reduction, normalisation and layout ops (`grad_engine.vjp`).

Each rule returns one entry per input: None (no gradient) or a function computing that input's cotangent from
`c.g` (the output's cotangent), `c.ins` and `c.outs`. The engine sums broadcast axes back (`grad_engine.conform`),
so binary rules return the cotangent at the output's shape. Conventions follow torch / JAX where they differ
from a bare derivative: ties of max / min / maximum / minimum share the gradient equally; relu, abs and clip
pass the gradient at their kink per torch (0 at 0 for relu and abs, 1 at a clip bound).
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.ops import Group, ops_in
from ..ir.shapes import norm_axis
from . import F
from .grad_engine import no_gradient, vjp

no_gradient(*ops_in(Group.PREDICATE), *ops_in(Group.COMPARE), *ops_in(Group.LOGICAL), *ops_in(Group.ARG_REDUCE),
            "floor", "ceil", "round", "sign", "floor_divide", "constant", "full", "full_like", "arange",
            "arange_dyn", "shape_of", "nonzero", "nms")


def _fl(x, like):
    """`x` (bool or number) as a tensor of `like`'s dtype."""
    return F.cast(x, like.dtype.name)


# ------------------------------------------------------------------------------------------- unary
@vjp("exp")
def _exp(c):
    return [lambda: c.g * c.outs[0]]


@vjp("log")
def _log(c):
    return [lambda: c.g / c.ins[0]]


@vjp("sqrt")
def _sqrt(c):
    return [lambda: c.g * 0.5 / c.outs[0]]


@vjp("rsqrt")
def _rsqrt(c):
    return [lambda: c.g * -0.5 * c.outs[0] / c.ins[0]]


@vjp("tanh")
def _tanh(c):
    return [lambda: c.g * (1.0 - c.outs[0] * c.outs[0])]


@vjp("sigmoid")
def _sigmoid(c):
    return [lambda: c.g * c.outs[0] * (1.0 - c.outs[0])]


@vjp("gelu")
def _gelu(c):
    def d():
        x = c.ins[0]
        cdf = 0.5 * (1.0 + F.erf(x * (1 / math.sqrt(2))))
        pdf = F.exp(x * x * -0.5) * (1 / math.sqrt(2 * math.pi))
        return c.g * (cdf + x * pdf)
    return [d]


@vjp("erf")
def _erf(c):
    return [lambda: c.g * (2 / math.sqrt(math.pi)) * F.exp(-(c.ins[0] * c.ins[0]))]


@vjp("sin")
def _sin(c):
    return [lambda: c.g * F.cos(c.ins[0])]


@vjp("cos")
def _cos(c):
    return [lambda: -(c.g * F.sin(c.ins[0]))]


@vjp("tan")
def _tan(c):
    return [lambda: c.g * (1.0 + c.outs[0] * c.outs[0])]


@vjp("neg")
def _neg(c):
    return [lambda: -c.g]


@vjp("abs")
def _abs(c):
    return [lambda: c.g * _fl(F.sign(c.ins[0]), c.g)]


@vjp("relu")
def _relu(c):
    return [lambda: c.g * _fl(c.ins[0] > 0, c.g)]


@vjp("clip")
def _clip(c):
    def d():
        x, keep = c.ins[0], None
        for bound, test in ((c.attrs.a_min, F.greater_equal), (c.attrs.a_max, F.less_equal)):
            if bound is not None:
                k = test(x, bound)
                keep = k if keep is None else F.logical_and(keep, k)
        return c.g * _fl(keep, c.g)
    return [d]


@vjp("cast")
def _cast(c):
    return [lambda: c.g]        # the engine casts back to the input's dtype (an integer input gets none)


# ------------------------------------------------------------------------------------------ binary
@vjp("add")
def _add(c):
    return [lambda: c.g, lambda: c.g]


@vjp("subtract")
def _subtract(c):
    return [lambda: c.g, lambda: -c.g]


@vjp("multiply")
def _multiply(c):
    return [lambda: c.g * c.ins[1], lambda: c.g * c.ins[0]]


@vjp("divide")
def _divide(c):
    return [lambda: c.g / c.ins[1], lambda: -(c.g * c.outs[0]) / c.ins[1]]


@vjp("power")
def _power(c):
    a, b = c.ins

    def da():       # b * a^(b-1); 0 where b == 0 (0^-1 is inf there, and 0 * inf NaN: torch's where)
        return F.where(F.equal(b, F.zeros_like(b)), F.zeros_like(c.g * a), c.g * b * F.power(a, b - 1.0))

    def db():       # a^b * log(a); 0 where a <= 0 (JAX's convention at a = 0)
        pos = a > 0
        return c.g * c.outs[0] * F.where(pos, F.log(F.where(pos, a, F.ones_like(a))), F.zeros_like(a))
    return [da, db]


def _share(first):
    """maximum / minimum: the gradient goes to the chosen operand, halved between equal ones (torch)."""
    def rule(c):
        a, b = c.ins
        w = _fl(first(a, b), c.g) + _fl(F.equal(a, b), c.g) * 0.5
        return [lambda: c.g * w, lambda: c.g * (1.0 - w)]
    return rule


vjp("maximum")(_share(F.greater))
vjp("minimum")(_share(F.less))


@vjp("fmod")
def _fmod(c):
    a, b = c.ins
    return [lambda: c.g, lambda: -(c.g * _trunc(a / b))]


@vjp("mod")
def _mod(c):
    a, b = c.ins
    return [lambda: c.g, lambda: -(c.g * F.floor(a / b))]


def _trunc(x):
    return F.where(x < 0, F.ceil(x), F.floor(x))


@vjp("where")
def _where(c):
    cond = c.ins[0]
    return [None, lambda: F.where(cond, c.g, F.zeros_like(c.g)), lambda: F.where(cond, F.zeros_like(c.g), c.g)]


# ------------------------------------------------------------------------------------------ matmul
def _swap_last(x):
    axes = list(range(x.ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return F.transpose(x, tuple(axes))


@vjp("matmul")
def _matmul(c):
    x, y = c.ins
    g = c.g
    if x.ndim == 1 and y.ndim == 1:         # a dot product: a 0-d result
        return [lambda: g * y, lambda: g * x]
    x2 = F.expand_dims(x, 0) if x.ndim == 1 else x
    y2 = F.expand_dims(y, -1) if y.ndim == 1 else y
    g2 = F.expand_dims(g, -2) if x.ndim == 1 else g
    g2 = F.expand_dims(g2, -1) if y.ndim == 1 else g2

    def dx():
        d = F.matmul(g2, _swap_last(y2))
        d = _sum_batch(d, x2.ndim)
        return F.squeeze(d, (-2,)) if x.ndim == 1 else d

    def dy():
        d = F.matmul(_swap_last(x2), g2)
        d = _sum_batch(d, y2.ndim)
        return F.squeeze(d, (-1,)) if y.ndim == 1 else d
    return [dx, dy]


def _sum_batch(d, ndim):
    """Batch axes a lower-rank operand was broadcast over (`conform` sums its size-1 batch axes)."""
    return F.sum(d, axis=tuple(range(d.ndim - ndim))) if d.ndim > ndim else d


# ---------------------------------------------------------------------------------------- reductions
def _reduced_axes(attrs, ndim):
    return tuple(range(ndim)) if attrs.axis is None else tuple(sorted(norm_axis(a, ndim) for a in attrs.axis))


def _unreduce(g, attrs, x):
    """`g` (a reduction's cotangent) with the reduced axes back, broadcast to x's shape."""
    if not attrs.keepdims:
        for ax in _reduced_axes(attrs, x.ndim):
            g = F.expand_dims(g, ax)
    return g + F.zeros_like(x, g.dtype.name)


@vjp("sum")
def _sum(c):
    return [lambda: _unreduce(c.g, c.attrs, c.ins[0])]


@vjp("mean")
def _mean(c):
    def d():
        x = c.ins[0]
        axes = _reduced_axes(c.attrs, x.ndim)
        count = F.prod(F.take(F.shape_of(x), np.asarray(axes, np.int64))) if axes else np.int64(1)
        return _unreduce(c.g, c.attrs, x) / _fl(count, c.g)
    return [d]


def _extreme(c):
    """max / min: the gradient shared equally among the entries equal to the extreme (torch's amax)."""
    def d():
        x = c.ins[0]
        out = _unreduce(c.outs[0], c.attrs, x)
        hit = _fl(F.equal(x, out), c.g)
        count = F.sum(hit, axis=_reduced_axes(c.attrs, x.ndim), keepdims=True)
        return hit * _unreduce(c.g, c.attrs, x) / count
    return [d]


vjp("max", "min")(_extreme)


@vjp("cumsum")
def _cumsum(c):
    def d():        # reversed cumsum of g along the axis
        ax = norm_axis(c.attrs.axis, c.g.ndim)
        return _flip(F.cumsum(_flip(c.g, ax), ax), ax)
    return [d]


def _flip(x, ax):
    return F.slice(x, [None], [None], [-1], [ax])


# ------------------------------------------------------------------------------ normalisations
@vjp("softmax")
def _softmax(c):
    def d():
        y, ax = c.outs[0], c.attrs.axis
        return y * (c.g - F.sum(c.g * y, axis=ax, keepdims=True))
    return [d]


@vjp("log_softmax")
def _log_softmax(c):
    return [lambda: c.g - F.exp(c.outs[0]) * F.sum(c.g, axis=c.attrs.axis, keepdims=True)]


@vjp("layer_norm")
def _layer_norm(c):
    x, gamma, _ = c.ins
    k = gamma.ndim
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    mean = F.mean(x, axis=axes, keepdims=True)
    xc = x - mean
    inv = F.rsqrt(F.mean(xc * xc, axis=axes, keepdims=True) + c.attrs.eps)
    xhat = xc * inv
    g = c.g

    def dx():
        dxhat = g * gamma
        return inv * (dxhat - F.mean(dxhat, axis=axes, keepdims=True) -
                      xhat * F.mean(dxhat * xhat, axis=axes, keepdims=True))
    return [dx, lambda: F.sum(g * xhat, axis=lead) if lead else g * xhat,
            lambda: F.sum(g, axis=lead) if lead else g]
