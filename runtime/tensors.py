"""Crossing between numpy and TVM tensors without copies where possible.

TVM's `from_dlpack` insists on 64-byte aligned data (and compiled kernels may assume it), while
numpy only guarantees 16. Arrays that are already aligned and contiguous cross zero-copy; others are
copied once into an aligned buffer. TVM -> numpy is always zero-copy (`np.from_dlpack`).
"""
from __future__ import annotations

import math
import sys

import numpy as np
import tvm
import tvm_ffi

ALIGN = 64
_TvmTensor = tvm.runtime.Tensor
_from_dlpack = tvm.runtime.from_dlpack
_ffi_from_dlpack = tvm_ffi.from_dlpack


def aligned_empty(shape, dtype) -> np.ndarray:
    """A C-contiguous numpy array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    off = (-_address(buf)) % ALIGN
    return buf[off:off + nbytes].view(dtype).reshape(shape)


def _address(a: np.ndarray) -> int:
    """The data pointer of a non-empty contiguous array, read from a DLPack view: 0.4 us where numpy's
    `ctypes.data` costs 1.4 us."""
    return _ffi_from_dlpack(a, require_alignment=0, require_contiguous=True).data_ptr()


def to_tvm(x):
    """A TVM tensor for `x` (numpy array or TVM tensor); zero-copy when `x` is aligned."""
    if type(x) is _TvmTensor:
        return x
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if x.size == 0:
        return tvm.runtime.empty(x.shape, x.dtype.name)
    if x.flags.c_contiguous and x.flags.writeable:
        # (TVM's own alignment check raises on a misaligned array: an exception costs 19 us)
        t = _ffi_from_dlpack(x, require_alignment=0, require_contiguous=True)
        if not t.data_ptr() % ALIGN:
            return t
    buf = aligned_empty(x.shape, x.dtype)
    np.copyto(buf, x)
    return _from_dlpack(buf)


class InputStaging:
    """Aligned buffers kept from one call to the next for the inputs that `to_tvm` would copy (numpy's arrays are
    often only 16-byte aligned): a fresh buffer per call cost twice the copy itself (detection N=200: ~10 us per
    call more than copying into a kept one). One per thread (a VM program's runner). A buffer still referenced
    after the call (an output that is an input, or a view of one) is left to its holder: the next call makes a
    new one (`release`). `element_aligned`: the kernels assume only element alignment (a library with
    `ir.vm_program.ELEMENT_ALIGNED_FUNCTION`): a contiguous, aligned, writeable numpy input is passed as it is
    (the FFI takes it by DLPack), never copied."""

    __slots__ = ("bufs", "unshared", "element_aligned", "copies")

    def __init__(self, n: int, element_aligned: bool = False):
        self.bufs: list = [None] * n
        self.unshared: list = [0] * n    # `sys.getrefcount(bufs[k])` while nothing but the list holds it
        self.element_aligned = element_aligned
        self.copies = 0                  # inputs copied into a kept buffer (tests)

    def tensors(self, arrays) -> list:
        """TVM tensors (or numpy arrays the FFI passes as they are) of `arrays`: zero-copy where the kernels
        accept the data's alignment, else copied into this slot's buffer."""
        out = []
        bufs = self.bufs
        element_aligned = self.element_aligned
        for k, x in enumerate(arrays):
            if type(x) is not np.ndarray or not x.size:
                out.append(to_tvm(x))
                continue
            flags = x.flags                  # (one flags object: each `x.flags` makes a new one)
            if flags.c_contiguous and flags.writeable:
                if element_aligned and flags.aligned:
                    out.append(x)            # (~0.3 us in the FFI's C code, `from_dlpack` here ~0.5 us)
                    continue
                t = _ffi_from_dlpack(x, require_alignment=0, require_contiguous=True)
                if not t.data_ptr() % ALIGN:
                    out.append(t)
                    continue
            buf = bufs[k]
            if buf is None or buf.shape != x.shape or buf.dtype != x.dtype:
                bufs[k] = aligned_empty(x.shape, x.dtype)
                self.unshared[k] = _getrefcount(bufs[k])     # (measured: interpreters count differently)
                buf = bufs[k]
            buf[...] = x                     # (same shape and dtype: half the time of `np.copyto`'s argument parsing)
            self.copies += 1
            out.append(_ffi_from_dlpack(buf, require_alignment=ALIGN, require_contiguous=True))
        return out

    def release(self) -> None:
        """After a call, once its input tensors are gone: forget the buffers something still references."""
        bufs, unshared = self.bufs, self.unshared
        for k in range(len(bufs)):
            if bufs[k] is not None and _getrefcount(bufs[k]) > unshared[k]:
                bufs[k] = None

    def clear(self) -> None:
        self.bufs = [None] * len(self.bufs)


_getrefcount = sys.getrefcount


def to_numpy(x) -> np.ndarray:
    """A numpy view of a TVM tensor (zero-copy), or `x` itself if it is already numpy."""
    if type(x) is _TvmTensor:
        return np.from_dlpack(x)
    return np.asarray(x)


def first_truth(res: list) -> bool:
    """A predicate subgraph's result (a one-value list) as a bool."""
    return bool(to_numpy(res[0]))


def host_array(x) -> np.ndarray:
    """`x` as numpy wherever it lives (a copy for a device tensor): for error paths and validation."""
    if type(x) is _TvmTensor and x.device.dlpack_device_type() != 1:       # kDLCPU
        return x.numpy()
    return to_numpy(x)


def is_tvm(x) -> bool:
    return type(x) is _TvmTensor


def aligned_rows(a: np.ndarray) -> list:
    """The rows `a[0], a[1], ...` as writeable, contiguous arrays that each start on a 64-byte boundary: one
    bulk copy into a buffer with padded rows when the row size is not a multiple of 64 bytes (or `a` is not
    writeable: DLPack cannot export it), else plain views."""
    a = np.asarray(a)
    row_shape = a.shape[1:]
    row_bytes = math.prod(row_shape) * a.itemsize
    if row_bytes % ALIGN == 0 and a.flags.c_contiguous and a.flags.writeable and a.size and not _address(a) % ALIGN:
        return list(a)
    if row_bytes == 0:
        return [a[t] for t in range(a.shape[0])]
    stride = -(-row_bytes // ALIGN) * ALIGN // a.itemsize
    buf = aligned_empty((a.shape[0], stride), a.dtype)
    n = math.prod(row_shape)
    buf[:, :n] = a.reshape(a.shape[0], n)
    return [buf[t, :n].reshape(row_shape) for t in range(a.shape[0])]
