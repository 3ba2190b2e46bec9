"""The converter registry: `CONVERTERS[op]` and the `converter` decorator that fills it."""
from __future__ import annotations

CONVERTERS: dict = {}

#: Known, documented differences between compiled code and the numpy reference (all in cases
#: where numpy raises, or in NaN/inf corner cases). Where numpy raises on values (a take index out
#: of range, argmax/argmin/max/min of an empty axis, an integer to a negative power) compiled code raises
#: too: a run-time check (`te_kernels.take_index_primfunc` and the like).
UNSUPPORTED_EXACTNESS = {
    "topk": "NaN sorts last like numpy, but a NaN and a real -inf (largest=True) / +inf "
            "(largest=False) tie by index instead of the NaN going last; k larger than a "
            "symbolic axis (numpy raises) gives indices >= the axis length for the missing "
            "entries (never an out-of-bounds read).",
    "cast": "float -> int of NaN/inf/out-of-range values follows x86 C casts (like numpy on "
            "x86) only for the low bits; unspecified in general (numpy: platform-dependent).",
    "reshape": "a -1 next to symbolic dims that are 0 at run time (numpy raises 'ambiguous') "
               "gives 0 for the -1.",
    "bool ops": "neg / subtract / sign of bools (numpy raises) give logical_not / xor / x.",
    "broadcast": "shapes that numpy refuses to broadcast, but whose mismatch only shows at run "
                 "time, either raise (match_cast) or read clamped indices; never out of bounds.",
    "float sums": "reductions accumulate in order in the input dtype; numpy sums pairwise, so "
                  "float32 sum/mean/layer_norm/softmax/matmul differ by rounding (~n * 1e-7 "
                  "relative; float16 within 1 ulp at small n).",
}


def converter(*names):
    """Register the decorated function as the converter of ops `names` (each at most once)."""
    def deco(fn):
        for n in names:
            if n in CONVERTERS:
                raise ValueError(f"converter for {n!r} registered twice")
            CONVERTERS[n] = fn
        return fn
    return deco
