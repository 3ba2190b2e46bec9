"""A CUDA schedule for matmuls whose row count M is a small batch: ``C[m, n] = sum_k A[m, k] * W[k, n]``
(+ an elementwise epilogue), M one symbolic var (or a static 2..16), K and N static, W laid out [K, N] (what
``F.matmul(x, W)`` with a weight gives: an LSTM step, an MLP on a batch of rows).

dlight's `Matmul` rule takes such a kernel (its M is not a constant, so `GEMV` declines it) and tiles it for a
large M: at the LSTM step's M = batch = 1 its 32x32-ish tiles leave most threads idle, ~11 us of device time
on an H200 for a [1, 256] x [256, 1024] product (benchmarks/README.md). dlight's `LowBatchGEMV` schedules only
the pad block and the first rfactor block of the [K, N] ("outer reduction") form and leaves its other blocks
unbound (TVM 0.27), so it cannot be used as is.

`SmallMMatmul`: a grid of (column tiles, rows); a thread block of TX x TY threads computes TX * V adjacent
columns of one row, threadIdx.x over the columns (a warp reads consecutive addresses of W; V > 1: each thread
V adjacent columns, its W loads vectorized), threadIdx.y over TY slices of K (`rfactor`: each thread sums its
slice in registers, then the TY partial sums are added across the block), the epilogue in the same block.
Any M is correct (a row per blockIdx.y; M = 0 is an empty grid, skipped on the host by `launch_guard`), as are
K and N that the tile does not divide (predicated loops).

The rule takes a matmul only when M is one symbolic var (a batch, presumed small) or a static 2..SMALL_M_MAX (a
region specialized for B = 16 by a tuning log's hints; M = 1 is dlight's `GEMV`'s). Inside a kernel a flattened
``T * B`` (the rows of an input projection hoisted out of a loop) is one var too, so `mark_pass` looks at the
callers first: it marks (`ATTR`) a kernel whose every call has static dims or one single-var symbolic dim, and
the rule takes marked kernels only. The marks are added after a tuning log's schedules (an attribute would
change the kernels' workload keys); a kernel a log scheduled keeps its tuned schedule.
`SMALL_M_GEMV = False` turns the rule off (A/B comparisons; in `codegen.cache.SWITCHES`).
"""
from __future__ import annotations

SMALL_M_GEMV = True
#: threads over the columns (a warp), over K
TX, TY = 32, 8
#: the largest static M the rule takes (M = 1 is dlight's `GEMV`'s; a symbolic one-var M is always taken)
SMALL_M_MAX = 16
#: the rule declines K or N shorter than this (a tiny product: dlight's rules are as good)
MIN_EXTENT = 32
#: column tiles wanted per row before V > 1 is chosen (V = 4 or 2 only where N still gives this many blocks)
MIN_COLUMN_BLOCKS = 16


#: the PrimFunc attribute `mark_pass` sets on a kernel whose calls all have a one-var batch as their only
#: symbolic output dim (inside the kernel, a flattened ``T * B`` is one var too: only the caller tells them apart)
ATTR = "dyntvm.small_m"


def mark_pass():
    """A Relax module pass (after FuseTIR and the tuned schedules): marks with `ATTR` each PrimFunc whose every
    call_tir has an output with static dims only, or whose one symbolic dim is a single var (a batch such as B,
    not T * B)."""
    import tvm
    from tvm import relax, tirx

    def _one_var_batch(sinfo) -> bool:
        if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None:
            return False
        shape = getattr(sinfo.shape, "values", None)
        if shape is None:
            return False
        dynamic = [d for d in shape if not isinstance(d, (int, tirx.IntImm))]
        return not dynamic or (len(dynamic) == 1 and isinstance(dynamic[0], tirx.Var))

    def apply(mod, _ctx):
        if not SMALL_M_GEMV:
            return mod
        call_tir = tvm.ir.Op.get("relax.call_tir")
        verdict: dict = {}

        def visit(e):
            if isinstance(e, relax.Call) and e.op.same_as(call_tir):
                gv = e.args[0]
                ok = _one_var_batch(e.ty)
                verdict[gv.name_hint] = verdict.get(gv.name_hint, True) and ok
        for _gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, visit)
        out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and verdict.get(gv.name_hint, False):
                out[gv] = func.with_attr(ATTR, True)
        return out
    return tvm.transform.module_pass(apply, opt_level=0, name="DyntvmMarkSmallM")


