"""What the VM program's lowering (`vm_program`, `vm_loops`) emits with: Relax constants and types of IR types, and
`_Seq`, the bindings of one Relax sequence (a function body or an ``If`` branch)."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..ir.types import TensorType

FALLBACK_CALLBACK = "dyntvm.vm_fallback"     # raises: the runtime runs this call in the executor instead


def _TRUE():  # noqa: N802 - a constant
    return relax.const(np.array(True), "bool")


def _i64(v: int):
    return tvm.tirx.IntImm("int64", v)


def _dtype_imm(dtype: str):
    """A data type as a packed function's argument (as `relax.op.memory.view` passes it)."""
    return tvm.ir.GenericConst(tvm.DataType(dtype), relax.AnyType())


def _ty(t: TensorType):
    return relax.TensorType(dtype=t.dtype, ndim=t.ndim)


def _ret_ty(types: list):
    return relax.TupleType([_ty(t) for t in types])


class _Seq:
    """The bindings of one Relax sequence (a function body or an If branch)."""

    def __init__(self, bb, inline: bool = False):
        self.bb, self.bindings = bb, []
        self.inline = inline            # region bodies may be copied in (the program's own sequence, its branches)

    def emit(self, expr, name: str = "v"):
        expr = self.bb.normalize(expr)
        var = relax.Var(name, expr.ty)
        self.bindings.append(relax.VarBinding(var, expr))
        return var

    def result(self, values: list):
        return relax.SeqExpr([relax.BindingBlock(self.bindings)], self.bb.normalize(relax.Tuple(values)))

    def value(self, values: list):
        """The sequence giving `values`: the value itself where there is one (an ``If`` of one value copies it;
        of a tuple, it makes the tuple, copies it and takes it apart: three more VM instructions)."""
        if len(values) == 1:
            return relax.SeqExpr([relax.BindingBlock(self.bindings)], self.bb.normalize(values[0]))
        return self.result(values)
