"""Dims that must be equal but cannot be proved so while tracing: unified, and checked at run time.

Two symbolic dims that an op needs equal (broadcast, concat, matmul, `where`, a loop's carried value) may be
neither provably equal nor provably different: ``h[k, H]`` and ``score[k']`` in a beam search, where both
shrink by the same boolean mask inside a `while_loop`. Like torch.export, JAX shape polymorphism and ONNX
Runtime, such dims are *unified* (later ops see one dim: the representative, or for a broadcast, where numpy
lets either be 1, a fresh dim of the result) and a `DimCheck` is recorded on the node; the check runs once per
call of the node, at run time, before it (`runtime/dim_check_run.py`).

Two dims the user named (symbols of the inputs, ``N`` and ``M``) are a statement that they are independent:
those are still refused, with a hint to `F.assert_dims_equal` (which records the same check on purpose).

Dims also have *origins*: where an unknown dim comes from ("rows kept by boolean_mask at beam.py:12").
`fresh_dim(origin=...)` records them (ir/types.py); `describe_dim` is the one way errors name a dim.
"""
from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass

from .dim_algebra import dims_equal
from .dims import Sym, parse_dim
from .types import Dim, ShapeError, check_dim, dim_origin, fresh_dim, is_unknown

__all__ = ["DimCheck", "dims_equal", "equate_dims", "broadcast_to_own_symbol", "recording_checks", "describe_dim", "undecided_fix", "state_equal",
           "undeclared_symbols", "name_internal_dims"]


@dataclass(frozen=True)
class DimCheck:
    """At run time `other` must equal `kept` (the dim later ops see). Where `what` is "broadcast", either may
    be 1 instead, as numpy broadcasts (the result has a dim of its own then, see `equate_dims`). `what`: the op
    rule that needs it ("broadcast", "concat", "matmul contraction", "assert_dims_equal", ...)."""

    kept: Dim
    other: Dim
    what: str
    result: Dim | None = None   # a broadcast's own dim: its size is bound when the check runs, so that a later
    #                             check naming it (a 3-way `where`: broadcast(broadcast(A, B), C)) can run too

    def holds(self, kept: int, other: int) -> bool:
        """Whether sizes `kept` and `other` of the two dims satisfy the check."""
        return kept == other or (self.what == "broadcast" and 1 in (kept, other))

    @staticmethod
    def result_size(kept: int, other: int) -> int:
        """The size of a held broadcast's `result`: either where equal, the other where one is 1."""
        return other if kept == 1 else kept

    def renamed(self, fn) -> "DimCheck":
        """The check with `fn` applied to each symbolic dim (a whole dim string)."""
        def ren(d):
            return fn(d) if isinstance(d, str) else d
        return DimCheck(ren(self.kept), ren(self.other), self.what, ren(self.result))

    def to_json(self):
        return [self.kept, self.other, self.what] + ([self.result] if self.result is not None else [])

    @staticmethod
    def from_json(obj) -> "DimCheck":
        kept, other, what, *result = obj        # ValueError for a malformed one
        if len(result) > 1:
            raise ValueError(f"a dim check has {len(obj)} entries, expected 3 or 4")
        return DimCheck(check_dim(kept), check_dim(other), str(what), check_dim(result[0]) if result else None)


class _Recording(threading.local):
    def __init__(self):
        self.checks: list | None = None     # where a Builder.emit (or lint) collects checks; None: refuse
        self.undeclared: dict = {}          # symbols an importer named for dims the model left unnamed -> origin


_REC = _Recording()


@contextlib.contextmanager
def recording_checks(checked: tuple = ()):
    """Within: undecided dims an op needs equal are unified and their `DimCheck`s appended to the yielded
    list (the tracer puts them on the node it emits). Outside: refused, as ShapeErrors. `checked`: a node's
    checks, when its rule is run again (lint): the dims they name are accepted as unified."""
    prev = _REC.checks, _REC.undeclared
    _REC.checks = []
    if checked:
        named = {s for c in checked for d in (c.kept, c.other) if isinstance(d, str) for s in parse_dim(d).symbols}
        _REC.undeclared = {**_REC.undeclared, **{s: "" for s in named}}
    try:
        yield _REC.checks
    finally:
        _REC.checks, _REC.undeclared = prev


@contextlib.contextmanager
def undeclared_symbols(origins: dict):
    """Within: the symbols of `origins` (symbol -> where it comes from) count as unknown dims, not as the user's:
    an importer names the dims a model leaves unnamed (ONNX dims without ``dim_param``), but nobody declared
    them independent, so they are unified (and checked) like unknown dims."""
    prev, _REC.undeclared = _REC.undeclared, {**_REC.undeclared, **origins}
    try:
        yield
    finally:
        _REC.undeclared = prev


def _made_by_us(s: str) -> bool:
    return is_unknown(s) or s in _REC.undeclared


def _user_named(d: Dim) -> bool:
    """A dim made only of the user's symbols (no unknown dim inside)."""
    return isinstance(d, int) or not any(_made_by_us(s) for s in parse_dim(d).symbols)


def _representative(a: Dim, b: Dim) -> tuple:
    """(kept, other): a dim of the user's over one an importer named (an ONNX dim_param) over an unknown one,
    a plain symbol over an expression, else `a`."""
    def rank(d):
        named = _user_named(d) or not any(is_unknown(s) for s in parse_dim(d).symbols)
        return (0 if _user_named(d) else 1 if named else 2, 0 if isinstance(parse_dim(d), Sym) else 1)
    return (b, a) if rank(b) < rank(a) else (a, b)


