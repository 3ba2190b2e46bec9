"""Which spatial blocks of a fused PrimFunc the CPU schedules inline, and how, so that compile time
stays linear in the length of an elementwise chain.

Two things made it exponential (a 4-deep ``tanh`` chain over 40 s, a 27-op chain never finished):

* A producer inlined into a consumer that reads it several times (the NaN-exact ``maximum`` reads
  each operand three times: ``isnan(a) | isnan(b) ? a + b : max(a, b)``) is copied to every read,
  so a chain of such ops grows the expression 3x per op. Here every repeated read of a buffer element
  in a block is bound once to a ``Let`` first (`bind_repeated_loads`), so an inlined producer appears
  once in the TIR.
* ``Let`` alone does not bound the cost: TVM's LLVM codegen binds every ``Let`` variable in an
  arithmetic analyzer, which simplifies the value with the earlier ``Let`` variables substituted, so
  it sees each value as a tree with every ``Let`` expanded (the fast ``tanh`` names its input ~77
  times in that tree: a tanh chain grows 77x per op). Inlining therefore stops where that expanded
  tree (`expanded_size`) would exceed ``INLINE_BUDGET`` nodes; the producer then stays a block and
  writes its value to memory once (the schedule rules compute it per row / tile of its consumer, so
  it stays in registers or L1).

Order: producers with one consumer are inlined first, so the consumers of a shared value merge into
one block (which then reads it several times: bound once) before the value itself is inlined.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from .cpu_sched_helpers import child_blocks, iter_kinds, op_count, prepacked_columns, writes_param

__all__ = ["INLINE_BUDGET", "bind_repeated_loads", "expanded_size", "inline_spatial"]

#: Most nodes (`expanded_size`) a block's stored value may have after inlining a producer into it.
#: TVM's compile time of one kernel, measured against it: 0.07 s at 1.3k (one fast tanh), 0.4 s at
#: 34k, 2.8 s at 240k, 40 s at 1.7M. The LSTM's and transformer's fused kernels stay below 3k (fully
#: inlined, as before); the decoder's GRU cell (81k) keeps its reset gate in a row buffer.
INLINE_BUDGET = 16384
# A Select's (and if_then_else's) condition weighs this much in `expanded_size`: TVM's simplifier
# rewrites it once, then again for each branch's constraint (c, then not c), so a condition that
# holds an inlined Select is simplified ~5x per level (a NaN-exact maximum chain: 5^depth, not 3^depth).
_COND_WEIGHT = 5
# A producer with several consumers is duplicated into each only when it is this cheap (ops).
_INLINE_MAX_OPS = 8


def _children(e) -> list:
    """Sub-expressions of `e`, each with its weight in `expanded_size`."""
    if isinstance(e, TensorLoad):
        return [(i, 1) for i in e.indices]
    if isinstance(e, tvm.ir.expr.Call):
        if _is_lazy(e):
            return [(e.args[0], _COND_WEIGHT), (e.args[1], 1), (e.args[2], 1)]
        return [(a, 1) for a in e.args]
    if isinstance(e, tirx.Select):
        return [(e.condition, _COND_WEIGHT), (e.true_value, 1), (e.false_value, 1)]
    if isinstance(e, tirx.Ramp):
        return [(e.base, 1), (e.stride, 1)]
    if isinstance(e, tirx.Shuffle):
        return [(k, 1) for k in list(e.vectors) + list(e.indices)]
    if isinstance(e, (tirx.Cast, tirx.Broadcast)):
        return [(e.value, 1)]
    kids = [getattr(e, f, None) for f in ("a", "b")]   # binary ops, comparisons, Not
    return [(k, 1) for k in kids if isinstance(k, tvm.ir.expr.Expr)]


def expanded_size(expr, buffer=None) -> tuple[int, int]:
    """(nodes, reads of `buffer`) of `expr` as a tree with every ``Let`` variable replaced by its
    value, the expression TVM's analyzers see; Select conditions count ``_COND_WEIGHT`` times. Linear
    in the size of the DAG (iterative, memoized)."""
    memo: dict = {}     # node handle -> (nodes, reads)
    bound: dict = {}    # Let var handle -> (nodes, reads) of its value
    stack = [(expr, 0)]
    while stack:
        e, state = stack.pop()
        h = e.__chandle__()
        if isinstance(e, tirx.Var):
            memo[h] = bound.get(h, (1, 0))
        elif isinstance(e, tirx.Let):
            if state == 0:      # value, then bind, then body, then done
                stack += [(e, 2), (e.body, 0), (e, 1), (e.value, 0)]
            elif state == 1:
                bound[e.var.__chandle__()] = memo[e.value.__chandle__()]
            else:
                memo[h] = memo[e.body.__chandle__()]
        elif state == 0:
            if h not in memo:
                stack.append((e, 1))
                stack += [(k, 0) for k, _ in _children(e) if k.__chandle__() not in memo]
        else:
            kids = [(memo[k.__chandle__()], w) for k, w in _children(e)]
            reads = int(buffer is not None and isinstance(e, TensorLoad) and e.source.same_as(buffer))
            memo[h] = (1 + sum(n * w for (n, _), w in kids), reads + sum(r * w for (_, r), w in kids))
    return memo[expr.__chandle__()]


def _store(sch: s_tir.Schedule, block):
    body = sch.get(block).body
    return body if isinstance(body, tirx.BufferStore) else None


def _is_lazy(e) -> bool:
    """``if_then_else`` evaluates one branch only (guarded reads): loads under it are left in place."""
    return isinstance(e, tvm.ir.expr.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "prim.if_then_else"


def bind_repeated_loads(sch: s_tir.Schedule, block) -> None:
    """Rewrites a spatial block ``B[i] = f(A[j], A[j], ...)`` to ``B[i] = let a = A[j] in f(a, a, ...)``
    (every element read more than once), so that inlining A's producer copies it once. Existing
    ``let v = A[j]`` bindings are undone first, so bindings never chain (``let a2 = a1``: LLVM codegen's
    analyzer re-simplifies the whole expansion of ``a1`` for it)."""
    store, stmt = _store(sch, block), sch.get(block)
    if store is None or "R" in iter_kinds(sch, block):
        return
    let_vars: set = set()
    tvm_ffi.structural_walk(store.value, (tirx.Let, lambda let: let_vars.add(let.var.__chandle__())))

    def key(ld):
        """(buffer, indices) of a load that may move to the top of the expression, else None."""
        if ld.source.same_as(store.buffer) or any(
                v.__chandle__() in let_vars for i in ld.indices for v in tirx.analysis.undefined_vars(i)):
            return None
        return ld.source.__chandle__(), str(list(ld.indices))

    def repeated(value) -> dict:
        """key -> a load, for each movable load read more than once outside if_then_else branches."""
        counts: dict = {}

        def count(ld):
            k = key(ld)
            if k is not None:
                counts.setdefault(k, []).append(ld)
        tvm_ffi.structural_walk(value, [(tvm.ir.expr.Call, lambda c: tvm_ffi.WalkResult.SKIP if _is_lazy(c) else None),
                                        (TensorLoad, count)], order="pre")
        return {k: lds[0] for k, lds in counts.items() if len(lds) > 1}

    if not repeated(store.value):
        return
    loads: dict = {}        # Let var of a `let v = A[j]` -> A[j]

    def unbind(let, mutator):
        if isinstance(let.value, TensorLoad) and key(let.value) is not None:
            loads[let.var.__chandle__()] = let.value
            return mutator.mutate(let.body)
        return mutator.default_mutate(let)
    value = tvm_ffi.structural_mutate(store.value, [(tirx.Let, unbind),
                                                    (tirx.Var, lambda v, m: loads.get(v.__chandle__(), v))])
    names = {k: (tirx.Var(f"{ld.source.name}_v", ld.ty), ld) for k, ld in repeated(value).items()}
    value = tvm_ffi.structural_mutate(value, [
        (tvm.ir.expr.Call, lambda c, m: c if _is_lazy(c) else m.default_mutate(c)),
        (TensorLoad, lambda ld, m: names[key(ld)][0] if key(ld) in names else m.default_mutate(ld))])
    for var, ld in reversed(list(names.values())):
        value = tirx.Let(var, ld, value)
    if value.same_as(store.value):
        return
    new = s_tir.SBlock(stmt.iter_vars, stmt.reads, stmt.writes, stmt.name_hint,
                       tirx.BufferStore(store.buffer, value, store.indices), stmt.init,
                       stmt.alloc_buffers, stmt.match_buffers, stmt.annotations)
    sch.state.replace(sch.get_sref(block), new, {stmt: new})


def _fits_budget(sch: s_tir.Schedule, block, sizes: dict) -> bool:
    """True if inlining `block` keeps every consumer's expanded stored value within the budget."""
    def size(b, buffer=None):
        store = _store(sch, b)
        if store is None:
            return INLINE_BUDGET + 1, 1
        key = (store.__chandle__(), None if buffer is None else buffer.__chandle__())
        if key not in sizes:    # the store is kept with its size: its address is not reused meanwhile
            sizes[key] = (store, buffer, expanded_size(store.value, buffer))
        return sizes[key][2]

    produced, _ = size(block)
    store = _store(sch, block)
    buffer = store.buffer if store is not None else None
    has_let, has_lazy = _has_let_or_lazy(store.value) if store is not None else (False, False)
    float_modulo = store is not None and _has_float_modulo(store.value)
    for consumer in sch.get_consumers(block):
        nodes, reads = size(consumer, buffer)
        if nodes + reads * (produced - 1) > INLINE_BUDGET:
            return False
        if float_modulo and reads > 1:
            # read several times, it would be a Let's value (`bind_repeated_loads`): binding a float
            # truncmod / floormod / floordiv whose divisor is a cast of an integer made TVM's LLVM codegen
            # fail ("Integer absolute value requires an integer type": its bound analysis takes |divisor|)
            return False
        if (has_lazy and reads > 1) or (has_let and _loads_of(sch, consumer, buffer) > 1):
            # copied to several reads (those of a reduction's update are not bound: a NaN-exact max reads
            # its operand three times), a Let defines its variable twice (ill-formed TIR) and an
            # if_then_else made TVM's CSE reuse a value computed in one branch elsewhere (LLVM rejected it).
            # A Let's copies are the loads as written (one bound to a Let and used twice is one copy): counting
            # the uses kept hardswish's clamp after a conv a block of its own, written per tile to a buffer of
            # run-time size (a workspace allocation per tile: 1.3-1.5x the depthwise layer's time)
            return False
    return True


