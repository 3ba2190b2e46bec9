"""Dim expressions: the one parser and visitor of symbolic dims.

Types store a dim as an ``int`` or a string (``"T"``, ``"(T + 1)"``, ``"max((N - 1), 0)"``): strings keep
`TensorType` hashable, printable and JSON-friendly. Every stage that needs the *structure* of a dim
(its symbols, its value, its translation to TIR, renaming unknown dims) goes through `parse_dim`, which
returns a `DimExpr` tree (cached per string), and walks it with `DimExpr.fold` or a `DimVisitor`. Stored
strings are in the canonical form of `ir.dim_algebra` (which builds and compares them); this file only reads
them, so the runtime evaluates dims without the algebra, and old non-canonical strings still parse.

    >>> e = parse_dim("((T + 1) * 2)")
    >>> sorted(e.symbols), e.evaluate({"T": 3}), str(e.rename({"T": "S"}))
    (['T'], 8, '((S + 1) * 2)')
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

__all__ = ["DimExpr", "Sym", "Const", "BinOp", "Call", "Neg", "DimVisitor", "parse_dim", "BINOPS",
           "FUNCS"]

#: Binary operators a dim may use, with their Python semantics on ints (floor division, floor mod).
BINOPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
          "//": lambda a, b: a // b, "%": lambda a, b: a % b}
#: Functions a dim may call.
FUNCS = {"min": min, "max": max}
_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


class DimExpr:
    """A parsed dim: `Const`, `Sym`, `BinOp`, `Call` (min/max) or `Neg`. Immutable and hashable."""

    __slots__ = ()

    @functools.cached_property
    def symbols(self) -> frozenset:
        """Symbol names the expression refers to."""
        return self.fold(lambda c: frozenset(), lambda s: frozenset((s,)),
                         lambda op, a, b: a | b, lambda fn, args: frozenset().union(*args), lambda a: a)

    @functools.cached_property
    def text(self) -> str:
        """The expression's rendering (as `ir.dim_algebra` renders its canonical form, the stored one)."""
        return str(self)

    def evaluate(self, env: dict) -> int:
        """The value given symbol values (KeyError for a symbol not in `env`). `env` may also hold whole
        expression dims seen as the size of some value (``{"min(N, 2)": 1}``): a sub-expression found
        there takes that value, so ``(4 * min(N, 2))`` is known where only such a value is."""
        if isinstance(self, Const):
            return self.value
        if isinstance(self, Sym):
            return env[self.name]
        if env:
            hit = env.get(self.text)
            if hit is not None:
                return hit
        if isinstance(self, BinOp):
            return BINOPS[self.op](self.left.evaluate(env), self.right.evaluate(env))
        if isinstance(self, Call):
            return FUNCS[self.fn](*(a.evaluate(env) for a in self.args))
        return -self.operand.evaluate(env)

    def free_symbols(self, atoms=frozenset()) -> frozenset:
        """Symbols needed to evaluate the expression when the sub-expressions whose text is in `atoms` are
        known as a whole (see `evaluate`)."""
        if isinstance(self, Sym):
            return frozenset((self.name,))
        if isinstance(self, Const) or self.text in atoms:
            return frozenset()
        kids = (self.left, self.right) if isinstance(self, BinOp) else self.args if isinstance(self, Call) \
            else (self.operand,)
        return frozenset().union(*(k.free_symbols(atoms) for k in kids))

    def rename(self, mapping) -> "DimExpr":
        """The expression with symbols renamed by `mapping` (a dict or a function of the name)."""
        get = mapping if callable(mapping) else (lambda s: mapping.get(s, s))
        return self.fold(Const, lambda s: Sym(get(s)), BinOp, lambda fn, args: Call(fn, tuple(args)), Neg)

    def fold(self, const, sym, binop, call, neg):
        """Bottom-up evaluation: each node kind is handled by one function of its children's results."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.fold(str, str, lambda op, a, b: f"({a} {op} {b})", lambda fn, args: f"{fn}({', '.join(args)})",
                         lambda a: f"-{a}")

    def solve(self, sym: str, value: int, env: dict):
        """The int that symbol `sym` must have for this expression to equal `value` (other symbols from
        `env`), or None where no int fits or the expression is not invertible in `sym`."""
        e, target = self, value
        while not (isinstance(e, Sym) and e.name == sym):
            if not isinstance(e, BinOp) or e.op not in ("+", "-", "*"):
                return None
            left = sym in e.left.symbols
            if left == (sym in e.right.symbols):
                return None
            k = (e.right if left else e.left).evaluate(env)
            if e.op == "+":
                target -= k
            elif e.op == "-":
                target = target + k if left else k - target
            else:
                if k == 0 or target % k:
                    return None
                target //= k
            e = e.left if left else e.right
        return target if self.evaluate({**env, sym: target}) == value else None

    def to_dim(self):
        """Back to the stored form: an int for a constant, else the canonical string."""
        return self.value if isinstance(self, Const) else str(self)


@dataclass(frozen=True, eq=True)
class Const(DimExpr):
    value: int

    def fold(self, const, sym, binop, call, neg):
        return const(self.value)


@dataclass(frozen=True, eq=True)
class Sym(DimExpr):
    name: str

    def fold(self, const, sym, binop, call, neg):
        return sym(self.name)


@dataclass(frozen=True, eq=True)
class BinOp(DimExpr):
    op: str
    left: DimExpr
    right: DimExpr

    def fold(self, const, sym, binop, call, neg):
        f = (const, sym, binop, call, neg)
        return binop(self.op, self.left.fold(*f), self.right.fold(*f))


@dataclass(frozen=True, eq=True)
class Call(DimExpr):
    fn: str
    args: tuple

    def fold(self, const, sym, binop, call, neg):
        return call(self.fn, [a.fold(const, sym, binop, call, neg) for a in self.args])


@dataclass(frozen=True, eq=True)
class Neg(DimExpr):
    operand: DimExpr

    def fold(self, const, sym, binop, call, neg):
        return neg(self.operand.fold(const, sym, binop, call, neg))


# cached_property needs a __dict__; frozen dataclasses with slots=False have one.


class DimVisitor:
    """Top-down visitor over a `DimExpr` (for walks that need the tree, e.g. solving for a symbol).
    Subclasses define ``visit_Const``, ``visit_Sym``, ``visit_BinOp``, ``visit_Call``, ``visit_Neg``."""

    def visit(self, e: DimExpr):
        return getattr(self, "visit_" + type(e).__name__)(e)


_MAX_LEN = 2000         # longer dims are refused rather than parsed (deep nesting overflows the stack)


def _shown(s: str) -> str:
    return repr(s) if len(s) <= 60 else repr(s[:57] + "...")


@functools.lru_cache(maxsize=8192)
def _parse_str(s: str) -> DimExpr:
    if len(s) > _MAX_LEN:
        raise ValueError(f"dim expression {_shown(s)} is too long ({len(s)} characters; at most {_MAX_LEN})")
    if not s.isascii():     # Python folds unicode identifiers (NFKC): "𝐍" would silently become "N"
        raise ValueError(f"bad dim expression {_shown(s)}: symbols must be ASCII identifiers")
    try:
        tree = ast.parse(s.strip(), mode="eval").body
        return _from_ast(tree, s)
    except SyntaxError:
        raise ValueError(f"bad dim expression {_shown(s)}") from None
    except RecursionError:
        raise ValueError(f"dim expression {_shown(s)} is nested too deeply") from None


def _from_ast(n, src) -> DimExpr:
    if isinstance(n, ast.Constant) and type(n.value) is int:
        return Const(n.value)
    if isinstance(n, ast.Name):
        return Sym(n.id)
    if isinstance(n, ast.BinOp) and type(n.op) in _AST_OPS:
        return BinOp(_AST_OPS[type(n.op)], _from_ast(n.left, src), _from_ast(n.right, src))
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
        inner = _from_ast(n.operand, src)
        return Const(-inner.value) if isinstance(inner, Const) else Neg(inner)
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in FUNCS and n.args \
            and not n.keywords:
        return Call(n.func.id, tuple(_from_ast(a, src) for a in n.args))
    raise ValueError(f"bad dim expression {_shown(src)}: only ints, symbols, + - * // %, min(...) and max(...) "
                     "are allowed")


def parse_dim(d) -> DimExpr:
    """The `DimExpr` of a stored dim (an int or a string); ValueError for anything else."""
    if isinstance(d, DimExpr):
        return d
    if isinstance(d, int) and not isinstance(d, bool):
        return Const(int(d))
    if isinstance(d, str):
        return _parse_str(str(d))
    raise ValueError(f"bad dim {d!r}")
