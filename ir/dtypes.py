"""Result-dtype rules (numpy's): what dtype an op computes in and returns, given its input dtypes."""
from __future__ import annotations

import numpy as np


def is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f"


def float_dtype(dts, a=None) -> str:
    """Float ops keep a float dtype; other inputs compute in float32."""
    return dts[0] if is_float(dts[0]) else "float32"


def arith_dtype(name):
    def rule(dts, a=None) -> str:
        dt = np.result_type(*(np.dtype(d) for d in dts))
        if name == "divide" and not np.issubdtype(dt, np.floating):
            dt = np.dtype("float64")
        if dt == np.bool_ and name != "subtract" and "??->?" not in getattr(np, name).types:
            dt = np.dtype("int8")       # numpy has no bool loop (power, fmod, floor_divide, mod): its int8 one
        return dt.name
    return rule


def reduce_dtype(name):
    """numpy's accumulator: sum/prod of small ints and bools in (u)int64, the mean of ints in float64."""
    def rule(dts, a=None) -> str:
        dt = np.dtype(dts[0])
        if name == "mean" and dt.kind not in "fc":
            return "float64"
        if name in ("sum", "prod") and (dt.kind == "b" or (dt.kind in "iu" and dt.itemsize < 8)):
            return "int64" if dt.kind in "bi" else "uint64"
        return dt.name
    return rule