def _vector(n: int) -> int:
    for v in (4, 2):
        if n % (TX * v) == 0 and n // (TX * v) >= MIN_COLUMN_BLOCKS:
            return v
    return 1


def _product(iters) -> int:
    out = 1
    for it in iters:
        out *= int(it.dom)
    return out


def _vars_in(expr) -> set:
    import tvm_ffi
    from tvm import tirx
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Var, lambda v: found.append(v)), order="post")
    return set(found)


def _rule_cls():
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    from .gpu_reduction import lone_reduction

    def _is_static(dom) -> bool:
        return isinstance(dom, (int, tirx.IntImm))

    def _matmul_form(sch, red):
        """(m iters, n iters, k iters) of a ``C[m, n] += A[m, k] * W[k, n]`` block, or None."""
        block = sch.get(red.block_rv)
        store = block.body
        if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
            return None
        import tvm_ffi
        if not tvm_ffi.structural_equal(store.value.a, tirx.BufferLoad(store.buffer, store.indices),
                                        map_free_vars=True):
            return None
        if len(block.writes) != 1 or len(block.reads) < 2:
            return None
        s_iters = [it for it in red.iters if it.kind == "S"]
        r_iters = [it for it in red.iters if it.kind == "R"]
        if len(red.iters) != len(s_iters) + len(r_iters) or not r_iters:
            return None
        if not all(_is_static(it.dom) for it in r_iters):
            return None
        block_vars = {iv.var: iv for iv in block.iter_vars}
        iter_of_loop = {}
        for iv, it in zip(block.iter_vars, red.iters):
            iter_of_loop[iv.var] = it
        reads = [r for r in block.reads if not r.source.same_as(store.buffer)]
        if len(reads) != 2:
            return None
        # the rows M: S iters only A reads; the columns N: S iters only W reads (a static extent >= MIN_EXTENT)
        used = [{v for v in _vars_in([d.min for d in r.region]) if v in iter_of_loop} for r in reads]
        own = [[iter_of_loop[v] for v in used[i] - used[1 - i] if iter_of_loop[v].kind == "S"] for i in range(2)]
        if len(block_vars) != len(iter_of_loop) or not own[0] or not own[1]:
            return None
        wide = [all(_is_static(it.dom) for it in o) and _product(o) >= MIN_EXTENT for o in own]
        if wide[0] == wide[1]:
            return None
        w_side = 0 if wide[0] else 1
        w, dynamic = reads[w_side], own[1 - w_side]
        if len(dynamic) != 1:
            return None
        m = dynamic[0].dom
        if _is_static(m):                                  # a static M: 2..SMALL_M_MAX (1: dlight's `GEMV`)
            if not 2 <= int(m) <= SMALL_M_MAX:
                return None
        elif len(_vars_in(m)) != 1:                        # one symbolic batch, not T * B
            return None
        last = {v for v in _vars_in(w.region[-1].min) if v in iter_of_loop}
        if not last or any(iter_of_loop[v].kind != "S" for v in last):      # W[k, n]: n innermost
            return None
        n_iters = [it for it in s_iters if it is not dynamic[0]]
        if not n_iters:
            return None
        return dynamic, n_iters, r_iters, w.source.name

    class SmallMMatmul(GPUScheduleRule):
        """See the module doc."""

        def apply(self, func, target, _tunable):
            if not SMALL_M_GEMV or not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            if func.attrs is None or not func.attrs.get(ATTR, False):
                return None
            found = lone_reduction(func)
            if found is None:
                return None
            sch, red, epilogue = found
            form = _matmul_form(sch, red)
            if form is None:
                return None
            m_iters, n_iters, k_iters, weight = form
            n_total = 1
            for it in n_iters:
                n_total *= int(it.dom)
            k_total = 1
            for it in k_iters:
                k_total *= int(it.dom)
            if n_total < MIN_EXTENT or k_total < MIN_EXTENT:
                return None
            try:
                self._schedule(sch, red, epilogue, m_iters, n_iters, k_iters, weight, _vector(n_total))
            except (s_tir.ScheduleError, ValueError, AssertionError):
                return None
            return sch

        @staticmethod
        def _schedule(sch, red, epilogue, m_iters, n_iters, k_iters, weight: str, vec: int) -> None:
            block = red.block_rv
            m = m_iters[0].loop_rv
            sch.reorder(m, *[it.loop_rv for it in n_iters], *[it.loop_rv for it in k_iters])
            n = sch.fuse(*[it.loop_rv for it in n_iters]) if len(n_iters) > 1 else n_iters[0].loop_rv
            k = sch.fuse(*[it.loop_rv for it in k_iters]) if len(k_iters) > 1 else k_iters[0].loop_rv
            bn, tx, v = sch.split(n, factors=[None, TX, vec])
            ko, ty = sch.split(k, factors=[None, TY])
            rf = sch.rfactor(ty, 0)                 # partial sums per K slice, in registers
            m_rf, bn_rf, tx_rf, v_rf, ko_rf, ty_rf = sch.get_loops(rf)
            sch.reorder(m_rf, bn_rf, ty_rf, tx_rf, ko_rf, v_rf)
            sch.bind(bn_rf, "blockIdx.x")
            sch.bind(m_rf, "blockIdx.y")
            sch.bind(ty_rf, "threadIdx.y")
            sch.bind(tx_rf, "threadIdx.x")
            sch.set_scope(rf, 0, "local")
            sch.decompose_reduction(rf, ko_rf)
            if vec > 1:                             # V adjacent columns of W: one vector load into registers
                reads = [r.source.name for r in sch.get(rf).reads]
                w_local = sch.cache_read(rf, reads.index(weight), "local")
                sch.compute_at(w_local, ko_rf, preserve_unit_loops=True)
                sch.vectorize(sch.get_loops(w_local)[-1])
            # the sum of the TY partial sums, across threadIdx.y, for each of the block's columns
            sch.reverse_compute_at(block, bn_rf, preserve_unit_loops=True)
            loops = sch.get_loops(block)[2:]          # the row (1), the TY slices, n within the tile
            r_in = next(lp for lp in loops if int(sch.get(lp).extent) == TY)
            rest = [lp for lp in loops if not lp.same_as(r_in)]
            n_in = sch.fuse(*rest) if len(rest) > 1 else rest[0]
            # thread tx combines the columns tx * V + v whose partial sums it holds in registers (the mapping of
            # the rfactor block), the reduced loop innermost (TVM's cross-thread reduction needs it there)
            n_tx, n_v = sch.split(n_in, factors=[TX, None])
            sch.reorder(n_v, n_tx, r_in)
            sch.bind(r_in, "threadIdx.y")
            sch.bind(n_tx, "threadIdx.x")
            if epilogue is not None:
                sch.reverse_compute_at(epilogue.block_rv, bn_rf, preserve_unit_loops=True)
                e_loops = sch.get_loops(epilogue.block_rv)[2:]
                e = sch.fuse(*e_loops) if len(e_loops) > 1 else e_loops[0]
                e_tx, _ = sch.split(e, factors=[TX, None])   # thread tx: columns tx * V + v, as above
                sch.bind(e_tx, "threadIdx.x")
                sch.set_scope(block, 0, "local")

    return SmallMMatmul


def small_m_rule():
    return _rule_cls()()
