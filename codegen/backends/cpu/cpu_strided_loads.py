"""Lane-strided vector loads as contiguous vector loads and one shuffle (`te_conv.STRIDED_LANES`).

A loop vectorized over positions that reads its input `s` apart (a stride-2 depthwise conv reading its padded
input: column w * 2 + tap) gives a load ``buf[Ramp(base, s, L)]``, which TVM's LLVM code generator writes as
L scalar loads and inserts (a gather). `strided_loads_pass` (run at the end of the TIR pipeline of a CPU
build, `cpu_schedule.tir_pipeline`) writes each such float load of a constant stride 2..`MAX_STRIDE` as
ceil(span / L) contiguous loads of L lanes - span = s * (L - 1) + 1, the last one ending at the last element
read, so that nothing past the strided load's own extent is read - and a ``Shuffle`` picking the lanes, which
LLVM lowers to a few ``vshufps`` / ``vpermps`` (for stride 2: two loads and two shuffles per vector, where the
gather took 8 loads and 8 inserts). (Tried: one in-block ``vshufps`` a load, the accumulator tile kept in that
shuffle's lane order and shuffled back by its readers: 1.04-1.23x the time of this form on mobilenet_v3_small's
3x3 / 2 layers.)
"""
from __future__ import annotations

import tvm
from tvm import tirx

from ...te_conv import STRIDED_LANES_MAX_STRIDE

#: Strides rewritten (a stride of s reads ceil((s * (L - 1) + 1) / L) vectors, about s of them, for L lanes): those
#: `te_conv` counts on for its strided depthwise convs (`te_conv.STRIDED_LANES`).
MAX_STRIDE = STRIDED_LANES_MAX_STRIDE


def _const(e) -> int | None:
    return int(e.value) if isinstance(e, tirx.IntImm) else None


def _rewrite(load, mutator):
    load = mutator.default_mutate(load)
    if len(load.indices) != 1 or not isinstance(load.indices[0], tirx.Ramp):
        return load
    ramp = load.indices[0]
    stride, lanes = _const(ramp.stride), _const(ramp.lanes)
    if stride is None or lanes is None or not 2 <= stride <= MAX_STRIDE or lanes < 2:
        return load
    if not str(load.source.dtype).startswith("float"):
        return load
    span = stride * (lanes - 1) + 1
    count = -(-span // lanes)
    starts = [min(j * lanes, span - lanes) for j in range(count)]
    index_dtype = str(ramp.base.ty)
    one = tirx.IntImm(str(index_dtype), 1)
    vectors = [tirx.BufferLoad(load.source, [tirx.Ramp(ramp.base + tirx.IntImm(str(index_dtype), s) if s else
                                                      ramp.base, one, lanes)]) for s in starts]
    picks = []
    for i in range(lanes):
        offset = i * stride
        j = max(k for k, s in enumerate(starts) if s <= offset)
        picks.append(tirx.IntImm("int32", j * lanes + offset - starts[j]))
    return tirx.Shuffle(vectors, picks)


def rewrite_strided_loads(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with each float load of a constant lane stride 2..MAX_STRIDE written as contiguous loads and a shuffle."""
    import tvm_ffi
    load_type = type(tirx.BufferLoad(tirx.decl_buffer((1,), "float32"), [tirx.IntImm("int64", 0)]))
    return func.with_body(tvm_ffi.structural_mutate(func.body, (load_type, _rewrite)))


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="dyntvm.StridedLoadsAsShuffles")
def strided_loads_pass(func, _mod, _ctx):
    """`rewrite_strided_loads` on every PrimFunc of the module."""
    return rewrite_strided_loads(func)
