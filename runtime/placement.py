"""Where the executor keeps values when the kernels run on a device (a GPU): `DevicePlacement`.

On the CPU target values cross between numpy and TVM zero-copy (`tensors.py`) and nothing here is used.
On a device, every value a region produces stays a TVM tensor on the device: regions take device tensors,
loops step through device tensors (each row of a `foreach` input is a device-to-device copy into a reused
buffer; per-step
outputs are copied device-to-device into one device buffer), and only what the host must read crosses:
a loop or branch condition (one scalar), a `max_iterations` tensor, the inputs of the dynamic-shape ops
that run in numpy, and the model's outputs. Each crossing is counted (`h2d`, `d2h`), reported by
``model(..., profile=True)`` in `model.last_profile` and asserted on by tests. The same class runs on
`tvm.cpu()` too (with explicit copies): tests check the device path's results and counts without a GPU.

Device buffers the executor fills itself (inputs copied from the host, a `foreach`'s row buffer and stacked
outputs, a `while_loop`'s joined chunks) come from a pool kept per placement (one per thread's executor):
`tvm.runtime.empty` on a GPU is a cudaMalloc, and dropping the tensor a cudaFree, which waits for the whole
device - one region call from numpy measured 108 us on an H200, most of it that pair. A pooled buffer is handed
out again only when nothing else holds it: no Python reference but the pool's, and no reference on the TVM side
(a view of it, a region output that is the same tensor, a list). Kernels' own outputs come from the Relax VM's
pooled allocator already.
"""
from __future__ import annotations

import ctypes
import sys
from collections import OrderedDict

import numpy as np
import tvm

_Tensor = tvm.runtime.Tensor
POOL_BYTES = 1 << 30          # free buffers kept per placement (least recently used dropped first)
POOL_PER_SHAPE = 8            # buffers kept per shape and dtype
READS_KEPT = 8                # host copies (and gather indices) of device tensors remembered within one call
_STRONG = 0xFFFFFFFF          # tvm-ffi's object header: strong references in the low 32 bits of its first word


def _free_index(kept: list) -> int:
    """The index of a buffer in `kept` that nothing but the list holds, else -1: no Python reference but the list's
    (`_PY_REFS`, measured the same way at import: the interpreter's own count differs between versions) and no TVM
    one (a view, a VM register, an array: tvm-ffi's strong count, 1 for the one Python wrapper). The buffer is
    never bound to a local variable or passed to a Python function: a tracer or debugger that reads frames'
    locals (kept in the frame's locals dict) and a PEP 523 frame-evaluation hook (torch.compile's: CPython 3.11
    then passes arguments with a reference per call level) would otherwise count as holders."""
    for i in range(len(kept)):
        if _getrefcount(kept[i]) == _PY_REFS and _strong(kept[i].__chandle__()) == 1:
            return i
    return -1


def _strong(handle: int) -> int:
    return ctypes.c_uint64.from_address(handle).value & _STRONG


def _refs_of_a_kept_object() -> int:
    """What `_free_index` sees for an object only a list holds."""
    kept = [object()]
    for i in range(len(kept)):
        return _getrefcount(kept[i])
    return 0


_getrefcount = sys.getrefcount
_PY_REFS = _refs_of_a_kept_object()


class BufferPool:
    """Device buffers by (shape, dtype), each handed out again once nothing else holds it (see the module's
    docstring). `allocs`: buffers allocated so far (tests: a repeated call with the same sizes allocates none)."""

    def __init__(self, device, max_bytes: int | None = None, per_shape: int = POOL_PER_SHAPE):
        self.device, self.per_shape = device, per_shape
        self.max_bytes = POOL_BYTES if max_bytes is None else max_bytes      # 0: nothing kept (A/B runs)
        self.buffers: OrderedDict = OrderedDict()      # (shape, dtype) -> [tensor], least recently used first
        self.bytes = 0
        self.allocs = 0

    def empty(self, shape: tuple, dtype: str) -> _Tensor:
        key = (shape, dtype)
        kept = self.buffers.get(key)
        if kept is not None:
            self.buffers.move_to_end(key)
            i = _free_index(kept)
            if i >= 0:
                return kept[i]
        t = tvm.runtime.empty(shape, dtype, self.device)
        self.allocs += 1
        nbytes = _nbytes(shape, dtype)
        if nbytes > self.max_bytes or (kept is not None and len(kept) >= self.per_shape):
            return t                                  # not kept: freed when dropped
        self._trim(key, self.max_bytes - nbytes)
        if self.bytes + nbytes > self.max_bytes:      # this shape's own buffers fill the budget: not kept
            return t
        if kept is None:
            kept = self.buffers[key] = []
        kept.append(t)
        self.bytes += nbytes
        return t

    def _trim(self, keep, budget: int) -> None:
        """Drop the least recently used other shapes' buffers until the pool holds at most `budget` bytes (a
        buffer still in use stays alive with its holder and is freed when it drops it)."""
        while self.bytes > budget and len(self.buffers) > (keep in self.buffers):
            key = next(iter(self.buffers))
            if key == keep:
                self.buffers.move_to_end(key)
                continue
            self.bytes -= len(self.buffers.pop(key)) * _nbytes(*key)


