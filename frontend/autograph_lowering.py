"""Before the autograph conversion (`autograph.py`): `return`, `break` and `continue` rewritten into the
structured statements the control-flow ops can express.

* An early ``return`` inside an ``if``: the statements after the ``if`` move into the branches that do not return,
  so every ``if`` holding a ``return`` ends the function on each path (it becomes ``return cond(...)``). A
  ``return`` inside a loop is refused (the loop's value would need a flag of every type the function returns).
* ``break`` / ``continue``: a flag set where they stood; the statements after them run under ``if not flag``; a
  ``while`` tests ``not break_flag and test``; a ``for`` on a traced tensor runs its remaining steps doing nothing
  (a Python ``for`` stops at once).
"""
from __future__ import annotations

import ast
import copy

def at_line(new, at):
    """`new` placed at the first line of `at` only: a generated node spanning all of `at`'s lines would make
    Python report its calls at `at`'s last line (frames and tracebacks name the statement's first line)."""
    new.lineno, new.col_offset = at.lineno, at.col_offset
    new.end_lineno, new.end_col_offset = at.lineno, at.col_offset
    return new


_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_LOOPS = (ast.For, ast.While, ast.AsyncFor)


def find(stmts, kinds, into_loops: bool):
    """The first node of `kinds` in `stmts`, not inside nested functions (nor loops unless `into_loops`)."""
    todo = list(stmts)[::-1]
    while todo:
        n = todo.pop()
        if isinstance(n, kinds):
            return n
        if isinstance(n, _NESTED) or (not into_loops and isinstance(n, _LOOPS)):
            continue
        todo.extend(list(ast.iter_child_nodes(n))[::-1])
    return None


def always_returns(stmts) -> bool:
    for s in stmts:
        if isinstance(s, ast.Return):
            return True
        if isinstance(s, ast.If) and always_returns(s.body) and always_returns(s.orelse):
            return True
    return False


#: how many AST nodes early-return lowering may copy in one function: each `if` that returns on some paths
#: copies what follows it into both branches, so successive such `if`s double the code (25 of them: 2^25 copies)
COPY_BUDGET = 50_000


def lower_returns(stmts: list, refuse, budget: list | None = None) -> list:
    """`stmts` (a function body) with every `if` that holds a `return` ending the block (see the module doc)."""
    budget = [COPY_BUDGET] if budget is None else budget
    out = []
    for i, s in enumerate(stmts):
        if isinstance(s, ast.Return):
            return out + [s]            # what follows never runs
        if isinstance(s, _LOOPS):
            r = find(s.body + s.orelse, ast.Return, True)
            if r is not None:
                refuse(r, "`return` inside a loop is not converted; assign the result to a variable, `break`, and "
                          "return after the loop")
        elif isinstance(s, (ast.With, ast.Try, ast.AsyncWith)) and find([s], ast.Return, True) is not None:
            refuse(find([s], ast.Return, True), "`return` inside `with` / `try` is not converted; return after it")
        elif isinstance(s, ast.If) and find([s], ast.Return, True) is not None:
            rest = stmts[i + 1:]
            copies = (not always_returns(s.body)) + (not always_returns(s.orelse))
            budget[0] -= copies * sum(1 for r in rest for _ in ast.walk(r))
            if budget[0] < 0:
                refuse(s, "too many `if`s that return on some paths only: each copies the rest of the function "
                          "into both branches; assign the result to a variable and return once at the end")
            body = s.body if always_returns(s.body) else s.body + copy.deepcopy(rest)
            orelse = s.orelse if always_returns(s.orelse) else s.orelse + copy.deepcopy(rest)
            new = ast.If(s.test, lower_returns(body, refuse, budget), lower_returns(orelse, refuse, budget))
            return out + [at_line(new, s)]
        out.append(s)
    return out


def _name(id_, store=False, at=None):
    n = ast.Name(id_, ast.Store() if store else ast.Load())
    return at_line(n, at) if at is not None else n


def _set(flag: str, value: bool, at) -> ast.Assign:
    return at_line(ast.Assign([_name(flag, True, at)], ast.Constant(value)), at)


def _not_any(flags: list, at):
    test = _name(flags[0], at=at) if len(flags) == 1 else ast.BoolOp(ast.Or(), [_name(f, at=at) for f in flags])
    return at_line(ast.UnaryOp(ast.Not(), test), at)


def _guard(stmts: list, flags: dict, refuse) -> list:
    """`stmts` with `break` / `continue` setting their flag and what follows them guarded."""
    out = []
    for i, s in enumerate(stmts):
        if isinstance(s, (ast.Break, ast.Continue)):
            out.append(_set(flags["break" if isinstance(s, ast.Break) else "continue"], True, s))
            return out                  # what follows never runs
        if find([s], (ast.Break, ast.Continue), False) is None:
            out.append(s)
            continue
        if not isinstance(s, ast.If):
            refuse(find([s], (ast.Break, ast.Continue), False), "`break` / `continue` inside `with` / `try` is not "
                   "converted")
        out.append(at_line(ast.If(s.test, _guard(s.body, flags, refuse), _guard(s.orelse, flags, refuse)), s))
        rest = stmts[i + 1:]
        if rest:
            out.append(at_line(ast.If(_not_any(list(flags.values()), rest[0]),
                                                _guard(rest, flags, refuse), []), rest[0]))
        return out
    return out


def lower_jumps(loop, counter: int, refuse) -> tuple[list, object, str | None]:
    """(statements to run before the loop, the loop without `break` / `continue`, the break flag or None)."""
    if loop.orelse:
        refuse(loop, "a loop's `else:` block is not converted; use a flag")
    has_break = find(loop.body, ast.Break, False) is not None
    has_cont = find(loop.body, ast.Continue, False) is not None
    if not (has_break or has_cont):
        return [], loop, None
    flags = {}
    if has_break:
        flags["break"] = f"break_{counter}"
    if has_cont:
        flags["continue"] = f"continue_{counter}"
    body = _guard(loop.body, flags, refuse)
    pre, brk = [], flags.get("break")
    if has_cont:
        body = [_set(flags["continue"], False, loop)] + body
    loop = copy.copy(loop)
    if brk:
        pre.append(_set(brk, False, loop))
        if isinstance(loop, ast.While):
            loop.test = at_line(ast.BoolOp(ast.And(), [_not_any([brk], loop), loop.test]), loop)
        else:
            body = [at_line(ast.If(_not_any([brk], loop), body, []), loop)]
    loop.body = body
    return pre, loop, brk
