"""Tensor types and symbolic dimensions.

A dim is an ``int``, a symbol name (``"T"``), or an expression string over symbols (``"(T + S)"``).
Symbols created by dynamic-shape ops are *unknown* dims, named with a leading underscore (``"_u3"``).
Strings keep types hashable, printable and JSON-friendly. Every stored dim is in the canonical form of
`ir.dim_algebra` (equal expressions are equal strings); `dim_add` and friends build canonical results, and the
structure of a string is read only through `ir.dims.parse_dim`.
"""
from __future__ import annotations

import functools
import itertools
import linecache
import math
import os
import sys
from dataclasses import dataclass
from typing import Union

import numpy as np

from .dim_algebra import (canonical_dim, dim_binop, dim_bounds, dim_compare, dim_minmax,  # noqa: F401 (re-exported)
                          dims_equal, simplify_dim)
from .dims import parse_dim

Dim = Union[int, str]

_unknown_counter = itertools.count()


_DIM_ORIGINS: dict = {}      # unknown dim -> where it comes from (see `fresh_dim`); traced graphs keep theirs


def fresh_dim(prefix: str = "_u", origin: str = "") -> str:
    """A new unknown dim (data-dependent size). `origin` says where it comes from, for messages ("rows kept
    by boolean_mask"); the tracer completes it with the op and the user's line (`set_dim_origin`)."""
    d = f"{prefix}{next(_unknown_counter)}"
    if origin:
        _DIM_ORIGINS[d] = origin
    return d


def dim_origin(d: str) -> str:
    """Where unknown dim `d` (a name `fresh_dim` made) comes from, or ""."""
    return _DIM_ORIGINS.get(d, "")


def set_dim_origin(d: str, origin: str) -> None:
    _DIM_ORIGINS[d] = origin


def is_symbol(d: Dim) -> bool:
    return isinstance(d, str) and d.isidentifier()


def is_unknown(d: Dim) -> bool:
    return isinstance(d, str) and d.startswith("_")


def check_dim(d) -> Dim:
    """`d` as stored in a type: an int >= 0, or the canonical string of a dim expression (``"N+1"`` is
    stored as ``"(N + 1)"``, ``"(H - 1) + 1"`` as ``"H"``, ``"4"`` as 4), so that equal dims compare equal
    and expressions built on top of it (`dim_mul`) keep their meaning."""
    if isinstance(d, (bool, np.bool_)):
        raise TypeError(f"a dim must be an int or a symbol name, got {d!r}")
    if isinstance(d, str):
        d = canonical_dim(d)            # ValueError for anything that is not a dim expression
    if isinstance(d, (int, np.integer)):
        if d < 0:
            raise ValueError(f"a dim must be >= 0, got {d}")
        if d > INT64_MAX:
            raise ShapeError(f"a dim must fit int64 (at most 2**63 - 1), got {d}")
        return int(d)
    if isinstance(d, str):
        return d
    raise TypeError(f"a dim must be an int or a symbol name, got {type(d).__name__} {d!r}")


def dim_add(a: Dim, b: Dim) -> Dim:
    """a + b in canonical form (`ir.dim_algebra`): ``dim_add(dim_sub("H", 1), 1)`` is ``"H"``."""
    return a + b if isinstance(a, int) and isinstance(b, int) else dim_binop("+", a, b)


def dim_sub(a: Dim, b: Dim) -> Dim:
    return a - b if isinstance(a, int) and isinstance(b, int) else dim_binop("-", a, b)


def dim_mul(a: Dim, b: Dim) -> Dim:
    return a * b if isinstance(a, int) and isinstance(b, int) else dim_binop("*", a, b)


def dim_floordiv(a: Dim, b: Dim) -> Dim:
    return a // b if isinstance(a, int) and isinstance(b, int) else dim_binop("//", a, b)


def dim_mod(a: Dim, b: Dim) -> Dim:
    return a % b if isinstance(a, int) and isinstance(b, int) else dim_binop("%", a, b)


def dim_min(a: Dim, b: Dim) -> Dim:
    """min(a, b) in canonical form: ``min(N, 0)`` is 0, ``min(N, N + 2)`` is N."""
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else dim_minmax("min", a, b)


def dim_max(a: Dim, b: Dim) -> Dim:
    """max(a, b) in canonical form: ``max(N, 0)`` is N."""
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else dim_minmax("max", a, b)


def dim_prod(dims) -> Dim:
    out: Dim = 1
    for d in dims:
        out = dim_mul(out, d)
    return out


def dim_symbols(d: Dim) -> frozenset:
    """Symbol names a dim refers to."""
    return frozenset() if isinstance(d, int) else parse_dim(d).symbols


def eval_dim(d: Dim, env: dict[str, int]) -> int:
    """Value of a dim given symbol values, or values of whole expression dims (``env["min(N, 2)"]``) where
    the symbols are not known (KeyError for a missing symbol)."""
    if isinstance(d, int):
        return d
    if d in env:
        return env[d]
    return int(parse_dim(d).evaluate(env))


class ShapeError(ValueError):
    """An op's inputs or attrs (or a type) do not fit its rule."""


