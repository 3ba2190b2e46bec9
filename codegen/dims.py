"""Our dims -> tirx PrimExprs over the symbolic vars of one region function (`ConvertContext`).

Dims come as ints or strings (``"N"``, ``"(T + 1)"``); every string goes through `ir.dims.parse_dim` and
is walked as a `DimExpr` tree (`_ToTir` translates it, `_Inverter` solves it for one symbol).
"""
from __future__ import annotations

import numpy as np
import tvm_ffi
from tvm import tirx
from tvm.sym import Analyzer, ConstIntBound

from dyntvm.errors import CompileError
from ..ir.dims import BinOp, Const, DimExpr, DimVisitor, Sym, parse_dim

__all__ = ["ConvertContext", "I64", "i64", "provably_equal", "is_one"]

I64 = "int64"


def i64(v):
    """An int as an int64 TIR constant (a PrimExpr as it is): the dims and sizes of the TE computes."""
    return tirx.IntImm(I64, v) if isinstance(v, int) else v

_TIR_BINOPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
               "//": tirx.floordiv, "%": tirx.floormod}


def provably_equal(analyzer, a, b) -> bool:
    """a == b for two PrimExprs: equal constants, structurally equal, or proven by `analyzer`."""
    if isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm):
        return int(a.value) == int(b.value)
    if tvm_ffi.structural_equal(a, b):
        return True
    try:
        return bool(analyzer.can_prove_equal(a, b))
    except Exception:   # noqa: BLE001 - dtype mismatches and the like: not provable
        return False


def is_one(d) -> bool:
    """`d` is the constant 1."""
    return isinstance(d, tirx.IntImm) and int(d.value) == 1


class _ToTir(DimVisitor):
    """A `DimExpr` -> an int64 PrimExpr over a context's vars. A (sub)expression that is an expression
    input dim is that dim's var; a symbol must be bound (CompileError otherwise)."""

    def __init__(self, ctx: "ConvertContext"):
        self.ctx = ctx

    def visit(self, e: DimExpr):
        var = self.ctx.exprs.get(e)
        return var if var is not None else super().visit(e)

    def visit_Const(self, e):
        return tirx.IntImm(I64, e.value)

    def visit_Sym(self, e):
        ctx = self.ctx
        if e.name in ctx.symbols:
            return ctx.symbols[e.name]
        node = ctx.node
        where = f" (needed by {node.op} node {node.name!r})" if node is not None else ""
        raise CompileError(
            f"region function {ctx.fn_name!r}: symbolic dim {e.name!r}{where} is not bound by the "
            f"shape of any region input; bound symbols: {sorted(ctx.symbols) or 'none'}. Pass a "
            f"tensor whose shape holds {e.name!r} into the region, or make the partitioner keep "
            f"this op with its producer")

    def visit_Neg(self, e):
        return -self.visit(e.operand)

    def visit_Call(self, e):
        f = tirx.min if e.fn == "min" else tirx.max
        out = self.visit(e.args[0])
        for a in e.args[1:]:
            out = f(out, self.visit(a))
        return out

    def visit_BinOp(self, e):
        return _TIR_BINOPS[e.op](self.visit(e.left), self.visit(e.right))


class _Inverter(DimVisitor):
    """Solves ``e == target`` for the one unbound symbol `sym` of `e` through ``+``, ``-`` and ``*``
    by terms the context can translate; None where it cannot."""

    def __init__(self, ctx: "ConvertContext", sym: str):
        self.ctx, self.sym = ctx, sym

    def solve(self, e: DimExpr, target):
        if isinstance(e, Sym):
            return target if e.name == self.sym else None
        if not isinstance(e, BinOp):
            return None
        has_l = self.sym in e.left.symbols
        known = e.right if has_l else e.left
        try:
            k = self.ctx.translate(known)
        except CompileError:
            return None
        inner = e.left if has_l else e.right
        if e.op == "+":
            return self.solve(inner, target - k)
        if e.op == "-":
            return self.solve(inner, target + k if has_l else k - target)
        if e.op == "*":
            return self.solve(inner, tirx.floordiv(target, k))
        return None


