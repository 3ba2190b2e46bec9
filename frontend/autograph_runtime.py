"""Run-time helpers of code converted by `autograph.py` (it calls them as ``ag__.if_stmt(...)`` and so on).

Each helper decides when the converted statement runs, as TF AutoGraph's ``ag__.if_stmt`` does: a condition
(or loop iterable) that is a traced tensor becomes a control-flow node (`F.cond`, `F.foreach`, `F.while_loop`);
anything else (a Python bool, int, list, a numpy array eagerly) runs as plain Python, with Python's semantics.
Branch and loop-body functions take the variables they assign as arguments and return them (the variables live
after the statement), so they are pure functions of their inputs, as the control-flow ops need.
"""
from __future__ import annotations

import builtins
import contextlib
import re

import numpy as np

from dyntvm.errors import TraceError

from ..ir.types import SymDim
from .control_flow import cond as _cond, foreach as _foreach, while_loop as _while_loop
from .tracer import Tensor, trace_error


class Undefined:
    """The value of a variable that has none yet (assigned later, or only on a path not taken). Using it
    raises a clear error rather than Python's UnboundLocalError far from the cause."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"<undefined {self.name}>"

    def _use(self, *_a, **_k):
        raise trace_error(f"variable {self.name!r} is used before it has a value (it is assigned only on a path "
                          "that did not run)")

    __bool__ = __call__ = __iter__ = __len__ = __getitem__ = __index__ = __float__ = __int__ = _use
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _use
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __matmul__ = __rmatmul__ = _use

    def __getattr__(self, attr):
        self._use()


def ld(read, name: str):
    """The current value of a variable (`read` is ``lambda: name``), or `Undefined` where it has none."""
    try:
        return read()
    except NameError:
        return Undefined(name)


def _traced(x) -> bool:
    return isinstance(x, Tensor)


def _tensor_pred(x, what: str, where: str):
    """A traced condition as the 0-d bool tensor `F.cond` / `F.while_loop` take (Python truthiness: != 0)."""
    from . import F
    if not _traced(x):
        return np.asarray(bool(x))
    if x.ndim != 0:
        raise trace_error(f"the condition of the {what} at {where} is a traced tensor {x.type}, not one value; "
                          "Python's `if` / `while` needs one value: reduce it (F.any, F.all, x.sum() > 0)")
    return x if x.dtype == np.bool_ else F.not_equal(x, np.zeros((), x.dtype))


_TENSORABLE = (Tensor, np.ndarray, np.generic, bool, int, float)


def _check_values(values, names, what: str, where: str, passthrough=None) -> list:
    """The values of `names` a traced statement outputs, as tensors (Python scalars are constants). Undefined
    and non-tensor values are refused by variable name; `passthrough` values (unchanged inputs) are kept."""
    out = []
    for name, v in zip(names, values):
        if isinstance(v, Undefined):
            raise trace_error(f"variable {name!r} is {what} at {where} and has no value before it; give it a "
                              "value (a tensor of the dtype and rank it will have) before the statement")
        if isinstance(v, _TENSORABLE) or (passthrough is not None and v is passthrough.get(name)):
            out.append(v)
        else:
            raise trace_error(f"variable {name!r} is {what} at {where} on a traced tensor, so it must be a tensor; "
                              f"it is a {type(v).__name__}")
    return out


# ------------------------------------------------------------------------------------------ if
def if_stmt(pred, then_fn, else_fn, args: tuple, out_names: tuple, where: str, returns: bool = False):
    """``if pred: then else: else``: each branch function takes `args` and returns the `out_names` values (or,
    with `returns`, the function's return value: both branches end the function)."""
    if not _traced(pred):
        return then_fn(*args) if pred else else_fn(*args)
    pred = _tensor_pred(pred, "`if`", where)
    if returns:
        def branch(fn, name):
            def run():
                res = fn(*args)
                if res is None:
                    raise trace_error(f"the {name} branch of the `if` at {where} (on a traced tensor) returns "
                                      "nothing; both branches must return values of the same structure")
                return res
            return run
        return _cond(pred, branch(then_fn, "then"), branch(else_fn, "else"))
    if not out_names:           # no variable to select: the branches still run (traced) once each, so that what
        _cond(pred, lambda: (then_fn(*args), np.False_)[1], lambda: (else_fn(*args), np.False_)[1])   # they do
        return ()               # is not lost silently (a traced value they leak is refused where it is used)
    inputs = dict(zip(_in_names(then_fn, len(args)), args))
    kept: dict = {}             # output -> the one non-tensor input value both branches leave as it is
    tensors: set = set()        # outputs a branch made a tensor

    def branch(fn, side):
        def run():
            res = fn(*args)
            vals = _check_values(res, out_names, f"assigned only in the {'else' if side == 'then' else 'then'} "
                                 "branch of the `if`", where, inputs)
            marks = []
            for name, v in zip(out_names, vals):
                passed = not isinstance(v, _TENSORABLE)
                (kept.__setitem__(name, v) if passed else tensors.add(name))
                if name in kept and name in tensors:
                    raise trace_error(f"variable {name!r} is a {type(kept[name]).__name__} before the `if` at "
                                      f"{where} (on a traced tensor) and a tensor after one branch; it must be a "
                                      "tensor in both")
                marks.append(np.False_ if passed else v)    # a placeholder output; the Python value is restored
            return tuple(marks)
        return run
    with _naming_outputs("`if`", where, out_names):
        res = _cond(pred, branch(then_fn, "then"), branch(else_fn, "else"))
    return tuple(kept.get(name, v) for name, v in zip(out_names, res))


@contextlib.contextmanager
def _naming_outputs(what: str, where: str, names):
    """A TraceError of the control-flow op a statement became names its outputs / states by number: say which
    variables those are."""
    try:
        yield
    except TraceError as e:
        if not names or getattr(e, "_named", False) or not re.search(r"\b(output|states|loop vars)\b", str(e)):
            raise                       # named already, or not about the outputs (an op of the body)
        listed = ", ".join(f"{i}: {n!r}" for i, n in enumerate(names))
        err = TraceError(f"{e}\n    (the {what} at {where} is converted with the variables {listed} as its "
                         "outputs / states, in that order)")
        err._named = True
        raise err from None


def _in_names(fn, n: int) -> tuple:
    return fn.__code__.co_varnames[:n]


def if_exp(pred, then_fn, else_fn):
    """``a if pred else b``."""
    if not _traced(pred):
        return then_fn() if pred else else_fn()
    return _cond(_tensor_pred(pred, "conditional expression", "this line"), then_fn, else_fn)


def not_(x):
    if _traced(x):
        from . import F
        return F.logical_not(_as_bool(x))
    return not x


def _as_bool(x):
    from . import F
    return x if x.dtype == np.bool_ else F.not_equal(x, np.zeros((), x.dtype))


def and_(*thunks):
    """``a and b and ...``, lazily as Python evaluates it; after a traced operand, the next ones run under an
    `F.cond` on it (``i < n and x[i] > 0`` reads ``x[i]`` only where ``i < n``)."""
    return _bool_op(list(thunks), True)


def or_(*thunks):
    return _bool_op(list(thunks), False)


def and_strict(*thunks):
    """``a and b``, where evaluating the operands after `a` cannot fail (`autograph._cannot_fail`): after a traced
    operand they are combined with `F.logical_and` (no `F.cond` per evaluation)."""
    return _bool_op(list(thunks), True, strict=True)


def or_strict(*thunks):
    return _bool_op(list(thunks), False, strict=True)


def _bool_op(thunks: list, is_and: bool, strict: bool = False):
    from . import F
    for i, t in enumerate(thunks):
        v = t()
        if _traced(v):
            v = _as_bool(v)
            if i == len(thunks) - 1:
                return v
            if strict:
                return (F.logical_and if is_and else F.logical_or)(v, _as_bool_any(_bool_op(thunks[i + 1:], is_and,
                                                                                             True)))
            rest = lambda: _as_bool_any(_bool_op(thunks[i + 1:], is_and))
            decided = lambda: np.asarray(not is_and)
            return _cond(v, rest, decided) if is_and else _cond(v, decided, rest)
        if bool(v) != is_and or i == len(thunks) - 1:
            return v                    # Python's short circuit: the deciding operand itself
    return None


def _as_bool_any(v):
    return _as_bool(v) if _traced(v) else np.asarray(bool(v))


# ---------------------------------------------------------------------------------------- loops
class StackedList:
    """After a loop on a traced tensor, a Python list the loop appended to: its items (those it had before the
    loop, then one per step) stacked on axis 0. `F.stack(lst)` and `lst[i]` work on it."""

    def __init__(self, name: str, prefix: list, stacked):
        self.name, self.prefix, self.stacked = name, prefix, stacked

    def tensor(self):
        from . import F
        if not self.prefix:
            return self.stacked
        return F.concat([F.stack(self.prefix), self.stacked])

    def __getitem__(self, i):
        return self.tensor()[i]

    def _no(self, *_a, **_k):
        raise trace_error(f"list {self.name!r} was appended to in a loop on a traced tensor, so its length is known "
                          "only at run time: use F.stack(lst) (the items stacked on a new axis) or lst[i]")

    __len__ = __iter__ = __bool__ = append = _no


def stack_(fn, xs, *args, **kwargs):
    """A call ``something.stack(xs, ...)``: F.stack of a `StackedList` is its stacked tensor."""
    if not isinstance(xs, StackedList):
        return fn(xs, *args, **kwargs)
    from . import F
    axis = args[0] if args else kwargs.get("axis", 0)
    t = xs.tensor()
    axis = axis + t.ndim if axis < 0 else axis
    if axis == 0:
        return t
    perm = list(range(1, t.ndim))
    perm.insert(axis, 0)
    return F.transpose(t, perm)


def loop_iter(fn, *args):
    """The iterable of ``for ... in range(...) / enumerate(...) / zip(...)``: Python's, or for traced arguments a
    `_TracedIter` the loop becomes a `foreach` over."""
    if fn in (builtins.range, builtins.enumerate, builtins.zip) and any(_traced(a) or isinstance(a, SymDim)
                                                                         for a in args):
        return _TracedIter(fn.__name__, args)
    return fn(*args)


class _TracedIter:
    def __init__(self, kind: str, args: tuple):
        self.kind, self.args = kind, args

    def data(self):
        """(the tensors foreach iterates, a function from their slices to the loop target's value)."""
        from . import F
        if self.kind == "range":
            return [F.arange(*self.args)], lambda xs: xs[0]
        if self.kind == "zip":
            return list(self.args), tuple
        x = self.args[0]
        start = self.args[1] if len(self.args) > 1 else 0
        return [F.arange(start, start + x.shape[0]), x], tuple


def for_stmt(iterable, body, init: tuple, names: tuple, lists: tuple, where: str, break_flag=None):
    """``for target in iterable: body``: `body(item, *carried)` returns (carried, one value per appended list).
    Returns the carried values and then the lists."""
    traced = _traced(iterable) or isinstance(iterable, _TracedIter)
    if not traced:
        n = len(names)
        vals = tuple(init[:n])
        for item in iterable:
            vals, steps = body(item, *vals)
            for lst, v in zip(lists_of(init, n, lists), steps):
                lst.append(v)
            if break_flag is not None and vals[break_flag] is True:
                break
        return tuple(vals) + tuple(init[n:])
    data, item_of = iterable.data() if isinstance(iterable, _TracedIter) else ([iterable], lambda xs: xs[0])
    return _traced_loop("for", where, names, lists, init,
                        lambda fn, carried: _foreach(lambda xs, st: fn(item_of(xs), st), data, carried),
                        lambda item, vals: body(item, *vals))


def lists_of(init: tuple, n: int, lists: tuple) -> list:
    """The appended-list objects among a loop's inputs (after the carried values)."""
    return list(init[n:n + len(lists)])


def _traced_loop(kind, where, names, lists, init, run, call):
    n = len(names)
    carried = _check_values(init[:n], names, f"carried by the `{kind}` loop", where)
    prefixes = []
    for name, lst in zip(lists, init[n:]):
        if not isinstance(lst, list):
            raise trace_error(f"{name!r} is appended to in the `{kind}` loop at {where} (on a traced tensor) but is a "
                              f"{type(lst).__name__}, not a Python list")
        prefixes.append(list(lst))

    def step(item, states):
        vals, steps = call(item, tuple(states))
        vals = _check_values(vals, names, f"carried by the `{kind}` loop", where)
        return list(steps), list(vals)
    with _naming_outputs(f"`{kind}` loop", where, names):
        stacked, final = run(step, list(carried))
    return tuple(final) + tuple(StackedList(nm, p, s) for nm, p, s in zip(lists, prefixes, stacked))


def while_stmt(test, body, init: tuple, names: tuple, lists: tuple, where: str):
    """``while test: body``: `test(*carried)` and `body(*carried)` (which returns (carried, appended values)). A
    condition that becomes a traced tensor after some Python iterations makes the rest of the loop a while_loop
    (what those iterations appended comes first in the lists)."""
    n = len(names)
    vals = tuple(init[:n])
    while True:
        c = test(*vals)
        if _traced(c):
            break
        if not c:
            return vals + tuple(init[n:])
        vals, steps = body(*vals)
        for lst, v in zip(lists_of(init, n, lists), steps):
            lst.append(v)
    return _traced_loop("while", where, names, lists, vals + tuple(init[n:]),
                        lambda fn, carried: _while_loop(lambda *v: _tensor_pred(test(*v), "`while`", where),
                                                        lambda *v: fn(None, v), carried),
                        lambda _item, vals: body(*vals))
