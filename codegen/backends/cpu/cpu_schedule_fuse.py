"""Fusion beyond Relax's FuseOps for the CPU: a matmul group with the matmuls that feed its epilogue and
the elementwise / slicing kernels that consume its result becomes one kernel (`merge_contractions`).

FuseOps stops at a matmul's result when it is read by ``split`` (injective, not elementwise) or by two
kernels, and never puts two matmuls in one group. An LSTM step ``split(x @ W + h @ U + b, 4)`` followed
by the gate math (sigmoid / tanh, the c and h updates) therefore ran as four kernels: both GEMVs, the c
update and the h update, each a launch of its own (for a batch-1 step, more launch than work), the 4H
pre-activations written to memory and read back. Merged, `cpu_schedule._sched_contraction_group`
computes both matmuls per tile of hidden units and applies the gate math to each tile while it is in
registers (one launch, one pass over the weights).

A merge is kept only if the merged kernel gets that schedule (checked on the fused PrimFunc), so a
pattern the rule does not know keeps FuseOps' kernels.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax, tirx

from .cpu_schedule_matmul import contraction_group_schedulable

_LOG = logging.getLogger(__name__)

#: Name prefix of the merged kernels (their PrimFuncs keep it through FuseTIR; `cpu_schedule` dispatches on it).
CONTRACTION_GROUP = "fused_contraction"

# op_pattern values (AnnotateTIROpPattern): elementwise 0, broadcast 1, injective 2, reduction 3,
# out-elementwise-fusable 4 (matmul)
_INJECTIVE, _CONTRACTION = 2, 4


def _callee_patterns(mod, call) -> list[int] | None:
    """op_pattern of every PrimFunc a binding's value runs (a call_tir or a call of a FuseOps group),
    or None for anything else."""
    if not isinstance(call, relax.Call):
        return None
    if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir":
        func = mod[call.args[0]]
        return [int(func.attrs.get("op_pattern", 8))] if isinstance(func, tirx.PrimFunc) else None
    if isinstance(call.op, tvm.ir.GlobalVar):
        func = mod[call.op]
        if not isinstance(func, relax.Function) or not func.attrs or not func.attrs.get("Primitive", False):
            return None
        pats = []
        for block in func.body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.call_tir":
                    pats.append(int(mod[v.args[0]].attrs.get("op_pattern", 8)))
                elif not isinstance(v, (relax.Tuple, relax.TupleGetItem)):
                    return None
        return pats
    return None


def _matmul_columns(mod, call) -> tirx.IntImm | None:
    """The static column count of the matmul a contraction binding runs (its own result, or the result
    of the pattern-4 call inside a FuseOps group), else None."""
    if isinstance(call.op, tvm.ir.GlobalVar):
        inner = [b.value for block in mod[call.op].body.blocks for b in block.bindings
                 if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
                 and b.value.op.name == "relax.call_tir"
                 and int(mod[b.value.args[0]].attrs.get("op_pattern", 8)) == _CONTRACTION]
        if len(inner) != 1:
            return None
        call = inner[0]
    shape = _shape(call)
    return shape[-1] if shape and isinstance(shape[-1], tirx.IntImm) else None


def _args(call) -> list:
    """The Relax arguments of a call_tir or group call."""
    if isinstance(call.op, tvm.ir.Op):
        return list(call.args[1].fields)
    return list(call.args)


def _shape(expr):
    ty = expr.ty
    return list(ty.shape) if isinstance(ty, relax.TensorType) and ty.shape is not None else None


def _same(a, b) -> bool:
    return tvm.sym.Analyzer().can_prove_equal(a, b)


class _Group:
    """Binding indices (of one dataflow block) merged into one kernel around contraction `anchor`."""

    def __init__(self, anchor: int):
        self.members = {anchor}
        self.anchor = anchor


def _find_groups(mod, block, escaping: set) -> list[_Group]:
    """Contraction bindings with (a) contraction bindings whose only use is their epilogue and (b) the
    chains of elementwise / injective bindings that read their result (same rows, a column count dividing
    theirs: an epilogue, or a split of it)."""
    bindings = list(block.bindings)
    index = {b.var.__chandle__(): i for i, b in enumerate(bindings)}
    users: dict[int, list[int]] = {}
    for i, b in enumerate(bindings):
        for a in relax.analysis.free_vars(b.value):
            if a.__chandle__() in index:
                users.setdefault(index[a.__chandle__()], []).append(i)
    pats = [_callee_patterns(mod, b.value) for b in bindings]

    def is_contraction(i):
        p = pats[i]
        return p is not None and p.count(_CONTRACTION) == 1 and all(
            q == _CONTRACTION or q <= _INJECTIVE for q in p)

    def escapes(i):
        return bindings[i].var.__chandle__() in escaping

    groups, taken = [], set()
    for c in range(len(bindings)):
        if c in taken or not is_contraction(c):
            continue
        out = _shape(bindings[c].var)
        n_cols = _matmul_columns(mod, bindings[c].value)
        if not out or len(out) != 2 or n_cols is None:
            continue
        out = [out[0], n_cols]      # the matmul's (rows, columns): the group may end in a slice of it
        group = _Group(c)
        for a in _args(bindings[c].value):    # matmuls whose only use is this epilogue
            p = index.get(a.__chandle__()) if isinstance(a, relax.Var) else None
            if (p is not None and p not in taken and is_contraction(p) and pats[p] == [_CONTRACTION]
                    and users.get(p) == [c] and not escapes(p) and _shape(bindings[p].var) is not None
                    and len(_shape(bindings[p].var)) == len(out)
                    and all(_same(x, y) for x, y in zip(_shape(bindings[p].var), out))):
                group.members.add(p)
        first = min(group.members)
        changed = True
        while changed:
            changed = False
            for d in range(c + 1, len(bindings)):
                if d in group.members or d in taken or pats[d] is None or max(pats[d]) > _INJECTIVE:
                    continue
                ins = [index[a.__chandle__()] for a in _args(bindings[d].value)
                       if isinstance(a, relax.Var) and a.__chandle__() in index]
                if not any(i in group.members for i in ins):
                    continue
                if any(i not in group.members and i > first for i in ins):
                    continue
                shape = _shape(bindings[d].var)
                if (not shape or len(shape) != len(out) or not all(_same(x, y) for x, y in zip(shape[:-1], out[:-1]))
                        or not isinstance(shape[-1], tirx.IntImm) or not isinstance(out[-1], tirx.IntImm)
                        or int(out[-1].value) % int(shape[-1].value)):
                    continue
                group.members.add(d)
                changed = True
        if len(group.members) < 2:
            continue
        last = max(group.members)
        # every use of a merged value outside the group must come after the merged kernel
        if any(u not in group.members and u < last for m in group.members for u in users.get(m, [])):
            continue
        groups.append(group)
        taken |= group.members
    return groups


def _escaping_vars(func) -> set:
    """Handles of the dataflow vars ... every non-DataflowVar binding var is visible after its block."""
    out = set()
    for block in func.body.blocks:
        for b in block.bindings:
            if not isinstance(b.var, relax.DataflowVar):
                out.add(b.var.__chandle__())
    return out


def _emit_binding(bb, mod, value, env: dict):
    """Emits `value` (call_tir or FuseOps group call) into `bb` with its args looked up in `env`; returns
    the emitted var."""
    def arg(a):
        return env.get(a.__chandle__(), a)

    if isinstance(value.op, tvm.ir.Op):
        return bb.emit(relax.call_tir(value.args[0], [arg(a) for a in value.args[1].fields], value.ty_args[0]
                                      if value.ty_args else value.ty))
    func = mod[value.op]
    args = [arg(a) for a in value.args]
    syms = {}
    for p, a in zip(func.params, args):
        for dp, da in zip(_shape(p) or [], _shape(a) or []):
            if isinstance(dp, tirx.Var) and dp.__chandle__() not in syms:
                syms[dp.__chandle__()] = (dp, da)
    func = func.bind_symbolic_vars({dp: da for dp, da in syms.values()})
    inner = {p.__chandle__(): a for p, a in zip(func.params, args)}
    result = None
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Tuple):
                result = bb.emit(relax.Tuple([inner.get(f.__chandle__(), f) for f in v.fields]))
            elif isinstance(v, relax.TupleGetItem):
                result = bb.emit(relax.TupleGetItem(inner.get(v.tuple_value.__chandle__(), v.tuple_value), v.index))
            else:
                result = _emit_binding(bb, mod, v, inner)
            inner[b.var.__chandle__()] = result
    body = func.body.body
    return inner.get(body.__chandle__(), result) if isinstance(body, relax.Var) else result


def _merge(mod: tvm.IRModule, func_name, groups: list[_Group], block_index: int, names: list) -> tvm.IRModule:
    """`mod` with the bindings of each group of block `block_index` of `func_name` replaced by a call of one
    new Primitive function (named in `names`, same order)."""
    func = mod[func_name]
    block = func.body.blocks[block_index]
    bindings = list(block.bindings)
    escaping = _escaping_vars(func)
    bb = relax.BlockBuilder(mod)
    replace: dict[int, list] = {}   # last member index -> new bindings
    drop: set = set()
    for group, name in zip(groups, names):
        members = sorted(group.members)
        defined = {bindings[i].var.__chandle__() for i in members}
        inputs, seen = [], set()
        for i in members:
            for a in _args(bindings[i].value):
                h = a.__chandle__()
                if h not in defined and h not in seen:
                    seen.add(h)
                    inputs.append(a)
        used_outside = {a.__chandle__() for j, b in enumerate(bindings) if j not in group.members
                        for a in relax.analysis.free_vars(b.value)}
        outputs = [bindings[i].var for i in members
                   if bindings[i].var.__chandle__() in used_outside | escaping]
        params = [relax.Var(f"p{k}", a.ty) for k, a in enumerate(inputs)]
        with bb.function(name, params, attrs={"Primitive": True}, private=True):
            with bb.dataflow():
                env = {a.__chandle__(): p for a, p in zip(inputs, params)}
                for i in members:
                    env[bindings[i].var.__chandle__()] = _emit_binding(bb, mod, bindings[i].value, env)
                outs = [env[v.__chandle__()] for v in outputs]
                out = bb.emit_output(relax.Tuple(outs) if len(outs) > 1 else outs[0])
            gv = bb.emit_func_output(out)
        call = bb.normalize(relax.Call(gv, inputs))
        if len(outputs) == 1:
            new = [relax.VarBinding(outputs[0], call)]
        else:
            tmp = relax.DataflowVar(name, call.ty)
            new = [relax.VarBinding(tmp, call)] + [
                relax.VarBinding(v, bb.normalize(relax.TupleGetItem(tmp, k))) for k, v in enumerate(outputs)]
        replace[max(group.members)] = new
        drop |= group.members
    new_bindings = []
    for i, b in enumerate(bindings):
        if i in replace:
            new_bindings += replace[i]
        elif i not in drop:
            new_bindings.append(b)
    blocks = list(func.body.blocks)
    blocks[block_index] = relax.DataflowBlock(new_bindings)
    new_func = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                              func.attrs)
    out = bb.get()
    out[func_name] = new_func
    return out


def _candidates(mod) -> list:
    """[(function GlobalVar, block index, [groups])] of every non-primitive Relax function."""
    found = []
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or (func.attrs and func.attrs.get("Primitive", False)):
            continue
        if not isinstance(func.body, relax.SeqExpr):
            continue
        escaping = _escaping_vars(func)
        for k, block in enumerate(func.body.blocks):
            if isinstance(block, relax.DataflowBlock):
                groups = _find_groups(mod, block, escaping)
                if groups:
                    found.append((gv, k, groups))
    return found


def _apply(mod, cands) -> tuple[tvm.IRModule, list]:
    """Merges every group of `cands`; returns the module and [(name, candidate index, group index)]."""
    made = []
    taken = {gv.name_hint for gv in mod.get_global_vars()}
    for ci, (gv, k, groups) in enumerate(cands):
        names = []
        for gi, _ in enumerate(groups):
            n = 0
            while f"{CONTRACTION_GROUP}{n}" in taken:
                n += 1
            taken.add(f"{CONTRACTION_GROUP}{n}")
            names.append(f"{CONTRACTION_GROUP}{n}")
            made.append((f"{CONTRACTION_GROUP}{n}", ci, gi))
        mod = _merge(mod, gv, groups, k, names)
    return mod, made


def merge_contractions(target) -> tvm.transform.Pass:
    """Module pass (between FuseOps and FuseTIR): merges contraction groups with their epilogue-feeding
    matmuls and their elementwise / slicing consumers (module doc). A merge whose fused kernel the
    contraction-group schedule rejects is undone."""
    def run(mod, _ctx):
        cands = _candidates(mod)
        if not cands:
            return mod
        merged, made = _apply(mod, cands)
        fused = relax.transform.FuseTIR()(merged)
        prims = {gv.name_hint: f for gv, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)}
        bad = {(ci, gi) for name, ci, gi in made
               if name not in prims or not contraction_group_schedulable(prims[name], target)}
        if not bad:
            return merged
        _LOG.debug("merge_contractions: %d merge(s) undone (no contraction-group schedule)", len(bad))
        kept = [(gv, k, [g for gi, g in enumerate(groups) if (ci, gi) not in bad])
                for ci, (gv, k, groups) in enumerate(cands)]
        kept = [c for c in kept if c[2]]
        return _apply(mod, kept)[0] if kept else mod
    return tvm.transform.module_pass(run, opt_level=0, name="DyntvmMergeContractions")
