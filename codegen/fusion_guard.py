"""Keeps TVM's FuseTIR away from kernels it crashes on.

Where a buffer's shape is an expression its symbols cannot be read back from (``N + min(N, 1)``, the
length of ``concat([v, v[:1]])``), Relax's legalization passes the symbol to the PrimFunc as a scalar
parameter. FuseTIR then fails on groups of such kernels: with ``VarRemapGet(source) == nullptr``, or a
segfault (``less(sum(concat([v, v[:1]])), 3.0)`` over ``v: [N]``, found by review). Marking those kernels
opaque keeps them out of fused groups: each runs as its own kernel, correct and rare.

A second case (issue 24): a kernel whose output size is a var that a ``match_cast`` binds to an expression (the
window ops' plain output dims, `converters/window_dims.py`) and that none of its inputs carries - the ``arange``
of a Resize to another map's size (an FPN's top-down path). In a fused group FuseOps passes that var in a shape
parameter; FuseTIR's first steps (ExpandTupleArguments re-normalizes the caller) put the match_cast's expression
in its place, and FuseTIR then stops with "All shape inputs are expected to be single tirx var". Such kernels stay
out of fusion too (`sized_by_cast_vars`).
"""
from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.tirx.buffer import is_buffer_var

OPAQUE = 8      # relax's OpPatternKind.kOpaque


def shape_scalars(f: tirx.PrimFunc) -> list:
    """The scalar parameters of `f` that a buffer parameter's shape uses."""
    scalars = [p for p in f.params if not is_buffer_var(p)]
    if not scalars:
        return []
    used = set()
    for p in f.params:
        if is_buffer_var(p):
            for d in p.ty.shape:
                used.update(v.name for v in tirx.analysis.undefined_vars(d))
    return [s for s in scalars if s.name in used]


def _vars_of(ty, out: set) -> None:
    """The names of the tirx vars in the shapes of a tensor type (or a tuple of them) into `out`."""
    if isinstance(ty, relax.TupleType):
        for t in ty.fields:
            _vars_of(t, out)
    elif isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        for d in ty.shape.values:
            out.update(v.name for v in tirx.analysis.undefined_vars(d))


def _dims(ty):
    """The dims of a tensor type's or a shape type's known shape, else None."""
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        return list(ty.shape.values)
    if isinstance(ty, relax.ShapeType) and ty.values is not None:
        return list(ty.values)
    return None


def sized_by_cast_vars(func: relax.Function) -> set:
    """The PrimFuncs (GlobalVars) that `func` calls with an output dim holding a var which a ``match_cast`` in
    `func` binds to an expression (not to a dim that is a var already) and which no argument of the call holds."""
    cast_vars = set()
    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(_CALL_TIR) and isinstance(expr.args[0], relax.GlobalVar):
            calls.append(expr)

    def walk(body):
        if not isinstance(body, relax.SeqExpr):
            return
        for block in body.blocks:
            for b in block.bindings:
                if isinstance(b, relax.MatchCast):
                    src, dst = _dims(b.value.ty), _dims(b.ty)
                    for a, v in zip(src or (), dst or ()):
                        if isinstance(v, tirx.Var) and not isinstance(a, (tirx.Var, tirx.IntImm)):
                            cast_vars.add(v.name)

    walk(func.body)
    relax.analysis.post_order_visit(func.body, visit)
    out = set()
    if not cast_vars:
        return out
    for call in calls:
        produced: set = set()
        for t in call.ty_args:
            _vars_of(t, produced)
        given: set = set()
        for a in call.args[1:]:
            for x in (a.fields if isinstance(a, relax.Tuple) else [a]):
                if isinstance(x, relax.ShapeExpr):
                    for d in x.values:
                        given.update(v.name for v in tirx.analysis.undefined_vars(d))
                elif isinstance(x.ty, (relax.TensorType, relax.TupleType)):
                    _vars_of(x.ty, given)
                else:       # a scalar (PrimExpr) argument
                    try:
                        given.update(v.name for v in tirx.analysis.undefined_vars(x))
                    except Exception:   # noqa: BLE001 - not a PrimExpr: holds no dim var
                        pass
        if (produced - given) & cast_vars:
            out.add(call.args[0])
    return out


_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@tvm.transform.module_pass(opt_level=0, name="dyntvm.OpaqueShapeScalarKernels")
def opaque_shape_scalar_kernels(mod: tvm.IRModule, ctx) -> tvm.IRModule:
    """Run after AnnotateTIROpPattern, before FuseOps."""
    sized = set()
    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            sized.update(gv.name_hint for gv in sized_by_cast_vars(f))
    for gv, f in list(mod.functions.items()):
        if isinstance(f, tirx.PrimFunc) and (shape_scalars(f) or gv.name_hint in sized):
            mod[gv] = f.with_attr("op_pattern", OPAQUE)
    return mod
