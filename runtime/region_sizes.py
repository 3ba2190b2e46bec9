"""Sizes a compiled region cannot hold, refused before it runs.

Tracing refuses a tensor whose static size exceeds this machine's memory (`ir.types.check_tensor_size`), but a
region's symbolic sizes are known only when it runs: an ONNX Resize by a scale of 1e9 on a symbolic axis makes
values of ``1000000000 * H`` rows. TVM would allocate them one by one; each alone may be under the machine's
memory (so the allocation succeeds) and filling them gets the process killed by the kernel's OOM killer, with no
error at all. So before a region runs, the element counts of its values that its inputs do not already hold are
evaluated at the input sizes, and one over `memory_limit()` raises MemoryError (the executor reports it as an
ExecutionError naming the region's largest value). The counts are evaluated again only when the input shapes
change: a call at the sizes of the last one pays one tuple comparison.

A value provably no larger than the region's inputs together plus `SLACK_BYTES` (``concat([tokens, t])`` in a
loop that grows a sequence, a slice, an elementwise result) needs no check: its inputs already exist, so it
amplifies nothing. Such a loop body, whose input sizes change at every step, then has no guard at all."""
from __future__ import annotations

import numpy as np

from ..ir.dims import DimVisitor
from ..ir.graph import Node
from ..ir.region_counts import amplified_counts
from ..ir.types import TensorType, format_bytes, is_symbol, memory_limit
from .control_flow import bind_symbols


def size_guard(region: Node):
    """``check(args)`` raising MemoryError where one of `region`'s values would not fit in memory at the sizes of
    `args` (its inputs, with ``.shape``); None where every size the region makes is static or an input's."""
    counts = amplified_counts(region)
    if not counts:
        return None
    inputs = [v.type for v in region.subgraphs[0].inputs]
    fast = _compiled_counts(inputs, counts)
    if fast is not None:
        return _fast_check(region, fast, counts)
    last = [None]

    def check(args) -> None:
        shapes = tuple(tuple(a.shape) for a in args)
        if shapes == last[0]:
            return
        env: dict = {}
        for t, shape in zip(inputs, shapes):
            if isinstance(t, TensorType):
                bind_symbols(t, shape, env)
        limit = memory_limit()
        for n, size, t in counts:
            try:
                elements = n.evaluate(env)
            except (KeyError, ValueError, ZeroDivisionError):
                continue                # a size known only inside the region: TVM's own checks
            if elements * size > limit:
                raise _too_large(region, t, elements, size, limit)
        last[0] = shapes
    return check


def _too_large(region: Node, t, elements: int, size: int, limit: int) -> MemoryError:
    return MemoryError(f"{region.attrs.name} would make a {t.dtype} value of {elements} elements "
                       f"({format_bytes(elements * size)}), more than this machine's memory "
                       f"({format_bytes(limit)}); nothing was allocated")


class _PyDim(DimVisitor):
    """A parsed dim as Python source over local names (`names`: symbol -> name); constants are ints, so nothing
    of a model's own text (its dim names) reaches the source."""

    def __init__(self, names: dict):
        self.names = names

    def visit_Const(self, e):
        return repr(int(e.value))

    def visit_Sym(self, e):
        return self.names[e.name]

    def visit_BinOp(self, e):
        return f"({self.visit(e.left)} {e.op} {self.visit(e.right)})"

    def visit_Call(self, e):
        return f"{e.fn}({', '.join(self.visit(a) for a in e.args)})"

    def visit_Neg(self, e):
        return f"(-{self.visit(e.operand)})"


def _compiled_counts(inputs: list, counts: list):
    """Where every symbol of the counts is a plain dim of an input: ``(positions, fn)`` - the (input, axis) each
    symbol is read from, and one Python function of those sizes returning every count in bytes. A region run at
    every step of a loop whose sizes change (a growing carry) then pays a few attribute reads and one call, not
    a dim evaluation per count. None where some count needs more (an expression dim of an input)."""
    where: dict = {}
    for k, t in enumerate(inputs):
        if isinstance(t, TensorType):
            for ax, d in enumerate(t.shape):
                if is_symbol(d) and d not in where:
                    where[d] = (k, ax)
    if not all(n.free_symbols() <= set(where) for n, _, _ in counts):
        return None
    names = {sym: f"v{i}" for i, sym in enumerate(where)}
    to_py = _PyDim(names)
    body = ", ".join(f"{to_py.visit(n)} * {int(size)}" for n, size, _ in counts)
    scope = {"min": min, "max": max, "__builtins__": {}}
    try:
        exec(f"def counts({', '.join(names.values())}):\n    return ({body},)\n", scope)  # noqa: S102 - our source
    except (SyntaxError, RecursionError, MemoryError):     # nested past Python's parser: the general check
        return None
    return list(where.values()), scope["counts"]


def _fast_check(region: Node, fast, counts: list):
    positions, fn = fast
    last = [None]

    def check(args) -> None:
        sizes = tuple([args[k].shape[ax] for k, ax in positions])
        if sizes == last[0]:
            return
        try:
            nbytes = fn(*sizes)
        except ZeroDivisionError:
            return                      # a size known only inside the region: TVM's own checks
        limit = memory_limit()
        for b, (_, size, t) in zip(nbytes, counts):
            if b > limit:
                raise _too_large(region, t, b // size, size, limit)
        last[0] = sizes
    return check
