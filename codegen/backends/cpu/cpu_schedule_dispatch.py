"""Run-time dispatch for the CPU schedule rules (`cpu_schedule`): a rule builds several variants of a
PrimFunc (serial / parallel, a row tile per batch size) and ``_select`` joins them into one PrimFunc that
picks a variant with an ``if`` on the actual sizes."""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize

# Work below which a kernel stays serial: loop iterations x arithmetic ops per iteration
# (`cpu_sched_helpers.total_work`). Measured on the 2-core Zen box, 2 threads vs 1
# (a launch costs ~1 us): x*(x+b) (2 ops) gains from 2 threads from ~128k elements, the
# vectorized tanh (~60 ops) and softmax rows from ~8k, matmul (2 ops per MAC) from ~128k MACs;
# below that the serial kernel is up to 1.4x faster.
PARALLEL_MIN_WORK = 1 << 18


def _combine(then_func: tirx.PrimFunc, else_func: tirx.PrimFunc, cond) -> tirx.PrimFunc:
    """One PrimFunc running then_func's body if ``cond`` holds at run time, else else_func's.
    Both schedule the same PrimFunc: same params. Each branch keeps its own intermediate buffers
    (in an opaque block of its own): a buffer shared by both would be allocated at the root at its
    full size, where one branch alone computes it per row / tile (a few registers)."""
    blk_a, blk_b = then_func.body.block, else_func.body.block

    def allocs(blk) -> dict:     # buffers allocated in `blk` or any block inside it (nested variants)
        found = {b.__chandle__(): b for b in blk.alloc_buffers}
        tvm_ffi.structural_walk(blk.body, (SBlock, lambda x: found.update(
            {b.__chandle__(): b for b in x.alloc_buffers})))
        return found
    in_a = allocs(blk_a)
    shared = {h: tirx.decl_buffer(b.shape, b.dtype, name=b.name, scope=b.scope())
              for h, b in allocs(blk_b).items() if h in in_a}
    if shared:     # the else branch gets copies
        blk_b = tvm_ffi.structural_mutate(blk_b, (tvm.ir.expr.Var, lambda v, m: shared.get(v.__chandle__(), v)))

    def branch(blk, name):
        return SBlockRealize([], True, SBlock([], [], [], name, blk.body, alloc_buffers=list(blk.alloc_buffers)))
    root = SBlock([], [], [], "root", tirx.IfThenElse(cond, branch(blk_a, "then"), branch(blk_b, "else")),
                  match_buffers=list(blk_a.match_buffers), annotations=dict(blk_a.annotations))
    func = then_func.with_body(SBlockRealize([], True, root))
    # Vars (loop vars, buffers) that appear in both branches: lowering rejects a var bound twice
    # with different ranges, so every definition gets its own var.
    return s_tir.transform.ConvertSSA()(tvm.IRModule({"main": func}))["main"]


def _select(func: tirx.PrimFunc, cands) -> tirx.PrimFunc:
    """Builds [(condition, make_variant)] as a runtime if-chain: the first true condition wins.
    Conditions provably false (every symbolic dim >= 1) are dropped, and a provably true one
    ends the chain; the last remaining variant is the default."""
    ana = tvm.sym.Analyzer()
    for param in func.params:
        for dim in getattr(param, "shape", []):
            if isinstance(dim, tirx.Var):
                ana.update(dim, tvm.sym.ConstIntBound(1, 1 << 40), override=True)
    live = []
    for cond, make in cands:
        cond = ana.simplify(cond)
        if not (isinstance(cond, tirx.IntImm) and not cond.value):
            live.append((cond, make))
            if isinstance(cond, tirx.IntImm):
                break
    result = live[-1][1]()
    for cond, make in reversed(live[:-1]):
        result = _combine(make(), result, cond)
    return result


def _parallel_cands(work: tirx.PrimExpr, target, make: Callable[[bool], tirx.PrimFunc]):
    """Serial variant below PARALLEL_MIN_WORK, parallel one above (none on one core)."""
    true = tirx.const(True, "bool")
    if int(target.attrs.get("num-cores", 1)) <= 1:
        return [(true, lambda: make(False))]
    return [(work < tirx.IntImm("int64", PARALLEL_MIN_WORK), lambda: make(False)),
            (true, lambda: make(True))]
