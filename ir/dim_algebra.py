"""The canonical form of dims, and what can be proved about them.

Every dim that a stage stores goes through `simplify_dim`, so equal expressions are equal strings:
``(H - 1) + 1`` is ``H``, ``(H + 2 - 3) // 1 + 1`` is ``H``, ``2 * (N // 2) + N % 2`` is ``N``. The form is a
*sum of monomials* with int coefficients over *atoms*: symbols, and canonical non-linear atoms
``(P // c)``, ``(P % c)`` (P itself canonical, c > 0), ``(P // Q)``, ``(P % Q)``, ``min(...)`` and ``max(...)``
(arguments flattened, deduplicated, dominated ones dropped, sorted). It is the idea of TVM's canonical
simplifier (``src/arith/canonical_simplify.cc``: a SumExpr of split terms) cut down to what dims use; torch's
ShapeEnv does the same with sympy, far too heavy for the runtime, which only *evaluates* stored dims (it never
simplifies, so it never imports this file's machinery on a hot path).

Every rewrite holds for all integer values of the symbols (floor division and mod by a constant c > 0), except
those that use bounds, which hold for sizes: symbols are >= 0 (`bounds`). The canonical string stays within the
grammar of `ir.dims` (ints, symbols, ``+ - * // %``, ``min``, ``max``), so stored graphs, artifacts and the TIR
translation read it as before.

    >>> simplify_dim("((H + 2) - 3) // 1 + 1"), simplify_dim("(H + 2 - 3) // 2 + 1"), simplify_dim("max(N + 1 - 2, 0)")
    ('H', '((H + 1) // 2)', 'max((N - 1), 0)')
    >>> dims_equal("2 * (N // 2) + N % 2", "N"), dim_compare("N + 1", ">", "N"), dims_equal("N", "M")
    (True, True, None)
"""
from __future__ import annotations

import functools
import math

from .dims import DimExpr, parse_dim

__all__ = ["simplify_dim", "canonical_dim", "dims_equal", "dim_compare", "dim_bounds", "dim_binop", "dim_minmax"]

_INF = float("inf")
#: A product of sums whose distributed text is longer than this and than the product written as is stays one
#: ``*`` atom (``(A + 1) * (B + 1) * ...`` would grow exponentially, past what `ir.dims` parses); its factors
#: are canonical, so it is too, except that such products are not compared through their expansions.
_MAX_EXPANDED = 800


class _Atom:
    """A factor of a monomial: a symbol (``kind == "sym"``, ``args == name``), ``//`` or ``%`` of two polys,
    ``min`` / ``max`` of a tuple of polys, or ``*`` of two sums too long to distribute (`_MAX_EXPANDED`). Its canonical text identifies it (equal texts, equal atoms)."""

    __slots__ = ("kind", "args", "text", "_hash", "_bounds")

    def __init__(self, kind: str, args):
        self.kind, self.args = kind, args
        if kind == "sym":
            self.text = args
        elif kind in ("//", "%", "*"):
            self.text = f"({args[0].text} {kind} {args[1].text})"
        else:
            self.text = f"{kind}({', '.join(a.text for a in args)})"
        self._hash = hash(self.text)
        self._bounds = None

    def __eq__(self, other):
        return self is other or (isinstance(other, _Atom) and self.text == other.text)

    def __hash__(self):
        return self._hash

    def sort_key(self):
        return (self.kind != "sym", self.text)

    def bounds(self) -> tuple:
        if self._bounds is None:
            self._bounds = _atom_bounds(self)
        return self._bounds


