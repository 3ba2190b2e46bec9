"""Converters: one per STATIC op of our IR, each emitting Relax that computes exactly what the numpy
reference kernel (`runtime/kernels.py`) computes.

Registry: ``CONVERTERS[op_name](bb, node, args, ctx) -> list[relax.Expr]`` with

* ``bb``: the `relax.BlockBuilder`, inside a dataflow block of the function being built;
* ``node``: our `Node` (its ``attrs`` and the input/output `TensorType`s are used);
* ``args``: one Relax expression per ``node.inputs`` (already bound vars, with known shapes);
* ``ctx``: a `ConvertContext` (`codegen/dims.py`): our dims -> tirx PrimExprs of the function's
  symbolic vars.

A converter returns one Relax expression per node output, with the output's dtype and rank.
Shapes of results come from Relax's own inference, never from our types: a type describes the
non-degenerate case only (``x[:1]`` is typed ``1`` but has length 0 when N = 0), while the compiled
code computes exactly what numpy computes at every size.

Converters register only with ``@converter(name, ...)``; an op family registers with a loop over
``ops_in(Group.X)`` (see `elementwise.py`). Where they live:

* `common.py`: shared helpers, numpy broadcasting (`unify_broadcast`), empty-reduction guards;
* `elementwise.py`: unary, binary, comparison, logical ops, ``where``, ``clip``, ``cast``;
* `reduce.py`: reductions and argmax/argmin;
* `shape.py`: reshape, transpose, slices, concat/stack/split, take, broadcast_to, tile, pad;
* `nn.py`: matmul, softmax, layer_norm, topk;
* `creation.py`: constant, full, full_like, arange;
* `index.py`: cumsum, scatter_flat;
* `window.py`: conv, max_pool, avg_pool (pools: the TE computes of `../te_window.py`; conv on the CPU: those of
  `../te_conv.py`, the weight packed at compile time);
* `../te_kernels.py`: the hand-written TE computes they emit.

Where Relax/TOPI does not reproduce numpy, the converter works around it (see the notes at each
converter and `UNSUPPORTED_EXACTNESS`). The general rules:

* Shapes Relax cannot prove compatible (broadcasting ``N`` against ``3``, two different
  expressions our IR says are equal, reshape sizes) are made explicit: a ``match_cast`` (checked
  at run time, raises instead of reading out of bounds) where our IR says two dims are equal, a
  materialized numpy broadcast (``dim == 1 ? 0 : i``) where a dim may be 1 at run time.
* Reductions over an axis whose length is symbolic get an epilogue that writes the identity when
  the length is 0: TVM's lowered reductions initialise the accumulator inside the reduction loop,
  so a 0-length symbolic axis leaves the output uninitialised (garbage).
* Slices, splits, take and symbolic broadcasts are our own TE computes: Relax's ``strided_slice``
  infers negative lengths for empty symbolic slices, ``broadcast_to`` reads out of bounds when a
  symbolic dim is 1 at run time, and ``take`` defaults to an unchecked mode.
* Where numpy raises on values, compiled code raises too (run-time checks, each a small serial
  kernel with a TIR assert: `te_kernels`): a ``take`` index out of range (the check also wraps
  negative indices; none for constant indices within a static axis), argmax/argmin/max/min of
  an empty axis (none for axes provably non-empty), an integer ``power`` with a negative exponent (none
  for a constant non-negative exponent). The executor turns the failure into an ExecutionError
  naming the op.
* Float max/min reductions use a NaN-propagating reducer with a -inf/+inf identity (TOPI's drops
  NaNs depending on order and starts from the lowest *finite* value, so max([-inf]) is -3.4e38);
  argmax/argmin are that extreme followed by a "first index equal to it" min-reduction (numpy's
  first-occurrence and first-NaN rules; a single tuple-reducer pass cannot be scheduled by dlight
  on GPUs).
* Comparisons: float ``!=`` adds ``isnan`` terms (TVM emits an ordered compare); bools compare as
  int8. Integer ``power`` is a TIR while loop (TVM has no integer power). float -> small/unsigned
  int casts go through int32/int64 like numpy's C casts on x86.
"""
from __future__ import annotations

from tvm import relax
from tvm.relax import op as R

from dyntvm.errors import CompileError, UnsupportedOpError
from ...ir.ops import Group, ops_in
from ..dims import ConvertContext

__all__ = ["CONVERTERS", "ConvertContext", "convert_node", "converter", "UNSUPPORTED_EXACTNESS"]

