"""Crossing between numpy and TVM tensors without copies where possible.

TVM's `from_dlpack` insists on 64-byte aligned data (and compiled kernels may assume it), while
numpy only guarantees 16. Arrays that are already aligned and contiguous cross zero-copy; others are
copied once into an aligned buffer. TVM -> numpy is always zero-copy (`np.from_dlpack`).
"""
from __future__ import annotations

import numpy as np
import tvm

ALIGN = 64
_TvmTensor = tvm.runtime.Tensor
_from_dlpack = tvm.runtime.from_dlpack


def aligned_empty(shape, dtype) -> np.ndarray:
    """A C-contiguous numpy array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    buf = np.empty(n * dtype.itemsize + ALIGN, np.uint8)
    off = (-buf.ctypes.data) % ALIGN
    return buf[off:off + n * dtype.itemsize].view(dtype).reshape(shape)


def to_tvm(x):
    """A TVM tensor for `x` (numpy array or TVM tensor); zero-copy when `x` is aligned."""
    if type(x) is _TvmTensor:
        return x
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if x.size == 0 or x.ctypes.data % ALIGN or not x.flags.c_contiguous or not x.flags.writeable:
        if x.size == 0:
            return tvm.runtime.empty(x.shape, x.dtype.name)
        buf = aligned_empty(x.shape, x.dtype)
        np.copyto(buf, x)
        x = buf
    return _from_dlpack(x)


def to_numpy(x) -> np.ndarray:
    """A numpy view of a TVM tensor (zero-copy), or `x` itself if it is already numpy."""
    if type(x) is _TvmTensor:
        return np.from_dlpack(x)
    return np.asarray(x)


def is_tvm(x) -> bool:
    return type(x) is _TvmTensor