class _Poly:
    """A canonical dim: ``terms`` maps a monomial (a sorted tuple of atoms, ``()`` for the constant) to its
    nonzero int coefficient. Immutable; `text` is the stored string (or the int, as text)."""

    __slots__ = ("terms", "text", "_hash", "_bounds")

    def __init__(self, terms: dict):
        self.terms = terms
        self.text = _render(terms)
        self._hash = hash(self.text)
        self._bounds = None

    def __eq__(self, other):
        return self is other or (isinstance(other, _Poly) and self.text == other.text)

    def __hash__(self):
        return self._hash

    @property
    def const(self) -> int:
        return self.terms.get((), 0)

    def is_const(self) -> bool:
        return not self.terms or (len(self.terms) == 1 and () in self.terms)

    def single_atom(self):
        """The atom when this poly is exactly one atom (coefficient 1, no constant), else None."""
        if len(self.terms) == 1:
            (mono, k), = self.terms.items()
            if k == 1 and len(mono) == 1:
                return mono[0]
        return None

    def bounds(self) -> tuple:
        if self._bounds is None:
            lo = hi = 0
            for mono, k in self.terms.items():
                b = (1, 1)
                for atom in mono:
                    b = _mul_bounds(b, atom.bounds())
                b = _mul_bounds(b, (k, k))
                lo, hi = lo + b[0], hi + b[1]
            self._bounds = (lo, hi)
        return self._bounds

    def to_dim(self):
        return self.const if self.is_const() else self.text


def _mono_key(mono: tuple):
    return (len(mono), tuple(a.sort_key() for a in mono))


def _term_text(mono: tuple, k: int) -> str:
    """``|k| * mono`` (the sign is written by the sum)."""
    if not mono:
        return str(abs(k))
    text = mono[0].text
    for atom in mono[1:]:
        text = f"({text} * {atom.text})"
    return text if abs(k) == 1 else f"({abs(k)} * {text})"


def _render(terms: dict) -> str:
    """Non-constant terms by degree, then atoms (symbols first, alphabetically), then the constant; positive
    terms before negative ones, so ``N - 1`` reads ``(N - 1)`` and ``1 - N`` reads ``(1 - N)``."""
    if not terms:
        return "0"
    order = sorted((m for m in terms if m), key=_mono_key) + ([()] if () in terms else [])
    order = [m for m in order if terms[m] > 0] + [m for m in order if terms[m] < 0]
    first = order[0]
    text = _term_text(first, terms[first])
    if terms[first] < 0:
        text = f"-{text}" if first else str(terms[first])
    for m in order[1:]:
        text = f"({text} {'+' if terms[m] > 0 else '-'} {_term_text(m, terms[m])})"
    return text


def _mul_bounds(x, y):
    ends = [p * q if p and q else 0 for p in x for q in y]      # 0 * inf is 0 here: a 0 dim stays 0
    return min(ends), max(ends)


def _floor_bound(v, c):
    return v if abs(v) == _INF else v // c


def _atom_bounds(atom: _Atom) -> tuple:
    """Bounds of an atom for sizes (every symbol >= 0), where it is defined (no division by zero)."""
    if atom.kind == "sym":
        return 0, _INF
    if atom.kind == "*":
        return _mul_bounds(atom.args[0].bounds(), atom.args[1].bounds())
    if atom.kind in ("min", "max"):
        bs = [a.bounds() for a in atom.args]
        f = min if atom.kind == "min" else max
        return f(b[0] for b in bs), f(b[1] for b in bs)
    (plo, phi), (qlo, qhi) = atom.args[0].bounds(), atom.args[1].bounds()
    if atom.kind == "//":
        if qlo == qhi > 0:
            return _floor_bound(plo, qlo), _floor_bound(phi, qlo)
        return (0, phi) if plo >= 0 and qlo >= 0 else (-_INF, _INF)
    if qlo >= 0:            # % by a divisor >= 0 (nonzero where defined): 0 <= result < divisor, <= P where P >= 0
        return 0, min(qhi - 1, phi) if plo >= 0 else qhi - 1
    return -_INF, _INF


# -- building polys ---------------------------------------------------------------------------------------

def _const(c: int) -> _Poly:
    return _Poly({(): c} if c else {})


def _atom_poly(atom: _Atom) -> _Poly:
    return _Poly({(atom,): 1})


def _make(terms: dict) -> _Poly:
    """The poly of `terms` (zero coefficients dropped), with ``a * (X % c)`` and ``a * c * (X // c)`` in the same
    monomial merged into ``a * X`` (TVM's split-term merge): ``2 * (N // 2) + N % 2`` is ``N``."""
    terms = {m: k for m, k in terms.items() if k}
    for mono, k in list(terms.items()):
        if mono not in terms:
            continue
        for i, atom in enumerate(mono):
            if atom.kind != "%" or not atom.args[1].is_const():
                continue
            x, c = atom.args
            rest = mono[:i] + mono[i + 1:]
            partner = tuple(sorted(rest + (_Atom("//", (x, c)),), key=_Atom.sort_key))
            if terms.get(partner) == k * c.const:
                del terms[mono], terms[partner]
                return _add(_Poly(terms), _mul(_Poly({rest: k}), x))
    return _Poly(terms)


