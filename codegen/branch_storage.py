"""A storage planned by TVM 0.27's StaticPlanBlockMemory used where it is not defined: each use gets its own.

The planner keeps one pool of released storage tokens per *function*, not per block: a token whose tensors die
inside one branch of an ``If`` goes back to the pool and is reused by an allocation in the other branch (or in
a block after the ``If``), and its rewriter emits the ``R.memory.alloc_storage`` where the token is first met
(in the first branch) and gives the other allocation that storage var, out of its scope. The VM then reads a
register that path never wrote (or one `KillAfterLastUse` cleared): a segfault in
``StorageObj::AllocTensor``. ``benchmarks/diag_branch_storage.py`` shows it on a plain Relax function (a sum in
one branch, a max in the other). dyntvm's VM program copies regions into the branches of its ``If`` s
(`vm_program._Lowering._branch`), so every build runs `scope_branch_storage` right after the planner: an
``R.memory.alloc_tensor`` whose storage var is not defined in its own or an enclosing sequence gets the
``alloc_storage`` (the same size, device and scope) emitted again just before it, shared by the later uses in
that sequence. Sharing within one path (what the planner proved safe) is kept; a path that never allocates the
storage allocates its own.
"""
from __future__ import annotations

import tvm
from tvm import relax

_ALLOC_STORAGE = tvm.ir.Op.get("relax.memory.alloc_storage")
_ALLOC_TENSOR = tvm.ir.Op.get("relax.memory.alloc_tensor")

def _is(value, op) -> bool:
    return isinstance(value, relax.Call) and value.op.same_as(op)


class _Scoper:
    def __init__(self):
        self.storages: dict = {}        # storage var -> its alloc_storage call (anywhere in the function)
        self.added = 0

    def seq(self, seq: relax.SeqExpr, visible: dict) -> relax.SeqExpr:
        """`seq` with every out-of-scope storage var replaced; `visible`: storage var -> the var to use for it
        in the enclosing sequences (copied: what this sequence defines is not seen after it)."""
        visible, changed, blocks = dict(visible), False, []
        for block in seq.blocks:
            bindings = []
            for b in block.bindings:
                new = self.binding(b, visible, bindings)
                changed |= new is not b
                bindings.append(new)
            blocks.append(type(block)(bindings) if changed else block)
        body = seq.body
        if isinstance(body, relax.If):      # (normalized Relax binds an If to a var; this is in case it does not)
            bound = relax.VarBinding(relax.Var("if", body.ty), body)
            new = self.binding(bound, visible, [])
            if new is not bound:
                body, changed = new.value, True
        return relax.SeqExpr(blocks, body) if changed else seq

    def binding(self, b, visible: dict, out: list):
        if not isinstance(b, relax.VarBinding):
            return b
        value = b.value
        if _is(value, _ALLOC_STORAGE):
            self.storages[b.var] = value
            visible[b.var] = b.var
            return b
        if _is(value, _ALLOC_TENSOR) and isinstance(value.args[0], relax.Var) and value.args[0] in self.storages:
            old = value.args[0]
            if old not in visible:      # defined in another branch or a sequence already left: allocate it here
                var = relax.Var("storage", old.ty)
                out.append(relax.VarBinding(var, self.storages[old]))
                visible[old] = var
                self.added += 1
            if visible[old].same_as(old):
                return b
            return relax.VarBinding(b.var, relax.Call(value.op, [visible[old], *value.args[1:]], value.attrs,
                                                      value.ty_args))
        if isinstance(value, relax.If):
            true, false = value.true_branch, value.false_branch
            then, other = self.seq(true, visible), self.seq(false, visible)
            if then is true and other is false:
                return b
            return relax.VarBinding(b.var, relax.If(value.cond, then, other))
        return b


def scope_storage(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` (planned by StaticPlanBlockMemory) with each storage var used out of its scope allocated again."""
    out = mod
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        scoper = _Scoper()
        body = scoper.seq(func.body, {})
        if not scoper.added:            # (then nothing was replaced either)
            continue
        new = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
        out = out if out is not mod else tvm.IRModule(dict(mod.functions_items()), mod.attrs, mod.global_infos)
        out[gv] = relax.BlockBuilder().normalize(new)
    return out


# repeated symbolic shape literals of a sequence made one VM shape (`shape_reuse`); False: one per use
REUSE_SHAPES = True


@tvm.transform.module_pass(opt_level=0, name="dyntvm.ScopeBranchStorage")
def scope_branch_storage(mod: tvm.IRModule, ctx) -> tvm.IRModule:     # pylint: disable=unused-argument
    """The module pass of `scope_storage` (after StaticPlanBlockMemory)."""
    return scope_storage(mod)


def after_planning(passes: list) -> list:
    """`passes` (a backend's finalization passes) with `scope_branch_storage` right after StaticPlanBlockMemory,
    and `shape_reuse.reuse_shapes` right before VMShapeLower."""
    from .shape_reuse import reuse_shapes
    out = []
    for p in passes:
        if p.info.name == "VMShapeLower" and REUSE_SHAPES:
            out.append(reuse_shapes)
        out.append(p)
        if p.info.name == "StaticPlanBlockMemory":
            out.append(scope_branch_storage)
    return out
