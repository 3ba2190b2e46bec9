"""Selects (``where``) on CUDA kernels of their own.

TVM 0.27's CUDA code generator cannot print a vectorized select whose condition is a vector: it declares the
condition's variable with the select's type (``float2 v = make_ushort2(...)``), which nvcc rejects ("no suitable
user-defined conversion from ushort2 to float2"). dlight vectorizes the epilogue of a matmul kernel, so a
``where`` fused after a matmul (a loop body's cond turned into a select, `partition.cond_select`: branchy's
per-row sub-networks) failed the build. Marked opaque, a ``where`` is a kernel of its own, which dlight's
fallback rule schedules without vectorizing.
"""
from __future__ import annotations

import re

import tvm
from tvm import tirx

from ...fusion_guard import OPAQUE

_WHERE = re.compile(r"where\d*")


@tvm.transform.module_pass(opt_level=0, name="dyntvm.OpaqueWheres")
def opaque_wheres(mod: tvm.IRModule, ctx) -> tvm.IRModule:
    """Run after AnnotateTIROpPattern, before FuseOps: every legalized ``where`` stays out of fused groups."""
    for gv, f in list(mod.functions.items()):
        if isinstance(f, tirx.PrimFunc) and _WHERE.fullmatch(gv.name_hint):
            mod[gv] = f.with_attr("op_pattern", OPAQUE)
    return mod
