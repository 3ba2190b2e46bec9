"""CPU schedule of `te_window.te_max_pool` (`cpu_schedule` dispatches here by block name): the padded input
(``dt_pool_pad``) is computed per output row (the rows its windows read, in a small buffer), and each output
row is one loop along the row whose body is the whole window, unrolled - the max kept in a register, the
row's loop left to LLVM's vectorizer (a stride-s load of each tap). Parallel over batch x channels.

Under the generic row-reduction rule a max pool was one fused loop over every output (four 64-bit divisions
each to recover its indices) with a bounds test per tap: resnet18's 3 x 3 / 2 max pool took ~38x onnxruntime's
time (~10% of the model's).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from .cpu_inline import inline_spatial
from .cpu_sched_helpers import child_blocks, iter_kinds, loop_extent, total_work
from .cpu_schedule_dispatch import _parallel_cands, _select
from ...te_window import MAX_POOL_BLOCK, POOL_PAD_BLOCK

#: Windows up to this many taps are unrolled (the max in a register): 3 x 3 is 9, 3 x 3 x 3 27.
_UNROLL_TAPS = 32


def pool_block_name(sch: s_tir.Schedule) -> str | None:
    """The `te_max_pool` block of a PrimFunc when it is the only reduction, else None."""
    names = [sch.get(b).name_hint for b in child_blocks(sch)]
    found = [n for n in names if n.startswith(MAX_POOL_BLOCK)]
    return found[0] if len(found) == 1 else None


def _sched_max_pool(func, target, name: str, parallel: bool) -> tirx.PrimFunc:
    del target
    sch = s_tir.Schedule(func)
    pool = sch.get_sblock(name)
    kinds = iter_kinds(sch, pool)
    n_red = kinds.count("R")
    if kinds != "S" * (len(kinds) - n_red) + "R" * n_red or len(kinds) - n_red < 3:
        raise ValueError("max_pool block is not [n, c, *out] x window")
    names = [sch.get(b).name_hint for b in child_blocks(sch)]
    epilogues = [n for n in names[names.index(sch.get(pool).name_hint) + 1:] if not n.startswith(POOL_PAD_BLOCK)]
    if any("R" in iter_kinds(sch, sch.get_sblock(n)) for n in epilogues):
        raise ValueError("a reduction after the max pool")
    ana = tvm.sym.Analyzer()
    sizes = [iv.dom.extent for iv in sch.get(pool).iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    for name_ in epilogues:
        # an epilogue over other dim vars (equal at run time: another window's output sizes) is not computed
        # per row: reverse_compute_at gave it every row under each row, reading the pool's one-row buffer
        ext = [iv.dom.extent for iv in sch.get(sch.get_sblock(name_)).iter_vars]
        if len(ext) != len(sizes) or not all(ana.can_prove_equal(a, b) for a, b in zip(ext, sizes)):
            raise ValueError("an epilogue over other sizes than the max pool's")
    loops = sch.get_loops(pool)
    n_sp = len(kinds) - n_red
    spatial, red = loops[:n_sp], loops[n_sp:]
    # parallel over batch x channels only: each index of a fused loop is recovered by a division, and one by
    # the symbolic row count stayed inside the padded copy's loop (its load is conditional: LLVM may not
    # hoist a division past it) - 2 divisions per element copied, ~10x the pool's time
    tasks = sch.fuse(spatial[0], spatial[1])
    row = spatial[-2] if n_sp > 3 else tasks      # (a 1-d pool: its one row)
    for pad in [b for b in child_blocks(sch) if sch.get(b).name_hint.startswith(POOL_PAD_BLOCK)]:
        sch.compute_at(pad, row, preserve_unit_loops=True)
    for name_ in epilogues:    # elementwise ops fusion put after the pool: computed per output row
        sch.reverse_compute_at(sch.get_sblock(name_), row, preserve_unit_loops=True)
    if parallel:
        sch.parallel(tasks)
    taps = 1
    for lp in red:
        ext = loop_extent(sch, lp)
        taps = taps * ext if isinstance(ext, int) else _UNROLL_TAPS + 1
    if taps <= _UNROLL_TAPS:
        for lp in red:
            sch.unroll(lp)
    sch.decompose_reduction(pool, red[0])
    return sch.mod["main"]


def pool_select(func, target, name: str) -> tirx.PrimFunc:
    """The max pool schedule of `func`: spatial producers inlined (the padded input kept), serial below
    PARALLEL_MIN_WORK."""
    sch = s_tir.Schedule(func)
    inline_spatial(func, sch, keep=(POOL_PAD_BLOCK,))
    inlined = sch.mod["main"]
    work = total_work(sch, child_blocks(sch))
    return _select(inlined, _parallel_cands(work, target, lambda par: _sched_max_pool(inlined, target, name, par)))
