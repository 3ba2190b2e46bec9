"""Fewer kernels per CUDA region: elementwise groups that Relax's `FuseOps` leaves apart, merged into one kernel.

`FuseOps` never fuses a value into a later group when the value is also used elsewhere (a function output, or a
second consumer): an LSTM step computes its cell state ``c`` in one kernel and ``h = sigmoid(o) * tanh(c)`` in a
second, because ``c`` is also a state the step returns. On a GPU each kernel is a launch (~4.4 us in a device
loop on an H200, benchmarks/README.md), more than the work of such a kernel.

`MergeElementwiseGroups` (a Relax pass between `FuseOps` and `FuseTIR`) merges two fused groups ``a = fA(...)``,
``b = fB(..., a, ...)`` into one group returning ``(a, b)`` when both are elementwise / injective (every kernel in
them of op pattern <= injective), their results have the same shape and dtype, and everything ``fB`` reads is
available where ``fA`` runs; `FuseTIR` then makes it one PrimFunc with two outputs. `ElementwiseGroup` (a
dlight rule, before the others) schedules such a PrimFunc as one kernel: the spatial blocks left after
inlining, over the same domain, are computed by the same thread, one after the other (the second reads the
first's output at the same index, which that thread has just written).

`MERGE_ELEMENTWISE = False` turns both off (A/B comparisons; in `codegen.cache.SWITCHES`).
"""
from __future__ import annotations

MERGE_ELEMENTWISE = True
#: op patterns (`relax.transform.AnnotateTIROpPattern`) a merged group may hold: elementwise, broadcast, injective
_INJECTIVE = 2
#: threads per block of a merged elementwise kernel
THREADS = 256


class _Stats:
    """What the last builds in this process merged (tests count them)."""

    def __init__(self):
        self.merged = 0


stats = _Stats()


# ------------------------------------------------------------------------------------------- the Relax pass
def _injective_group(mod, func) -> bool:
    """Whether every call of a fused Relax function is a call_tir of a PrimFunc of pattern <= injective."""
    import tvm
    from tvm import relax, tirx
    body = func.body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
        return False
    for binding in body.blocks[0].bindings:
        value = binding.value
        if not isinstance(binding, relax.VarBinding) or not isinstance(value, relax.Call):
            return False
        if not value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            return False
        callee = mod[value.args[0]]
        pattern = callee.attrs.get("op_pattern", None) if isinstance(callee, tirx.PrimFunc) else None
        if pattern is None or int(pattern) > _INJECTIVE:
            return False
    return isinstance(body.body, relax.Var)


def _primitive(mod, call):
    """The fused Relax function a binding calls (a FuseOps group), or None."""
    from tvm import ir, relax
    if not isinstance(call, relax.Call) or not isinstance(call.op, ir.GlobalVar):
        return None
    func = mod[call.op]
    if isinstance(func, relax.Function) and func.attrs is not None and func.attrs.get("Primitive", False):
        return func
    return None


def _shape_vars(fn, call_args) -> list:
    """(the function's own symbolic var, the caller's dim expression) of each plain-var dim of its parameters."""
    from tvm import relax, tirx
    out = []
    for p, a in zip(fn.params, call_args):
        pt, at = p.ty, a.ty
        if isinstance(pt, relax.TensorType) and isinstance(at, relax.TensorType) and pt.shape is not None \
                and at.shape is not None and len(pt.shape.values) == len(at.shape.values):
            out += [(d, e) for d, e in zip(pt.shape.values, at.shape.values) if isinstance(d, tirx.Var)]
    return out


def _unify_symbolic_vars(fa, fb, a_args, b_args):
    """fB with its symbolic vars replaced by fA's where the caller passes the same dim to both (each fused
    function has its own copy of a dim such as the batch B; FuseTIR would keep them apart)."""
    import tvm_ffi
    ours = _shape_vars(fa, a_args)
    mapping = {}
    for v, e in _shape_vars(fb, b_args):
        same = next((va for va, ea in ours if tvm_ffi.structural_equal(ea, e)), None)
        if same is not None and not same.same_as(v):
            mapping[v] = same
    return fb.bind_symbolic_vars(mapping) if mapping else fb


