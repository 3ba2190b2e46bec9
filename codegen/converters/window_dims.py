"""Output dims of the sliding-window kernels (conv, pooling) as plain symbolic vars.

A strided window's output size is an expression of the input's (``(H - 1) // 2 + 1``). Left so, every kernel
after it (bias, activation, the next layer's elementwise work) has a buffer whose shape its symbols cannot be
read back from: Relax's legalization passes H and W to the kernel as scalar parameters, and
`fusion_guard.opaque_shape_scalar_kernels` keeps such kernels out of fusion (FuseTIR crashes on some groups of
them). In a CNN with symbolic H, W that was every kernel after the first strided layer: mobilenet_v3_small
ran ~400 kernel calls, a hardswish as 12 kernels.

So each spatial output size that is an expression gets one fresh var, bound BEFORE the window kernel, and the
kernel is built with those vars as its output sizes: the kernel and its elementwise epilogue (bias, relu,
hardswish) stay one fusible chain (a ``match_cast`` of the kernel's result between them kept FuseOps from fusing
them: resnet18's strided convs ran their bias / relu as kernels of their own). The function's dim translation
(`ConvertContext.exprs`) maps the node's output dim to the var, so later nodes that name the same dim get the var
too; a later window of the same output size reuses the var.

The binding hides the expression from Relax: a tiny kernel writes the sizes into an int64 tensor, read back as a
shape (``R.tensor_to_shape``) and ``match_cast`` to ``R.Shape([conv_out0, ...])``: one per distinct size pair of
a region. A ``match_cast`` of a value whose dims Relax knows (``R.shape([(H - 1) // 2 + 1])``, or the kernel's
result typed so) lets the block builder of any later pass that re-normalizes the function (FuseTIR's own
ExpandTupleArguments) substitute the expression for the var, and a fused group whose output is sized by the var
(the conv and its epilogue; an FPN's Resize ``arange`` to another map's size) gets the var in a shape parameter:
FuseTIR then failed with "All shape inputs are expected to be single tirx var" (the torchvision detectors).
`fusion_guard.sized_by_cast_vars` keeps such kernels out of fusion where a ``match_cast`` with a known value
remains. Nothing reads the sizes' bindings (their vars are used in types only), so FuseOps, which re-sorts a
dataflow block by its data edges, would put them after the kernels they size: they run in a block in front of the
function's dataflow block (`hoist_window_sizes`), which is why only sizes of the parameters' dims (and earlier
sizes) become vars. Only on the CPU: a GPU region keeps the expression dims (the sizes kernel would need a GPU schedule, and
the fusion gain is not measured there).
"""
from __future__ import annotations

import tvm
from tvm import relax, te, tirx
from tvm.relax import op as R
from tvm.sym import ConstIntBound

from ...ir.dims import Const, Sym, parse_dim


#: False: window outputs keep their expression dims (as before; for A/B measurements, `bench_conv_models --expr-dims`)
PLAIN_SIZES = True


def plain_window_sizes(bb, ctx, node, out: list) -> list:
    """`out` (the window kernel's spatial output sizes for `node`) with each size that is neither a constant nor
    a var replaced by a var bound to it (run-time sizes are >= 1: a check stands in front of the kernel where
    that is not provable), registered in `ctx` for the node's output dim. Sizes of equal dims share one var."""
    if not PLAIN_SIZES or ctx.device_checks:    # a GPU region: its kernels need a GPU schedule; not measured there
        return list(out)
    dims = node.outputs[0].type.shape
    new = list(out)
    created = []
    for i, d in enumerate(out):
        if isinstance(d, (int, tirx.IntImm, tirx.Var)):
            continue
        if not all(v in ctx.head_vars for v in tirx.analysis.undefined_vars(d)):
            continue        # a size of a var bound inside the function: its binding could not move before it
        ours = parse_dim(str(dims[i + 2]))
        if isinstance(ours, Const):
            continue
        if isinstance(ours, Sym):
            if ours.name in ctx.symbols:      # already bound: keep its var, Relax gets the equality checked
                continue
            var = ctx.symbols[ours.name] = _fresh(ctx, node, i)
        elif ours in ctx.exprs:               # the same size as an earlier window's: that var, no new binding
            new[i] = ctx.exprs[ours]
            continue
        else:
            var = ctx.exprs[ours] = _fresh(ctx, node, i)
        new[i] = var
        created.append(i)
    if created:
        sizes = bb.emit_te(_sizes_te, [out[i] for i in created], primfunc_name_hint="dt_window_sizes")
        shape = bb.emit(R.tensor_to_shape(sizes))
        cast = bb.match_cast(shape, relax.ShapeType([new[i] for i in created]))
        ctx.window_sizes.append((sizes, shape, cast))
        ctx.head_vars.update(new[i] for i in created)
    return new


def hoist_window_sizes(func: relax.Function, ctx) -> relax.Function:
    """`func` with the bindings of its window sizes (`ctx.window_sizes`) moved out of its dataflow block into a
    block in front of it. Nothing reads them (the vars they define are used only in types), so FuseOps, which
    re-sorts a dataflow block by its data edges, would move them after the kernels sized by their vars (Relax's
    VMShapeLower then fails: "... has not been computed"). Their inputs are the parameters' dims and earlier
    sizes (`plain_window_sizes` creates no other), so they can run first."""
    moved = {v for chain in ctx.window_sizes for v in chain}
    blocks = list(func.body.blocks)
    k = next(i for i, b in enumerate(blocks) if isinstance(b, relax.DataflowBlock))
    head, rest = [], []
    rename: dict = {}
    for b in blocks[k].bindings:
        if b.var not in moved:
            rest.append(b)
            continue
        var = relax.Var(b.var.name, b.var.ty)
        value = _renamed(b.value, rename)
        rename[b.var] = var
        head.append(relax.MatchCast(var, value, b.ty) if isinstance(b, relax.MatchCast)
                    else relax.VarBinding(var, value))
    blocks[k:k + 1] = [relax.BindingBlock(head), relax.DataflowBlock(rest)]
    new = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.body.ty, func.is_pure,
                         func.attrs)
    return relax.transform.Normalize()(tvm.IRModule({"f": new}))["f"]


def _sizes_te(sizes: list):
    """[len(sizes)] int64 holding `sizes` (PrimExprs of the function's dim vars)."""
    def value(i):
        v = sizes[-1]
        for k in range(len(sizes) - 2, -1, -1):
            v = tirx.Select(i == tirx.IntImm("int64", k), sizes[k], v)
        return v
    return te.compute((tirx.IntImm("int64", len(sizes)),), value, name="window_sizes")


def _fresh(ctx, node, i: int) -> tirx.Var:
    var = tirx.Var(f"{node.op}_out{i}", "int64")
    ctx.analyzer.update(var, ConstIntBound(1, ConstIntBound.POS_INF), override=True)
    return var


def _renamed(value, rename: dict):
    """`value` (a var, or a call of vars / tuples of vars: the sizes' bindings) with the vars of `rename` replaced."""
    if isinstance(value, relax.Var):
        return rename.get(value, value)
    if isinstance(value, relax.Tuple):
        return relax.Tuple([_renamed(f, rename) for f in value.fields])
    if isinstance(value, relax.Call) and any(isinstance(a, (relax.Var, relax.Tuple)) for a in value.args):
        return relax.Call(value.op, [_renamed(a, rename) for a in value.args], value.attrs, value.ty_args)
    return value
