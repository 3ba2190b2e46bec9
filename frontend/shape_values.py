"""Known values of small integer tensors while tracing: the entries of shape vectors and sizes.

A traced integer tensor of rank 0 or 1 and static length may have a *known value*: a tuple with one entry per
element (in order), each an int, a symbolic dim string (``"N"``, ``"(N * 2)"``: the value it has at run time) or
None (not known while tracing). ``F.shape_of(x)`` is known to be x's shape; constants are known; and the ops
that move shape entries around keep what is known (`RULES`): take / slice / concat / stack / expand_dims /
squeeze / reshape of such vectors, casts to an integer dtype, elementwise + - * // % and maximum / minimum, sum /
prod over the vector, and comparisons and `where` where the entries' bounds decide them (a size is never -1: the
exporters' ``Where(Equal(shape, -1), 1, shape)``). The `Builder` calls `propagate` for every node it records and keeps the
known values of its values (`Builder.known`); `frontend/shape_rewrites.py` reads them where an op takes a shape,
a size or an index from a tensor, so ``F.zeros(F.shape_of(x))`` has x's dims and ``F.arange(F.shape_of(x)[0])``
is ``[N]``. The ONNX importer traces through the same builder, so its ``Shape -> Gather -> Concat -> Reshape``
chains keep the model's symbols too.

The entries are exact: a known value is what the tensor holds at run time, whatever the sizes. Integer entries
that would overflow the tensor's dtype (numpy wraps them) become None.
"""
from __future__ import annotations

import operator

import numpy as np

from ..ir.ops import Group, get_op, ops_in
from ..ir.types import TensorType, as_shape_dim, dim_bounds, dim_max, dim_min

MAX_ENTRIES = 64            # longer integer vectors are data, not shapes: not tracked


def trackable(t: TensorType) -> bool:
    """Whether a value of type `t` can have a known value: integer (or bool: comparisons of entries, as the
    exporters' ``Where(Equal(shape, -1), ...)``), rank 0 or 1 of a static, small length."""
    if not isinstance(t, TensorType) or np.dtype(t.dtype).kind not in "iub" or t.ndim > 1:     # (a list: no)
        return False
    return t.ndim == 0 or isinstance(t.shape[0], int) and t.shape[0] <= MAX_ENTRIES


def propagate(known: dict, node) -> None:
    """Record in `known` (Value -> entries) the known value of `node`'s output from those of its inputs."""
    rule = RULES.get(node.op)
    if rule is None or len(node.outputs) != 1 or not trackable(node.outputs[0].type):
        return
    out = node.outputs[0].type
    try:
        entries = rule(node, [known.get(v) for v in node.inputs])
    except (ValueError, TypeError, IndexError, ZeroDivisionError, OverflowError):
        return                  # a form the rule does not follow (the op's own checks report real errors)
    if entries is None:
        return
    entries = tuple(_fits(e, out.dtype) for e in entries)
    if len(entries) == (out.shape[0] if out.ndim else 1) and (not entries or any(e is not None for e in entries)):
        known[node.outputs[0]] = entries


def as_dim(entry):
    """A known entry as a dim of a shape: an int >= 0, or a symbolic dim that cannot be negative; else None (a
    negative int, an expression such as ``(N - 1)`` that is negative for some sizes, or not known)."""
    if isinstance(entry, (int, np.integer)) and not isinstance(entry, (bool, np.bool_)):
        return int(entry) if entry >= 0 else None
    if isinstance(entry, str) and dim_bounds(entry)[0] >= 0:
        return entry
    return None


def ints_of(entries) -> list | None:
    """The entries as ints where every one is an int, else None."""
    if entries is None or not all(isinstance(e, int) and not isinstance(e, bool) for e in entries):
        return None
    return list(entries)


