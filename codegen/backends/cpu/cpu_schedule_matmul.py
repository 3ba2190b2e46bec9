"""CPU schedules of matmul kernels (`cpu_schedule`): register tiles with the epilogue per tile
(`_sched_matmul`), and the kernels `cpu_schedule_fuse` merges (several matmuls and the elementwise /
split kernels around them: `contraction_group_schedulable`, `_group_select`)."""

from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize

from . import cpu_sched_helpers
from .cpu_inline import inline_spatial
from .cpu_schedule_dispatch import _parallel_cands, _select
from .cpu_sched_helpers import (child_blocks, is_contraction, iter_kinds, loop_extent, pick_tile,
                                prepacked_columns, tile_scope, total_work, vector_lanes, vector_registers,
                                vectorize_inner, vectorize_tile, writes_param)

_LOG = logging.getLogger("dyntvm.codegen.cpu_schedule")

# Matmul register tile, rows x vector registers of columns, per the ISA's register count
# (`vector_registers`): with 32 (AVX-512) 4x4 (64 fp32 columns, 16 zmm accumulators) measured best for
# M >= 4 (~400 GFLOP/s on 2 cores, numpy ~200), 1x8 for M < 4, the batch-1 GEMV. With 16 (AVX2) at most 12
# accumulators (the tile's loads and the broadcast row value need the other 4; 4x4 spilled): 6x2, the
# BLIS Haswell kernel's shape, measured 1.1x faster than 4x2 and 4x3 at 2048x512x512 and 2048x128x384
# (Zen 3, packed panels, one thread).
_MATMUL_MR = 4  # rows from which a matmul gets a multi-row tile (below: the 1-row GEMV tile)
_ROWS = {32: 4, 16: 6}
_TILE_VECTORS = {32: {1: 8, 2: 8, 3: 4, 4: 4, 6: 2}, 16: {1: 8, 2: 6, 3: 4, 4: 3, 6: 2}}
# Rows from which the matmul packs the right operand's panels (`_pack_panel`): the copy (K x nr floats per
# panel) is paid back once enough row tiles reuse the panel.
PACK_MIN_ROWS = 16
#: (rows, column vectors) of the matmul tile, for experiments (None: `_TILE_VECTORS`).
MATMUL_TILE_OVERRIDE = None


def matmul_rows(target) -> int:
    """Rows of the register tile of a matmul with M >= `_MATMUL_MR` on `target`."""
    if MATMUL_TILE_OVERRIDE is not None:
        return MATMUL_TILE_OVERRIDE[0]
    return _ROWS[32 if vector_registers(target) >= 32 else 16]


def tile_columns(mr: int, target, dtype) -> int:
    """Columns of the `mr`-row register tile on `target`: a number of native vectors of `dtype`."""
    lanes = vector_lanes(target, dtype)
    if MATMUL_TILE_OVERRIDE is not None and MATMUL_TILE_OVERRIDE[0] == mr:
        return MATMUL_TILE_OVERRIDE[1] * lanes
    table = _TILE_VECTORS[32 if vector_registers(target) >= 32 else 16]
    return table.get(mr, table[matmul_rows(target)]) * lanes
_K_SPLIT = 4
#: Column tile of the contraction-group tiles (None: chosen by gate count); for experiments.
TILE_OVERRIDE = None


