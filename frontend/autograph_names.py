"""Which Python names a statement reads and writes, for the autograph conversion (`autograph.py`).

Liveness on structured code: a statement's *upward-exposed* reads (`exposed`: names it may read before it
writes them) and its *definite* writes (`definite`: names every path through it assigns). A name is live after a
statement when a later statement of the block exposes it, or when it is live after the block and no later
statement definitely assigns it; a loop body's end also flows to its own start (the next iteration).
Reads inside nested functions, lambdas and comprehensions count (they may read the name when called), writes
inside them do not (they are the inner scope's)."""
from __future__ import annotations

import ast

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def reads(node) -> set:
    """Every name `node` loads (anywhere, nested scopes included)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Load, ast.Del)):
            out.add(n.id)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
    return out


def writes(node) -> set:
    """Every name `node` stores in its own scope (not inside nested functions or comprehensions)."""
    out = set()

    def visit(n, top):
        if isinstance(n, _SCOPES) and not top:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)                 # a def binds its name in the enclosing scope
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
        for c in ast.iter_child_nodes(n):
            visit(c, False)
    if isinstance(node, list):
        for s in node:
            visit(s, False)
    else:
        visit(node, False)
    return out


#: statements whose bodies may run zero times, stop anywhere, or run one of several arms (`match`; a `try*`)
_MAYBE = tuple(getattr(ast, k) for k in ("For", "While", "AsyncFor", "Try", "TryStar", "Match") if hasattr(ast, k))


def _walrus_targets(node) -> set:
    return {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)}


def definite(stmts: list) -> set:
    """Names assigned on every path through `stmts` (under-approximated: a name left out only stays live)."""
    out = set()
    for s in stmts:
        if isinstance(s, ast.If):
            out |= definite(s.body) & definite(s.orelse)
        elif isinstance(s, _MAYBE):
            continue
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            out |= definite(s.body)
        elif isinstance(s, ast.AnnAssign) and s.value is None:
            continue                            # `y: T` declares, assigns nothing
        else:
            out |= writes(s) - _walrus_targets(s)    # a walrus may sit in a branch of an expression
    return out


def exposed(stmts: list) -> set:
    """Names `stmts` may read before assigning them."""
    out, done = set(), set()
    for s in stmts:
        if isinstance(s, ast.If):
            here = reads(s.test) | exposed(s.body) | exposed(s.orelse)
        elif isinstance(s, ast.While):
            here = reads(s.test) | exposed(s.body) | exposed(s.orelse)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            here = reads(s.iter) | (exposed(s.body) - writes(s.target)) | exposed(s.orelse)
        else:
            here = reads(s)
        out |= here - done
        done |= definite([s])
    return out


def liveness(stmts: list, live_out: set) -> list:
    """The names live after each statement of `stmts`, given those live after the block."""
    live, after = set(live_out), []
    for s in reversed(stmts):
        after.append(set(live))
        live = (live - definite([s])) | exposed([s])
    return after[::-1]
