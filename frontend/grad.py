"""`dt.grad`, `dt.value_and_grad`, `dt.vjp`: reverse-mode gradients of dyntvm programs (JAX style).

While tracing (inside `dt.trace` / `dt.compile`, or a control-flow body) the function runs on the traced tensors
and its nodes are the tape: each node's vjp rule (`grad_engine`) emits the backward as more nodes of the same
graph, so the gradient compiles with the model, once for all sizes. Eagerly (numpy arguments) the gradient
function is traced for the arguments' shapes and run by the reference interpreter (traces are cached per
shapes and dtypes).
"""
from __future__ import annotations

import numpy as np

from ..ir.tree import tree_flatten, tree_unflatten
from . import grad_control, grad_rules, grad_rules_index  # noqa: F401  (they register the rules)
from .grad_engine import NOT_DIFFERENTIABLE_YET, backprop, is_float, rule_table  # noqa: F401  (re-exported: the loaded table)
from .tracer import Tensor, TensorSpec, as_array, current, trace, trace_error, tracing

MEMORY = ("recompute", "save_all")


def _options(api, fn, memory):
    if not callable(fn):
        raise trace_error(f"{api}: expected a function of tensors to differentiate, got a {type(fn).__name__}")
    if memory not in MEMORY:
        raise trace_error(f"grad: memory must be one of {', '.join(map(repr, MEMORY))}, got {memory!r}")
    return {"memory": memory}


def _argnums(api, argnums, n):
    many = isinstance(argnums, (tuple, list))
    nums = tuple(argnums) if many else (argnums,)
    for i in nums:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not -n <= i < n:
            raise trace_error(f"{api}: argnums {argnums!r} does not name arguments of a call with {n} argument(s)")
    return tuple(int(i) % n for i in nums), many


def _as_tensors(api, args) -> list:
    b = current()
    out = []
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            out.append(a)
        elif isinstance(a, (np.ndarray, np.generic, bool, int, float)):
            out.append(Tensor(b.constant(as_array(a)), b))
        else:
            raise trace_error(f"{api}: argument {i} is a {type(a).__name__}; pass tensors or numpy arrays")
    return out


class _Tape:
    """`fn` run on traced tensors in the current builder: its outputs and the nodes it added."""

    def __init__(self, api, fn, args):
        self.api, self.builder = api, current()
        self.inputs = _as_tensors(api, args)
        start = len(self.builder.nodes)
        self.out = fn(*self.inputs)
        self.nodes = self.builder.nodes[start:]

    def backward(self, seeds: dict, wrt: list, options) -> list:
        from . import F
        for v in wrt:
            if not is_float(v.value):
                raise trace_error(f"{self.api}: gradients are taken with respect to float tensors; an argument is "
                                  f"{v.type}")
        grads = backprop(self.builder, self.nodes, seeds, [v.value for v in wrt], options)
        return [F.zeros_like(v) if g is None else g for v, g in zip(wrt, grads)]


def _scalar_out(api, out):
    if not isinstance(out, Tensor):
        raise trace_error(f"{api}: the function must return one 0-d float tensor (the value to differentiate), "
                          f"got a {type(out).__name__}")
    if out.ndim != 0 or out.dtype.kind != "f":
        raise trace_error(f"{api}: the function must return a 0-d float tensor, got {out.type}; reduce it first "
                          f"(F.sum) or use dt.vjp")
    return out


def _eager(api, traced_fn, args, cache):
    """Run `traced_fn` (a function of traced tensors) on numpy `args`: traced for their shapes, cached."""
    from ..runtime.interpreter import run_reference
    for i, a in enumerate(args):
        if isinstance(a, (str, bytes)) or as_array(a).dtype.kind not in "biuf":
            raise trace_error(f"{api}: argument {i} is a {type(a).__name__}; pass tensors or numpy arrays")
    arrays = [as_array(a) for a in args]
    key = tuple((a.shape, a.dtype.str) for a in arrays)
    graph = cache.get(key)
    if graph is None:
        graph = cache[key] = trace(traced_fn, *[TensorSpec(a.shape, a.dtype.name) for a in arrays], name=api)
    return run_reference(graph, *arrays)


