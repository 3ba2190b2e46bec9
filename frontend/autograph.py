"""Python control flow in traced functions: `convert(fn)` rewrites `fn`'s source with `ast` so that its `if`,
`for` and `while` statements call the run-time helpers of `autograph_runtime.py`, which make them `F.cond`,
`F.foreach` and `F.while_loop` where the condition or iterable is a traced tensor, and run them as plain Python
otherwise (as TF AutoGraph does). `dt.compile(fn, ..., autograph=True)` (and `dt.trace`, `dt.hybridize`) use it;
`dt.show_converted(fn)` returns the converted source.

Each converted statement becomes local functions of the variables it assigns:

    if x.sum() > 0:                    def if_true_1(y):                def if_false_1(y):
        y = x * 2              ->          y = x * 2; return (y,)           y = -x; return (y,)
    else:                              (y,) = ag__.if_stmt(x.sum() > 0, if_true_1, if_false_1,
        y = -x                                             (ag__.ld(lambda: y, 'y'),), ('y',), 'model.py:12')

Its outputs are the variables it assigns that are live after it (read later before being reassigned); a loop
carries those it assigns that the next iteration or the code after the loop reads (`autograph_names.py`); a
Python list appended to (``ys.append(v)`` at the top level of the loop body) gets one value per step, and after
a loop on a traced tensor is a `StackedList` that `F.stack(ys)` stacks. The new code keeps the user's file and
line numbers, so trace errors and tracebacks point at the user's lines; it runs with the function's globals,
closure cells and defaults.
"""
from __future__ import annotations

import ast
import inspect
import linecache
import os
import textwrap
import tokenize
import types

from dyntvm.errors import TraceError

from . import autograph_runtime
from .autograph_lowering import at_line, find, lower_jumps, lower_returns
from .autograph_names import exposed, liveness, reads, writes

_RUNTIME = "ag__"
_CONVERTED = "__dyntvm_autograph__"


