"""Kernels that assume only element alignment of their tensor arguments (`vm_program.ELEMENT_ALIGNED_INPUTS`).

TVM gives every PrimFunc parameter's buffer a data alignment of 64 bytes; MakePackedAPI turns it into a
``storage_alignment`` attribute of the argument's data pointer, and LLVM then emits aligned vector moves
(``vmovaps``), which fault on data that is not so aligned. Nothing checks it at run time. numpy allocates with
16-byte alignment, so the runtime copied such an input into an aligned buffer before every call (two inputs of
the detection example: ~4 us of its ~35 us call). `element_aligned_pass`, run after TVM's TIR pipeline
(`cpu_schedule.tir_pipeline`), sets those attributes to 1: LLVM then emits unaligned moves (``vmovups``: the same speed on aligned data),
and a contiguous numpy array of the argument's dtype is passed as it is. Only LLVM's alignment hints change, not
where anything is allocated.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx


def _element_aligned(stmt):
    if stmt.attr_key == "storage_alignment" and int(stmt.value) > 1:
        return tirx.AttrStmt(stmt.node, stmt.attr_key, tirx.IntImm("int32", 1), stmt.body, stmt.span)
    return stmt


@tvm.transform.module_pass(opt_level=0, name="dyntvm.ElementAlignedArguments")
def element_aligned_pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every ``storage_alignment`` hint of `mod` (lowered by TVM's TIR pipeline: MakePackedAPI made them) set to 1."""
    return tvm_ffi.structural_map(mod, (tirx.AttrStmt, _element_aligned))
