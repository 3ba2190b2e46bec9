"""Output dims of the sliding-window kernels (conv, pooling) as plain symbolic vars.

A strided window's output size is an expression of the input's (``(H - 1) // 2 + 1``). Left so, every kernel
after it (bias, activation, the next layer's elementwise work) has a buffer whose shape its symbols cannot be
read back from: Relax's legalization passes H and W to the kernel as scalar parameters, and
`fusion_guard.opaque_shape_scalar_kernels` keeps such kernels out of fusion (FuseTIR crashes on some groups of
them). In a CNN with symbolic H, W that was every kernel after the first strided layer: mobilenet_v3_small
ran ~400 kernel calls, a hardswish as 12 kernels. So the result is re-typed (``match_cast``) with one fresh
var per expression dim, and the function's dim translation (`ConvertContext.exprs`) maps the node's output
dim to that var, so later nodes that name the same dim get the var too.
"""
from __future__ import annotations

from tvm import relax, tirx
from tvm.sym import ConstIntBound

from ...ir.dims import Const, Sym, parse_dim
from .common import dtype_of, shape_of


def plain_window_dims(bb, ctx, node, r):
    """`r` (the window kernel's [N, C, *out] result for `node`) with each spatial dim that is neither a constant
    nor a var replaced by a fresh var (run-time sizes are >= 1: a check stands in front of the kernel where
    that is not provable), registered in `ctx` for the node's output dim."""
    shape = shape_of(r)
    dims = node.outputs[0].type.shape
    new = list(shape)
    for i in range(2, len(shape)):
        d = shape[i]
        if isinstance(d, (int, tirx.IntImm, tirx.Var)):
            continue
        ours = parse_dim(str(dims[i]))
        if isinstance(ours, Const):
            continue
        var = tirx.Var(f"{node.op}_out{i - 2}", "int64")
        ctx.analyzer.update(var, ConstIntBound(1, ConstIntBound.POS_INF), override=True)
        if isinstance(ours, Sym):
            if ours.name in ctx.symbols:      # already bound: keep its var, Relax gets the equality checked
                continue
            ctx.symbols[ours.name] = var
        else:
            ctx.exprs.setdefault(ours, var)
            var = ctx.exprs[ours]
        new[i] = var
    if all(a is b for a, b in zip(new, shape)):
        return r
    return bb.match_cast(r, relax.TensorType(new, dtype_of(r)))
