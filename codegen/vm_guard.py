"""A region's size check in the VM program without Python on the common path (`vm_program.py`).

The runtime's check (`runtime/region_sizes.py`, called back as `GUARD_CALLBACK`) compares each value a region
could amplify (`ir.region_counts.amplified_counts`) with this machine's memory. A Python callback per region call
cost more than the region itself on small models (branchy: two per call). Here the program first evaluates the
same byte counts at the inputs' sizes, in float64 (no int64 overflow: a count of ``1000000000 * H`` rows stays
large, a division by zero gives inf or NaN), and calls the runtime's check only where one of them is not
provably at most `NATIVE_GUARD_BYTES`, a size every machine that runs a model holds. The exact check (and its
MemoryError naming the value) is then still the runtime's.
"""
from __future__ import annotations

from tvm import tirx

from ..ir.graph import Node
from ..ir.region_counts import amplified_counts
from ..ir.types import TensorType, is_symbol
from ..ir.vm_program import NATIVE_GUARD_BYTES      # byte counts up to it skip the runtime's check

_F64 = "float64"


def _f64(v) -> tirx.PrimExpr:
    return tirx.FloatImm(_F64, float(v))


def _floordiv(a, b):
    return tirx.floor(a / b)


_BINOPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": _floordiv,
           "%": lambda a, b: a - _floordiv(a, b) * b}


def _to_float(dim, syms: dict):
    """A parsed dim as a float64 PrimExpr over `syms` (symbol -> int64 var)."""
    def call(fn, args):
        f = tirx.min if fn == "min" else tirx.max
        out = args[0]
        for a in args[1:]:
            out = f(out, a)
        return out
    return dim.fold(_f64, lambda s: tirx.Cast(_F64, syms[s]), lambda op, a, b: _BINOPS[op](a, b), call,
                    lambda a: -a)


def guard_symbols(region: Node) -> dict | None:
    """``{symbol: (input position, axis)}`` for the symbols of `region`'s counts, each read from a plain dim of
    one of its inputs; None where some count needs more (then the program always calls the runtime's check)."""
    where: dict = {}
    for k, v in enumerate(region.subgraphs[0].inputs):
        if isinstance(v.type, TensorType):
            for ax, d in enumerate(v.type.shape):
                if is_symbol(d) and d not in where:
                    where[d] = (k, ax)
    if not all(n.free_symbols() <= set(where) for n, _, _ in amplified_counts(region)):
        return None
    return where


def guard_needed(region: Node, syms: dict) -> tirx.PrimExpr:
    """A bool PrimExpr over `syms` (symbol -> int64 var of an input dim): true where one of `region`'s counts,
    in bytes, is not provably within `NATIVE_GUARD_BYTES` (NaN included)."""
    limit = _f64(NATIVE_GUARD_BYTES)
    test = None
    for n, size, _ in amplified_counts(region):
        over = tirx.Not(_to_float(n, syms) * _f64(size) <= limit)
        test = over if test is None else tirx.Or(test, over)
    return test
