"""The buffers of a compiled loop function (`compiled_loops.py`) and the TVMScript text that addresses and copies
them, for the loop run on the host (the CPU library's ``__loop``) and on a device (``__dloop``, see
`ir.compiled_loop`).

The generation context `_Names` says which: ``device`` None (the host loop: buffers are read and written by the
loop function itself), "cpu" (the device loop built for the CPU, which runs the device code path in tests) or
"cuda". In a device loop the host part of the function never reads or writes a buffer (on a GPU its memory is
the device's: TVM's VerifyMemory refuses such an access): kernels get addresses built with ``tvm_access_ptr``
(pointer arithmetic, no load), and every copy is a loop that on CUDA is a kernel of its own (thread-bound
loops, split off by TVM's SplitHostDevice like any scheduled kernel), on the CPU a plain loop.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

ALIGN = 64
_THREADS = 256                  # threads per block of a copy kernel on CUDA


class Decline(Exception):
    """This loop is not compiled (the message says why; the step-by-step loop runs instead)."""


class _Names:
    """TVMScript names for the symbolic dims of the body (by object identity), and the variant of the loop
    function being written (`device`: None, "cpu" or "cuda", see the module docstring)."""

    def __init__(self, device: str | None = None, steps=None):
        self.vars: list = []
        self.device = device
        self.steps = steps          # the tirx Var written "n" (the steps, or the capacity of a while_loop)

    def of(self, v) -> str:
        if self.steps is not None and v.same_as(self.steps):
            return "n"
        for k, w in enumerate(self.vars):
            if w.same_as(v):
                return f"d{k}"
        self.vars.append(v)
        return f"d{len(self.vars) - 1}"


_BIN = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//", "FloorMod": "%"}


def _expr(e, names: _Names) -> str:
    kind = type(e).__name__
    if kind == "IntImm":
        return f"T.int64({int(e.value)})"
    if kind == "Var":
        return names.of(e)
    if kind in _BIN:
        return f"({_expr(e.a, names)} {_BIN[kind]} {_expr(e.b, names)})"
    if kind in ("Min", "Max"):
        return f"T.{kind.lower()}({_expr(e.a, names)}, {_expr(e.b, names)})"
    raise Decline(f"shape expression {e} ({kind})")


def _tensor_type(ty):
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        raise Decline(f"not a tensor of known rank: {ty}")
    return list(ty.shape.values), str(ty.dtype)


def _dtype_hint(dtype: str) -> str:
    return "T.bool(False)" if dtype == "bool" else f"T.{dtype}(0)"


def _is_aligned(shape, dtype: str) -> bool:
    size = np.dtype(dtype).itemsize
    expr = tvm.tirx.const(size, "int64")
    for d in shape:
        expr = expr * d
    ana = tvm.sym.Analyzer()
    return bool(ana.can_prove(tvm.tirx.floormod(expr, ALIGN) == 0))


def _elements(shape: list, names: _Names) -> str:
    return " * ".join([_expr(d, names) for d in shape]) if shape else "T.int64(1)"


class _Loc:
    """A tensor value of the body in a buffer of the loop function: the whole buffer, or (`row`) one row of a
    stacked buffer, the row given when addressed (the step `t`, say)."""

    def __init__(self, buf: str, shape: list, dtype: str, row: bool):
        self.buf, self.shape, self.dtype, self.row = buf, shape, dtype, row

    def index(self, row, its: list, names: _Names) -> str:
        idx = ([row] if self.row else []) + its
        return ", ".join(idx) if idx else "()"

    def offset(self, row, names: _Names) -> str:
        """The flat element offset of the value in its buffer."""
        return f"({row}) * ({_elements(self.shape, names)})" if self.row else "T.int64(0)"

    def addr(self, row, names: _Names) -> str:
        if names.device is not None:        # pointer arithmetic only: the host part never touches device memory
            return (f"T.tvm_access_ptr(T.type_annotation(\"{self.dtype}\"), {self.buf}.data, "
                    f"{self.offset(row, names)}, {_elements(self.shape, names)}, 3)")
        return f"T.address_of({self.buf}[{self.index(row, ['T.int64(0)'] * len(self.shape), names)}])"

    def arg(self, row, names: _Names) -> str:
        dims = ", ".join(_expr(d, names) for d in self.shape)
        shape = f"T.tvm_stack_make_shape({dims})" if dims else "T.reinterpret(\"handle\", T.uint64(0))"
        return (f"T.tvm_stack_make_array({self.addr(row, names)}, {shape}, "
                f"T.reinterpret(\"handle\", T.uint64(0)), {len(self.shape)}, {_dtype_hint(self.dtype)}, "
                "T.int64(0))")


class _Ring(_Loc):
    """A state's values in one flat buffer of `rows` rows, each padded to a multiple of 64 bytes (kernels
    assume aligned data): row ``r % rows`` for a row expression r. Two rows (a foreach, the host while_loop):
    step t writes row t % 2 and reads the previous value in row (t + 1) % 2, the initial state starting in
    row 1. n + 1 rows (the device while_loop, whose steps after the condition failed still run): every
    step's value is kept, so the value after the last live step is still there at the end."""

    def __init__(self, buf: str, shape: list, dtype: str, names: _Names, rows=2):
        super().__init__(buf, shape, dtype, row=True)
        size = np.dtype(dtype).itemsize
        elems = tvm.tirx.const(1, "int64")
        for d in shape:
            elems = elems * d
        # elements per padded row: ceil(bytes / 64) * 64 / itemsize
        self.stride = tvm.sym.Analyzer().simplify(
            tvm.tirx.floordiv(elems * size + (ALIGN - 1), ALIGN) * (ALIGN // size))
        self.two = isinstance(rows, int) and rows == 2
        self.rows = tvm.tirx.const(rows, "int64") if isinstance(rows, int) else rows
        self.names = names

    def before(self, row: str) -> str:
        """The row before `row` (kept non-negative: row + rows - 1)."""
        return f"({row} + T.int64(1))" if self.two else f"({row} + {_expr(self.rows, self.names)} - T.int64(1))"

    def size(self):
        return tvm.sym.Analyzer().simplify(self.stride * self.rows)

    def index(self, row, its: list, names: _Names) -> str:
        flat = "T.int64(0)"
        for d, i in zip(self.shape, its):
            flat = f"({flat} * {_expr(d, names)} + {i})"
        return f"({row}) % {_expr(self.rows, names)} * {_expr(self.stride, names)} + {flat}"

    def offset(self, row, names: _Names) -> str:
        return f"({row}) % {_expr(self.rows, names)} * {_expr(self.stride, names)}"


def _element(loc: _Loc, row, its: list, names: _Names) -> str:
    return f"{loc.buf}[{loc.index(row, its, names)}]"


def _as_loc(x, row, shape) -> _Loc:
    return x if isinstance(x, _Loc) else _Loc(x, shape, "", row=row is not None)


def elementwise(shape: list, assign, names: _Names) -> list:
    """TVMScript lines running ``assign(its)`` (lines for the element at indices `its`) over `shape`: a loop
    nest in a host loop function and the device loop built for the CPU; on CUDA a kernel of flat
    threads (no launch for no elements: a host-side guard where the count is symbolic)."""
    its = [f"i{k}" for k in range(len(shape))]
    if names.device != "cuda":
        if not shape:
            return assign([])
        rng = ", ".join(_expr(x, names) for x in shape)
        return [f"for {', '.join(its)} in T.grid({rng}):"] + ["    " + ln for ln in assign(its)]
    total, count = _elements(shape, names), _constant(shape)
    if count == 0:
        return []
    threads = min(_THREADS, count or _THREADS)
    flat = f"(bx * T.int64({threads}) + tx)"
    idx, inner = [], "T.int64(1)"
    for k in reversed(range(len(shape))):        # row-major: i_k = flat // (dims after k) % dim k
        idx.insert(0, f"({flat} // {inner} % {_expr(shape[k], names)})")
        inner = f"({inner} * {_expr(shape[k], names)})"
    lines = [f"for bx in T.thread_binding(({total} + T.int64({threads - 1})) // T.int64({threads}), "
             "thread=\"blockIdx.x\"):",
             f"    for tx in T.thread_binding(T.int64({threads}), thread=\"threadIdx.x\"):",
             f"        if {flat} < {total}:"] + ["            " + ln for ln in assign(idx)]
    if count is None:
        lines = [f"if {total} > T.int64(0):"] + ["    " + ln for ln in lines]
    return lines


def _constant(shape: list):
    """The element count of `shape` when every dim is a constant, else None."""
    count = 1
    for d in shape:
        if type(d).__name__ != "IntImm":
            return None
        count *= int(d.value)
    return count


def copy_lines(dst, dst_row, src, src_row, shape: list, names: _Names) -> list:
    """TVMScript lines copying a tensor of `shape` from `src` to `dst` (each a _Loc, or the name of a buffer of
    that shape, stacked when its row is given)."""
    dst, src = _as_loc(dst, dst_row, shape), _as_loc(src, src_row, shape)
    return elementwise(shape, lambda its: [f"{_element(dst, dst_row, its, names)} = "
                                           f"{_element(src, src_row, its, names)}"], names)


def select_copy_lines(dst, count: str, first, first_row, rows, rows_row, shape: list, names: _Names) -> list:
    """Like `copy_lines` into `dst` (whole), from `first` when ``count == 0``, else from `rows` (its row
    `rows_row`): the final state of a loop. `count` may be read on the device (``ctl[0]``)."""
    dst = _as_loc(dst, None, shape)
    first, rows = _as_loc(first, first_row, shape), _as_loc(rows, rows_row, shape)
    return elementwise(shape, lambda its: [
        f"if {count} == T.int64(0):",
        f"    {_element(dst, None, its, names)} = {_element(first, first_row, its, names)}",
        "else:", f"    {_element(dst, None, its, names)} = {_element(rows, rows_row, its, names)}"], names)