def exact_tile(func, name: str, mr: int, target):
    """(condition, nr) of the `exact` variant of `_sched_matmul` for `func`'s matmul block `name` with `mr`-row
    tiles: the run-time condition that its symbolic M and N are multiples of the tile (mr rows, nr columns; a
    symbolic N gets a power-of-two number of vectors); None where neither is symbolic or no column tile fits."""
    sch = s_tir.Schedule(func)
    mm = sch.get_sblock(name)
    *_, i, j, _k = sch.get_loops(mm)
    m_ext, n_ext = loop_extent(sch, i), loop_extent(sch, j)
    dtype = sch.get(mm).body.buffer.dtype
    lanes = vector_lanes(target, dtype)
    cols = tile_columns(mr, target, dtype)
    if isinstance(n_ext, int):
        nr = pick_tile(n_ext, cols, lanes, at_most=True)
    else:  # 16 columns, not 24, with AVX2's 4-row tile: sequence lengths are mostly powers of two
        nr = lanes * (1 << ((cols // lanes).bit_length() - 1))
    conds = [tirx.EQ(tirx.floormod(ext, tirx.IntImm(str(ext.ty), t)), tirx.IntImm(str(ext.ty), 0))
             for ext, t in ((m_ext, mr), (n_ext, nr)) if not isinstance(ext, int) and t > 1]
    if nr is None or not conds or (isinstance(m_ext, int) and m_ext % mr):
        return None
    return (conds[0] if len(conds) == 1 else tirx.And(*conds)), nr


def _pad_tile_buffer(func: tirx.PrimFunc, buf, mr: int, nr: int) -> tirx.PrimFunc:
    """`buf` (the accumulator tile's buffer) declared with its last two dims rounded up to the tile: lowering's
    CompactBufferAllocation clips a tile's region to the buffer's shape, and with a symbolic M / N [mr, nr]
    became [min(M, mr), min(N, nr)], a workspace allocated per call with every FMA a load and a store of it
    (attention's q.k^T with a column tile 1.2-1.8x slower than without); rounded up, the tile's region is a
    constant (an alloca: registers)."""
    *lead, m, n = buf.shape
    up = lambda e, t: e if isinstance(e, tirx.IntImm) else (e + (t - 1)) // t * t  # noqa: E731
    new = tirx.decl_buffer([*lead, up(m, mr), up(n, nr)], buf.dtype, name=buf.name, scope=buf.scope())
    old_data, old_buf = buf.data, buf

    def swap_buffer(b, _mutator):
        return new if b.same_as(old_buf) else b

    def swap_var(v, _mutator):
        return new.data if v.same_as(old_data) else v
    body = tvm_ffi.structural_mutate(func.body, [(tirx.Buffer, swap_buffer), (tvm.ir.expr.Var, swap_var)])
    return func.with_body(body)


def _strip_predicates(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Every block's predicate made true: for the `exact` variant, whose predicates (the packed panel's and the
    epilogue's, derived from the tile's bounds) hold whenever its dims are multiples of the tile; left in, they
    scalarized the vectorized epilogue (per element a compare, a branch and a scalar store)."""
    true = tirx.const(True, "bool")

    def strip(realize, mutator):
        realize = mutator.default_mutate(realize)
        return SBlockRealize(realize.iter_values, true, realize.block)
    return func.with_body(tvm_ffi.structural_mutate(func.body, (SBlockRealize, strip)))


def _sched_matmul(func, target, name: str, mr: int, parallel: bool, attach: bool = True,
                  pack: bool = False, exact: bool = False) -> tirx.PrimFunc:
    """`attach=False`: the result stays a buffer of its own (no epilogue per tile), for kernels with
    several matmuls whose epilogues read all of them (`_sched_contraction_group`). `pack`: each column
    panel of the right operand (K x nr) is copied into a contiguous buffer once, before the row tiles
    that read it (see `_pack_panel`); the parallel loop is then the column panels (and batch).
    `exact`: a variant for symbolic M / N that are multiples of the tile (`exact_tile`; its caller checks that
    at run time): no padding, no predicates, and a column tile over a symbolic N (attention's q.k^T: without
    it the accumulators of a row were a buffer in memory, not registers)."""
    sch = s_tir.Schedule(func)
    mm = sch.get_sblock(name)
    lanes = vector_lanes(target, sch.get(mm).body.buffer.dtype)
    loops = sch.get_loops(mm)
    m_ext, pads = loop_extent(sch, loops[-3]), []
    exact_nr = exact_tile(func, name, mr, target)[1] if exact else None
    if mr > 1 and not exact and not (isinstance(m_ext, int) and m_ext % mr == 0):
        # A ragged row tile puts an `i < M` test inside the k loop (1.8x slower at M = 16 than
        # padding): pad M to the tile instead.
        # Input rows are copied per tile (K floats per mr*nr*K MACs) and the padded result is
        # written back under the `i < M` predicate, outside the k loop.
        sch.pad_einsum(mm, [1] * (len(loops) - 3) + [mr, 1, 1])
        pads = [b for b in sch.get_producers(mm) if sch.get(b).name_hint.endswith("_pad")]
        for copy in sch.get_consumers(mm):
            if not writes_param(func, sch, copy):
                sch.compute_inline(copy)  # the epilogue reads the padded tile directly
    prepacked = _inline_unpack(sch, func, mm)      # after pad_einsum (it needs the plain W[k, j])
    *batch, i, j, k = sch.get_loops(mm)
    nr = exact_nr or pick_tile(loop_extent(sch, j), tile_columns(mr, target, sch.get(mm).body.buffer.dtype),
                               lanes, at_most=True)
    # `exact`: M and N are multiples of the tile (checked by the caller), so no split needs a predicate
    io, ii = (i, None) if mr == 1 else sch.split(i, [None, mr], disable_predication=exact)
    jo, ji = (None, j) if nr is None else sch.split(j, [None, nr], disable_predication=exact)
    k_ext = loop_extent(sch, k)
    ko, ki = (sch.split(k, [None, _K_SPLIT]) if isinstance(k_ext, int)
              and k_ext % _K_SPLIT == 0 and k_ext > _K_SPLIT else (k, None))
    # Column tiles outside row tiles: a weight panel (K x nr) is reused by every row tile while
    # it sits in L1/L2 (1.15-1.2x faster at 64x256x1024 and 256x512x512 than rows outside).
    outer = [*batch] + ([jo] if jo is not None else []) + [io]
    sch.reorder(*outer, ko, *[lp for lp in (ki, ii) if lp is not None], ji)
    pack = pack and jo is not None
    if pack and not prepacked:      # prepacked: the panels are the parameter
        _pack_panel(sch, mm, jo, target)
    # Epilogue per tile: the accumulator tile (thread-local scratch) stays in registers and the
    # intermediate buffer shrinks to the tile (CompactBufferAllocation); a matmul writing the
    # output directly gets a cache tile.
    epilogues = list(sch.get_consumers(mm)) if attach else []
    if not writes_param(func, sch, mm):
        if attach:
            tile_scope(sch, mm)
    elif not epilogues:
        epilogues = [sch.cache_write(mm, 0, cpu_sched_helpers.TILE_SCOPE)]
    for pad in pads:
        if pack:
            # once for all panels, before them: per row tile, its input rows would be copied again for every
            # column panel (1.3x slower at 2048x512x512, 1.2x at 64x256x1024, one thread)
            vectorize_inner(sch, pad, target)
            if parallel:
                sch.parallel(sch.get_loops(pad)[0])
            continue
        sch.compute_at(pad, outer[-1], preserve_unit_loops=True)
        vectorize_inner(sch, pad, target)
    attached = []
    while epilogues:  # and their consumers: an epilogue chain the inlining budget split
        epi = epilogues.pop(0)
        try:
            sch.reverse_compute_at(epi, outer[-1], preserve_unit_loops=True)
        except Exception:  # pylint: disable=broad-except
            continue  # stays a separate loop nest after the matmul
        attached.append(epi)
        epilogues += [c for c in sch.get_consumers(epi)
                      if not any(sch.get(c).same_as(sch.get(e)) for e in attached + epilogues)]
    if parallel:
        if pack:  # the panel is packed under jo: the loops above it, not the row tiles, run in parallel
            sch.parallel(sch.fuse(*outer[:-1]) if len(outer) > 2 else outer[0])
        elif attach:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        else:
            # the result is a whole buffer: with the row tiles fused in, CompactBufferAllocation sized it
            # with a division by the row-tile count (hoisted to the function's entry: SIGFPE for M = 0)
            sch.parallel(outer[0])
    for lp in (ki, ii):  # explicit, rather than left to LLVM's unrolling heuristics
        if lp is not None:
            sch.unroll(lp)
    if nr is not None:
        vectorize_tile(sch, ji, nr, lanes, unroll=True)
        for epi in attached:  # the epilogue stays a loop: unrolling it only costs compile time
            inner = sch.get_loops(epi)[-1]
            if loop_extent(sch, inner) == nr:
                vectorize_tile(sch, inner, nr, lanes, unroll=False)
    sch.decompose_reduction(mm, ko)  # only now: parallel/vectorize refuse a decomposed block
    if not exact:
        return sch.mod["main"]
    acc = sch.get(mm).writes[0].source
    main = sch.mod["main"]
    tile = not any(acc.same_as(p) for p in main.params)      # the tile (TILE_SCOPE), not the output itself
    return _strip_predicates(_pad_tile_buffer(main, acc, mr, nr) if tile else main)


def _unpack_blocks(sch: s_tir.Schedule, func: tirx.PrimFunc) -> list:
    """The blocks of `func` that read a weight packed at compile time (`PREPACKED`)."""
    return [b for b in child_blocks(sch) if prepacked_columns(func, sch.get(b)) is not None]


def _inline_unpack(sch: s_tir.Schedule, func: tirx.PrimFunc, mm=None) -> bool:
    """Inlines the prepacked weights' reading blocks (those `mm` reads; None: all) into the matmuls: they read
    the panels directly. True if there was one."""
    blocks = _unpack_blocks(sch, func)
    if mm is not None:
        producers = sch.get_producers(mm)
        blocks = [b for b in blocks if any(sch.get(p).same_as(sch.get(b)) for p in producers)]
    for b in blocks:
        sch.compute_inline(b)
    return bool(blocks)


def _pack_panel(sch: s_tir.Schedule, mm, jo, target) -> None:
    """Copies the right operand's K x nr column panel of each `jo` tile into a contiguous buffer (the
    panel of packed BLAS): unpacked, the micro-kernel reads nr columns from K rows N floats apart, and
    with N a multiple of 512 (a 2 KiB row) those rows map to the same few L1 sets and evict each other
    every pass over K."""
    j_var = sch.get(mm).iter_vars[-2].var
    reads = sch.get(mm).reads
    idx = next(n for n, r in enumerate(reads) if r.region and r.region[-1].min.same_as(j_var))
    panel = sch.cache_read(mm, idx, "global")
    sch.compute_at(panel, jo, preserve_unit_loops=True)
    vectorize_inner(sch, panel, target)


def _group_parts(sch: s_tir.Schedule):
    """(contractions, epilogues, S) of a merged contraction group (`cpu_schedule_fuse`): every reduction a
    2-d matmul ``C[i, j] += A[i, k] * W[k, j]`` with the same (M, N), every other block spatial over
    (M, S), S dividing N: the epilogue reads columns ``g * S + s`` of the matmuls (a split into N / S
    gates, or S == N)."""
    func = sch.mod["main"]
    blocks = [b for b in child_blocks(sch) if prepacked_columns(func, sch.get(b)) is None]
    cons = [b for b in blocks if "R" in iter_kinds(sch, b)]
    epis = [b for b in blocks if "R" not in iter_kinds(sch, b)]
    if not cons or not epis or not all(is_contraction(sch, c) and len(sch.get_loops(c)) == 3 for c in cons):
        raise ValueError("not a 2-d contraction group")
    ana = tvm.sym.Analyzer()
    m_ext, n = (sch.get(lp).extent for lp in sch.get_loops(cons[0])[:2])
    if not isinstance(n, tirx.IntImm) or any(
            not ana.can_prove_equal(sch.get(sch.get_loops(c)[0]).extent, m_ext)
            or not ana.can_prove_equal(sch.get(sch.get_loops(c)[1]).extent, n) for c in cons):
        raise ValueError("matmuls of different shapes")
    ext = {loop_extent(sch, sch.get_loops(e)[-1]) for e in epis}
    if len(ext) != 1 or any(len(sch.get_loops(e)) != 2 or not ana.can_prove_equal(
            sch.get(sch.get_loops(e)[0]).extent, m_ext) for e in epis):
        raise ValueError("epilogues of different shapes")
    (s_ext,) = ext
    if not isinstance(s_ext, int) or int(n.value) % s_ext:
        raise ValueError("epilogue columns do not divide the matmul's")
    return cons, epis, s_ext


def _sched_group_tiles(func, target, parallel: bool) -> tirx.PrimFunc:
    """A contraction group with few rows (M < 4; GEMV-like): per tile of t epilogue columns (the same t
    columns of each of the G = N / S gates), every matmul's G x t accumulators in registers over k, then
    the epilogues on that tile. Tiles run in parallel; each core reads the same weight columns every call
    (its share of the weights stays in its L2)."""
    sch = s_tir.Schedule(func)
    cons, epis, s_ext = _group_parts(sch)
    n = loop_extent(sch, sch.get_loops(cons[0])[1])
    gates = n // s_ext
    lanes = vector_lanes(target, sch.get(cons[0]).writes[0].source.dtype)
    # 16 accumulator vectors per matmul (G x t floats): t = 64 for the 4 gates of an LSTM (1.1x faster than
    # 32: longer contiguous weight rows); 128 columns for one gate, as the GEMV tile
    want = TILE_OVERRIDE or (tile_columns(1, target, sch.get(cons[0]).writes[0].source.dtype) if gates == 1
                             else 256 // gates)
    panels = {prepacked_columns(func, sch.get(b)) for b in _unpack_blocks(sch, func)}
    _inline_unpack(sch, func)
    if panels and not TILE_OVERRIDE:
        # weights packed at compile time (panels of nr columns): whole panels, as many accumulators as the
        # one-gate GEMV tile where that is at least a panel per gate; an LSTM on AVX2: 16 columns per gate, each
        # gate's weights one contiguous stream over k (step kernel 1.4x -> 0.87x numpy's sgemv at B1; 64 columns
        # per gate read 16 streams of 64 bytes and spill)
        nr = min(panels)
        want = max(nr, tile_columns(1, target, sch.get(cons[0]).writes[0].source.dtype) // gates // nr * nr)
    t = next((c for c in (want, 64, 32, 16) if c >= lanes and s_ext % c == 0 and c % lanes == 0), None)
    if t is None:
        raise ValueError("no column tile")
    outer = []
    for c in cons:
        # [M, N] -> [M, G, S]: each gate's tile is a box (the epilogue's gate index a constant)
        sch.transform_block_layout(c, lambda i, j, k: (i, j // s_ext, j % s_ext, k))
        sch.transform_layout(c, ("write", 0), lambda i, j: (i, j // s_ext, j % s_ext))
        tile_scope(sch, c)
        i, g, col, k = sch.get_loops(c)
        so, si = sch.split(col, [None, t])
        ko, ki = sch.split(k, [None, _K_SPLIT]) if isinstance(loop_extent(sch, k), int) and \
            loop_extent(sch, k) % _K_SPLIT == 0 else (k, None)
        sch.reorder(so, i, ko, *([ki] if ki is not None else []), g, si)
        outer.append((so, i))
    so, row = (sch.merge(*lps) if len(lps) > 1 else lps[0] for lps in zip(*outer))
    if parallel:
        sch.parallel(so)
    for c in cons:
        loops = sch.get_loops(c)     # so, row, ko, [ki], g, si
        for lp in loops[3:-1]:
            sch.unroll(lp)
        vectorize_tile(sch, loops[-1], t, lanes, unroll=True)
        sch.decompose_reduction(c, loops[2])
    # The epilogues go under the row loop by hand: reverse_compute_at cannot solve a constant (gate) index
    # of the region they read.
    return _move_epilogues(sch.mod["main"], [sch.get(e).name_hint for e in epis], sch.get(so).loop_var,
                           sch.get(row).loop_var, t, lanes)


def _move_epilogues(func, names, so_var, row_var, t: int, lanes: int) -> tirx.PrimFunc:
    """Moves each root-level loop nest of a spatial block in `names` (loops (row, col)) under the loop of
    `row_var` (below what is there), for columns ``so * t + [0, t)``, in order, vectorized."""
    root = func.body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    realizes, keep = {}, []
    for st in stmts:
        found = []
        tvm_ffi.structural_walk(st, (SBlockRealize, lambda r: found.append(r) if r.block.name_hint in names else None))
        if found:
            if len(found) != 1 or not isinstance(st, tirx.For):
                raise ValueError("epilogue is not a loop nest of its own")
            realizes[found[0].block.name_hint] = found[0]
        else:
            keep.append(st)
    if set(realizes) != set(names):
        raise ValueError("epilogue not found")
    i64 = lambda v: tirx.IntImm("int64", v)  # noqa: E731
    moved = []
    for name in names:
        outer, vec = tirx.Var("e_o", "int64"), tirx.Var("e_v", "int64")
        realize = SBlockRealize([row_var, so_var * t + outer * lanes + vec], tirx.const(True, "bool"),
                                realizes[name].block)
        moved.append(tirx.For(outer, i64(0), i64(t // lanes), tirx.ForKind.SERIAL,
                              tirx.For(vec, i64(0), i64(lanes), tirx.ForKind.VECTORIZED, realize)))
    done = []

    def under_row(loop, mutator):
        if not loop.loop_var.same_as(row_var):
            return mutator.default_mutate(loop)
        done.append(loop)
        seq = list(loop.body.seq) if isinstance(loop.body, tirx.SeqStmt) else [loop.body]
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.SeqStmt(seq + moved),
                        loop.thread_binding, loop.annotations)
    keep = [tvm_ffi.structural_mutate(st, (tirx.For, under_row)) for st in keep]
    if len(done) != 1:
        raise ValueError("row loop not found")
    new_root = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                      tirx.SeqStmt(keep) if len(keep) > 1 else keep[0], root.init, root.alloc_buffers,
                      root.match_buffers, root.annotations)
    return func.with_body(SBlockRealize([], tirx.const(True, "bool"), new_root))


def _sched_group_separate(func, target, parallel: bool) -> tirx.PrimFunc:
    """A contraction group with many rows: each matmul with the 4-row packed matmul schedule into a buffer
    of its own, then the epilogues, rows parallel (what the separate kernels did, in one launch)."""
    sch = s_tir.Schedule(func)
    cons, epis, _ = _group_parts(sch)
    names = [sch.get(c).name_hint for c in cons]
    epi_names = [sch.get(e).name_hint for e in epis]
    for name in names:
        # packed weight panels, 4-row tiles: an LSTM's recurrent weight (H x 4H, 1 MiB at H = 256) has rows 4H
        # floats apart that evict each other from L1 (see `_pack_panel`); LSTM B16 T64 1.15x, B8 1.25x faster
        # than unpacked 6-row tiles (one thread; 4 rows alone were not faster)
        func = _sched_matmul(func, target, name, _MATMUL_MR, parallel, attach=False, pack=True)
    sch = s_tir.Schedule(func)
    for name in epi_names:
        block = sch.get_sblock(name)
        vectorize_inner(sch, block, target)
        if parallel:
            sch.parallel(sch.get_loops(block)[0])
    return sch.mod["main"]


def _group_select(func, target, work) -> tirx.PrimFunc:
    """Row tiles (`_sched_group_tiles`) while M < 4, else `_sched_group_separate`; each serial below
    PARALLEL_MIN_WORK."""
    sch = s_tir.Schedule(func)
    cons, _, _ = _group_parts(sch)
    m_ext = sch.get(sch.get_loops(cons[0])[0]).extent
    true = tirx.const(True, "bool")
    if isinstance(m_ext, tirx.IntImm):
        kinds = [(true, _sched_group_tiles if int(m_ext.value) < _MATMUL_MR else _sched_group_separate)]
    else:
        kinds = [(m_ext < tirx.IntImm(str(m_ext.ty), _MATMUL_MR), _sched_group_tiles), (true, _sched_group_separate)]
    cands = []
    for m_cond, sched in kinds:
        for p_cond, make in _parallel_cands(work, target, lambda par, sched=sched: sched(func, target, par)):
            cands.append((tirx.And(m_cond, p_cond), make))
    return _select(func, cands)


def contraction_group_schedulable(func: tirx.PrimFunc, target) -> bool:
    """True if the contraction-group rule schedules `func` (a kernel `cpu_schedule_fuse` merged)."""
    try:
        sch = s_tir.Schedule(func)
        inline_spatial(func, sch)
        inlined = sch.mod["main"]
        _group_select(inlined, target, total_work(sch, child_blocks(sch)))
        return True
    except Exception as err:  # pylint: disable=broad-except
        _LOG.debug("cpu_schedule: no contraction-group schedule: %s", err)
        return False
