"""Keeps TVM's FuseTIR away from kernels it crashes on.

Where a buffer's shape is an expression its symbols cannot be read back from (``N + min(N, 1)``, the
length of ``concat([v, v[:1]])``), Relax's legalization passes the symbol to the PrimFunc as a scalar
parameter. FuseTIR then fails on groups of such kernels: with ``VarRemapGet(source) == nullptr``, or a
segfault (``less(sum(concat([v, v[:1]])), 3.0)`` over ``v: [N]``, found by review). Marking those kernels
opaque keeps them out of fused groups: each runs as its own kernel, correct and rare.
"""
from __future__ import annotations

import tvm
from tvm import tirx
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


@tvm.transform.module_pass(opt_level=0, name="dyntvm.OpaqueShapeScalarKernels")
def opaque_shape_scalar_kernels(mod: tvm.IRModule, ctx) -> tvm.IRModule:
    """Run after AnnotateTIROpPattern, before FuseOps."""
    for gv, f in list(mod.functions.items()):
        if isinstance(f, tirx.PrimFunc) and shape_scalars(f):
            mod[gv] = f.with_attr("op_pattern", OPAQUE)
    return mod