def _has_float_modulo(expr) -> bool:
    found = []
    tvm_ffi.structural_walk(expr, [(cls, lambda e: found.append(e) if e.ty.dtype.is_float else None)
                                   for cls in (tirx.Mod, tirx.FloorMod, tirx.FloorDiv)])
    return bool(found)


def _has_let_or_lazy(expr) -> tuple[bool, bool]:
    """(whether `expr` holds a ``Let``, whether it holds an ``if_then_else``)."""
    lets, lazy = [], []
    tvm_ffi.structural_walk(expr, [(tirx.Let, lets.append),
                                   (tvm.ir.expr.Call, lambda c: lazy.append(c) if _is_lazy(c) else None)])
    return bool(lets), bool(lazy)


def _loads_of(sch: s_tir.Schedule, block, buffer) -> int:
    """Loads of `buffer` in `block`'s stored value as written (a load bound once to a ``Let`` and used several
    times is one): the copies of a producer that inlining makes. (`expanded_size` counts the uses.)"""
    store = _store(sch, block)
    if store is None:
        return 2
    found = []
    tvm_ffi.structural_walk(store.value, (TensorLoad, lambda ld: found.append(ld) if ld.source.same_as(buffer)
                                          else None))
    return len(found)


def inline_spatial(func: tirx.PrimFunc, sch: s_tir.Schedule, keep: tuple = ()) -> None:
    """Inlines intermediate spatial blocks (elementwise chains, bias adds, reshapes) into their
    consumers, within ``INLINE_BUDGET``; an expensive one with several consumers (softmax's exp) is
    kept, not to compute it twice. Passes over the blocks, producers first: one-consumer blocks
    until none is left to inline, then one cheap shared block, and again. Blocks whose names start
    with a prefix in `keep` stay blocks (a convolution's padded input: `cpu_schedule_conv`)."""
    sizes: dict = {}
    for block in child_blocks(sch):
        bind_repeated_loads(sch, block)

    def try_inline(block) -> bool:
        stmt = sch.get(block)
        if (any(iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars) or writes_param(func, sch, block)
                or (keep and stmt.name_hint.startswith(keep)) or prepacked_columns(func, stmt) is not None):
            return False
        consumers = sch.get_consumers(block)
        if not consumers or (len(consumers) > 1 and (shared_done or op_count(sch, block) > _INLINE_MAX_OPS)):
            return False
        if not _fits_budget(sch, block, sizes):
            return False
        try:
            sch.compute_inline(block)
        except Exception:  # pylint: disable=broad-except
            return False
        for consumer in consumers:
            bind_repeated_loads(sch, consumer)
        return True

    while True:
        shared_done = True      # this pass: one-consumer blocks only
        if any([try_inline(b) for b in child_blocks(sch)]):
            continue
        shared_done = False     # none left: one shared block, then one-consumer passes again
        for block in child_blocks(sch):
            if len(sch.get_consumers(block)) > 1 and try_inline(block):
                break
        else:
            return