class _Converter:
    def __init__(self, filename: str):
        self.filename, self.counter = filename, 0
        self.always_live: set = set()

    def refuse(self, node, msg: str):
        line = getattr(node, "lineno", 0)
        code = linecache.getline(self.filename, line).strip()
        raise TraceError(f"autograph: {msg}\n    at {os.path.basename(self.filename)}:{line}" +
                         (f": {code}" if code else ""))

    def where(self, node) -> str:
        return f"{os.path.basename(self.filename)}:{node.lineno}"

    def fresh(self) -> int:
        self.counter += 1
        return self.counter

    # ----------------------------------------------------------------------------- blocks
    def function(self, fn: ast.FunctionDef) -> ast.FunctionDef:
        for n in ast.walk(fn):
            if isinstance(n, (ast.Global, ast.Nonlocal)) and find(fn.body, (ast.If, ast.For, ast.While), True):
                self.refuse(n, "functions with `global` / `nonlocal` statements are not converted")
            if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)):
                self.refuse(n, "generators and coroutines are not converted")
        outer = self.always_live
        # names a nested function or lambda reads are live everywhere: it may be called later, anywhere
        self.always_live = set().union(*(_free_reads(n) for n in ast.walk(fn) if n is not fn and isinstance(
            n, (ast.FunctionDef, ast.Lambda))))
        fn.body = self.block(lower_returns(fn.body, self.refuse), set())
        self.always_live = outer
        fn.decorator_list = []
        return fn

    def block(self, stmts: list, live_out: set) -> list:
        out = []
        for s, live in zip(stmts, liveness(stmts, live_out | self.always_live)):
            out += self.stmt(s, live)
        return out

    def stmt(self, s, live: set) -> list:
        if isinstance(s, ast.If):
            return self.if_stmt(s, live)
        if isinstance(s, (ast.While, ast.For)):
            return self.loop(s, live)
        if isinstance(s, ast.AsyncFor):
            self.refuse(s, "`async for` is not converted")
        if isinstance(s, ast.FunctionDef):
            inner = self.function(s)        # its own scope: converted on its own
            inner.decorator_list = s.decorator_list
            return [inner]
        if isinstance(s, (ast.With, ast.AsyncWith)):
            s.items = [self.expr(i) for i in s.items]
            s.body = self.block(s.body, live)
            return [s]
        if isinstance(s, ast.Try):
            for part in ("body", "orelse", "finalbody"):
                setattr(s, part, self.block(getattr(s, part), live))
            for h in s.handlers:
                h.body = self.block(h.body, live)
            return [s]
        if isinstance(s, ast.ClassDef):
            return [s]
        return [self.expr(s)]

    def expr(self, node):
        return _Expressions().visit(node)

    # ------------------------------------------------------------------------------- if
    def if_stmt(self, s: ast.If, live: set) -> list:
        returns = find([s], ast.Return, True) is not None   # `lower_returns` made it end the function
        assigned = writes(s.body) | writes(s.orelse)
        outs = [] if returns else sorted(assigned & live)
        params = sorted(set(outs) | (assigned & (exposed(s.body) | exposed(s.orelse))))
        k = self.fresh()
        tail = [] if returns else [_return(_tuple(outs, s))]
        then_fn = _def(f"if_true_{k}", params, self.block(s.body, set(outs)) + tail, s)
        else_fn = _def(f"if_false_{k}", params, self.block(s.orelse, set(outs)) + tail, s)
        call = _call("if_stmt", [self.expr(s.test), _name(then_fn.name, s), _name(else_fn.name, s),
                                 _loads(params, s), _strs(outs, s), ast.Constant(self.where(s))], s,
                     [ast.keyword("returns", ast.Constant(True))] if returns else [])
        if returns:
            done = ast.Return(call)
        elif outs:
            done = ast.Assign([_tuple(outs, s, store=True)], call)
        else:
            done = ast.Expr(call)
        return [then_fn, else_fn, at_line(done, s)]

    # ----------------------------------------------------------------------------- loops
    def loop(self, s, live: set) -> list:
        k = self.fresh()
        pre, s, brk = lower_jumps(s, k, self.refuse)
        pre = [p for st in pre for p in self.stmt(st, live)]
        body, lists = self.appends(s.body, s)
        item = f"item_{k}"
        if isinstance(s, ast.For):
            body = [at_line(ast.Assign([s.target], _name(item, s)), s)] + body
        test_reads = reads(s.test) if isinstance(s, ast.While) else set()
        carried = sorted(writes(body) & (live | exposed(body) | test_reads) - {item})
        if brk and brk not in carried:
            carried.append(brk)
        steps = [tmp for _, tmp in lists]
        ret = ast.Return(at_line(ast.Tuple([_tuple(carried, s), _tuple(steps, s)], ast.Load()), s))
        body_fn = _def(f"loop_body_{k}", ([item] if isinstance(s, ast.For) else []) + carried,
                       self.block(body, set(carried) | set(steps)) + [at_line(ret, s)], s)
        names = [lst for lst, _ in lists]
        common = [_loads(carried + names, s), _strs(carried, s), _strs(names, s), ast.Constant(self.where(s))]
        if isinstance(s, ast.While):
            test_fn = _def(f"loop_test_{k}", carried, [at_line(ast.Return(self.expr(s.test)), s)], s)
            defs, call = [test_fn, body_fn], _call("while_stmt", [_name(test_fn.name, s), _name(body_fn.name, s)]
                                                   + common, s)
        else:
            it = self.expr(s.iter)
            if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and
                    it.func.id in ("range", "enumerate", "zip") and not it.keywords and
                    not any(isinstance(a, ast.Starred) for a in it.args)):
                it = _call("loop_iter", [it.func] + it.args, it)
            flag = [ast.Constant(carried.index(brk))] if brk else []
            defs, call = [body_fn], _call("for_stmt", [it, _name(body_fn.name, s)] + common + flag, s)
        outs = carried + names
        done = ast.Assign([_tuple(outs, s, store=True)], call) if outs else ast.Expr(call)
        return pre + defs + [at_line(done, s)]

    def appends(self, body: list, loop) -> tuple[list, list]:
        """The loop body with each top-level ``lst.append(v)`` (of a list the body does not assign) made
        ``append_K_lst = v``: the per-step values, and [(list name, step variable)]."""
        assigned, out, lists = writes(body), [], []
        for s in body:
            v = s.value if isinstance(s, ast.Expr) else None
            if (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "append" and
                    isinstance(v.func.value, ast.Name) and v.func.value.id not in assigned and len(v.args) == 1
                    and not v.keywords):
                lst = v.func.value.id
                if lst in [n for n, _ in lists]:
                    self.refuse(s, f"the loop appends to {lst!r} twice per step; append once (a tuple of tensors "
                                   "is not a tensor: stack them first)")
                tmp = f"append_{self.counter}_{lst}"
                lists.append((lst, tmp))
                s = at_line(ast.Assign([_name(tmp, s, True)], v.args[0]), s)
            out.append(s)
        return out, lists


