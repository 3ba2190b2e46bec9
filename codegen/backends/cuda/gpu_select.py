"""Selects (``where``) on CUDA kernels of their own.

TVM 0.27's CUDA code generator cannot print a vectorized select whose condition is a vector: it declares the
condition's variable with the select's type (``float2 v = make_ushort2(...)``), which nvcc rejects ("no suitable
user-defined conversion from ushort2 to float2"). dlight vectorizes the epilogue of a matmul kernel, so a
``where`` fused after a matmul (a loop body's cond turned into a select, `partition.cond_select`: branchy's
per-row sub-networks) failed the build: its condition, one bool per row, is the same for every lane of a
vectorized row. Marked opaque, such a ``where`` - whose condition has another shape than its result - is a kernel
of its own, which dlight's fallback rule schedules without vectorizing. A ``where`` whose condition has the
result's shape stays fused (relu, clip and the NaN-aware maximum / minimum are such wheres on CUDA: a matmul's
relu epilogue stays in the matmul's kernel).
"""
from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx.buffer import is_buffer_var

from ...fusion_guard import OPAQUE

_WHERE = re.compile(r"where\d*")


def broadcast_condition(f: tirx.PrimFunc) -> bool:
    """Whether a legalized ``where`` (condition, then, else -> result) reads a condition of another shape than
    its result's (a broadcast one). Unknown forms count as broadcast (kept out of fusion: always safe)."""
    buffers = [p.ty for p in f.params if is_buffer_var(p)]
    if len(buffers) < 2:
        return True
    cond, out = buffers[0], buffers[-1]
    if str(cond.dtype) != "bool" or len(cond.shape) != len(out.shape):
        return True
    return not all(tvm_ffi.structural_equal(a, b) for a, b in zip(cond.shape, out.shape))


@tvm.transform.module_pass(opt_level=0, name="dyntvm.OpaqueWheres")
def opaque_wheres(mod: tvm.IRModule, ctx) -> tvm.IRModule:
    """Run after AnnotateTIROpPattern, before FuseOps: a legalized ``where`` with a broadcast condition stays out
    of fused groups."""
    for gv, f in list(mod.functions.items()):
        if isinstance(f, tirx.PrimFunc) and _WHERE.fullmatch(gv.name_hint) and broadcast_condition(f):
            mod[gv] = f.with_attr("op_pattern", OPAQUE)
    return mod
