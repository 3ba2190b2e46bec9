"""The VM program: the whole partitioned graph as one Relax function (`ir.vm_program`), so one model call is
one VM call.

`program_pass(graph, prefix)` is a module pass run after the regions are fused and scheduled and the compiled
loops added (`cpu_schedule.build_cpu`): it adds the public function `PROGRAM` and the functions it needs, then
legalizes the few Relax ops they use (row slices, stacking). Values have rank and dtype only (no shapes): each
region function checks its inputs' shapes when called, as it does when the executor calls it. Lowering:

* region -> its body copied into the program's own sequence or one of its branches (`INLINE_REGIONS`,
  `_Lowering._inline`; its parameters whose arguments' shapes prove the match bound without a ``match_cast``,
  `_implied`; where such a program fails to build, `build_with_program` builds it again with calls; the storage
  TVM's planner shares across branches is made safe by `branch_storage`), else (inside a loop function) a call
  of its function; cond / case -> ``If`` (a case: nested, predicates in order);
* foreach -> a call of its compiled loop where codegen built one, else a recursive function over a range of
  steps (the loops' lowering: `vm_loops`). Where the per-step outputs have static shapes (`_inplace_foreach`),
  their stacks are allocated once per call and each step copies its rows into them; a range of more than
  `_CHAIN` steps runs its two halves, a shorter one its first step and then itself on the rest (one call per
  step, at most `_CHAIN` deep). Else
  (`_halving_foreach`) ``steps(lo, hi)`` runs ``steps(lo, mid)`` then ``steps(mid, hi)`` and concatenates
  their stacked outputs (a range of one step runs the body on row `lo`), copying each row log2(steps) times.
  Either recursion is about log2(steps) deep, so the number of steps is not limited by the VM's stack (a
  recursion per step overflows it). Zero steps give empty stacks when the body's per-step output types are
  static, else the program asks the runtime to run the model in the executor (`FALLBACK_CALLBACK`);
* `boolean_mask` (a bool mask on axis 0) and 1-d `nonzero` -> kernels that count, then fill; `topk` with a
  tensor k on the last axis -> a k check and a merge sort; a static op outside regions -> its region converter
  (`vm_dynamic`);
* another dynamic-shape op -> `ir.vm_program.KERNEL_CALLBACK` with the node's key (the runtime runs its numpy
  kernel).
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.utils import copy_with_new_vars

from dyntvm.errors import CompileError

from ..ir.graph import Graph
from ..ir.vm_program import (CALLBACKS_FUNCTION, ELEMENT_ALIGNED_FUNCTION, GUARD_CALLBACK, KERNEL_CALLBACK, PROGRAM,
                             node_keys, unsupported_nodes)
from .vm_dynamic import DynamicOps, native
from .vm_guard import guard_needed, guard_symbols
from .vm_loops import LoopLowering
from .vm_seq import FALLBACK_CALLBACK, _i64, _ret_ty, _Seq, _ty, _TRUE  # noqa: F401  (FALLBACK_CALLBACK: named here)



# region functions' bodies copied into the program (`_Lowering._inline`). Some programs with a copied body whose
# symbolic vars are bound by the region's parameters fail to build ("PrimExpr T_1 ... has not been computed" in
# VMShapeLower: a jvp of a foreach, three torchvision detectors): `build_with_program` builds those again with the
# regions called (`inline=False`). False: regions are always called.
INLINE_REGIONS = True
#: the library's kernels are built assuming only element alignment of their arguments, and say so
#: (`ELEMENT_ALIGNED_FUNCTION`, `backends/cpu/cpu_alignment.py`): the runtime passes a numpy input that is not 64-byte
#: aligned without copying it. False: TVM's 64 bytes (LLVM's aligned vector moves), such inputs copied per call.
ELEMENT_ALIGNED_INPUTS = True


class _Lowering(LoopLowering):
    def __init__(self, mod: tvm.IRModule, graph: Graph, prefix: str, inline: bool = False):
        self.bb = relax.BlockBuilder(mod)
        self.inline = inline                    # region bodies copied into the program's own sequence
        self.funcs = {gv.name_hint: gv for gv in mod.get_global_vars()}
        self.mod = mod
        self.keys = node_keys(graph, prefix)
        self.n_loops = 0
        self.recursive: list = []                # (GlobalVar, function) of the halving foreach loops
        self.dynamic = DynamicOps(self)
        self.called_back: set = set()           # keys of the nodes called back on every run (`CALLBACKS_FUNCTION`)
        self.shaped: dict = {}                  # value of rank only -> the value matched to a shape (`_match`)
        self.current = None                     # the sequence `graph` emits into (where `shaped` entries hold)

    def graph(self, seq: _Seq, g: Graph, args: list) -> list:
        """Emit `g`'s nodes into `seq` on `args` (Relax values of its inputs); returns its outputs' values."""
        env = dict(zip(g.inputs, args))
        before, outer = dict(self.shaped), self.current     # (a value matched in a branch or a loop function is
        self.current = seq                                  # not seen outside it)
        for n in g.nodes:
            ins = [self.shaped.get(env[v], env[v]) for v in n.inputs]
            outs = getattr(self, "_" + n.op, self._kernel)(seq, n, ins)
            env.update(zip(n.outputs, outs))
        outs = [self.shaped.get(env[v], env[v]) for v in g.outputs]
        self.shaped, self.current = before, outer
        return outs

    def _constant(self, seq, n, ins):
        dtype = n.outputs[0].type.dtype          # (relax.const would make int64 and float64 32-bit)
        value = np.asarray(n.attrs.value, dtype=dtype)
        if not value.size:                       # a library holding a constant of no element does not load
            return [seq.emit(relax.op.zeros(relax.ShapeExpr([_i64(d) for d in value.shape]), dtype))]
        return [relax.const(value, dtype)]

    def _if(self, seq, cond, then: _Seq, then_values: list, other: _Seq, else_values: list, name: str) -> list:
        """The values of ``If(cond, then, other)`` (branches giving as many values): `_Seq.value`."""
        res = seq.emit(relax.If(cond, then.value(then_values), other.value(else_values)), name)
        return [res] if len(then_values) == 1 else self._items(seq, res, len(then_values))

    def _items(self, seq, res, k: int) -> list:
        return [seq.emit(relax.TupleGetItem(res, j)) for j in range(k)]

    def _region(self, seq, n, ins):
        if n in self.keys:              # the runtime checks its sizes first, where they may be large (`vm_guard`)
            self._size_guard(seq, n, ins)
            ins = [self.shaped.get(a, a) for a in ins]      # (the values the guard matched to a shape)
        if not n.outputs:               # all its results unused (an ONNX Dropout's mask): a region is pure, and the
            return []                   # VM cannot call a function whose result is the empty tuple (void register)
        inlined = self._inline(seq, n.attrs.name, ins) if self.inline and seq.inline else None
        if inlined is not None:
            return inlined
        res = seq.emit(relax.Call(self.funcs[n.attrs.name], ins), n.attrs.name)
        return self._items(seq, res, len(n.outputs))

    def _inline(self, seq, name: str, ins: list):
        """The outputs of region function `name` on `ins`, its body copied into `seq` (fresh variables, its
        dataflow block made plain): each parameter bound by a ``match_cast`` (the shape checks the call made),
        then its kernels. A call costs ~12 VM instructions more (the callee's shape heap and argument checks,
        the result tuple packed, checked against the declared shapes and unpacked). None where the function is
        not a Relax function of one sequence."""
        func = self.mod[self.funcs[name]]
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return None
        func = copy_with_new_vars(func)
        implied = _implied(func.params, ins)
        checked = [(p, a) for p, a, ok in zip(func.params, ins, implied) if not ok]
        if len(checked) < len(ins):     # arguments whose shapes match their parameters': no check, dims bound
            func = func.bind_params({p: a for p, a, ok in zip(func.params, ins, implied) if ok})
        func = _NON_DATAFLOW(tvm.IRModule({"f": func}))["f"]
        for p, (_, a) in zip(func.params, checked):     # (the parameters left, in order)
            seq.bindings.append(relax.MatchCast(p, a, p.ty))
            self._matched(seq, a, p)
        bindings = [b for block in func.body.blocks for b in block.bindings]
        res = func.body.body
        if bindings and isinstance(bindings[-1].value, relax.Tuple) and bindings[-1].var.same_as(res):
            res = bindings.pop().value      # (the result tuple, taken apart here: no make_tuple instruction)
        seq.bindings += bindings
        if isinstance(res, relax.Tuple):
            return list(res.fields)
        return self._items(seq, res, len(func.ret_ty.fields)) if isinstance(func.ret_ty, relax.TupleType) else [res]

    def _size_guard(self, seq, n, ins):
        def call(into: _Seq):
            into.emit(relax.Call(relax.ExternFunc(GUARD_CALLBACK), [tvm.ir.StringImm(self.keys[n])] + ins,
                                 ty_args=[relax.TupleType([])]), "guard")
        where = guard_symbols(n)
        if where is None:
            call(seq)
            return
        shaped = {k: self._shaped(seq, ins[k]) for k, _ in where.values()}
        syms = {s: shaped[k].ty.shape.values[ax] for s, (k, ax) in where.items()}
        check = _Seq(self.bb)
        call(check)
        self._if(seq, guard_needed(n, syms), check, [_TRUE()], _Seq(self.bb), [_TRUE()], "guard")

    def _kernel(self, seq, n, ins):
        outs = self.dynamic.lower(seq, n, ins) if native(n) else None
        if outs is not None:
            return outs
        self.called_back.add(self.keys[n])
        return self._callback(seq, n, ins)

    def _callback(self, seq, n, ins):
        types = [v.type for v in n.outputs]
        ty = _ty(types[0]) if len(types) == 1 else _ret_ty(types)
        call = relax.Call(relax.ExternFunc(KERNEL_CALLBACK), [tvm.ir.StringImm(self.keys[n])] + ins, ty_args=[ty])
        res = seq.emit(call, n.op)
        return [res] if len(types) == 1 else self._items(seq, res, len(types))

    def _branch(self, g: Graph, args: list, parent: _Seq):
        """A branch of an ``If`` in `parent`: its regions' bodies copied in where `parent` copies them (no VM
        frame per branch region). TVM 0.27's StaticPlanBlockMemory pools storage per function, not per branch:
        it gave a tensor of one branch the storage it allocates in the other (a var out of scope: a segfault on
        the path that never allocated it); `branch_storage.scope_branch_storage`, run after it in every build,
        allocates such a storage again where it is used (`benchmarks/diag_branch_storage.py` shows the bug)."""
        seq = _Seq(self.bb, parent.inline)
        return seq, self.graph(seq, g, args)

    def _cond(self, seq, n, ins):
        then_g, else_g = n.subgraphs
        return self._if(seq, ins[0], *self._branch(then_g, ins[1:], seq), *self._branch(else_g, ins[1:], seq),
                        "cond")

    def _case(self, seq, n, ins):
        subs = n.subgraphs
        preds, branches, default = subs[0:-1:2], subs[1:-1:2], subs[-1]

        def from_case(k: int, into: _Seq) -> list:      # case k onwards (its predicate first), into `into`
            if k == len(preds):
                return self.graph(into, default, ins)
            (pred,) = self.graph(into, preds[k], ins)
            rest = _Seq(self.bb, into.inline)
            rest_values = from_case(k + 1, rest)
            return self._if(into, pred, *self._branch(branches[k], ins, into), rest, rest_values, "case")
        return from_case(0, seq)

    def _recursive(self, kind: str, params: list, ret_types: list):
        """The name and GlobalVar (typed: the program's functions call it before it exists) of a recursive
        function of the program."""
        name = f"dyntvm_{kind}_{self.n_loops}"
        self.n_loops += 1
        gv = relax.GlobalVar(name)
        relax.expr._update_type(gv, relax.FuncType([p.ty for p in params], relax.TupleType(ret_types), purity=False))
        return name, gv

    def _concat(self, seq: _Seq, a, b):
        """`a` and `b` (stacked rows of one shape) joined on axis 0."""
        a = self._shaped(seq, a)
        rows = list(a.ty.shape.values[1:])
        b = self._match(seq, b, relax.TensorType([tvm.tirx.Var("s0", "int64")] + rows, a.ty.dtype))
        return seq.emit(relax.op.concat([a, b], axis=0))

    def _view(self, seq: _Seq, value, shape: list, name: str = "v"):
        """`value` (shaped, contiguous, as every tensor of the VM) seen with `shape` of as many elements: a view
        (`vm.builtin.reshape`), not the copy kernel a legalized ``R.reshape`` outside a dataflow block becomes."""
        if _same_shape(value.ty, shape):         # (a view of the same shape: an instruction for nothing)
            return value
        ty = relax.TensorType(shape, value.ty.dtype)
        return seq.emit(relax.call_pure_packed("vm.builtin.reshape", value, relax.ShapeExpr(shape), ty_args=ty), name)

    def _int64(self, seq: _Seq, value):
        """`value` (a tensor of one integer) as a shaped int64[1] (to be read as a shape)."""
        value = self._shaped(seq, value)
        if value.ty.dtype != "int64":
            value = seq.emit(relax.op.astype(value, "int64"))
        return self._view(seq, value, [_i64(1)])

    def _shaped(self, seq: _Seq, value):
        """`value` (a tensor of known rank) with a shape of fresh symbolic dims: Relax ops are legalized only
        where their inputs have a shape (itself where it has one)."""
        value = self.shaped.get(value, value)
        ty = value.ty
        if isinstance(getattr(ty, "shape", None), relax.ShapeExpr):
            return value
        dims = [tvm.tirx.Var(f"s{k}", "int64") for k in range(ty.ndim)]
        return self._match(seq, value, relax.TensorType(dims, ty.dtype))

    def _match(self, seq: _Seq, value, ty):
        var = relax.Var("data", ty)
        seq.bindings.append(relax.MatchCast(var, value, ty))
        self._matched(seq, value, var)
        return var

    def _matched(self, seq: _Seq, value, var):
        """Later uses of `value` (a tensor of rank only) in `seq` and its branches take `var`, its match to a shape:
        a region's parameters are then implied by their arguments (`_implied`), with no second ``match_cast``.
        Only where `seq` is the sequence `graph` emits into: a match in a sequence of a node's own (a loop step, a
        branch a node makes) is not seen after it."""
        if (seq is self.current and isinstance(value, relax.Var)
                and not isinstance(getattr(value.ty, "shape", None), relax.ShapeExpr)):
            self.shaped[value] = var


def _implied(params: list, args: list) -> list:
    """For each of a region function's `params`, whether its argument's shape (of `args`, Relax values) proves
    the match: each of its dims is a symbolic variable bound here at its first use, or a constant or a variable
    bound before, provably equal to the argument's. The region's body copied in needs no ``match_cast`` of those
    parameters (two VM instructions each); a variable a ``match_cast`` binds is not known here after it."""
    ana, bound, matched, out = tvm.sym.Analyzer(), {}, set(), []
    for p, a in zip(params, args):
        pt, at = p.ty, a.ty
        ok = (isinstance(pt, relax.TensorType) and isinstance(at, relax.TensorType) and pt.dtype == at.dtype
              and isinstance(pt.shape, relax.ShapeExpr) and isinstance(at.shape, relax.ShapeExpr)
              and len(pt.shape.values) == len(at.shape.values))
        new = {}
        for pd, ad in zip(pt.shape.values, at.shape.values) if ok else ():
            if isinstance(pd, tvm.tirx.Var) and pd not in bound and pd not in matched:
                new[pd] = new.get(pd, ad)
                ok = ok and ana.can_prove_equal(new[pd], ad)
            elif isinstance(pd, tvm.tirx.Var) and pd in bound:
                ok = ok and ana.can_prove_equal(bound[pd], ad)
            else:
                ok = ok and isinstance(pd, tvm.tirx.IntImm) and ana.can_prove_equal(pd, ad)
        if ok:
            bound.update(new)
        elif isinstance(getattr(pt, "shape", None), relax.ShapeExpr):
            matched.update(d for d in pt.shape.values if isinstance(d, tvm.tirx.Var) and d not in bound)
        out.append(ok)
    return out


def _same_shape(ty, shape: list) -> bool:
    """Whether tensor type `ty` has a known shape provably equal to `shape`."""
    known = getattr(ty, "shape", None)
    if not isinstance(known, relax.ShapeExpr) or len(known.values) != len(shape):
        return False
    ana = tvm.sym.Analyzer()
    return all(ana.can_prove_equal(a, b) for a, b in zip(known.values, shape))


def add_program(mod: tvm.IRModule, graph: Graph, prefix: str, inline: bool = False) -> tvm.IRModule:
    """`mod` with the VM program of `graph` (see the module doc; `inline`: the regions' bodies copied in, else
    called); raises CompileError where it cannot be built."""
    bad = unsupported_nodes(graph)
    if bad:
        raise CompileError(f"no VM program: {bad[0][1]}")
    mod = relax.transform.RewriteDataflowReshape()(mod)     # (the regions' reshapes: views, also when inlined)
    low = _Lowering(mod, graph, prefix, inline)
    params = [relax.Var(f"in{i}", _ty(v.type)) for i, v in enumerate(graph.inputs)]
    seq = _Seq(low.bb, inline=True)
    outs = low.graph(seq, graph, params)
    func = relax.Function(params, seq.result(outs), _ret_ty([v.type for v in graph.outputs]), is_pure=False)
    low.bb.add_func(func.with_attr("global_symbol", PROGRAM), PROGRAM)
    positions = sorted(int(key.rsplit(":", 1)[1]) for key in low.called_back)
    callbacks = relax.Function([], relax.ShapeExpr([_i64(p) for p in positions]),
                                relax.ShapeType(ndim=len(positions)))
    low.bb.add_func(callbacks.with_attr("global_symbol", CALLBACKS_FUNCTION), CALLBACKS_FUNCTION)
    # (the CPU build lowers the kernels' alignment hints where this exists; a row view of a data input made zero-offset
    # by TVM's `ensure_zero_offset` raises where the input is not 64-byte aligned: such programs keep the copies)
    if ELEMENT_ALIGNED_INPUTS and not getattr(low, "row_views", False):
        mark = relax.Function([], relax.ShapeExpr([_i64(1)]), relax.ShapeType(ndim=1))
        low.bb.add_func(mark.with_attr("global_symbol", ELEMENT_ALIGNED_FUNCTION), ELEMENT_ALIGNED_FUNCTION)
    out = low.bb.get()
    for gv, f in low.recursive:
        out[gv] = f
    out = relax.transform.LegalizeOps(customize_legalize_map={op: _as_view(op) for op in _VIEW_OPS})(out)
    return relax.transform.CanonicalizeBindings()(out)


# a region function's copy made plain (no dataflow block) and its var-to-var bindings dropped (each a VM copy)
_NON_DATAFLOW = tvm.transform.Sequential([relax.transform.ToNonDataflow(), relax.transform.CanonicalizeBindings()])

_VIEW_OPS = ("relax.reshape", "relax.squeeze", "relax.expand_dims")


def _as_view(op_name: str):
    """A LegalizeOps function: a reshape-like op of the program (the regions' were legalized before) as a view,
    `vm.builtin.reshape` to its inferred shape (outside a dataflow block TVM's legalization is a copy kernel,
    ~35 us for 3200 floats: a div and a mod per element); TVM's own where the shape is not inferred."""
    fallback = tvm.ir.Op.get(op_name).get_attr("FLegalize")

    def legalize(bb, call):
        ty = call.ty
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
            return relax.call_pure_packed("vm.builtin.reshape", call.args[0], ty.shape, ty_args=ty)
        return fallback(bb, call)
    return legalize


def program_pass(graph: Graph, prefix: str, declined: list, inline: bool = False):
    """Module pass adding the VM program (`add_program`); where it cannot, the module is left as it was and the
    reason appended to `declined`."""
    @tvm.transform.module_pass(opt_level=0, name="dyntvm.VMProgram")
    def add_vm_program(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        try:
            return add_program(mod, graph, prefix, inline)
        except Exception as e:  # noqa: BLE001 - the program is an optimization: the executor runs the model
            declined.append(f"{type(e).__name__}: {str(e).strip()[:300]}")
            return mod
    return add_vm_program


class _Stats:
    def __init__(self):
        self.built = 0                          # libraries built with a VM program
        self.declined: list = []                # why a program was not added (tests and debugging)
        self.inline_retries: list = []          # why a program with the region bodies copied in failed to build


stats = _Stats()


def build_with_program(build_cpu, mod, tvm_target, loops, tuned, program):
    """`build_cpu` with the VM program of ``program = (graph, key prefix)``; None where that build fails
    (warned: the caller builds the library without the program, and the executor runs the model). With
    `INLINE_REGIONS` the regions' bodies are copied into the program first; where that build fails, it is built
    again with the regions called (counted in `stats.inline_retries`)."""
    import warnings
    graph, prefix = program
    for inline in ((True, False) if INLINE_REGIONS else (False,)):
        declined: list = []
        try:
            ex = build_cpu(mod, tvm_target, loops, tuned=tuned, program=program_pass(graph, prefix, declined, inline))
        except Exception as e:  # noqa: BLE001 - the program is an optimization: never the reason a build fails
            from .interrupts import check
            check()             # a Ctrl-C come out of a TVM call as this error: no second build
            if inline:
                stats.inline_retries.append(f"{type(e).__name__}: {str(e).strip()[:300]}")
                continue
            warnings.warn(f"dyntvm: building the VM program failed ({type(e).__name__}: {str(e).strip()[:200]}); "
                          "the model runs in the executor", RuntimeWarning, stacklevel=3)
            stats.declined.append(f"{type(e).__name__}: {str(e).strip()[:300]}")
            return None
        if declined:
            stats.declined += declined
        else:
            stats.built += 1
        return ex
    return None
