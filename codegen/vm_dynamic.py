"""Dynamic-shape ops inside the VM program (`vm_program.py`) as kernels: count the rows the output will have,
read the count as a shape (``tensor_to_shape`` + ``match_cast``), then fill an output of that size with a serial
TIR loop. Only the common forms: `boolean_mask` of a bool mask on axis 0, `nonzero` of a 1-d tensor; the other
forms, and the other dynamic-shape ops, call back into Python for their numpy kernel.

A mask whose length differs from the data's rows fails the ``match_cast``: the program fails and the executor
runs the call, raising its usual error.
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..ir.graph import Node
from ..ir.vm_program import native  # noqa: F401  (codegen/vm_program.py imports it from here)

_MASK_ROWS = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_d: T.handle, h_m: T.handle, h_o: T.handle, h_c: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    n = T.int64()
    r = T.int64()
    k = T.int64()
    d = T.match_buffer(h_d, (n, r), "{dtype}")
    m = T.match_buffer(h_m, (n,), "bool")
    o = T.match_buffer(h_o, (k, r), "{dtype}")
    c = T.match_buffer(h_c, (T.int64(1),), "int64")
    c[0] = T.int64(0)
    for i in range(n):
        if m[i]:
            for q in range(r):
                o[c[0], q] = d[i, q]
            c[0] = c[0] + T.int64(1)
'''

_NONZERO = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_x: T.handle, h_o: T.handle, h_c: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    n = T.int64()
    k = T.int64()
    x = T.match_buffer(h_x, (n,), "{dtype}")
    o = T.match_buffer(h_o, (T.int64(1), k), "int64")
    c = T.match_buffer(h_c, (T.int64(1),), "int64")
    c[0] = T.int64(0)
    for i in range(n):
        if {test}:
            o[0, c[0]] = i
            c[0] = c[0] + T.int64(1)
'''


_COUNT = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_x: T.handle, h_c: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    n = T.int64()
    x = T.match_buffer(h_x, (n,), "{dtype}")
    c = T.match_buffer(h_c, (T.int64(1),), "int64")
    c[0] = T.int64(0)
    for i in range(n):
        if {test}:
            c[0] = c[0] + T.int64(1)
'''


class DynamicOps:
    """The kernels of `native` nodes, emitted by a `vm_program._Lowering` (`low`)."""

    def __init__(self, low):
        self.low = low
        self.prims: dict = {}

    def _prim(self, template: str, kind: str, dtype: str):
        name = f"dyntvm_vm_{kind}_{dtype}"
        if name not in self.prims:
            from tvm.script import tirx as T  # noqa: F401 - the script's namespace
            test = "x[i]" if dtype == "bool" else f'x[i] != T.Cast("{dtype}", 0)'
            prim = tvm.script.from_source(template.format(name=name, dtype=dtype, test=test))
            self.prims[name] = self.low.bb.add_func(prim.with_attr("global_symbol", name), name)
        return self.prims[name]

    def _count(self, seq, nonzero_of):
        """The number of nonzero entries of the 1-d `nonzero_of` as a symbolic dim (a loop of its own: a TIR
        reduction over no element never initializes its result)."""
        low = self.low
        total = seq.emit(relax.call_tir(self._prim(_COUNT, "count", nonzero_of.ty.dtype), relax.Tuple([nonzero_of]),
                                        relax.TensorType([1], "int64")))
        k = tvm.tirx.Var("kept", "int64")
        low._match(seq, seq.emit(relax.op.tensor_to_shape(total)), relax.ShapeType([k]))
        return k

    def boolean_mask(self, seq, n: Node, ins: list) -> list:
        low = self.low
        data = low._shaped(seq, ins[0])
        dims = list(data.ty.shape.values)
        dtype = n.inputs[0].type.dtype
        mask = low._match(seq, ins[1], relax.TensorType([dims[0]], "bool"))
        k = self._count(seq, mask)
        row = tvm.tirx.IntImm("int64", 1)
        for d in dims[1:]:
            row = row * d
        flat = seq.emit(relax.op.reshape(data, [dims[0], row]))
        res = seq.emit(relax.call_tir(self._prim(_MASK_ROWS, "mask_rows", dtype), relax.Tuple([flat, mask]),
                                      [relax.TensorType([k, row], dtype), relax.TensorType([1], "int64")]))
        rows = seq.emit(relax.TupleGetItem(res, 0))
        return [seq.emit(relax.op.reshape(rows, [k] + dims[1:]), "boolean_mask")]

    def nonzero(self, seq, n: Node, ins: list) -> list:
        low = self.low
        x = low._shaped(seq, ins[0])
        k = self._count(seq, x)
        dtype = n.inputs[0].type.dtype
        res = seq.emit(relax.call_tir(self._prim(_NONZERO, "nonzero", dtype), relax.Tuple([x]),
                                      [relax.TensorType([1, k], "int64"), relax.TensorType([1], "int64")]))
        return [seq.emit(relax.TupleGetItem(res, 0), "nonzero")]