def _fits(e, dtype):
    """Entry `e` of a tensor of `dtype`: bools as bools, ints that fit the dtype as ints, symbolic dims as they are
    in 32- and 64-bit integers (the dtypes models keep sizes in)."""
    if np.dtype(dtype).kind == "b":
        return bool(e) if isinstance(e, (bool, np.bool_)) else None
    if isinstance(e, (int, np.integer, bool, np.bool_)):
        info = np.iinfo(dtype)
        return int(e) if info.min <= e <= info.max else None
    return e if isinstance(e, str) and np.dtype(dtype).itemsize >= 4 else None      # (int8 sizes wrap)


def _length(t: TensorType):
    return 1 if t.ndim == 0 else t.shape[0]


def _of(node, ins, k: int) -> list:
    """Input k's entries, a None per element where it has no known value."""
    got = ins[k]
    return list(got) if got is not None else [None] * _length(node.inputs[k].type)


# ------------------------------------------------------------------------------------------ rules
RULES: dict = {}


def rule(*ops):
    def deco(fn):
        for op in ops:
            RULES[op] = fn
        return fn
    return deco


@rule("constant")
def _constant(node, ins):
    return np.asarray(node.attrs.value).reshape(-1).tolist()


@rule("shape_of")
def _shape_of(node, ins):
    return list(node.inputs[0].type.shape)


@rule("cast")
def _cast(node, ins):
    return ins[0]               # an integer input to an integer dtype (`_fits` drops what overflows it)


@rule("take")
def _take(node, ins):
    data, idx = ins
    if data is None or node.inputs[0].type.ndim != 1:
        return None
    n = len(data)
    picked = []
    for i in _of(node, ins, 1):
        if not isinstance(i, int) or not -n <= i < n:
            return None
        picked.append(data[i])
    return picked


def _sliced(entries, starts, stops, steps, axes):
    if entries is None or len(axes) > 1 or any(ax not in (0, -1) for ax in axes):
        return None
    return entries[slice(starts[0], stops[0], steps[0])] if axes else entries


@rule("slice")
def _slice(node, ins):
    a = node.attrs
    return _sliced(ins[0], a.starts, a.stops, a.steps, a.axes)


@rule("slice_dyn")
def _slice_dyn(node, ins):
    bounds = [ins[k] for k in (1, 2, 3)]
    if not all(b is not None and all(isinstance(e, int) for e in b) for b in bounds):
        return None
    return _sliced(ins[0], *bounds, node.attrs.axis)


@rule("squeeze", "expand_dims", "reshape", "reshape_dyn")
def _same_entries(node, ins):
    return ins[0]               # rank 0 <-> 1 of the same elements, in order


@rule("concat")
def _concat(node, ins):
    return [e for k in range(len(ins)) for e in _of(node, ins, k)]


@rule("stack")
def _stack(node, ins):
    if any(v.type.ndim != 0 for v in node.inputs):
        return None
    return [_of(node, ins, k)[0] for k in range(len(ins))]


def _arith(op: str):
    """(function on ints, function on dims) of an ARITH op, or None for one a shape entry does not go through:
    Python's operator (numpy's integer semantics, without wrapping) and `SymDim`'s, which builds the dim
    expression; maximum / minimum from the dim algebra."""
    if op in ("maximum", "minimum"):
        return (max, dim_max) if op == "maximum" else (min, dim_min)
    sym = get_op(op).operator
    if sym not in ("add", "sub", "mul", "floordiv", "mod"):
        return None
    fn = getattr(operator, sym)

    def on_dims(a, b):
        if sym in ("floordiv", "mod") and not (isinstance(b, int) and b > 0):
            raise ValueError("a dim expression divides by a positive constant only")
        return _stored(fn(as_shape_dim(a), as_shape_dim(b)))
    return fn, on_dims


def _stored(d):
    return d if isinstance(d, int) else str(d)


_BINARY = {op: fns for op in ops_in(Group.ARITH) if (fns := _arith(op)) is not None}