def _recall(memo: list, x):
    """What `memo` (``[(tensor, value)]``, this call's) holds for tensor `x` itself, else None."""
    for t, v in memo:
        if t is x:
            return v
    return None


def _remember(memo: list, x, value) -> None:
    memo.append((x, value))
    if len(memo) > READS_KEPT:
        del memo[0]


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


class DevicePlacement:
    """Values on TVM device `device`; `h2d` / `d2h`: host<->device copies made so far (bytes in `*_bytes`);
    `pool`: the device buffers it fills itself."""

    def __init__(self, device):
        self.device = device
        self.h2d = self.d2h = self.h2d_bytes = self.d2h_bytes = 0
        self.pool = BufferPool(device)
        self._reads: list = []      # [(device tensor, its host copy)] of this call, for kernels that only read
        self._gathers: list = []    # [(mask tensor, its indices on the device)] of this call (boolean_mask)

    def new_call(self) -> None:
        """Forget the copies remembered for the last call (they hold its tensors, which the pool then reuses)."""
        self._reads.clear()
        self._gathers.clear()

    def read(self, x) -> np.ndarray:
        """`x` on the host for a kernel that only reads it (a dynamic-shape op): a device tensor is copied once per
        call (detection's mask feeds three boolean_masks and a nonzero: one copy, not four). The copy is
        read-only; the last `READS_KEPT` are remembered (they keep their tensors, hence those buffers, alive)."""
        if type(x) is not _Tensor:
            return np.asarray(x)
        a = _recall(self._reads, x)
        if a is None:
            a = self.to_host(x)
            a.flags.writeable = False
            _remember(self._reads, x, a)
        return a

    def gather_indices(self, mask: _Tensor, host_mask: np.ndarray) -> _Tensor:
        """The positions of `mask`'s true elements as an int64 tensor on the device, copied once per call and
        mask tensor (detection's three boolean_masks share one mask)."""
        idx = _recall(self._gathers, mask)
        if idx is None:
            idx = self.to_device(np.flatnonzero(host_mask).astype(np.int64))
            if type(mask) is _Tensor:
                _remember(self._gathers, mask, idx)
        return idx

    def on_device(self, x) -> bool:
        return type(x) is _Tensor and x.device == self.device

    def to_device(self, x) -> _Tensor:
        """`x` as a tensor on the device (a host array is copied there: counted)."""
        if type(x) is _Tensor:
            if x.device == self.device:
                return x
            x = x.numpy()
        a = np.asarray(x, order="C")        # not ascontiguousarray: it makes a 0-d array 1-d
        if not a.flags.c_contiguous:
            a = a.copy()
        t = self.pool.empty(a.shape, a.dtype.name)
        if a.size:
            t.copyfrom(a)
            self.h2d += 1
            self.h2d_bytes += a.nbytes
        return t

    def to_host(self, x) -> np.ndarray:
        """`x` as a numpy array (a device tensor is copied to the host: counted)."""
        if type(x) is not _Tensor:
            return np.asarray(x)
        if x.device.dlpack_device_type() == 1 and self.device.dlpack_device_type() != 1:    # on the host: a view
            return np.from_dlpack(x)
        out = x.numpy()
        if out.size:
            self.d2h += 1
            self.d2h_bytes += out.nbytes
        return out

    @staticmethod
    def shape_stub(x) -> np.ndarray:
        """An array with `x`'s shape and dtype and no data (zero strides): for ops that read only those."""
        if type(x) is not _Tensor:
            return np.asarray(x)
        shape = tuple(x.shape)
        return np.lib.stride_tricks.as_strided(np.zeros(1, str(x.dtype)), shape, (0,) * len(shape))

    def truth(self, x) -> bool:
        """A condition's value: one scalar to the host."""
        return bool(self.to_host(x))

    def first_truth(self, res: list) -> bool:
        return bool(self.to_host(res[0]))

    # -------------------------------------------------------------------------------- loops
    def rows(self, x):
        """Row t of device tensor `x` (axis 0), each a fresh device tensor (device-to-device copy; kernels
        may assume aligned data, which a view at an arbitrary row offset is not)."""
        return _Rows(self.to_device(x), self.pool)

    def alloc(self, shape, dtype) -> "DeviceStack":
        return DeviceStack(shape, str(dtype), self.pool)

    def stacked(self, bufs: list) -> list:
        return [b.tensor if isinstance(b, DeviceStack) else b for b in bufs]

    def stack_rows(self, rows: list, kinds: list) -> list:
        """While-loop outputs: the list of per-step device tensors of each output -> one device tensor each."""
        out = []
        for acc, (shape, dtype) in zip(rows, kinds):
            buf = DeviceStack((len(acc),) + tuple(shape), str(dtype), self.pool)
            for t, r in enumerate(acc):
                buf[t] = r
            out.append(buf.tensor)
        return out

    def join_rows(self, chunks: list) -> _Tensor:
        """The first `count` rows of each device tensor of ``[(tensor, count)]`` (a compiled while_loop's chunks),
        stacked into one device tensor by device-to-device copies (a view when there is one chunk)."""
        first = chunks[0][0]
        row_shape, dtype = tuple(first.shape)[1:], str(first.dtype)
        row_bytes = _nbytes(row_shape, dtype)
        if len(chunks) == 1:
            count = chunks[0][1]
            return first if count == first.shape[0] else first._create_view((count,) + row_shape, dtype, 0)
        out = self.pool.empty((sum(c for _, c in chunks),) + row_shape, dtype)
        done = 0
        for t, count in chunks:
            if count and row_bytes:
                t._create_view((count,) + row_shape, dtype, 0).copyto(
                    out._create_view((count,) + row_shape, dtype, done * row_bytes))
            done += count
        return out