INT64_MAX = 2 ** 63 - 1


@functools.cache
def memory_limit() -> int:
    """The most bytes one tensor of a static size may take: this machine's physical memory. A larger one can
    never be allocated, and folding or running it only exhausts the machine (a 181-byte ONNX file asking for a
    4 TiB ConstantOfShape took 11 GB before it aborted)."""
    try:        # POSIX, no dependency: the runtime-only bundle (`dyntvm bundle`) has no psutil
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        import psutil
        return int(psutil.virtual_memory().total)


def check_tensor_size(shape, dtype) -> None:
    """ShapeError where no tensor of `shape` and `dtype` can exist: the product of its int dims overflows int64
    (TVM's index type) or, times the item size, exceeds `memory_limit()`. Symbolic dims count as 1: a tensor
    with any elements is at least that large (one with a symbolic dim of 0 is empty, and pointless). Every
    `TensorType` goes through here, so the tracer, TensorSpec, each op's type rule and the ONNX importer refuse
    such sizes where the shape is made, before anything is allocated."""
    static = [d for d in shape if isinstance(d, int)]
    elements = math.prod(static)
    if elements == 0:
        return
    if elements > INT64_MAX:
        raise ShapeError(f"a tensor of shape {_shape_str(shape)} has {elements} elements, more than int64 "
                         f"(2**63 - 1) can count")
    nbytes = elements * _itemsize(dtype)
    if nbytes > memory_limit():
        at_least = "" if len(static) == len(shape) else " at least (with its symbolic dims 1)"
        raise ShapeError(f"a tensor of shape {_shape_str(shape)} and dtype {dtype} needs{at_least} "
                         f"{format_bytes(nbytes)}, more than this machine's memory ({format_bytes(memory_limit())})")


