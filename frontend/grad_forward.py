"""`dt.jvp`: forward-mode derivatives (Jacobian-vector products), built from the reverse mode.

The vjp of `fn` at the primals is a linear function of the cotangent, ``u -> J^T u``. Its own vjp, taken with
the tangent ``t`` as cotangent, is ``J t``: the jvp (the "transpose of the transpose", as JAX derives
`linearize` / `jvp` relations). So no forward rule per op is needed: every op with a vjp rule whose
backward nodes have vjp rules too (the elementwise, reduction, shape and matmul ops, and the control-flow
ops, whose backward is control flow again) gets a jvp, and an op without one is refused by name as in
`dt.grad`. The cost is a forward pass plus two backward passes (JAX's own forward mode runs one pass); the
result is exact, not a finite difference, and compiles like any other program (one build for all sizes).
"""
from __future__ import annotations

from ..ir.tree import tree_flatten, tree_unflatten
from .grad import _as_tensors, _eager, _options, _Tape, _vjp_traced
from .grad_engine import is_float
from .tracer import Tensor, as_array, trace_error, tracing


def jvp(fn, primals, tangents, memory: str = "recompute"):
    """``(fn(*primals), tangent_out)``: `tangent_out` is the derivative of `fn` at `primals` along `tangents`
    (``sum_i d fn / d primal_i . tangent_i``), shaped like fn's output (None for an integer output). `primals`
    and `tangents` are tuples of the same length and shapes; the tangent of an integer primal is ignored
    (None is taken as zeros). Works eagerly on numpy arrays and inside `dt.trace` / `dt.compile`.

    Example:
        >>> y, dy = dt.jvp(lambda x: F.sin(x) * x, (np.float64(1.0),), (np.float64(1.0),))   # cos(1) + sin(1)
    """
    options = _options("jvp", fn, memory)
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise trace_error("jvp: primals and tangents must be tuples (one entry per argument of the function)")
    if len(primals) != len(tangents):
        raise trace_error(f"jvp: {len(primals)} primal(s) but {len(tangents)} tangent(s); give one tangent per "
                          "argument")
    n = len(primals)
    tangents = [_zeros_like(p) if t is None else t for p, t in zip(primals, tangents)]
    if tracing() or any(isinstance(a, Tensor) for a in (*primals, *tangents)):
        out, tan_leaves, spec = _jvp_traced(fn, primals, tangents, options)
        return out, tree_unflatten(spec, tan_leaves)
    shape: dict = {}

    def flat(*xs):                  # (out, tangent) as one list of tensors for the reference interpreter
        out, tan_leaves, spec = _jvp_traced(fn, xs[:n], xs[n:], options)
        out_leaves, _ = tree_flatten(out)
        shape["spec"], shape["missing"] = spec, [t is None for t in tan_leaves]
        return out_leaves + [t for t in tan_leaves if t is not None]
    values = _eager("jvp", flat, [*primals, *tangents], {})
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    n_out = len(shape["missing"])
    it = iter(values[n_out:])
    return (tree_unflatten(shape["spec"], values[:n_out]),
            tree_unflatten(shape["spec"], [None if m else next(it) for m in shape["missing"]]))


def _zeros_like(p):
    import numpy as np
    if isinstance(p, Tensor):
        from . import F
        return F.zeros_like(p)
    return np.zeros_like(as_array(p))


def _same_shape_and_float(p, t) -> bool:
    """A float tangent of the primal's rank whose dims match where both are known (a symbolic dim may differ
    in name and still be equal when it runs)."""
    if not is_float(t.value) or t.ndim != p.ndim:
        return False
    return all(not (isinstance(a, int) and isinstance(b, int)) or a == b for a, b in zip(t.type.shape, p.type.shape))


def _jvp_traced(fn, primals, tangents, options):
    """(fn's output, the tangent of each of its leaves (None: not a float tensor), the output's tree spec)."""
    from . import F
    tape = _Tape("jvp", fn, primals)
    ts = _as_tensors("jvp", tangents)
    for i, (p, t) in enumerate(zip(tape.inputs, ts)):
        if is_float(p.value) and not _same_shape_and_float(p, t):
            raise trace_error(f"jvp: tangent {i} is {t.type}; its primal is {p.type} (a float tangent of the "
                              "primal's shape is expected)")
    leaves, spec = tree_flatten(tape.out)
    floats = [k for k, o in enumerate(leaves) if isinstance(o, Tensor) and is_float(o.value)]
    if not floats:
        return tape.out, [None] * len(leaves), spec

    def contracted(*us):
        """<J^T u, t>: linear in the cotangents `us` (one per float output)."""
        it = iter(us)
        cot = [next(it) if k in floats else o for k, o in enumerate(leaves)]
        grads = _vjp_traced(tape, leaves, spec, tree_unflatten(spec, cot), options)
        total = F.sum(F.zeros_like(us[0]))
        for g, p, t in zip(grads, tape.inputs, ts):
            if g is not None and is_float(p.value):
                total = total + F.cast(F.sum(g * F.cast(t, g.dtype.name)), total.dtype.name)
        return total
    outer = _Tape("jvp", contracted, [F.zeros_like(leaves[k]) for k in floats])
    tangent_of = iter(outer.backward({outer.out.value: F.ones_like(outer.out)}, outer.inputs, options))
    return tape.out, [next(tangent_of) if k in floats else None for k in range(len(leaves))], spec