def _merge_functions(fa, fb, b_arg_of_a: list):
    """One fused Relax function computing fA then fB, returning ``(a, b)``. `b_arg_of_a[i]`: whether fB's i-th
    parameter is fA's result. Its parameters: fA's, then fB's other ones."""
    from tvm import relax
    pa = [relax.Var(p.name, p.ty) for p in fa.params]
    fa2 = fa.bind_params(dict(zip(fa.params, pa)))
    a_out = fa2.body.body
    extra, mapping = [], {}
    for p, is_a in zip(fb.params, b_arg_of_a):
        if is_a:
            mapping[p] = a_out
        else:
            mapping[p] = relax.Var(p.name, p.ty)
            extra.append(mapping[p])
    fb2 = fb.bind_params(mapping)
    bindings = list(fa2.body.blocks[0].bindings) + list(fb2.body.blocks[0].bindings)
    out = relax.Tuple([a_out, fb2.body.body])
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], out)
    func = relax.Function(pa + extra, body, relax.TupleType([a_out.ty, fb2.body.body.ty]), attrs=fa.attrs)
    return func, len(extra)


def _merge_in(mod, func):
    """`func` with one pair of groups merged, and the merged group; None when there is no pair."""
    from tvm import relax
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return None
    for bi, block in enumerate(body.blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        bindings = list(block.bindings)
        defined_before = set(func.params)
        for i, first in enumerate(bindings):
            fa = _primitive(mod, first.value)
            if fa is not None and _injective_group(mod, fa):
                for j in range(i + 1, len(bindings)):
                    second = bindings[j]
                    fb = _primitive(mod, second.value)
                    if fb is None or not _injective_group(mod, fb) or fb.same_as(fa):
                        continue
                    args = list(second.value.args)
                    uses_a = [a.same_as(first.var) for a in args]
                    if not any(uses_a):
                        continue
                    if not all(u or not isinstance(a, relax.Var) or a in defined_before for a, u in zip(args, uses_a)):
                        continue
                    if not _same_tensor(first.var.ty, second.var.ty):
                        continue
                    fb = _unify_symbolic_vars(fa, fb, list(first.value.args), args)
                    merged, _ = _merge_functions(fa, fb, uses_a)
                    return _rewrite(func, bi, i, j, merged, first, second, args, uses_a), merged
            defined_before.add(first.var)
    return None


def _same_tensor(a, b) -> bool:
    import tvm_ffi
    from tvm import relax
    return (isinstance(a, relax.TensorType) and isinstance(b, relax.TensorType)
            and a.dtype == b.dtype and a.shape is not None and b.shape is not None
            and tvm_ffi.structural_equal(a.shape, b.shape, map_free_vars=False))


def _rewrite(func, bi, i, j, merged, first, second, args, uses_a):
    """The caller with the pair replaced by one call of `merged` (its GlobalVar filled in by the pass)."""
    from tvm import relax
    block = func.body.blocks[bi]
    bindings = list(block.bindings)
    call_args = list(first.value.args) + [a for a, u in zip(args, uses_a) if not u]
    pair = relax.DataflowVar(f"{first.var.name}_pair", merged.ret_ty)
    placeholder = relax.Call(relax.ExternFunc("__dyntvm_merged__"), call_args)
    new = bindings[:i] + [relax.VarBinding(pair, placeholder),
                          relax.VarBinding(first.var, relax.TupleGetItem(pair, 0))]
    new += bindings[i + 1:j] + [relax.VarBinding(second.var, relax.TupleGetItem(pair, 1))] + bindings[j + 1:]
    blocks = list(func.body.blocks)
    blocks[bi] = relax.DataflowBlock(new)
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                          func.is_pure, func.attrs)


