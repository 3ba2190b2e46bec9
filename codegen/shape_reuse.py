"""One VM shape per distinct symbolic shape of a sequence (issue 25: VM instructions per node).

VMShapeLower makes every ``R.shape([...])`` literal with a symbolic dim a ``vm.builtin.make_shape`` instruction
where it is used: the storage and the tensor of one allocation of a one-byte dtype (a mask) are two, and a mask's
count shapes its output's storage, its output, the next region's storage and output, a view ... each its own
``make_shape``. `reuse_shapes`, run right before VMShapeLower, binds each such literal used more than once in a
binding block to a variable at its first use (one ``make_shape``) and passes that variable to the calls. Only call
arguments are rewritten (not a type, a ``match_cast`` or a function's result); each nested sequence (an ``If``
branch) is rewritten on its own, seeing none of its parent's variables. A shape variable is never killed: a
``Shape`` object per distinct shape stays in its register until the function returns.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax


class _Count:
    made = 0                    # shape variables made (whether a function changed)


def _key(shape: relax.ShapeExpr):
    """A hashable key of `shape`'s dims when one is symbolic, else None (a constant shape costs no instruction)."""
    if all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    return tuple(str(d) for d in shape.values)      # (equal text, told apart by `_same`)


def _same(a: relax.ShapeExpr, b: relax.ShapeExpr) -> bool:
    return len(a.values) == len(b.values) and all(tvm_ffi.structural_equal(x, y, map_free_vars=False)
                                                  for x, y in zip(a.values, b.values))


def _shapes_of(call: relax.Call):
    return [a for a in call.args if isinstance(a, relax.ShapeExpr) and _key(a) is not None]


def _block(block: relax.BindingBlock) -> relax.BindingBlock:
    uses: dict = {}                                 # key -> [(ShapeExpr, times used)]
    for b in block.bindings:
        if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call):
            for s in _shapes_of(b.value):
                entries = uses.setdefault(_key(s), [])
                hit = next((e for e in entries if _same(e[0], s)), None)
                if hit is None:
                    entries.append([s, 1])
                else:
                    hit[1] += 1
    bound: dict = {}                                # key -> [(ShapeExpr, Var)]
    out = []
    for b in block.bindings:
        if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.If):
            then, other = _seq(b.value.true_branch), _seq(b.value.false_branch)
            if then.same_as(b.value.true_branch) and other.same_as(b.value.false_branch):
                out.append(b)
                continue
            value = relax.If(b.value.cond, then, other, b.value.span)
            relax.expr._update_type(value, b.value.ty)         # (the constructor leaves it unset)
            out.append(relax.VarBinding(b.var, value, b.span))
            continue
        if not (isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call) and _shapes_of(b.value)):
            out.append(b)
            continue
        call, args, changed = b.value, [], False
        for a in call.args:
            key = _key(a) if isinstance(a, relax.ShapeExpr) else None
            entry = next((e for e in uses.get(key, ()) if _same(e[0], a)), None) if key is not None else None
            if entry is None or entry[1] < 2:
                args.append(a)
                continue
            have = next((v for s, v in bound.get(key, ()) if _same(s, a)), None)
            if have is None:
                have = relax.Var("shape", a.ty)
                _Count.made += 1
                out.append(relax.VarBinding(have, a))
                bound.setdefault(key, []).append((a, have))
            args.append(have)
            changed = True
        if changed:
            call = relax.Call(call.op, args, call.attrs, call.ty_args, call.span, ret_ty=call.ty)
            b = relax.VarBinding(b.var, call, b.span)
        out.append(b)
    return relax.BindingBlock(out, block.span)


def _seq(expr):
    """`expr` with its blocks rewritten (itself where none changed)."""
    if not isinstance(expr, relax.SeqExpr):
        return expr
    before = _Count.made
    blocks = [b if isinstance(b, relax.DataflowBlock) else _block(b) for b in expr.blocks]
    if _Count.made == before:
        return expr
    out = relax.SeqExpr(blocks, expr.body, expr.span)
    relax.expr._update_type(out, expr.ty)
    return out


def reuse_shapes_in(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each Relax function's repeated symbolic shape literals bound once per binding block."""
    out = mod
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            before = _Count.made
            body = _seq(func.body)
            if _Count.made != before:
                new = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
                out = out if out is not mod else tvm.IRModule(dict(mod.functions_items()), mod.attrs, mod.global_infos)
                out[gv] = new
    return out


@tvm.transform.module_pass(opt_level=0, name="dyntvm.ReuseShapes")
def reuse_shapes(mod: tvm.IRModule, ctx) -> tvm.IRModule:     # pylint: disable=unused-argument
    """The module pass of `reuse_shapes_in` (right before VMShapeLower)."""
    return reuse_shapes_in(mod)