def _combine(op: str, a, b):
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return None
    on_ints, on_dims = _BINARY[op]
    if isinstance(a, int) and isinstance(b, int):
        if get_op(op).operator in ("floordiv", "mod") and b == 0:
            return None         # numpy gives 0 (with a warning): not a shape anyone means
        return on_ints(a, b)
    try:
        return on_dims(a, b)
    except ValueError:
        return None


@rule(*_BINARY)
def _binary(node, ins):
    ab = _pairs(node, ins)
    return None if ab is None else [_combine(node.op, x, y) for x, y in zip(*ab)]


_REDUCE = {"sum": "add", "prod": "multiply"}        # (Size of a shape vector; its sum)


@rule(*_REDUCE)
def _reduce(node, ins):
    if ins[0] is None or node.inputs[0].type.ndim != 1 or not ins[0]:
        return None
    out = ins[0][0]
    for e in ins[0][1:]:
        out = _combine(_REDUCE[node.op], out, e)
    return [out]


@rule("full")
def _full(node, ins):
    a = node.attrs
    n = 1 if not a.shape else a.shape[0]
    fill = a.fill_value
    return [int(fill)] * n if isinstance(fill, (int, np.integer)) and not isinstance(fill, bool) else None


@rule("arange")
def _arange(node, ins):
    a = node.attrs
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (a.start, a.stop, a.step)):
        return None
    return list(range(a.start, a.stop, a.step))


def _decide(op: str, a, b):
    """`a op b` of two entries where their bounds decide it (a symbolic dim is never -1), else None: the
    orderings of a and b their bounds allow, each tried on a pair of ints with that ordering."""
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return None
    (lo_a, hi_a), (lo_b, hi_b) = dim_bounds(a), dim_bounds(b)
    orders = {o for o, possible in ((-1, lo_a < hi_b), (0, a == b or not (hi_a < lo_b or lo_a > hi_b)),
                                    (1, hi_a > lo_b)) if possible}
    if a == b:
        orders = {0}
    outcomes = {bool(getattr(np, op)(*pair)) for pair in ({-1: (0, 1), 0: (0, 0), 1: (1, 0)}[o] for o in orders)}
    return outcomes.pop() if len(outcomes) == 1 else None


def _pairs(node, ins, k0: int = 0):
    """The entries of inputs k0 and k0 + 1, broadcast to one length (None where the lengths do not broadcast)."""
    a, b = _of(node, ins, k0), _of(node, ins, k0 + 1)
    n = max(len(a), len(b))
    if min(len(a), len(b)) not in (1, n):
        return None
    return (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)


@rule(*ops_in(Group.COMPARE))
def _compare(node, ins):
    ab = _pairs(node, ins)
    return None if ab is None else [_decide(node.op, x, y) for x, y in zip(*ab)]


@rule("where")
def _where(node, ins):
    cond = _of(node, ins, 0)
    xy = _pairs(node, ins, 1)
    if xy is None:
        return None
    n = max(len(cond), len(xy[0]))
    if len(cond) not in (1, n) or len(xy[0]) not in (1, n):
        return None
    cond, xs, ys = (cond * n if len(cond) == 1 else cond), (xy[0] * n if len(xy[0]) == 1 else xy[0]), \
        (xy[1] * n if len(xy[1]) == 1 else xy[1])
    return [None if c is None else x if c else y for c, x, y in zip(cond, xs, ys)]


def describe(entries) -> str:
    """A known value for messages: ``[N, 3, ?]``."""
    return "[" + ", ".join("?" if e is None else str(e) for e in entries) + "]"


def known_of(t):
    """The known entries of traced tensor `t` (a `Tensor`), or None."""
    return t.builder.known.get(t.value)


def known_array(t) -> np.ndarray | None:
    """Traced tensor `t` as a numpy array where every entry is a known int (or bool), else None."""
    entries = known_of(t)
    if entries is None or not all(isinstance(e, (int, bool)) for e in entries):
        return None
    return np.asarray(entries, dtype=t.value.type.dtype).reshape(t.value.type.shape)
