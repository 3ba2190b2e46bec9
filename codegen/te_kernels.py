"""Hand-written TE computes (and TIR functions) that the converters emit where Relax/TOPI does not
compute what numpy computes (why, per case, is in the `converters` package docstring):

* `te_broadcast`, `te_slice`, `te_take`: numpy broadcasting, slicing and take that never read out of
  bounds, also for symbolic dims that are 0 or 1 at run time (take's indices checked first);
* `te_empty_guard`, `te_mean_div`: the identity / NaN of a reduction over a 0-length symbolic axis;
* `te_nan_reduce`, `te_first_index`: NaN-propagating max/min, and argmax/argmin's first index;
* `te_sort_key`: topk's key of a float tensor, NaN last in both directions (numpy's order);
* `te_arange`: arange over symbolic integer bounds;
* `int_power_primfunc`: integer power as a TIR while loop (TVM has no integer power);
* `take_index_primfunc`, `nonnegative_primfunc`, `nonempty_primfunc`: run-time checks (TIR asserts)
  where numpy raises: take indices out of range, negative integer exponents, argmax/max/min of an empty axis.

Each TE function takes TE tensors / PrimExprs and is emitted with ``bb.emit_te(fn, ...)``.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx
from tvm.sym import Analyzer

from ..ir.dtypes import is_float
from .dims import I64, is_one, provably_equal

INT64_MAX = (1 << 63) - 1


def te_broadcast(x, target):
    """numpy broadcast of `x` to `target`; a dim that is neither 1 nor the target at run time
    (numpy raises) reads clamped indices, never out of bounds."""
    off = len(target) - len(x.shape)

    def f(*i):
        idx, conds = [], []
        for k, d in enumerate(x.shape):
            t, ii = target[k + off], i[k + off]
            if provably_equal(Analyzer(), d, t):
                idx.append(ii)
            elif is_one(d):
                idx.append(tirx.IntImm(I64, 0))
            else:
                idx.append(tirx.Select(d == 1, tirx.IntImm(I64, 0), tirx.min(ii, d - 1)))
                if not (isinstance(d, tirx.IntImm) and int(d.value) > 0):
                    conds.append(d > 0)
        v = x(*idx)
        if conds:
            v = tirx.if_then_else(tirx.all(*conds), v, tirx.const(0, x.dtype))
        return v
    return te.compute(list(target), f, name="broadcast_to")


def te_slice(x, axes, begins, lengths, steps):
    """out[.., i, ..] = x[.., begin + i * step, ..] along `axes` (begins/lengths canonical)."""
    spec = {int(a): (b, n, s) for a, b, n, s in zip(axes, begins, lengths, steps)}
    shape = [spec[a][1] if a in spec else d for a, d in enumerate(x.shape)]

    def f(*i):
        return x(*[spec[a][0] + i[a] * spec[a][2] if a in spec else i[a] for a in range(len(x.shape))])
    return te.compute(shape, f, name="strided_slice")


def te_take(x, idx, axis, n, checked=False):
    """np.take. `checked`: `idx` holds int64 indices already in [0, n) (`take_index_primfunc`). Else
    numpy's negative-index wrap, with out-of-range indices clamped and 0 for an empty axis (never an
    out-of-bounds read; the converter uses this only for constant indices known to be in range)."""
    nd_i = len(idx.shape)
    shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])

    def f(*i):
        j = idx(*i[axis:axis + nd_i])
        j = j if str(idx.dtype) == I64 else tirx.Cast(I64, j)
        if checked:
            return x(*i[:axis], j, *i[axis + nd_i:])
        j = tirx.Select(j < 0, j + n, j)
        j = tirx.max(tirx.min(j, n - 1), tirx.IntImm(I64, 0))
        v = x(*i[:axis], j, *i[axis + nd_i:])
        if not (isinstance(n, tirx.IntImm) and int(n.value) > 0):
            v = tirx.if_then_else(n > 0, v, tirx.const(0, x.dtype))
        return v
    return te.compute(shape, f, name="take")


def te_empty_guard(r, src, extent, identity):
    """r where the reduced extent > 0, else the reduction identity: TVM initialises a reduction inside
    its loop, so a 0-length symbolic axis would leave the output uninitialised. `src` (the reduced
    tensor, not read) binds the symbols of `extent` by its shape: passed as scalar arguments instead,
    they made TVM's FuseTIR fail (renew_defs 'VarRemapGet(source) == nullptr') when the guard fused with
    an elementwise op that takes the symbol of an expression dim (``sum(x[1:], axis=1) * 2``)."""
    del src
    ident = tirx.const(identity, r.dtype)
    return te.compute(list(r.shape), lambda *i: tirx.if_then_else(extent > 0, r(*i), ident),
                      name="empty_reduce_guard")


def te_mean_div(s, src, count):
    """mean = sum / count in the sum's float dtype; nan for an empty reduction (numpy). `src`: see
    `te_empty_guard`."""
    del src
    nan = tirx.const(float("nan"), s.dtype)
    cnt = count.astype(s.dtype)
    return te.compute(list(s.shape),
                      lambda *i: tirx.if_then_else(count > 0, s(*i) / cnt, nan), name="mean_div")


def _reduce_index_map(nd, axes, keepdims, rvars):
    def full(i):
        it = iter(i)
        out = []
        for a in range(nd):
            if a in axes:
                if keepdims:
                    next(it)
                out.append(rvars[a])
            else:
                out.append(next(it))
        return out
    return full


def _reduce_out_shape(shape, axes, keepdims):
    return [(tirx.IntImm(I64, 1) if keepdims else None) if a in axes else d
            for a, d in enumerate(shape) if keepdims or a not in axes]


def te_nan_reduce(x, axes, keepdims, is_max):
    """np.max/np.min over float `axes`: NaN propagates (TVM's max/min keep whichever operand
    the comparison picks, so a NaN can be lost)."""
    axes = [int(a) for a in axes]
    nd = len(x.shape)
    rvars = {a: te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes}

    def combine(a, b):
        m = tirx.max(a, b) if is_max else tirx.min(a, b)
        return tirx.Select(tirx.isnan(a), a, tirx.Select(tirx.isnan(b), b, m))

    def ident(dtype):       # -inf / +inf: min_value(float) is the lowest *finite* value
        inf = tirx.infinity(dtype)
        return -inf if is_max else inf
    red = te.comm_reducer(combine, ident, name="nanmax" if is_max else "nanmin")
    full = _reduce_index_map(nd, set(axes), keepdims, rvars)
    shape = _reduce_out_shape(x.shape, set(axes), keepdims)
    return te.compute(shape, lambda *i: red(x(*full(i)), axis=[rvars[a] for a in axes]),
                      name="max" if is_max else "min")


def monotone_bits(b, magnitude, it: str):
    """A float's bits `b` (as a signed integer) made to order like the float: a negative's magnitude bits flip
    (`magnitude`: all bits but the sign; `it` the integer type). Its own inverse (`te_nan_reduce_keyed` decodes with it)."""
    return tirx.Select(b < tirx.const(0, it), tirx.bitwise_xor(b, magnitude), b)


#: float dtype -> the integer type of its bits (`te_nan_reduce_keyed`)
_KEY_INT = {"float16": "int16", "bfloat16": "int16", "float32": "int32", "float64": "int64"}


def te_nan_reduce_keyed(x, axes, keepdims, is_max):
    """`te_nan_reduce` with a plain integer max/min, the form GPUs reduce across threads (a custom reducer is
    not: `backends/cuda/gpu_reduction.py`): each float maps to an integer key ordered like the float (its bits,
    the non-sign bits flipped for negatives), NaN to the key past every number (the largest for max, the
    smallest for min), so NaN propagates; the result key maps back. -0.0 orders below 0.0, so max(-0.0, 0.0)
    is 0.0 and min is -0.0 whatever their order (numpy keeps the first of the two). Other dtypes: `te_nan_reduce`."""
    it = _KEY_INT.get(str(x.dtype))
    if it is None:
        return te_nan_reduce(x, axes, keepdims, is_max)
    bits = int(it[3:])
    flip = tirx.const((1 << (bits - 1)) - 1, it)        # 0x7f..f: the bits below the sign
    nan_key = tirx.const((1 << (bits - 1)) - 1 if is_max else -(1 << (bits - 1)), it)   # a NaN's bits: no number's key
    axes = [int(a) for a in axes]
    rvars = {a: te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes}
    full = _reduce_index_map(len(x.shape), set(axes), keepdims, rvars)
    shape = _reduce_out_shape(x.shape, set(axes), keepdims)

    def key(v):
        return tirx.Select(tirx.isnan(v), nan_key, monotone_bits(tirx.reinterpret(it, v), flip, it))
    extreme = te.max if is_max else te.min
    keys = te.compute(shape, lambda *i: extreme(key(x(*full(i))), axis=[rvars[a] for a in axes]), name="key")

    def value(*i):
        k = keys(*i)
        return tirx.Select(k == nan_key, tirx.const(float("nan"), str(x.dtype)),
                           tirx.reinterpret(str(x.dtype), monotone_bits(k, flip, it)))
    return te.compute(shape, value, name="max" if is_max else "min")


def te_first_index(x, m, axis, keepdims):
    """Second pass of argmax/argmin: the first index along `axis` where x equals the extreme `m`
    (kept-dims shape), or is NaN where `m` is NaN. A plain min-reduction, which every backend
    schedules (dlight cannot do cross-thread reductions with a custom tuple combiner)."""
    axis = int(axis)
    nd = len(x.shape)
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    full = _reduce_index_map(nd, {axis}, keepdims, {axis: k})
    shape = _reduce_out_shape(x.shape, {axis}, keepdims)
    is_f = is_float(str(x.dtype))

    def f(*i):
        xi = full(i)
        mi = [tirx.IntImm(I64, 0) if a == axis else xi[a] for a in range(nd)]
        v, mv = x(*xi), m(*mi)
        hit = v == mv
        if is_f:
            hit = tirx.any(hit, tirx.all(tirx.isnan(v), tirx.isnan(mv)))
        return te.min(tirx.Select(hit, tirx.Cast(I64, k.var), tirx.const(INT64_MAX, I64)), axis=k)
    return te.compute(shape, f, name="arg_index")


def te_shape_vector(*dims):
    """The int64 vector of `dims` (PrimExprs: a value's symbolic shape), for shape_of in a region."""
    def at(i):
        v = tirx.IntImm("int64", 0)
        for k in reversed(range(len(dims))):
            v = tirx.Select(i == k, tirx.Cast("int64", dims[k]), v)
        return v
    return te.compute([len(dims)], at, name="shape_of")


#: `te_lane_reduce`: a 1-d input is read as rows of LANE_ROW elements (the lanes), LANE_BLOCK rows per
#: block (4096 elements: the unit of parallel work, and what argmax searches again for the first index).
LANE_ROW = 128
LANE_BLOCK = 32
LANE_FOLD = 16          # lanes -> LANE_FOLD partials (vectorized), then a short scalar loop
_NAN_BITS = {16: 0x7C00, 32: 0x7F800000, 64: 0x7FF0000000000000}


def isnan_bits(v, dtype: str):
    """isnan(v) (`v` of float `dtype`) on the bits (|v| > inf as an integer): TVM's vectorizer scalarizes
    ``tirx.isnan`` (a scalar loop LLVM does not re-vectorize when it updates a reduction's accumulator in
    memory)."""
    bits = tvm.DataType(dtype).bits
    it = f"int{bits}"
    mag = tirx.reinterpret(it, v) & tirx.const((1 << (bits - 1)) - 1, it)
    return mag > tirx.const(_NAN_BITS[bits], it)


def te_sort_key(x, largest: bool):
    """An integer key of float `x` that TVM's topk sorts in numpy's stable argsort order of `x` (or of `-x` for
    `largest`): the float's bits made monotone (negatives flip their magnitude bits), -0.0 tied with 0.0, and NaN
    past every value in the sort's direction (past inf too: mapping NaN to inf in the float tied NaN with a real
    inf and the index decided). A float16 key is widened to int32 (TVM's sort has no int16)."""
    bits = tvm.DataType(x.dtype).bits
    it, out = f"int{bits}", f"int{max(bits, 32)}"
    nan_key = tirx.min_value(it) if largest else tirx.max_value(it)
    magnitude = tirx.const((1 << (bits - 1)) - 1, it)

    def key(*i):
        v = x(*i)
        b = tirx.Select(v == tirx.const(0, x.dtype), tirx.const(0, it), tirx.reinterpret(it, v))
        k = tirx.Select(isnan_bits(v, x.dtype), nan_key, monotone_bits(b, magnitude, it))
        return k if out == it else tirx.Cast(out, k)
    return te.compute(x.shape, key, name="sort_key")


def _lane_combine(kind: str, dtype: str):
    """(binary combine, identity) of sum / prod / max / min in `dtype`; float max / min propagate NaN."""
    is_f = is_float(dtype)
    if kind == "sum":
        return (lambda a, b: a + b), tirx.const(0, dtype)
    if kind == "prod":
        return (lambda a, b: a * b), tirx.const(1, dtype)
    is_max = kind == "max"
    ident = (-tirx.infinity(dtype) if is_max else tirx.infinity(dtype)) if is_f else (
        tirx.min_value(dtype) if is_max else tirx.max_value(dtype))
    if not is_f:
        pick = tirx.max if is_max else tirx.min
        return (lambda a, b: pick(a, b)), ident

    def combine(acc, b):
        """NaN-propagating: `b` if NaN, else the extreme; a NaN `acc` stays (ordered compares are false)."""
        better = b > acc if is_max else b < acc
        return tirx.Select(isnan_bits(b, dtype), b, tirx.Select(better, b, acc))
    return combine, ident


def _halve(vec, combine, name):
    """A 0-d tensor: `vec` (a power-of-2 length) combined pairwise in halves (a tree: log2 steps of latency,
    where a loop over it would chain every step)."""
    def step(v, h):
        return te.compute((tirx.IntImm(I64, h),), lambda l: combine(v[l], v[l + h]), name=f"{name}_{h}")
    while int(vec.shape[0]) > 1:
        vec = step(vec, int(vec.shape[0]) // 2)
    return te.compute((), lambda: vec[0], name=name)


def te_lane_reduce(x, kind: str):
    """numpy's sum / prod / max / min / argmax / argmin of a 1-d tensor `x` (any length, 0 included) as a
    0-d tensor, in a form the CPU schedules vectorize and parallelize (`cpu_schedule`, blocks ``dt_lanes_*``):

    * ``dt_lanes_block[b, l]``: the reduction of lane ``l`` (every LANE_ROW-th element) over the LANE_BLOCK
      rows of block ``b`` (full rows only); blocks run in parallel, lanes are vectors;
    * ``dt_lanes_lane[l]`` over the blocks, ``dt_lanes_tail[l]`` with the last N % LANE_ROW elements,
      ``dt_lanes_fold`` to LANE_FOLD lanes and ``dt_lanes_value`` to the result;
    * argmax / argmin: that extreme m (NaN if any element is NaN), then the first block holding m
      (``dt_lanes_bpos*``, from the block partials), then the first index of m in that block or in the
      tail (``dt_lanes_pos*``): numpy's first occurrence / first NaN, reading the data once more only
      for one block.

    Integer sums wrap like numpy's in the accumulator dtype (the converter casts first). Empty input:
    the identity (sum 0, prod 1, max -inf, ...), argmax INT64_MAX (the converter checks emptiness)."""
    n = x.shape[0]
    dtype = str(x.dtype)
    arg = kind in ("argmax", "argmin")
    combine, ident = _lane_combine({"argmax": "max", "argmin": "min"}.get(kind, kind), dtype)
    red = te.comm_reducer(combine, lambda t: ident, name="lane_" + kind)
    i64 = lambda v: tirx.IntImm(I64, v)  # noqa: E731
    row, blk, fold = i64(LANE_ROW), i64(LANE_BLOCK), i64(LANE_FOLD)
    nrows = tirx.floordiv(n, row)
    nblk = tirx.floordiv(nrows + blk - 1, blk)
    tail0 = nrows * row
    zero = i64(0)

    # The last n % LANE_ROW elements: lane l holds element tail_at(l) of the last LANE_ROW (a contiguous
    # vector load; for n < LANE_ROW, element l, the index clamped and an empty `x` never read), the identity
    # where that element is not in the tail. A block of its own, so its if_then_else is never copied into
    # another expression (TVM's CSE then reused a value computed in one copy's branch in the other: LLVM
    # rejected the module).
    def tail_at(l):
        return tirx.Select(n >= row, n - row + l, l)

    def in_tail(l):
        return tirx.And(tail_at(l) >= tail0, tail_at(l) < n)
    tail = te.compute((row,), lambda l: tirx.Select(in_tail(l), tirx.if_then_else(
        n >= row, x[n - row + l], tirx.if_then_else(n > zero, x[tirx.max(tirx.min(l, n - 1), zero)], ident)),
        ident), name="dt_lanes_tailv")

    # rows per block: LANE_BLOCK, fewer when there are fewer rows (the last block's rows past the end are
    # skipped by a test per row, the same for every lane)
    # Every reduction domain has at least one step, the steps past the data read the identity: unscheduled,
    # TVM initializes a reduction inside its loop, so an empty domain left the result uninitialized.
    one = i64(1)
    rows_per_blk = tirx.max(tirx.min(blk, nrows), one)
    r = te.reduce_axis((zero, rows_per_blk), "r")
    part = te.compute((nblk, row), lambda b, l: red(tirx.if_then_else(
        b * blk + r < nrows, x[(b * blk + r) * row + l], ident), axis=r), name="dt_lanes_block")
    b = te.reduce_axis((zero, tirx.max(nblk, one)), "b")
    lane = te.compute((row,), lambda l: red(tirx.if_then_else(b < nblk, part[b, l], ident), axis=b),
                      name="dt_lanes_lane")

    merged = te.compute((row,), lambda l: combine(lane[l], tail[l]), name="dt_lanes_tail")
    j = te.reduce_axis((zero, row // fold), "j")
    folded = te.compute((fold,), lambda l: red(merged[j * fold + l], axis=j), name="dt_lanes_fold")
    value = _halve(folded, combine, "dt_lanes_value")
    if not arg:
        return value

    big = i64(INT64_MAX)
    is_f = is_float(dtype)

    def match(v):
        """v is m, or NaN where m is NaN (numpy: the first NaN)."""
        hit = v == value[()]
        return tirx.Or(hit, tirx.And(isnan_bits(v, dtype), isnan_bits(value[()], dtype))) if is_f else hit

    bb_ = te.reduce_axis((zero, tirx.max(nblk, one)), "b")
    pv = tirx.Var("v", dtype)       # bound once: an if_then_else copied into an expression broke TVM's CSE
    bpos_lane = te.compute((row,), lambda l: te.min(tirx.Let(pv, tirx.if_then_else(bb_ < nblk, part[bb_, l], ident),
                                                             tirx.Select(tirx.And(bb_ < nblk, match(pv)), bb_, big)),
                                                    axis=bb_), name="dt_lanes_bpos_lane")
    j2 = te.reduce_axis((zero, row // fold), "j")
    bpos_fold = te.compute((fold,), lambda l: te.min(bpos_lane[j2 * fold + l], axis=j2), name="dt_lanes_bpos_fold")
    bpos = _halve(bpos_fold, tirx.min, "dt_lanes_bpos")
    r2 = te.reduce_axis((zero, rows_per_blk), "r")
    i32 = lambda v: tirx.IntImm("int32", v)  # noqa: E731
    big32 = i32((1 << 31) - 1)
    first_row = tirx.min(bpos[()], nblk - 1) * blk       # of the block holding m (where bpos < INT64_MAX)

    def in_block(l):
        """First row (in the block) where lane l holds m: the row number is the same for every lane (no
        per-lane index arithmetic in the loop)."""
        rr = first_row + r2
        ok = tirx.And(bpos[()] < big, rr < nrows)         # the same for every lane: loads stay vectors
        v = tirx.Var("v", dtype)
        return te.min(tirx.Let(v, tirx.if_then_else(ok, x[rr * row + l], ident), tirx.Select(
            tirx.And(ok, match(v)), tirx.Cast("int32", r2), big32)), axis=r2, where=ok)
    pos_lane = te.compute((row,), in_block, name="dt_lanes_pos_lane")

    def with_tail_pos(l):
        r_hit = pos_lane[l]
        in_blk = tirx.Select(r_hit < big32, (first_row + tirx.Cast(I64, r_hit)) * row + l, big)
        return tirx.min(in_blk, tirx.Select(tirx.And(in_tail(l), match(tail[l])), tail_at(l), big))
    pos_tail = te.compute((row,), with_tail_pos, name="dt_lanes_pos_tail")
    j3 = te.reduce_axis((zero, row // fold), "j")
    pos_fold = te.compute((fold,), lambda l: te.min(pos_tail[j3 * fold + l], axis=j3), name="dt_lanes_pos_fold")
    return _halve(pos_fold, tirx.min, "dt_lanes_index")


def te_arange(start, step, length, dtype):
    """start + i * step for i < length, cast to `dtype` (symbolic integer bounds)."""
    return te.compute([length], lambda i: (start + i * step).astype(dtype), name="arange")


def int_power_primfunc(dtype: str):
    """Flat numpy integer power: square-and-multiply in a while loop (wraps on overflow like
    numpy's C loop; a negative exponent gives 1: the converter checks exponents first,
    `nonnegative_primfunc`). TIR, because an unrolled
    TE expression over the exponent's bits makes TVM's simplifier exponential. The loop state
    lives in the output and two scratch outputs (no block-local buffer: those break when a
    schedule duplicates the block, and GPU code cannot allocate global memory)."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def int_power(a: T.handle, b: T.handle, c: T.handle, sb: T.handle, se: T.handle):
        # opaque (8): never fused, so the scratch outputs stay function arguments
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})
        n = T.int64()
        A = T.match_buffer(a, (n,), dtype)
        B = T.match_buffer(b, (n,), dtype)
        C = T.match_buffer(c, (n,), dtype)
        SB = T.match_buffer(sb, (n,), dtype)
        SE = T.match_buffer(se, (n,), dtype)
        for i in range(n):
            with T.sblock("int_power"):       # a spatial block: dlight binds it on GPUs
                vi = T.axis.spatial(n, i)
                T.reads(A[vi], B[vi])
                T.writes(C[vi], SB[vi], SE[vi])
                C[vi] = T.Cast(dtype, 1)
                SB[vi] = A[vi]
                SE[vi] = B[vi]
                while SE[vi] > T.Cast(dtype, 0):
                    if SE[vi] % T.Cast(dtype, 2) == T.Cast(dtype, 1):
                        C[vi] = C[vi] * SB[vi]
                    SB[vi] = SB[vi] * SB[vi]
                    SE[vi] = SE[vi] // T.Cast(dtype, 2)
    return int_power


# Run-time checks: where numpy raises (an index out of range, argmax/max/min of an empty axis, an integer to a
# negative power), compiled code raises too: a TIR assert makes the kernel fail, the VM raises, and the
# executor names the op (re-running the region's numpy reference on that error path). Each check is a
# serial kernel of its own (SERIAL_CHECK): an assert inside a parallel loop was missed in 2 of 40 runs
# (TVM's parallel launcher), and the kernels that use the checked values keep their schedules.
NEGATIVE_POWER = "power: integers to negative integer powers are not allowed"
TAKE_OUT_OF_RANGE = "take: index out of range"
EMPTY_REDUCE = "argmax/argmin/max/min of an empty axis (no identity)"
#: PrimFunc attribute: the CPU schedules leave the function as written (a serial loop of checks).
SERIAL_CHECK = "dyntvm.serial_check"


def take_index_primfunc(dtype: str):
    """Flat ``take`` indices -> int64 indices in [0, n): numpy's negative wrap, and a run-time error
    for an index outside [-n, n) (one pass over the indices)."""
    from tvm.script import tirx as T
    unsigned = np.dtype(dtype).kind == "u"

    @T.prim_func(private=True, s_tir=True)
    def take_index(i: T.handle, n: T.int64, o: T.handle):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8, SERIAL_CHECK: True})
        m = T.int64()
        idx = T.match_buffer(i, (m,), dtype)
        out = T.match_buffer(o, (m,), I64)
        for k in range(m):
            with T.sblock("take_index"):
                vk = T.axis.spatial(m, k)
                T.reads(idx[vk])
                T.writes(out[vk])
                if unsigned:
                    assert idx[vk] < T.Cast(dtype, n), TAKE_OUT_OF_RANGE
                    out[vk] = T.Cast(I64, idx[vk])
                else:
                    assert T.Cast(I64, idx[vk]) >= T.int64(0) - n and T.Cast(I64, idx[vk]) < n, TAKE_OUT_OF_RANGE
                    out[vk] = T.Select(T.Cast(I64, idx[vk]) < T.int64(0), T.Cast(I64, idx[vk]) + n,
                                       T.Cast(I64, idx[vk]))
    return take_index


def nonnegative_primfunc(dtype: str):
    """Flat integer exponents passed through, or a run-time error for a negative one."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def nonnegative(x: T.handle, n: T.int64, o: T.handle):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8, SERIAL_CHECK: True})
        m = T.int64()
        xs = T.match_buffer(x, (m,), dtype)
        out = T.match_buffer(o, (m,), dtype)
        for k in range(m):
            with T.sblock("nonnegative"):
                vk = T.axis.spatial(m, k)
                T.reads(xs[vk])
                T.writes(out[vk])
                assert xs[vk] >= T.Cast(dtype, 0), NEGATIVE_POWER
                out[vk] = xs[vk]
    return nonnegative


def nonempty_primfunc(dtype: str = I64):
    """A reduction's result (argmax/argmin's indices, max/min's extremes, of `dtype`) passed through,
    or a run-time error if the reduced extent n is 0 (numpy: no identity)."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def nonempty(r: T.handle, n: T.int64, o: T.handle):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8, SERIAL_CHECK: True})
        m = T.int64()
        res = T.match_buffer(r, (m,), dtype)
        out = T.match_buffer(o, (m,), dtype)
        assert n > T.int64(0), EMPTY_REDUCE
        for k in range(m):
            with T.sblock("copy"):
                vk = T.axis.spatial(m, k)
                out[vk] = res[vk]
    return nonempty


def same_size_primfunc(dtype: str):
    """A copy ``a (m,) -> b (k,)`` that first asserts m == k: a reshape whose element counts Relax cannot
    prove equal (`converters.shape._checked_reshape`). The assert stands outside the loop (on a GPU: in the
    host part, before the launch). Opaque, so it is never fused (a `match_cast` in its place, fused with a
    following elementwise op, crashed TVM's fusion passes)."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def same_size(a: T.handle, b: T.handle):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})
        m = T.int64()
        k = T.int64()
        src = T.match_buffer(a, (m,), dtype)
        dst = T.match_buffer(b, (k,), dtype)
        assert m == k, "reshape: the number of elements differs from the target shape's"
        for i in range(k):
            with T.sblock("copy"):
                vi = T.axis.spatial(k, i)
                dst[vi] = src[vi]
    return same_size


# The same checks on a GPU: a TIR assert cannot raise inside a CUDA kernel (TVM 0.27 emits a host-only
# error call there, which nvcc rejects). Instead a kernel counts the bad values into a 1-element int64
# tensor `bad`; the region copies that one number to the host (`R.tensor_to_shape`) and passes it to
# `pass_if_zero_primfunc`, whose host-side assert fails unless bad == 0. As on the CPU, the executor then
# re-runs the region's numpy reference, which raises numpy's error naming the op (`common.checked`).
def te_check_device(flat, n, kind: str):
    """(checked values, bad count [1]) for `kind` "take_index" / "nonnegative" / "nonempty"."""
    from tvm import te
    m = flat.shape[0]
    if kind == "nonempty":
        bad = te.compute((1,), lambda _: tirx.Select(n > tirx.IntImm(I64, 0), tirx.IntImm(I64, 0),
                                                     tirx.IntImm(I64, 1)), name="bad")
        return te.compute((m,), lambda k: flat[k], name="checked"), bad
    r = te.reduce_axis((0, m), name="k")
    if kind == "nonnegative":
        zero = tirx.const(0, flat.dtype)
        bad = te.compute((1,), lambda _: te.sum(tirx.Select(flat[r] < zero, tirx.IntImm(I64, 1),
                                                            tirx.IntImm(I64, 0)), axis=r), name="bad")
        return te.compute((m,), lambda k: flat[k], name="checked"), bad
    unsigned = str(flat.dtype).startswith("uint")

    def as_i64(v):
        return tirx.Cast(I64, v)

    def out_of_range(v):
        if unsigned:    # compared in the index's dtype: a huge uint64 must not wrap to a negative int64
            return tirx.Cast("bool", v >= tirx.Cast(flat.dtype, n))
        return tirx.Or(as_i64(v) < tirx.IntImm(I64, 0) - n, as_i64(v) >= n)
    bad = te.compute((1,), lambda _: te.sum(tirx.Select(out_of_range(flat[r]), tirx.IntImm(I64, 1),
                                                        tirx.IntImm(I64, 0)), axis=r), name="bad")
    out = te.compute((m,), lambda k: tirx.Select(as_i64(flat[k]) < tirx.IntImm(I64, 0), as_i64(flat[k]) + n,
                                                 as_i64(flat[k])), name="take_index")
    return out, bad


def pass_if_zero_primfunc(dtype: str, message: str, resized: bool = False):
    """A copy ``a (m,) -> b (m,)`` that first asserts its scalar argument `bad` is 0 (`te_check_device`'s
    count, read to the host). The assert stands outside any loop, so on a GPU it runs in the host part of
    the kernel, before the launch. `resized`: ``b`` has a size of its own (``m2``, which `bad` == 0 makes m: a
    reshape whose dims `bad` compared; `converters.common.cast_shape`)."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def pass_if_zero(a: T.handle, bad: T.int64, b: T.handle):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})
        m = T.int64()
        src = T.match_buffer(a, (m,), dtype)
        dst = T.match_buffer(b, (m,), dtype)
        assert bad == T.int64(0), message
        for k in range(m):
            with T.sblock("copy"):
                vk = T.axis.spatial(m, k)
                dst[vk] = src[vk]

    @T.prim_func(private=True, s_tir=True)
    def pass_if_zero_resized(a: T.handle, bad: T.int64, b: T.handle):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})
        m = T.int64()
        m2 = T.int64()
        src = T.match_buffer(a, (m,), dtype)
        dst = T.match_buffer(b, (m2,), dtype)
        assert bad == T.int64(0), message
        assert m == m2, message
        for k in range(m2):
            with T.sblock("copy"):
                vk = T.axis.spatial(m2, k)
                dst[vk] = src[vk]
    return pass_if_zero_resized if resized else pass_if_zero
