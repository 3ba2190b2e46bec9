"""The nodes outside regions that the VM program (`vm_program.py`) runs as kernels rather than Python callbacks
(`ir.vm_program.native` says which):

* `boolean_mask` of a bool mask on axis 0, `nonzero` of a 1-d tensor: a kernel counts the rows the output will
  have and returns the count, a Relax variable of PrimType that is a dim of the output (`COUNT_RETURNED`), then
  another fills an output of that size with a serial TIR loop (1-d data directly, else viewed as rows and
  back); data whose rows the program knows equal the mask's is not matched again;
* `topk` with a tensor `k` (along the last axis; another axis is moved there and back): a TIR kernel checks ``0 <= k <= n`` (out of range: the numpy
  kernel is called back, which raises its error), k is read as a shape, and another kernel sorts each row's
  indices with a stable merge sort (ties in index order, NaN last, as numpy's stable argsort of ``-x`` / ``x``)
  and writes the first k (`vm_topk.py`);
* `slice_dyn` (tensor starts, stops, steps): a plan kernel (Python's slice clamping), the lengths read as a
  shape, a gather kernel (`vm_slice.py`); a zero step calls the numpy kernel back, which raises;
* a static op the partitioner left out of regions (the view ops `slice`, `squeeze`, `reshape`, ... that would
  make a region of their own): its region converter (`converters`), emitted into the program.

The other forms, and the other dynamic-shape ops, call back into Python for their numpy kernel. A failing check
(a mask whose length differs from the data's rows fails the ``match_cast``; k out of range) fails the program,
and the executor runs the call, raising its usual error.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..ir.graph import Node
from ..ir.ops import STATIC
from ..ir.vm_program import native  # noqa: F401  (codegen/vm_program.py imports it from here)
from .vm_slice import gather_primfunc as slice_gather_primfunc
from .vm_slice import plan_primfunc as slice_plan_primfunc
from .vm_topk import topk_check_primfunc, topk_primfunc

_MASK_ROWS = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_d: T.handle, h_m: T.handle, h_o: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    n = T.int64()
    r = T.int64()
    k = T.int64()
    d = T.match_buffer(h_d, (n, r), "{dtype}")
    m = T.match_buffer(h_m, (n,), "bool")
    o = T.match_buffer(h_o, (k, r), "{dtype}")
    c = T.alloc_buffer((T.int64(1),), "int64")
    c[0] = T.int64(0)
    for i in range(n):
        if m[i]:
            for q in range(r):
                o[c[0], q] = d[i, q]
            c[0] = c[0] + T.int64(1)
'''

_MASK_1D = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_d: T.handle, h_m: T.handle, h_o: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    n = T.int64()
    k = T.int64()
    d = T.match_buffer(h_d, (n,), "{dtype}")
    m = T.match_buffer(h_m, (n,), "bool")
    o = T.match_buffer(h_o, (k,), "{dtype}")
    c = T.alloc_buffer((T.int64(1),), "int64")
    c[0] = T.int64(0)
    for i in range(n):
        if m[i]:
            o[c[0]] = d[i]
            c[0] = c[0] + T.int64(1)
'''

_NONZERO = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_x: T.handle, h_o: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    n = T.int64()
    k = T.int64()
    x = T.match_buffer(h_x, (n,), "{dtype}")
    o = T.match_buffer(h_o, (T.int64(1), k), "int64")
    c = T.alloc_buffer((T.int64(1),), "int64")
    c[0] = T.int64(0)
    for i in range(n):
        if {test}:
            o[0, c[0]] = i
            c[0] = c[0] + T.int64(1)
'''


# the count, returned (a scalar: the program binds it as a dim, with no tensor to allocate and read as a shape)
_COUNT = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_x: T.handle) -> T.int64:
    T.func_attr({{"tirx.noalias": True}})
    n = T.int64()
    x = T.match_buffer(h_x, (n,), "{dtype}")
    c = T.alloc_buffer((T.int64(1),), "int64")
    c[0] = T.int64(0)
    for i in range(n):
        if {test}:
            c[0] = c[0] + T.int64(1)
    return c[0]
'''

# the count written to a tensor, read as a shape (`COUNT_RETURNED` off)
_COUNT_TENSOR = '''# from tvm.script import tirx as T
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

# the count kernel returns the count, a Relax variable of PrimType the program uses as a dim (two VM instructions:
# the call, the value stored in the shape heap); False: it writes the count to an int64[1] tensor read as a shape
# (eight: the tensor's allocation, ``tensor_to_shape``, its ``match_cast`` and the copy the match makes)
COUNT_RETURNED = True


class DynamicOps:
    """The kernels of `native` nodes, emitted by a `vm_program._Lowering` (`low`)."""

    def __init__(self, low):
        self.low = low
        self.prims: dict = {}
        self.counts: dict = {}          # (sequence, value) -> its count of nonzero entries, bound in that sequence
        self.masks: dict = {}           # (sequence, value) -> that mask matched to a shape in that sequence

    def lower(self, seq, n: Node, ins: list):
        """The outputs of `native` node `n`, or None where it cannot be lowered here (the caller calls back)."""
        if n.opdef.kind == STATIC:
            return self.static(seq, n, ins)
        return getattr(self, n.op)(seq, n, ins)

    def _prim(self, template: str, kind: str, dtype: str):
        def make(name):
            from tvm.script import tirx as T  # noqa: F401 - the script's namespace
            test = "x[i]" if dtype == "bool" else f'x[i] != T.Cast("{dtype}", 0)'
            if str(dtype).startswith(("float", "bfloat")):
                # TIR's != on floats is LLVM's ordered `fcmp one`, false for NaN; numpy counts NaN as nonzero
                # (as `converters.elementwise._compare` does for not_equal)
                test = f"({test} or T.isnan(x[i]))"
            return tvm.script.from_source(template.format(name=name, dtype=dtype, test=test))
        return self._once(f"dyntvm_vm_{kind}_{dtype}", make)

    def _once(self, name: str, make):
        """The GlobalVar of PrimFunc `name` (``make(name)``), added to the module on first use."""
        if name not in self.prims:
            self.prims[name] = self.low.bb.add_func(make(name).with_attr("global_symbol", name), name)
        return self.prims[name]

    def _count(self, seq, nonzero_of, value=None):
        """The number of nonzero entries of the 1-d `nonzero_of` as a symbolic dim (a loop of its own: a TIR
        reduction over no element never initializes its result). Counted once per `value` (the node input
        `nonzero_of` was matched from) and sequence: the detection example masks three tensors with one mask and
        takes its nonzero (one count, not four; a count bound in a branch is not seen outside it)."""
        if value is not None and (seq, value) in self.counts:
            return self.counts[(seq, value)]
        k = self._count_kernel(seq, nonzero_of)
        if value is not None:
            self.counts[(seq, value)] = k
        return k

    def _count_kernel(self, seq, nonzero_of):
        low = self.low
        dtype = nonzero_of.ty.dtype
        if COUNT_RETURNED:      # (a PrimType variable is a dim: the VM stores it in its shape heap when it is bound)
            return seq.emit(relax.Call(self._prim(_COUNT, "count", dtype), [nonzero_of]), "kept")
        total = seq.emit(relax.call_tir(self._prim(_COUNT_TENSOR, "count_tensor", dtype), relax.Tuple([nonzero_of]),
                                        relax.TensorType([1], "int64")))
        k = tvm.tirx.Var("kept", "int64")
        low._match(seq, seq.emit(relax.op.tensor_to_shape(total)), relax.ShapeType([k]))
        return k

    def boolean_mask(self, seq, n: Node, ins: list) -> list:
        low = self.low
        mask = self.masks.get((seq, ins[1]))     # a mask of several boolean_masks: matched (and counted) once
        if mask is None:
            mask = self.masks[(seq, ins[1])] = low._shaped(seq, ins[1])
        t = n.inputs[0].type                      # the data: as many rows as the mask (else the match fails)
        data, rows = ins[0], mask.ty.shape.values[0]
        known = data.ty.shape.values if isinstance(getattr(data.ty, "shape", None), relax.ShapeExpr) else None
        if known is None or not tvm.sym.Analyzer().can_prove_equal(known[0], rows):
            rest = list(known[1:]) if known is not None else [tvm.tirx.Var(f"s{j}", "int64") for j in range(1, t.ndim)]
            data = low._match(seq, data, relax.TensorType([rows] + rest, t.dtype))
        dims = list(data.ty.shape.values)
        dtype = t.dtype
        k = self._count(seq, mask, ins[1])
        if len(dims) == 1:                        # (no views to rows of one element and back)
            return [seq.emit(relax.call_tir(self._prim(_MASK_1D, "mask", dtype), relax.Tuple([data, mask]),
                                            relax.TensorType([k], dtype)), "boolean_mask")]
        row = tvm.tirx.IntImm("int64", 1)
        for d in dims[1:]:
            row = row * d
        flat = low._view(seq, data, [dims[0], row])
        rows = seq.emit(relax.call_tir(self._prim(_MASK_ROWS, "mask_rows", dtype), relax.Tuple([flat, mask]),
                                       relax.TensorType([k, row], dtype)))     # (the kernel's counter: a local)
        return [low._view(seq, rows, [k] + dims[1:], "boolean_mask")]

    def nonzero(self, seq, n: Node, ins: list) -> list:
        low = self.low
        x = low._shaped(seq, ins[0])
        k = self._count(seq, x, ins[0])
        dtype = n.inputs[0].type.dtype
        return [seq.emit(relax.call_tir(self._prim(_NONZERO, "nonzero", dtype), relax.Tuple([x]),
                                        relax.TensorType([1, k], "int64")), "nonzero")]

    def topk_dyn(self, seq, n: Node, ins: list) -> list:
        low = self.low
        x = low._shaped(seq, ins[0])
        nd = x.ty.ndim
        axis = n.attrs.axis % nd                  # sorted along the last axis: another one is moved there
        perm = [j for j in range(nd) if j != axis] + [axis]
        if axis != nd - 1:
            x = seq.emit(relax.op.permute_dims(x, perm))
        dims = list(x.ty.shape.values)
        dtype, largest = n.inputs[0].type.dtype, bool(n.attrs.largest)
        rows = tvm.tirx.IntImm("int64", 1)
        for d in dims[:-1]:
            rows = rows * d
        flat = low._view(seq, x, [rows, dims[-1]])
        k_in = low._int64(seq, ins[1])
        ok = seq.emit(relax.call_tir(self._once("dyntvm_vm_topk_k", topk_check_primfunc),
                                     relax.Tuple([k_in, relax.prim_value(dims[-1])]), relax.TensorType([], "bool")))
        run = type(seq)(seq.bb)                   # k in range: read as a shape, then the sort
        k = tvm.tirx.Var("k", "int64")
        low._match(run, run.emit(relax.op.tensor_to_shape(k_in)), relax.ShapeType([k]))
        sort = self._once(f"dyntvm_vm_topk_{'largest' if largest else 'smallest'}_{dtype}",
                          lambda name: topk_primfunc(name, dtype, largest))
        res = run.emit(relax.call_tir(sort, relax.Tuple([flat]), [
            relax.TensorType([rows, k], dtype), relax.TensorType([rows, k], "int64"),
            relax.TensorType([2, dims[-1]], "int64")]))
        outs = [low._view(run, run.emit(relax.TupleGetItem(res, j)), dims[:-1] + [k], name)
                for j, name in ((0, "top_values"), (1, "top_indices"))]
        if axis != nd - 1:
            outs = [run.emit(relax.op.permute_dims(o, [int(j) for j in np.argsort(perm)])) for o in outs]
        fail = type(seq)(seq.bb)                  # out of range: the kernel called back raises its error
        res = seq.emit(relax.If(ok, run.result(outs), fail.result(low._callback(fail, n, ins))), "topk")
        return low._items(seq, res, 2)

    def slice_dyn(self, seq, n: Node, ins: list) -> list:
        low = self.low
        x = low._shaped(seq, ins[0])
        dims = list(x.ty.shape.values)
        nd, dtype = len(dims), n.inputs[0].type.dtype
        axes = tuple(ax % nd for ax in n.attrs.axis)
        bounds = []
        for b in ins[1:]:                         # one entry per axis (else the match_cast fails: the executor)
            b = low._match(seq, b, relax.TensorType([len(axes)], b.ty.dtype))
            bounds.append(b if b.ty.dtype == "int64" else seq.emit(relax.op.astype(b, "int64")))
        plan = self._once(f"dyntvm_vm_slice_plan_{nd}_{'_'.join(map(str, axes))}",
                          lambda name: slice_plan_primfunc(name, nd, axes))
        res = seq.emit(relax.call_tir(plan, relax.Tuple(bounds + [relax.prim_value(d) for d in dims]), [
            relax.TensorType([2 * nd], "int64"), relax.TensorType([nd], "int64"), relax.TensorType([], "bool")]))
        first_step, lengths, ok = low._items(seq, res, 3)
        run = type(seq)(seq.bb)                   # steps nonzero: the lengths as a shape, then the gather
        out = [tvm.tirx.Var(f"len{j}", "int64") for j in range(nd)]
        low._match(run, run.emit(relax.op.tensor_to_shape(lengths)), relax.ShapeType(out))
        gather = self._once(f"dyntvm_vm_slice_{nd}_{dtype}", lambda name: slice_gather_primfunc(name, nd, dtype))
        got = run.emit(relax.call_tir(gather, relax.Tuple([x, first_step]), relax.TensorType(out, dtype)), "slice")
        fail = type(seq)(seq.bb)                  # a zero step: the kernel called back raises its error
        res = seq.emit(relax.If(ok, run.result([got]), fail.result(low._callback(fail, n, ins))), "slice")
        return low._items(seq, res, 1)

    def static(self, seq, n: Node, ins: list):
        """A static op outside regions through its region converter, its inputs' dims bound from its types as a
        region function binds them (a value of other dims fails the ``match_cast``: the executor runs the call).
        None where the converter fails (the op is then called back)."""
        from .converters import CONVERTERS, convert_node
        from .dims import ConvertContext
        if n.op not in CONVERTERS:
            return None
        low = self.low
        mark = len(seq.bindings)
        ctx = ConvertContext(f"vm_{n.name}")
        args = []
        for i, (v, x) in enumerate(zip(n.inputs, ins)):
            if isinstance(x, tvm.ir.expr.Constant):
                args.append(x)
                continue
            shape = [ctx.bind_input_dim(d, f"in{i}_d{j}") for j, d in enumerate(v.type.shape)]
            args.append(low._match(seq, x, relax.TensorType(shape, v.type.dtype)))
        try:
            ctx.solve()
            return convert_node(_SeqBuilder(seq), n, args, ctx)
        except Exception:  # noqa: BLE001 - an op the converters cannot lower here: a Python callback instead
            del seq.bindings[mark:]
            return None


class _SeqBuilder:
    """What a converter uses of a `relax.BlockBuilder`, emitting into a `vm_program._Seq` (an ``If`` branch or a
    function body the program builds binding by binding) instead of the builder's current block."""

    def __init__(self, seq):
        self.seq, self.bb = seq, seq.bb

    def emit(self, expr, name_hint: str = ""):
        return self.seq.emit(expr, name_hint or "v")

    def emit_te(self, func, *args, **kwargs):
        return self.emit(self.bb.call_te(func, *args, **kwargs))

    def match_cast(self, value, ty, name_hint: str = ""):
        var = relax.Var(name_hint or "cast", ty)
        self.seq.bindings.append(relax.MatchCast(var, value, ty))
        return var

    def lookup_binding(self, var):
        return next((b.value for b in self.seq.bindings if isinstance(b, relax.VarBinding) and b.var.same_as(var)),
                    None)

    def normalize(self, expr):
        return self.bb.normalize(expr)

    def add_func(self, func, name: str):
        return self.bb.add_func(func, name)

    def get(self):
        return self.bb.get()