def equate_dims(a: Dim, b: Dim, what: str) -> Dim:
    """The dim that `a` and `b` must both be, for an op rule `what`: `a` where equal; ShapeError where they
    provably differ, or where both are the user's own symbols; else (undecided) the representative, with a
    `DimCheck` recorded (ShapeError when no node records checks, e.g. a rule called outside tracing). A
    broadcast ("broadcast") gets a fresh unknown dim instead: numpy lets either side be 1, so neither is the
    result's size in every run."""
    eq = dims_equal(a, b)
    if eq:
        return a
    if eq is False:
        raise ShapeError(f"{what}: dims {a} and {b} differ")
    if (_user_named(a) and _user_named(b)) or _REC.checks is None:
        raise ShapeError(f"{what} needs {describe_dim(a)} and {describe_dim(b)} equal, but they are not known to "
                         f"be equal; {undecided_fix()}")
    if what == "broadcast":     # numpy's rule: equal, or one is 1; the result's size is known when it runs
        result = fresh_dim(origin=f"the broadcast of {describe_dim(a)} and {describe_dim(b)}")
        _REC.checks.append(DimCheck(a, b, what, result))
        return result
    kept, other = _representative(a, b)
    _REC.checks.append(DimCheck(kept, other, what))
    return kept


def broadcast_to_own_symbol(a: Dim, b: Dim) -> Dim | None:
    """The dim of broadcasting `a` with `b` where one of them is a plain symbol ``S`` and the other a dim computed
    from ``S`` alone that is 0 where ``S`` is 0 and 1 where ``S`` is 1 (``min(S, 64)``: a buffer sliced to the
    sequence length): ``S`` in every run that broadcasts at all (equal, or the other is 1), so ``S`` with a
    `DimCheck` recorded; None where this does not apply or no node records checks."""
    if _REC.checks is None:
        return None
    for big, small in ((a, b), (b, a)):
        if not isinstance(big, str) or not isinstance(small, str) or not isinstance(parse_dim(big), Sym):
            continue
        if parse_dim(small).symbols != {big}:
            continue
        try:
            ends = [int(parse_dim(small).evaluate({big: v})) for v in (0, 1)]
        except (ArithmeticError, ValueError, KeyError):
            continue
        if ends == [0, 1]:
            _REC.checks.append(DimCheck(big, small, "broadcast"))
            return big
    return None


def broadcast_to_size(size: int, d: Dim) -> int:
    """The dim of broadcasting the size `size` (not 1) with the symbolic dim `d`: `size`, with a `DimCheck` recorded
    (`d` must be `size` or 1 at run time: numpy refuses anything else) where a node records checks."""
    if _REC.checks is not None:
        _REC.checks.append(DimCheck(size, d, "broadcast"))
    return size


def state_equal(kept: Dim, other: Dim, what: str) -> None:
    """Record that `other` must equal `kept` (the user said so: `F.assert_dims_equal`); nothing is recorded
    where no node records checks (lint re-running a rule)."""
    if _REC.checks is not None:
        _REC.checks.append(DimCheck(kept, other, what))


def undecided_fix() -> str:
    return ("if they are always equal, say so with F.assert_dims_equal(x, y, axis_x, axis_y) (checked at run time) "
            "or give both inputs the same symbol")


def describe_dim(d: Dim, origins: dict | None = None) -> str:
    """`d` for a message, never a bare internal name: an int as itself; the user's symbol ``N`` as
    "the symbolic dim N"; an unknown dim by its origin ("the rows kept by boolean_mask at
    m.py:3"); an expression with its unknown parts named by origin. `origins`: a graph's `dim_origins`
    (renamed dims of a traced graph); the process-wide registry of `fresh_dim` is asked otherwise."""
    if isinstance(d, int):
        return str(d)
    e = parse_dim(d)
    origins = origins or {}
    unknown = sorted(s for s in e.symbols if _made_by_us(s) or s in origins)
    if not unknown:
        return f"the symbolic dim {d}" if isinstance(e, Sym) else f"the dim {d}"

    def origin(s):
        got = origins.get(s) or dim_origin(s) or _REC.undeclared.get(s)
        return got or "a size known only at run time"
    if len(unknown) == 1 and isinstance(e, Sym):
        return origin(unknown[0])
    letters = {s: f"<{k}>" for k, s in enumerate(unknown)}
    text = str(e.rename(lambda s: letters.get(s, s))).replace("<", "u").replace(">", "")
    return text + " where " + "; ".join(f"u{k} is {origin(s)}" for k, s in enumerate(unknown))


_INTERNAL = re.compile(r"(?<![A-Za-z0-9_])_[a-z]+\d+(?![A-Za-z0-9_])")      # `fresh_dim` names: _u5, _in2, _d3


def name_internal_dims(text: str, origins: dict | None = None) -> str:
    """`text` with each internal dim name (``_u5``, ``_d3``) written ``#1``, ``#2``, ..., and a line saying where
    each comes from (``#1 is the rows kept by boolean_mask at m.py:3``): the funnel for messages that show types
    (``float32[_d0,4]``), so no message shows a bare internal name."""
    found = list(dict.fromkeys(_INTERNAL.findall(text)))
    if not found:
        return text
    marks = {d: f"#{k + 1}" for k, d in enumerate(found)}
    body = _INTERNAL.sub(lambda m: marks[m.group(0)], text)
    legend = "; ".join(f"{marks[d]} is {describe_dim(d, origins)}" for d in found)
    head, at, tail = body.partition("\n    at ")       # keep the user's line last
    return f"{head}\n    ({legend}){at}{tail}"