# Importing the converter modules registers every converter (each imports `converter` from .registry).
from . import checks, creation, elementwise, index, nn, reduce, shape, window  # noqa: E402
from .common import dtype_of, emit, ndim_of, shape_of, ty_of, unflatten  # noqa: E402
from .registry import CONVERTERS, UNSUPPORTED_EXACTNESS, converter  # noqa: E402,F401

_CONVERTER_MODULES = (checks, creation, elementwise, index, nn, reduce, shape, window)


def _same_dtype_unary(name):
    fn = getattr(R, name, None)
    if fn is None:
        raise NotImplementedError(f"unary op {name!r}: Relax has no R.{name}; register a converter with "
                                  f"@converter({name!r}) in codegen/converters/elementwise.py")
    return lambda bb, node, args, ctx: [fn(args[0])]


for _group in (Group.UNARY, Group.PREDICATE):      # members without a converter of their own: R.<name>
    for _name in ops_in(_group):
        if _name not in CONVERTERS:
            converter(_name)(_same_dtype_unary(_name))


# elementwise ops that run on a flattened matmul's 2-D result (`sink_flat`): unary and arithmetic families
_SINKABLE = frozenset(ops_in(Group.FLOAT_UNARY)) | frozenset(ops_in(Group.UNARY)) | frozenset(ops_in(Group.ARITH)) | \
    {"clip"}


def sink_flat(bb, node, args: list, ctx: ConvertContext):
    """(args, view shape): where an elementwise op reads a flattened matmul's result ``reshape(flat, shape)``
    (`ctx.flat_views`, the matmul converter's [..., M, K] @ [K, N] as one 2-D GEMM) and its other operands
    are scalars, vectors along the last axis or views of the same shape, the op runs on the 2-D `flat`
    operands (the same numpy broadcast) and its result is reshaped back to the view shape by `convert_node`.
    FuseOps stops at the (injective) reshape after a matmul; on the 2-D result the bias / activation /
    second matmul's input stay in the matmul's kernel. Otherwise `args` unchanged and None."""
    if node.op not in _SINKABLE or len(node.outputs) != 1 or not ctx.flat_views:
        return args, None
    shape, new, seen = None, [], False
    for a in args:
        hit = next((v for v in ctx.flat_views if isinstance(a, relax.Var) and v[0].same_as(a)), None)
        if hit is not None:
            if shape is not None and (len(shape) != len(hit[2]) or not all(
                    ctx.relax_equal(x, y) for x, y in zip(shape, hit[2]))):
                return args, None
            shape, seen = hit[2], True
            new.append(hit[1])
        else:
            new.append(a)
    if not seen or node.outputs[0].type.ndim != len(shape):
        return args, None
    for a, n in zip(args, new):
        if n is a:       # not a view: a scalar, or a vector of the last dim (it broadcasts over rows alike)
            s = shape_of(a) if isinstance(ty_of(a), relax.TensorType) else None
            if s is None or len(s) > 1 or (len(s) == 1 and not ctx.relax_equal(s[0], shape[-1])):
                return args, None
    return new, shape


def convert_node(bb, node, args: list, ctx: ConvertContext) -> list:
    """Run the converter of `node` and emit its results; checks dtype/rank against our types."""
    fn = CONVERTERS.get(node.op)
    if fn is None:
        raise UnsupportedOpError(f"op {node.op!r} has no Relax converter (node {node.name!r}"
                                 f"{', ' + node.source if node.source else ''})")
    ctx.node = node
    args, view_shape = sink_flat(bb, node, list(args), ctx)
    outs = fn(bb, node, args, ctx)
    if view_shape is not None:      # the 2-D result, reshaped back (and remembered as a view in turn)
        flat = emit(bb, outs[0])
        outs = [unflatten(bb, flat, list(view_shape), ctx.flat_casts)]
        ctx.flat_views.append((outs[0], flat, view_shape))
    if len(outs) != len(node.outputs):
        raise CompileError(f"internal: converter of {node.op} returned {len(outs)} results, "
                           f"expected {len(node.outputs)}")
    res = []
    for v, e in zip(node.outputs, outs):
        e = emit(bb, e)
        t = v.type
        if not isinstance(ty_of(e), relax.TensorType) or dtype_of(e) != t.dtype or ndim_of(e) != t.ndim:
            raise CompileError(f"internal: converter of {node.op} (node {node.name!r}) produced "
                               f"{e.ty}, expected {t}")
        if shape_of(e) is None:
            raise CompileError(f"internal: Relax could not infer the shape of {node.op} "
                               f"(node {node.name!r}, {e.ty}); the converter must make shapes provable")
        res.append(e)
    ctx.node = None
    return res