class _Expressions(ast.NodeTransformer):
    """`not`, `and`, `or`, `a if c else b` and `something.stack(xs)` in an expression, as run-time helpers (they
    stay Python's own for Python values). Nested functions and lambdas are left as they are."""

    def visit_Lambda(self, node):
        return node

    def visit_FunctionDef(self, node):
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        return _call("not_", [node.operand], node) if isinstance(node.op, ast.Not) else node

    def visit_BoolOp(self, node):
        simple = all(_cannot_fail(v) for v in node.values[1:])     # checked before the operands are rewritten
        self.generic_visit(node)
        helper = ("and_" if isinstance(node.op, ast.And) else "or_") + ("strict" if simple else "")
        return _call(helper, [_thunk(v) for v in node.values], node)

    def visit_IfExp(self, node):
        self.generic_visit(node)
        return _call("if_exp", [node.test, _thunk(node.body), _thunk(node.orelse)], node)

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if ((isinstance(f, ast.Attribute) and f.attr == "stack") or (isinstance(f, ast.Name) and f.id == "stack")) \
                and node.args and not isinstance(node.args[0], ast.Starred):
            return at_line(ast.Call(_runtime("stack_", node), [f] + node.args, node.keywords), node)
        return node


def _cannot_fail(e) -> bool:
    """Whether evaluating `e` cannot fail nor act (names, constants, attributes, arithmetic and comparisons of
    them): `and` / `or` may then evaluate it even where Python would not, as one `logical_and` rather than an
    `F.cond` (which a condition like ``i < n and x[i] > 0`` needs, so that ``x[i]`` is read only when ``i < n``)."""
    return all(isinstance(n, (ast.Name, ast.Constant, ast.Attribute, ast.Compare, ast.BinOp, ast.UnaryOp, ast.BoolOp,
                              ast.Load, ast.cmpop, ast.operator, ast.unaryop, ast.boolop)) for n in ast.walk(e)) and \
        not any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv, ast.Mod)) for n in ast.walk(e))


def _free_reads(fn) -> set:
    """The names a nested function or lambda reads from enclosing scopes (not its parameters or locals)."""
    a = fn.args
    own = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    return reads(fn) - own - writes(body)


# ------------------------------------------------------------------------------ AST builders
def _name(id_, at, store=False):
    return at_line(ast.Name(id_, ast.Store() if store else ast.Load()), at)


def _runtime(attr, at):
    return at_line(ast.Attribute(_name(_RUNTIME, at), attr, ast.Load()), at)


def _call(helper, args, at, keywords=()):
    return at_line(ast.Call(_runtime(helper, at), list(args), list(keywords)), at)


def _thunk(e):
    return at_line(ast.Lambda(ast.arguments([], [], None, [], [], None, []), e), e)


def _tuple(names, at, store=False):
    return at_line(ast.Tuple([_name(n, at, store) for n in names], ast.Store() if store else ast.Load()), at)


def _strs(names, at):
    return at_line(ast.Tuple([ast.Constant(n) for n in names], ast.Load()), at)


def _loads(names, at):
    """(ag__.ld(lambda: a, 'a'), ...): each variable's value, or Undefined where it has none yet."""
    return at_line(ast.Tuple([_call("ld", [_thunk(_name(n, at)), ast.Constant(n)], at) for n in names],
                                       ast.Load()), at)


def _return(value):
    return at_line(ast.Return(value), value)


def _def(name, params, body, at):
    args = ast.arguments([], [ast.arg(p) for p in params], None, [], [], None, [])
    return at_line(ast.FunctionDef(name, args, body or [ast.Pass()], [], None), at)