class _Rows:
    """Rows of a device tensor, each copied into a pooled device buffer: a fresh allocation per step measured
    26 us on an H100 (cudaMalloc + cudaFree), more than the LSTM step's kernels. A buffer is taken again only
    when nothing holds it (the previous step's body may have kept its row as a state or returned it), so a
    loop alternates between two; the copy into it is ordered after the previous step's kernels on the same
    stream."""
    __slots__ = ("x", "pool", "row_shape", "row_bytes", "dtype")

    def __init__(self, x: _Tensor, pool: BufferPool):
        self.x, self.pool = x, pool
        self.row_shape = tuple(x.shape)[1:]
        self.dtype = str(x.dtype)
        self.row_bytes = _nbytes(self.row_shape, self.dtype)

    def __getitem__(self, t: int) -> _Tensor:
        row = self.pool.empty(self.row_shape, self.dtype)
        if self.row_bytes:
            row.copyfrom(self.x._create_view(self.row_shape, self.dtype, t * self.row_bytes))
        return row


class DeviceStack:
    """A device buffer of stacked rows; ``buf[t] = r`` copies device tensor `r` into row t on the device."""
    __slots__ = ("tensor", "shape", "dtype", "row_shape", "row_bytes")

    def __init__(self, shape, dtype: str, pool: BufferPool):
        self.tensor = pool.empty(tuple(shape), dtype)
        self.shape, self.dtype = tuple(shape), dtype
        self.row_shape = self.shape[1:]
        self.row_bytes = _nbytes(self.row_shape, dtype)

    def __len__(self):
        return self.shape[0]

    def __setitem__(self, t: int, r: _Tensor) -> None:
        if self.row_bytes:
            r.copyto(self.tensor._create_view(self.row_shape, self.dtype, t * self.row_bytes))