def value_and_grad(fn, argnums=0, memory: str = "recompute"):
    """A function returning ``(fn(*args), gradient)``: the gradient of `fn` (which returns a 0-d float tensor)
    with respect to argument `argnums` (a tuple of positions gives a tuple of gradients).

    `memory` chooses what loops keep for the backward: ``"recompute"`` saves each step's carries and
    recomputes the body in reverse; ``"save_all"`` also saves the body's intermediates (more memory, no
    recomputation). Works eagerly on numpy arrays and inside `dt.trace` / `dt.compile`.

    Example:
        >>> dfdx = dt.grad(lambda x: F.sum(F.tanh(x) ** 2))
        >>> model = dt.compile(dfdx, dt.TensorSpec(("N",)))
    """
    options = _options("grad", fn, memory)
    cache: dict = {}

    def traced(*args):
        nums, many = _argnums("grad", argnums, len(args))
        tape = _Tape("grad", fn, args)
        out = _scalar_out("grad", tape.out)
        from . import F
        grads = tape.backward({out.value: F.ones_like(out)}, [tape.inputs[i] for i in nums], options)
        return out, (tuple(grads) if many else grads[0])

    def call(*args):
        if tracing() or any(isinstance(a, Tensor) for a in args):
            return traced(*args)
        return _eager("value_and_grad", traced, args, cache)
    call.__name__ = f"value_and_grad_{getattr(fn, '__name__', 'fn').strip('<>')}"
    return call


def grad(fn, argnums=0, memory: str = "recompute"):
    """The gradient of `fn` (which returns a 0-d float tensor) with respect to argument `argnums`, as a
    function of the same arguments; see `value_and_grad`.

    Example:
        >>> dt.grad(lambda x: F.sum(x * x))(np.arange(3.0, dtype="float32"))
        array([0., 2., 4.], dtype=float32)
    """
    vg = value_and_grad(fn, argnums, memory)

    def call(*args):
        return vg(*args)[1]
    call.__name__ = f"grad_{getattr(fn, '__name__', 'fn').strip('<>')}"
    return call


def vjp(fn, *primals, memory: str = "recompute"):
    """``(fn(*primals), vjp_fn)``: ``vjp_fn(cotangent)`` (shaped like fn's output, a tensor or a nest of them)
    returns one cotangent per primal: ``sum(cotangent * d fn(primals) / d primal)``, zeros for a float primal
    the output does not depend on, None for an integer one."""
    options = _options("vjp", fn, memory)
    if tracing() or any(isinstance(a, Tensor) for a in primals):
        tape = _Tape("vjp", fn, primals)
        out_leaves, out_spec = tree_flatten(tape.out)
        return tape.out, lambda cot: _vjp_traced(tape, out_leaves, out_spec, cot, options)
    out = fn(*primals)
    cache: dict = {}

    def vjp_fn(cot):
        cot_leaves, cot_spec = tree_flatten(cot)
        n = len(primals)

        def traced(*xs):
            tape = _Tape("vjp", fn, xs[:n])
            leaves, spec = tree_flatten(tape.out)
            grads = _vjp_traced(tape, leaves, spec, tree_unflatten(cot_spec, list(xs[n:])), options)
            return [g for g in grads if g is not None]
        floats = iter(_eager("vjp", traced, list(primals) + cot_leaves, cache))
        return tuple(next(floats) if as_array(p).dtype.kind == "f" else None for p in primals)
    return out, vjp_fn


def _vjp_traced(tape, out_leaves, out_spec, cot, options):
    cot_leaves, cot_spec = tree_flatten(cot)
    if cot_spec != out_spec:
        raise trace_error(f"vjp: the cotangent must have the structure of the output ({len(out_leaves)} tensor(s))")
    seeds: dict = {}
    from . import F
    for i, (o, ct) in enumerate(zip(out_leaves, cot_leaves)):
        if not isinstance(o, Tensor):
            continue
        ct = ct if isinstance(ct, Tensor) else Tensor(tape.builder.constant(as_array(ct)), tape.builder)
        if ct.type.shape != o.type.shape and ct.ndim != o.ndim:
            raise trace_error(f"vjp: cotangent {i} is {ct.type}; the output is {o.type}")
        if is_float(o.value):
            ct = F.cast(ct, o.dtype.name) if ct.dtype != o.dtype else ct
            seeds[o.value] = seeds[o.value] + ct if o.value in seeds else ct
    wrt = [x for x in tape.inputs if is_float(x.value)]
    grads = iter(tape.backward(seeds, wrt, options))
    return tuple(next(grads) if is_float(x.value) else None for x in tape.inputs)