@functools.cache
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def _shape_str(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def format_bytes(n: int) -> str:
    """`n` bytes for a message: "4.0 TiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


#: The dtypes tensors may have (numpy names).
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64")


def normalize_dtype(dtype) -> str:
    """The numpy name of a supported tensor dtype (None: float32); ShapeError (a ValueError) otherwise."""
    if dtype is None:
        return "float32"
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ShapeError(f"unsupported dtype {dtype!r}; tensors are one of {', '.join(DTYPES)}")
    return name


_PKG_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
                  for d in ("dyntvm", "ir", "frontend", "partition", "codegen", "runtime"))


def user_line() -> str:
    """'file.py:LINE: code' of the innermost frame outside dyntvm (the user's line), as TraceErrors name it
    (the frontend's `user_source` reports it too)."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIRS):
        f = f.f_back
    if f is None:
        return ""
    fn, line = f.f_code.co_filename, f.f_lineno
    code = linecache.getline(fn, line).strip()
    return f"{os.path.basename(fn)}:{line}: {code}" if code else f"{os.path.basename(fn)}:{line}"


@dataclass(frozen=True)
class TensorType:
    """Shape and dtype of a tensor value. ``shape`` is a tuple of dims."""

    shape: tuple
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(check_dim(d) for d in self.shape))
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        check_tensor_size(self.shape, self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def symbols(self) -> set[str]:
        return set().union(*(dim_symbols(d) for d in self.shape)) if self.shape else set()

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"

    def to_json(self):
        return {"shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(obj) -> "TensorType":
        return TensorType(tuple(obj["shape"]), obj["dtype"])


def map_type_dims(t: "TensorType", fn) -> "TensorType":
    """`t` with `fn` applied to every symbolic (string) dim."""
    return TensorType(tuple(fn(d) if isinstance(d, str) else d for d in t.shape), t.dtype)


def join_dims(a: Dim, b: Dim, keep=frozenset()) -> Dim:
    """The dim of a value that is `a` on one path and `b` on another: `a` if they agree, else a fresh
    unknown dim. Dims in `keep` (unknowns made by an earlier join of the same value) stay as they are."""
    return a if a == b or a in keep or dims_equal(a, b) else fresh_dim()


def join_types(a: TensorType, b: TensorType, keep=frozenset()) -> TensorType:
    assert a.dtype == b.dtype and a.ndim == b.ndim
    return TensorType(tuple(join_dims(x, y, keep) for x, y in zip(a.shape, b.shape)), a.dtype)


def shape_matches(t: TensorType, shape: tuple, env: dict[str, int] | None = None) -> bool:
    """Whether a concrete shape fits `t`; binds symbols in `env` (unknown dims match anything), and expression
    dims that `env` cannot evaluate yet as a whole."""
    env = {} if env is None else env
    if len(shape) != t.ndim:
        return False
    for d, s in zip(t.shape, shape):
        if isinstance(d, int):
            if d != s:
                return False
        elif is_symbol(d):
            if env.setdefault(d, s) != s:
                return False
        else:
            try:
                if eval_dim(d, env) != s:
                    return False
            except KeyError:     # not known yet: remember the expression's size as a whole (see eval_dim)
                env[d] = s
    return True


def expression_dim_errors(types: list, shapes: list, env: dict) -> list:
    """Check the expression dims of input `types` against concrete `shapes`, once `env` holds the sizes of
    the plain symbols (bound from every input first). A symbol that occurs only inside expressions is solved
    for where the expression is invertible (``(T + 1)`` of size 5 gives T = 4) and bound in `env`. Returns
    ``(input index, axis, dim, size)`` of each dim that cannot hold (``(2 * N)`` of size 5, or ``(N % 3)``
    of size 1 with N = 5)."""
    pending = [(i, ax, d, s) for i, (t, shape) in enumerate(zip(types, shapes))
               for ax, (d, s) in enumerate(zip(t.shape, shape)) if isinstance(d, str) and not is_symbol(d)]
    bad: list = []
    while pending:
        left = []
        for i, ax, d, s in pending:
            e = parse_dim(d)
            unbound = [x for x in e.symbols if x not in env]
            if not unbound:
                if e.evaluate({k: v for k, v in env.items() if k.isidentifier()}) != s:
                    bad.append((i, ax, d, s))
            elif len(unbound) == 1 and not unbound[0].startswith("_"):
                v = e.solve(unbound[0], s, env)
                if v is None or v < 0:
                    bad.append((i, ax, d, s))
                else:
                    env[unbound[0]] = v
            else:
                left.append((i, ax, d, s))
        if len(left) == len(pending):
            break                       # unknown dims or several unknowns: checked where they are used
        pending = left
    return bad


class SymDim(str):
    """A symbolic dim as seen from `Tensor.shape`: a `str` whose arithmetic builds dim expressions, so
    `x.shape[0] * 2` is ``"(N * 2)"`` rather than ``"NN"``."""

    __slots__ = ()
    __array_ufunc__ = None      # numpy defers to these operators: np.int64(1) == d asks d, as 1 == d does

    def _op(self, other, fn, reflected=False):
        if type(other) is str and fn is dim_add:    # plain strings concatenate as usual ("id_" + d)
            return other + str(self) if reflected else str(self) + other
        if isinstance(other, (bool, np.bool_)) or not isinstance(other, (int, np.integer, SymDim)):
            return NotImplemented
        other = int(other) if isinstance(other, (int, np.integer)) else str(other)
        a, b = (other, str(self)) if reflected else (str(self), other)
        return as_shape_dim(fn(a, b))

    def __add__(self, o): return self._op(o, dim_add)
    def __radd__(self, o): return self._op(o, dim_add, True)
    def __sub__(self, o): return self._op(o, dim_sub)
    def __rsub__(self, o): return self._op(o, dim_sub, True)
    def __mul__(self, o): return self._op(o, dim_mul)
    def __rmul__(self, o): return self._op(o, dim_mul, True)
    def __floordiv__(self, o): return self._op(o, dim_floordiv)
    def __rfloordiv__(self, o): return self._op(o, dim_floordiv, True)
    def __mod__(self, o): return self._op(o, dim_mod)
    def __rmod__(self, o): return self._op(o, dim_mod, True)
    __hash__ = str.__hash__

    def _compare(self, other, sym, str_compare):
        if isinstance(other, (int, np.integer)) and not isinstance(other, (bool, np.bool_)):
            decided = dim_compare(str(self), sym, int(other))      # true for every size: N >= 0, min(N, 2) <= 2
            if decided is not None:
                return decided
            from dyntvm.errors import TraceError
            where = user_line()
            raise TraceError(f"{str(self)!r} {sym} {other}: a symbolic dim (from x.shape) has no value while "
                             f"tracing, so Python cannot decide the comparison; compare F.shape_of(x)[i] (an int64 "
                             f"tensor), e.g. in F.cond or F.where, or trace with a fixed size"
                             + (f"\n    at {where}" if where else ""))
        return str_compare(self, other)

    # == / != against an int answer like the orderings (a str comparison would make `x.shape[0] == 1` always
    # False, silently); against a str or SymDim they stay str's, so dims still work as dict keys and set members
    def __eq__(self, o): return self._compare(o, "==", str.__eq__)
    def __ne__(self, o): return self._compare(o, "!=", str.__ne__)
    def __lt__(self, o): return self._compare(o, "<", str.__lt__)
    def __le__(self, o): return self._compare(o, "<=", str.__le__)
    def __gt__(self, o): return self._compare(o, ">", str.__gt__)
    def __ge__(self, o): return self._compare(o, ">=", str.__ge__)


def is_static_dim(d, value: int | None = None) -> bool:
    """Whether `d` is a known int (equal to `value` where given). Internal code asks this rather than
    ``d == 1``: for a `SymDim` that asks the dim algebra, and raises where the answer depends on the sizes."""
    return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and (value is None or d == value)


def same_dim(a, b) -> bool:
    """Whether dims `a` and `b` are the same: equal ints, or the same symbolic dim (an int and a symbol never are,
    whatever sizes the symbol takes)."""
    return isinstance(a, str) == isinstance(b, str) and a == b


def as_shape_dim(d: Dim):
    """`d` as `Tensor.shape` shows it (symbolic dims as `SymDim`)."""
    return SymDim(d) if isinstance(d, str) else d