def merge_pass():
    """The Relax module pass (between FuseOps and FuseTIR): merges pairs until none is left."""
    import tvm
    from tvm import relax

    def apply(mod, _ctx):
        if not MERGE_ELEMENTWISE:
            return mod
        changed = True
        count = 0
        while changed:
            changed = False
            for gvar, func in list(mod.functions_items()):
                if not isinstance(func, relax.Function) or (func.attrs is not None
                                                             and func.attrs.get("Primitive", False)):
                    continue
                found = _merge_in(mod, func)
                if found is None:
                    continue
                new_func, merged = found
                count += 1
                bb = relax.BlockBuilder(mod)
                mgvar = bb.add_func(bb.normalize(merged), f"fused_merged{count}_{gvar.name_hint}")
                bb.update_func(gvar, bb.normalize(_fill_placeholder(new_func, mgvar)))
                mod = bb.get()
                changed = True
                break
        stats.merged += count
        return relax.transform.DeadCodeElimination()(mod) if count else mod
    return tvm.transform.module_pass(apply, opt_level=0, name="DyntvmMergeElementwiseGroups")


def _fill_placeholder(func, mgvar):
    """The placeholder call of `_rewrite` turned into a call of the merged group's GlobalVar."""
    from tvm import relax
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, relax.ExternFunc) and v.op.global_symbol == \
                    "__dyntvm_merged__":
                v = relax.Call(mgvar, v.args)
            bindings.append(relax.VarBinding(b.var, v))
        blocks.append(type(block)(bindings))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                          func.is_pure, func.attrs)


# ------------------------------------------------------------------------------------------- the dlight rule
def _element_rule_cls():
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline_contiguous_spatial
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class ElementwiseGroup(GPUScheduleRule):
        """A PrimFunc of spatial blocks only, two or more left after inlining (several outputs), all over the
        same domain: one kernel, each thread computing every block at its index (see the module doc)."""

        def apply(self, func, target, _tunable):
            if not MERGE_ELEMENTWISE or not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if infos is None or any(not i.is_injective() for i in infos):
                return None
            infos = try_inline_contiguous_spatial(sch, infos)
            if not infos or len(infos) < 2:
                return None
            import tvm_ffi
            doms = [[it.dom for it in i.iters] for i in infos]
            if any(len(d) != len(doms[0]) or not all(tvm_ffi.structural_equal(x, y) for x, y in zip(d, doms[0]))
                   for d in doms[1:]):
                return None
            if not _pointwise_chain(sch, infos):
                return None
            try:
                loop = sch.fuse(*sch.get_loops(infos[0].block_rv))
                bx, tx = sch.split(loop, factors=[None, THREADS])
                sch.bind(bx, "blockIdx.x")
                sch.bind(tx, "threadIdx.x")
                for info in infos[1:]:
                    sch.reverse_compute_at(info.block_rv, tx, preserve_unit_loops=True)
            except (s_tir.ScheduleError, ValueError, AssertionError):
                return None
            return sch

    def _identity(block, region) -> bool:
        """Whether `region` is the element at the block's own iter vars, in order (x[v0, v1, ...])."""
        dims = list(region.region)
        return len(dims) == len(block.iter_vars) and all(
            d.min.same_as(iv.var) and isinstance(d.extent, (int, tirx.IntImm)) and int(d.extent) == 1
            for d, iv in zip(dims, block.iter_vars))

    def _pointwise_chain(sch, infos) -> bool:
        """Every block writes its element, and reads what an earlier one wrote at that same element: a thread
        computing all the blocks at one index reads only what it wrote itself (no other thread's output)."""
        written = set()
        for info in infos:
            block = sch.get(info.block_rv)
            if len(block.writes) != 1 or not _identity(block, block.writes[0]):
                return False
            for r in block.reads:
                if r.source.name in written and not _identity(block, r):
                    return False
            written.add(block.writes[0].source.name)
        return True

    return ElementwiseGroup


def elementwise_group_rule():
    return _element_rule_cls()()