def _add(p: _Poly, q: _Poly, sign: int = 1) -> _Poly:
    terms = dict(p.terms)
    for m, k in q.terms.items():
        terms[m] = terms.get(m, 0) + sign * k
    return _make(terms)


def _scale(p: _Poly, k: int) -> _Poly:
    return _Poly({m: c * k for m, c in p.terms.items()}) if k else _const(0)


def _mul(p: _Poly, q: _Poly) -> _Poly:
    if q.is_const():
        return _scale(p, q.const)
    if p.is_const():
        return _scale(q, p.const)
    terms: dict = {}
    for m1, k1 in p.terms.items():
        for m2, k2 in q.terms.items():
            m = tuple(sorted(m1 + m2, key=_Atom.sort_key))
            terms[m] = terms.get(m, 0) + k1 * k2
    out = _make(terms)
    if len(out.text) > _MAX_EXPANDED and len(out.text) > len(p.text) + len(q.text) + 5:
        return _atom_poly(_Atom("*", tuple(sorted((p, q), key=lambda a: a.text))))     # kept as one product
    return out


def _split(p: _Poly, c: int):
    """p = c * A + B with every coefficient of B (the constant too) in [0, c)."""
    a, b = {}, {}
    for m, k in p.terms.items():
        q, r = divmod(k, c)
        if q:
            a[m] = q
        if r:
            b[m] = r
    return _Poly(a), _Poly(b)


def _coef_gcd(p: _Poly, start: int = 0) -> int:
    g = start
    for k in p.terms.values():
        g = math.gcd(g, k)
    return g


