"""The generic gradient checker: `dt.grad` of a function against central finite differences in float64."""
from __future__ import annotations

import numpy as np

import dyntvm as dt
from dyntvm import F


def _leaves(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def weighted_loss(fn, args, seed=0):
    """``sum_k sum(fn(*args)[k] * w_k)`` with fixed random weights per float output (a scalar whose gradient
    exercises every output entry differently), as a function of the same arguments."""
    rng = np.random.default_rng(seed)
    outs = _leaves(fn(*args))
    weights = [rng.standard_normal(np.shape(o)) if np.asarray(o).dtype.kind == "f" else None for o in outs]

    def loss(*a):
        total = None
        for o, w in zip(_leaves(fn(*a)), weights):
            if w is not None:
                t = F.sum(o * w.astype(o.dtype))
                total = t if total is None else total + t
        return total
    return loss


def finite_difference(f, args, i, eps=1e-6):
    """Central differences of scalar `f` with respect to argument `i` (float64)."""
    x = np.asarray(args[i], np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[idx] += eps
        lo[idx] -= eps
        fa = [hi if k == i else a for k, a in enumerate(args)]
        fb = [lo if k == i else a for k, a in enumerate(args)]
        g[idx] = (float(f(*fa)) - float(f(*fb))) / (2 * eps)
    return g


def check_grad(fn, *args, argnums=None, rtol=1e-5, atol=1e-6, memory="recompute"):
    """dt.grad of a weighted sum of fn's outputs equals finite differences for every float argument (or those
    in `argnums`). Returns the gradients."""
    loss = weighted_loss(fn, args)
    if argnums is None:
        argnums = tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
    grads = dt.grad(loss, argnums=tuple(argnums), memory=memory)(*args)
    for i, g in zip(argnums, grads):
        assert g.shape == np.shape(args[i]) and g.dtype == np.asarray(args[i]).dtype, (i, g.shape, g.dtype)
        np.testing.assert_allclose(g, finite_difference(loss, args, i), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of argument {i}")
    return grads