# ---------------------------------------------------------------------------------- entry
def _source_tree(fn) -> tuple[ast.FunctionDef, str]:
    filename = fn.__code__.co_filename
    try:
        lines, first = inspect.getsourcelines(fn)
        src = "".join(lines)
    except (SyntaxError, tokenize.TokenError) as e:     # inspect tokenizes the file: edited since, not Python
        raise TraceError(f"autograph: cannot read the source of {fn.__qualname__} from {filename}:"
                         f"{fn.__code__.co_firstlineno} ({type(e).__name__}: {e}); {_STALE_HINT}") from None
    except (OSError, TypeError) as e:
        raise TraceError(f"autograph: cannot read the source of {fn.__qualname__} ({e}); define it in a file, or "
                         "write its control flow with F.cond / F.foreach / F.while_loop") from None
    where = f"{filename}:{fn.__code__.co_firstlineno}"
    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:                 # a body less indented than its def (a multi-line string): wrap it
        try:
            tree = ast.parse("if 1:\n" + src).body[0]
        except SyntaxError as e:        # the file on disk no longer holds the function there (edited since)
            raise TraceError(f"autograph: cannot parse the source of {fn.__qualname__} read from {where} ({e.msg}, "
                             f"line {fn.__code__.co_firstlineno + (e.lineno or 2) - 2}); {_STALE_HINT}") from None
        tree = ast.Module(tree.body, [])
        ast.increment_lineno(tree, -1)
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs or isinstance(defs[0], ast.AsyncFunctionDef):
        raise TraceError(f"autograph: {fn.__qualname__} is not a plain `def` function; write its control flow with "
                         "F.cond / F.foreach / F.while_loop")
    ast.increment_lineno(defs[0], fn.__code__.co_firstlineno - 1)
    if first != fn.__code__.co_firstlineno or not _same_code(defs[0], fn, filename):
        raise TraceError(f"autograph: the source of {fn.__qualname__} in {where} is not the code Python runs for it "
                         f"(the file was edited after the function was defined); {_STALE_HINT}")
    return defs[0], filename


_STALE_HINT = ("autograph converts the function's text in its file, so that must be the text the function was "
               "made from: re-import the module (or restart) after editing it")


_SAME_OP = {"LOAD_METHOD": "LOAD_ATTR"}      # 3.11 compiles `m.f(x)` either way, by where the AST came from