class ConvertContext:
    """Per-function state: our dims (ints, symbol names, expression strings) -> tirx PrimExprs.

    `bind_input_dim` is called for every dim of every function parameter (by the region builder):
    a plain symbol (``"N"``, or an unknown ``"_u3"``) gets one int64 `tirx.Var` per function; an
    expression dim (``"(T + 1)"``) gets a fresh var too, remembered so that the same expression
    (or a symbol it determines, see `solve`) can be translated later. `dim` translates any dim.
    """

    def __init__(self, fn_name: str = "main", device_checks: bool = False):
        self.fn_name = fn_name
        self.device_checks = device_checks                # run-time checks for a GPU (`common.checked`)
        self.symbols: dict[str, tirx.PrimExpr] = {}
        self.exprs: dict[DimExpr, tirx.PrimExpr] = {}  # an expression input dim -> its var
        self.analyzer = Analyzer()                     # knows every dim var is >= 0
        self._plain = Analyzer()
        self.node = None                               # the node being converted (for errors)
        # (view, flat, shape): `view` is reshape(flat, shape), a [..., M, N] result computed as a 2-D [rows, N]
        # (the matmul converter's flattened GEMM); elementwise ops on it run on `flat` (`converters.sink_flat`)
        self.flat_views: list = []
        self.flat_casts: list = []                     # the match_casts before those views (`common.unflatten`)
        # dim vars defined before the function's dataflow block (its parameters' and the window sizes' bound
        # there: `converters.window_dims`), and the bindings of those sizes (moved there: `relax_builder`)
        self.head_vars: set = set()
        self.window_sizes: list = []

    # -- binding ---------------------------------------------------------------------------------
    def _new_var(self, hint: str) -> tirx.Var:
        v = tirx.Var(hint, I64)
        self.analyzer.update(v, ConstIntBound(0, ConstIntBound.POS_INF))
        return v

    def new_dim(self, hint: str) -> tirx.Var:
        """A fresh int64 dim var (>= 0), for a converter's match_cast."""
        return self._new_var(hint)

    def bind_input_dim(self, d, hint: str = "d"):
        """The dim of a parameter shape for our dim `d` (int, or a var bound by this parameter)."""
        if isinstance(d, (int, np.integer)):
            return int(d)
        e = parse_dim(str(d))
        if isinstance(e, Sym):
            if e.name not in self.symbols:
                self.symbols[e.name] = self._new_var(e.name.lstrip("_") or "u")
            return self.symbols[e.name]
        if isinstance(e, Const):
            return e.value
        if e not in self.exprs:
            self.exprs[e] = self._new_var(hint)
        return self.exprs[e]

    def solve(self):
        """Bind symbols that only occur inside expression input dims when they can be solved for
        (``(T + 1)`` bound to ``d`` gives ``T = d - 1``; also ``-`` and ``*`` by known terms)."""
        progress = True
        while progress:
            progress = False
            for e, var in self.exprs.items():
                unbound = e.symbols - set(self.symbols)
                if len(unbound) != 1:
                    continue
                (sym,) = unbound
                val = _Inverter(self, sym).solve(e, var)
                if val is not None:
                    self.symbols[sym] = self.analyzer.simplify(val)
                    progress = True

    # -- translation -----------------------------------------------------------------------------
    def dim(self, d) -> tirx.PrimExpr:
        """Our dim -> an int64 PrimExpr over this function's vars (CompileError if unbound)."""
        if isinstance(d, (int, np.integer)):
            return tirx.IntImm(I64, int(d))
        try:
            e = parse_dim(str(d))
        except ValueError:
            raise CompileError(f"region function {self.fn_name!r}: unsupported dim expression "
                               f"{str(d)!r}") from None
        return self.analyzer.simplify(self.translate(e))

    def shape(self, dims) -> list:
        return [self.dim(d) for d in dims]

    def translate(self, e: DimExpr) -> tirx.PrimExpr:
        """A parsed dim -> a PrimExpr over this function's vars (not simplified)."""
        return _ToTir(self).visit(e)

    # -- proofs ----------------------------------------------------------------------------------
    def equal(self, a, b) -> bool:
        """Provably a == b (structurally or by the analyzer; symbolic dims are >= 0)."""
        if isinstance(a, int):
            a = tirx.IntImm(I64, a)
        if isinstance(b, int):
            b = tirx.IntImm(I64, b)
        return provably_equal(self.analyzer, a, b)

    def relax_equal(self, a, b) -> bool:
        """Provably a == b the way Relax's shape inference sees it (structurally, or by an analyzer
        that knows nothing about the vars): where this is False, converters make the equality
        explicit (match_cast) so that Relax can infer the result shape."""
        return provably_equal(self._plain, a, b)

    def positive(self, a) -> bool:
        if isinstance(a, int):
            return a > 0
        if isinstance(a, tirx.IntImm):
            return int(a.value) > 0
        return bool(self.analyzer.can_prove(a > 0))