def _divide_exact(p: _Poly, g: int) -> _Poly:
    return _Poly({m: k // g for m, k in p.terms.items()})


def _floordiv(p: _Poly, q: _Poly) -> _Poly:
    if not q.is_const():
        if q.bounds()[0] >= 1 and (p == q or not p.terms):     # nonzero divisor: P // P is 1, 0 // Q is 0
            return _const(1 if p.terms else 0)
        return _atom_poly(_Atom("//", (p, q)))
    c = q.const
    if c == 0:
        return _atom_poly(_Atom("//", (p, q)))                  # fails when evaluated, as Python's // does
    if c < 0:                                                   # floor(P / c) == floor(-P / -c)
        return _floordiv(_scale(p, -1), _const(-c))
    if p.is_const():
        return _const(p.const // c)
    if c == 1:
        return p
    a, b = _split(p, c)                                         # (c*A + B) // c == A + B // c for every int A
    lo, hi = b.bounds()
    if lo != -_INF and hi != _INF and lo // c == hi // c:       # B // c is one value for every size
        return _add(a, _const(lo // c))
    g = _coef_gcd(b, c)
    if g > 1:                                                   # (g*B') // (g*c') == B' // c'
        b, c = _divide_exact(b, g), c // g
    inner = _Poly({m: k for m, k in b.terms.items() if m}).single_atom()
    if inner is not None and inner.kind == "//" and inner.args[1].is_const() and inner.args[1].const > 0:
        x, d = inner.args[0], inner.args[1].const               # (X // d + r) // c == (X + r*d) // (d*c)
        return _add(a, _floordiv(_add(x, _const(b.const * d)), _const(d * c)))
    return _add(a, _atom_poly(_Atom("//", (b, _const(c)))))


def _mod(p: _Poly, q: _Poly) -> _Poly:
    if not q.is_const():
        if q.bounds()[0] >= 1 and (p == q or not p.terms):
            return _const(0)
        return _atom_poly(_Atom("%", (p, q)))
    c = q.const
    if c == 0:
        return _atom_poly(_Atom("%", (p, q)))
    if c < 0:                                                   # P % c == -((-P) % -c)
        return _scale(_mod(_scale(p, -1), _const(-c)), -1)
    if p.is_const():
        return _const(p.const % c)
    if c == 1:
        return _const(0)
    _, b = _split(p, c)                                         # (c*A + B) % c == B % c
    for mono, k in b.terms.items():                             # (X % (c*j)) % c == X % c: X % (c*j) is X mod c
        for i, atom in enumerate(mono):
            if atom.kind == "%" and atom.args[1].is_const() and atom.args[1].const % c == 0:
                rest = dict(b.terms)
                del rest[mono]
                swapped = _mul(_Poly({mono[:i] + mono[i + 1:]: k}), atom.args[0])
                return _mod(_add(_Poly(rest), swapped), q)
    if not b.terms:
        return _const(0)
    lo, hi = b.bounds()
    if lo != -_INF and hi != _INF and lo // c == hi // c:       # B is in one period: B % c is B shifted
        return _add(b, _const(-c * (lo // c)))
    g = _coef_gcd(b, c)
    if g > 1:                                                   # (g*B') % (g*c') == g * (B' % c')
        return _scale(_mod(_divide_exact(b, g), _const(c // g)), g)
    return _atom_poly(_Atom("%", (b, _const(c))))


def _minmax(kind: str, args) -> _Poly:
    """min / max of polys: nested ones of the same kind flattened, duplicates and dominated args dropped
    (``min(N, N + 2)`` is N: their difference's bounds decide), the common factor of the args pulled out
    (``min(2*N, 2*M)`` is ``2 * min(M, N)``), the args sorted (constants last: ``min(N, 2)``)."""
    flat: dict = {}
    todo = list(args)
    while todo:
        a = todo.pop()
        atom = a.single_atom()
        if atom is not None and atom.kind == kind:
            todo.extend(atom.args)
        else:
            flat[a.text] = a
    kept: list = []
    for a in sorted(flat.values(), key=lambda p: p.text):
        # for min: a is dropped where some kept k <= a always; kept ones >= a always go
        if any(_sign_of_diff(k, a, kind) for k in kept):
            continue
        kept = [k for k in kept if not _sign_of_diff(a, k, kind)] + [a]
    if len(kept) == 1:
        return kept[0]
    # Constants stay inside (``max(N - 1, 0)``, not ``max(N, 1) - 1``): pulled out, ``N * max(N - 1, 0)`` would
    # distribute into ``N * max(N, 1) - N``, whose interval bounds are lost; a positive factor scales them exactly.
    g = 0
    for a in kept:
        g = _coef_gcd(a, g)
    if g > 1:
        kept = [_divide_exact(a, g) for a in kept]
    atom = _Atom(kind, tuple(sorted(kept, key=lambda p: (p.is_const(), p.text))))     # min(N, 2)
    return _scale(_atom_poly(atom), max(g, 1))


def _sign_of_diff(a: _Poly, b: _Poly, kind: str) -> bool:
    """For min: a <= b for every size; for max: a >= b."""
    lo, hi = _add(a, b, -1).bounds()
    return hi <= 0 if kind == "min" else lo >= 0


# -- from and to stored dims ---------------------------------------------------------------------------------

_BUILD = {"+": lambda p, q: _add(p, q), "-": lambda p, q: _add(p, q, -1), "*": _mul, "//": _floordiv, "%": _mod}


def _from_expr(e: DimExpr) -> _Poly:
    return e.fold(_const, lambda s: _atom_poly(_Atom("sym", s)), lambda op, a, b: _BUILD[op](a, b),
                  _minmax, lambda a: _scale(a, -1))


@functools.lru_cache(maxsize=16384)
def _poly_of_str(s: str) -> _Poly:
    return _from_expr(parse_dim(s))


def _poly(d) -> _Poly:
    if isinstance(d, _Poly):
        return d
    if isinstance(d, str):
        return _poly_of_str(d)
    if isinstance(d, DimExpr):
        return _from_expr(d)
    return _const(int(d))


def simplify_dim(d):
    """The canonical stored form of a dim (an int, a dim string or a `DimExpr`): an int for a constant, else the
    canonical string. ValueError for a string that is not a dim expression."""
    if isinstance(d, int) and not isinstance(d, bool):
        return d
    return _poly(d).to_dim()


@functools.lru_cache(maxsize=16384)
def canonical_dim(s: str):
    """The stored form of a dim string (see `simplify_dim`)."""
    return _poly_of_str(s).to_dim()


@functools.lru_cache(maxsize=16384)
def dim_binop(op: str, a, b):
    """``a op b`` (op one of ``+ - * // %``) for stored dims, in canonical form."""
    return _BUILD[op](_poly(a), _poly(b)).to_dim()


@functools.lru_cache(maxsize=16384)
def dim_minmax(kind: str, *dims):
    """``min(*dims)`` or ``max(*dims)`` for stored dims, in canonical form."""
    return _minmax(kind, [_poly(d) for d in dims]).to_dim()


def dim_bounds(d) -> tuple:
    """(lowest, highest) value a dim can take where every symbol is a size (0 to infinity), by interval arithmetic
    on the canonical form: ``min(N, 2)`` is in (0, 2), ``max(N - 1, 0)`` in (0, inf)."""
    if isinstance(d, int):
        return d, d
    return _poly(d).bounds()


_DECIDE = {"==": lambda lo, hi: True if lo == hi == 0 else False if lo > 0 or hi < 0 else None,
           "<": lambda lo, hi: True if hi < 0 else False if lo >= 0 else None,
           "<=": lambda lo, hi: True if hi <= 0 else False if lo > 0 else None}


def dim_compare(a, op: str, b):
    """``a op b`` (op one of ``== != < <= > >=``) for every size of the symbols: True or False where that is
    provable (the difference is a constant, or its bounds decide), None where it depends on the sizes."""
    if op in (">", ">="):
        return dim_compare(b, "<" if op == ">" else "<=", a)
    if op == "!=":
        eq = dim_compare(a, "==", b)
        return None if eq is None else not eq
    if op not in _DECIDE:
        raise ValueError(f"unknown dim comparison {op!r}; expected one of == != < <= > >=")
    if isinstance(a, int) and isinstance(b, int):
        lo = hi = a - b
    else:
        lo, hi = _sign_bounds(_add(_poly(a), _poly(b), -1))
    return _DECIDE[op](lo, hi)


def _sign_bounds(p: _Poly, depth: int = 2) -> tuple:
    """Bounds of `p` tight enough to decide its sign (they may be fractions): interval bounds, tightened
    where a term is one atom whose relation to its arguments interval arithmetic forgets. ``k * max(X, Y)`` with
    k > 0 is at least ``k * X`` and ``k * Y`` (``max(N, 3) - N >= 0``), ``k * min(...)`` at most each argument, and
    ``c * (X // c)`` is ``X - X % c`` (``N // 2 - N <= 0``)."""
    lo, hi = p.bounds()
    if depth == 0 or (lo != -_INF and hi != _INF):       # finite: already as tight as the terms allow
        return lo, hi
    for mono, k in p.terms.items():
        if len(mono) != 1:
            continue
        atom, rest = mono[0], dict(p.terms)
        del rest[mono]
        rest = _Poly(rest)
        if atom.kind in ("min", "max"):
            # the side each argument bounds: a max from below (k > 0), a min from above (k > 0)
            below = (atom.kind == "max") == (k > 0)
            for arg in atom.args:
                alo, ahi = _sign_bounds(_add(rest, _scale(arg, k)), depth - 1)
                lo, hi = (max(lo, alo), hi) if below else (lo, min(hi, ahi))
        elif atom.kind == "//" and atom.args[1].is_const() and atom.args[1].const > 0:
            x, c = atom.args[0], atom.args[1].const
            exact = _add(_scale(rest, c), _scale(_add(x, _mod(x, atom.args[1]), -1), k))       # c * p
            elo, ehi = _sign_bounds(exact, depth - 1)
            lo, hi = max(lo, elo / c), min(hi, ehi / c)
    return lo, hi


def dims_equal(a, b):
    """True where dims `a` and `b` are equal for every size, False where they never are, None where it depends
    on the sizes (``N`` and ``M``; ``N`` and ``2 * N``, equal only at 0)."""
    if a == b:
        return True
    return dim_compare(a, "==", b)