def _code_key(code) -> tuple:
    """What the compiler made of a function's text: its instructions (with their names and constants; jump
    offsets left out, as the two forms of a method call differ in length), names, constants (nested code objects
    in turn)."""
    import dis
    ops = tuple((_SAME_OP.get(i.opname, i.opname), None if i.opcode in dis.hasjrel + dis.hasjabs or
                 isinstance(i.argval, types.CodeType) else repr(i.argval)) for i in dis.get_instructions(code))
    consts = tuple(_code_key(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
                   for c in code.co_consts)
    return ops, code.co_varnames, code.co_freevars, consts


def _same_code(tree: ast.FunctionDef, fn, filename: str) -> bool:
    """Whether `tree` (the def read from the file) compiles to `fn.__code__`: a stale file (edited after import)
    gives other bytecode. Compiled inside a factory taking the function's free variables, so that they are
    closure cells as in `fn`. Where the text cannot be compiled standalone, it is taken as it is."""
    import __future__
    import copy
    plain = copy.deepcopy(tree)
    plain.decorator_list = []
    free = list(fn.__code__.co_freevars)
    factory = ast.FunctionDef("__autograph_check", ast.arguments([], [ast.arg(n) for n in free], None, [], [], None,
                                                                []), [plain], [], None)
    future = fn.__code__.co_flags & sum(getattr(__future__, f).compiler_flag for f in __future__.all_feature_names)
    try:
        code = compile(ast.fix_missing_locations(ast.Module([_in_owner_class(fn, factory)], [])), filename, "exec",
                       flags=future, dont_inherit=True)
    except (SyntaxError, ValueError, TypeError):
        return True
    factory_code = _factory_code(fn, code)
    made = [c for c in factory_code.co_consts if isinstance(c, types.CodeType) and c.co_name == plain.name]
    return not made or _code_key(made[0]) == _code_key(fn.__code__)


def _owner_class(fn) -> str | None:
    """The class whose body holds `fn`'s text, from its `__qualname__` (`Net.forward`, `Net.forward.<locals>.g`:
    `Net`; `f.<locals>.Net.forward`: `Net`), or None for a function outside any class. A name before `<locals>`
    is a function; any other enclosing name is a class."""
    parts = fn.__qualname__.split(".")[:-1]
    while parts:
        name = parts.pop()
        if name == "<locals>":
            parts.pop()                         # the function that holds the locals
        elif name.isidentifier():
            return name
    return None


def _in_owner_class(fn, factory: ast.FunctionDef) -> ast.stmt:
    """`factory` (a def holding `fn`'s re-compiled def) inside `class <owner>:` where `fn` was defined in a class:
    Python mangles a class-private name (`self.__w` in `class Net` is `self._Net__w`) only in a class body, so
    compiled outside one the text would not be the code `fn` runs (and the converted method would look up the
    unmangled name)."""
    owner = _owner_class(fn)
    return factory if owner is None else ast.ClassDef(owner, [], [], [factory], [])


def _factory_code(fn, module_code) -> types.CodeType:
    """The factory's code object in the compiled module of `_in_owner_class` (one class body deeper if wrapped)."""
    code = next(c for c in module_code.co_consts if isinstance(c, types.CodeType))
    return code if _owner_class(fn) is None else next(c for c in code.co_consts if isinstance(c, types.CodeType))


def _convert_tree(fn) -> tuple[ast.FunctionDef, str]:
    tree, filename = _source_tree(fn)
    return _Converter(filename).function(tree), filename


def show_converted(fn) -> str:
    """The source `dt.compile(fn, ..., autograph=True)` traces: `fn` with its `if` / `for` / `while` statements
    as calls of the ``ag__`` helpers (`dyntvm.frontend.autograph_runtime`).

    Example:
        >>> print(dt.show_converted(model))
    """
    fn = getattr(fn, "__wrapped__", fn) if getattr(fn, _CONVERTED, False) else fn
    fn = getattr(fn, "__func__", fn)
    return ast.unparse(ast.fix_missing_locations(_convert_tree(fn)[0]))


def convert(fn):
    """`fn` with Python control flow on traced tensors converted (see the module doc); a lambda (no statements)
    or an already converted function is returned as it is."""
    if getattr(fn, _CONVERTED, False):
        return fn
    if isinstance(fn, types.MethodType):
        return types.MethodType(convert(fn.__func__), fn.__self__)
    if not isinstance(fn, types.FunctionType):
        raise TraceError(f"autograph: converts Python functions and methods; got a {type(fn).__name__} (convert its "
                         "method, e.g. dt.compile(obj.forward, ..., autograph=True))")
    if fn.__name__ == "<lambda>":
        return fn
    tree, filename = _convert_tree(fn)
    free = list(fn.__code__.co_freevars)
    factory = ast.FunctionDef("__autograph_factory", ast.arguments([], [ast.arg(_RUNTIME)] + [ast.arg(n) for n in free],
                                                                   None, [], [], None, []),
                              [tree, ast.Return(ast.Name(tree.name, ast.Load()))], [], None)
    module = ast.fix_missing_locations(ast.Module([_in_owner_class(fn, factory)], []))
    code = compile(module, filename, "exec", dont_inherit=True)
    factory_code = _factory_code(fn, code)
    fn_code = next(c for c in factory_code.co_consts if isinstance(c, types.CodeType) and c.co_name == tree.name)
    cells = dict(zip(free, fn.__closure__ or ()))
    cells[_RUNTIME] = types.CellType(autograph_runtime)
    if hasattr(fn_code, "co_qualname"):        # tracebacks name the user's function, not the factory
        fn_code = fn_code.replace(co_qualname=fn.__code__.co_qualname)
    new = types.FunctionType(fn_code, fn.__globals__, fn.__name__, fn.__defaults__,
                             tuple(cells[n] for n in fn_code.co_freevars))
    new.__kwdefaults__, new.__annotations__ = fn.__kwdefaults__, dict(fn.__annotations__)
    new.__dict__.update(fn.__dict__)
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    new.__wrapped__ = fn
    setattr(new, _CONVERTED, True)
    return new
