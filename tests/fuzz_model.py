"""The value model of the fuzzer's random programs (`fuzz_programs.py`), and their inputs.

The generator keeps its own model of every value, without asking dyntvm's type rules (they are under test):

* `shape`: dim *tokens*: ints, the input symbols ``N`` / ``M``, or strings naming how a dim was made
  (``"N[1:3:1]"``, ``"_m4"`` for a mask). Equal tokens always mean dims dyntvm types as the same string
  (so broadcasting, concat and matmul between them trace); different tokens are never combined.
* `exact`: whether compiled code must reproduce the value bit for bit. Ints and bools are exact; floats are
  exact while they stay on a grid of ``2**-grid`` within ``bound`` (the inputs are multiples of 1/4, and
  +, -, *, sums and matmuls of them are exact in any order while they fit 24 bits); transcendental ops,
  divisions and means are not. Ops whose result jumps (comparisons, floor, casts to int, argmax, sorting,
  masks) only take exact inputs, so a rounding difference never flips a branch or a shape.
* `size`: how large the fused elementwise expression above it is. Compile time grows quickly with it today
  (issue 8 item 2: tanh, clip, maximum name their input several times), so chains stay short.

Nothing generated should raise in numpy: no out-of-range `take`, no empty `argmax`/`max`, no negative
integer power, no bool arithmetic (see codegen's UNSUPPORTED_EXACTNESS for what compiled code does there).
"""
from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import strategies as st

SYMBOLS = ("N", "M")
MAX_SIZE = 17                 # largest size a symbol takes in test_fuzz's runs
EXACT_LIMIT = 2.0 ** 24       # float32 integers
BOUND_LIMIT = 1e4             # keep magnitudes (and so tolerances) modest
MAX_OUTPUTS = 10
SIZE_LIMIT = 10               # fused-expression size (see module doc)
HEAVY = {"tanh": 3, "clip": 8, "maximum": 2, "minimum": 2, "sign": 2, "relu": 2, "exp": 2}
FLOATS, INTS = ("float32", "float64"), ("int32", "int64", "int8", "uint8")
FLOAT_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "erf", "sin", "cos")
UNARY = ("neg", "abs", "relu", "floor", "ceil", "round", "sign")
ARITH = ("add", "subtract", "multiply", "divide", "power", "maximum", "minimum")
COMPARE = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
SCALARS = (0.5, -1.5, 2.0, 0.0, 1.0, -0.25, 3.0)
#: Steer clear of bugs that have an xfail repro in test_fuzz.py (set False to look for them again).
KNOWN_BUGS = True


class Skip(Exception):
    """The op being generated would make a value that is not wanted: `gen_block` drops the op."""


@dataclass
class Val:
    name: str
    shape: tuple
    dtype: str
    exact: bool = True
    bound: float = 2.0
    grid: int = 2
    size: float = 1.0

    @property
    def ndim(self):
        return len(self.shape)

    def fits(self) -> bool:
        return self.bound <= BOUND_LIMIT


def is_float(dt):
    return dt in FLOATS


def exact_float(bound, grid) -> bool:
    return grid <= 24 and bound * 2.0 ** grid <= EXACT_LIMIT


def power_bound(b, n) -> float:
    return b ** n if b <= 1 or n * math.log(b) < 30 else math.inf


class Program:
    """One random program: inputs, nested blocks of statements, outputs."""

    def __init__(self):
        self.inputs: list[Val] = []
        self.lines: list[str] = []
        self.scopes: list[list[Val]] = [[]]
        self.indent = 1
        self.count = itertools.count()
        self.dmax = {s: MAX_SIZE for s in SYMBOLS}
        self.masks: dict = {}           # (scope id, mask name) -> dim of what it selects
        self.loops: list[set] = []      # per enclosing loop body: the dims that vary between its iterations
        self.scope_ids = [0]
        self.outputs: list[Val] = []

    # -- values and statements
    def name(self, prefix="v") -> str:
        return f"{prefix}{next(self.count)}"

    def add(self, v: Val) -> Val:
        self.scopes[-1].append(v)
        return v

    def emit(self, line: str):
        self.lines.append("    " * self.indent + line)

    def visible(self, pred=lambda v: True) -> list:
        return [v for s in self.scopes for v in s if pred(v)]

    def token(self, key: str, dmax: int, deps=()) -> str:
        """The dim token `key` (made from the dims `deps`); it varies between loop iterations where they do."""
        self.dmax.setdefault(key, dmax)
        for varying in self.loops:
            if any(d in varying for d in deps):
                varying.add(key)
        return key

    def fresh(self, dmax: int) -> str:
        """A new data-dependent dim (it varies between iterations of every enclosing loop)."""
        key = f"_t{next(self.count)}"
        self.dmax[key] = dmax
        for varying in self.loops:
            varying.add(key)
        return key

    def stable(self, v: Val) -> bool:
        """`v` has the same shape in every iteration of the innermost loop body."""
        return not self.loops or not set(v.shape) & self.loops[-1]

    @contextlib.contextmanager
    def block(self, header: str, loop=False):
        """A nested function (branch or loop body) with its own scope."""
        self.emit(header)
        self.indent += 1
        self.scopes.append([])
        self.scope_ids.append(next(self.count))
        if loop:
            self.loops.append(set())
        try:
            yield
        finally:
            self.indent -= 1
            self.scopes.pop()
            self.scope_ids.pop()
            if loop:
                self.loops.pop()

    def size_of(self, d) -> int:
        return d if isinstance(d, int) else self.dmax[d]

    def source(self, fname="prog") -> str:
        args = ", ".join(v.name for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        return f"def {fname}({args}):\n" + "\n".join(self.lines + [f"    return [{outs}]"]) + "\n"

    def __repr__(self):
        specs = ", ".join(f"{v.name}: {v.dtype}[{','.join(map(str, v.shape))}]" for v in self.inputs)
        return f"\n# {specs}\n{self.source()}"


def draw_from(draw, items):
    return draw(st.sampled_from(items)) if items else None


# ---------------------------------------------------------------------------------- helpers for the ops
def fused(op, *ins):
    return HEAVY.get(op, 1) * sum(v.size for v in ins if isinstance(v, Val))


def broadcastable(a: Val, b: Val) -> bool:
    for x, y in zip(reversed(a.shape), reversed(b.shape)):
        if not (x == y or x == 1 or y == 1):
            return False
    return True


def broadcast_shape(*vals) -> tuple:
    shapes = [v.shape for v in vals if isinstance(v, Val)]
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(nd):
        d = 1
        for s in shapes:
            j = i - (nd - len(s))
            if j >= 0 and s[j] != 1:
                d = s[j]
        out.append(d)
    return tuple(out)


def scalar_dtype(x, other: str) -> str:         # dyntvm's NEP 50 rule for Python scalars
    k = np.dtype(other).kind
    if isinstance(x, int):
        return other if k in "iuf" else "int64"
    return other if k == "f" else "float64"


def result_dtype(a, b) -> str:
    da = a.dtype if isinstance(a, Val) else scalar_dtype(a, b.dtype)
    db = b.dtype if isinstance(b, Val) else scalar_dtype(b, a.dtype)
    return np.result_type(da, db).name


def operand(draw, p, a: Val, pred=lambda v: True):
    """A partner for `a` in a binary op: a Python scalar or a visible value broadcastable with it."""
    partners = p.visible(lambda v: v.dtype != "bool" and broadcastable(a, v) and pred(v))
    if draw(st.booleans()) or not partners:
        s = draw_from(draw, SCALARS)
        s = abs(s) if np.dtype(a.dtype).kind == "u" else s
        return int(s) if np.dtype(a.dtype).kind in "iu" and s == int(s) else s
    return draw_from(draw, partners)


def numeric(x) -> tuple:
    """(exact, bound, grid) of an operand (a Val or a Python scalar)."""
    if isinstance(x, Val):
        return x.exact, x.bound, x.grid
    return True, abs(float(x)), 2


def render(x) -> str:
    return x.name if isinstance(x, Val) else repr(x)


def derive(a: Val, p, shape, **kw) -> Val:
    return p.add(replace(a, name=p.name(), shape=tuple(shape), **kw))


def mask_over(draw, p, tok):
    """A 1-d bool value over a dim `tok` (an existing one, or `sum(exact value over its other axes) > c`)."""
    have = p.visible(lambda v: v.dtype == "bool" and v.shape == (tok,))
    if have and draw(st.booleans()):
        return draw_from(draw, have)
    src = draw_from(draw, p.visible(lambda v: v.exact and tok in v.shape and (
        v.dtype == "bool" or exact_float(v.bound * math.prod(p.size_of(d) for d in v.shape), v.grid))))
    if src is None:
        return draw_from(draw, have)
    ax = src.shape.index(tok)
    others = tuple(i for i in range(src.ndim) if i != ax)
    expr = f"F.sum({src.name}, axis={others})" if others else src.name
    m = p.add(Val(p.name("m"), (tok,), "bool", bound=1, grid=0))
    c = draw_from(draw, (0, 1) if src.dtype == "bool" else (0.0, 0.5, -1.0))
    p.emit(f"{m.name} = F.greater({expr}, {c!r})")
    return m


def selected_dim(p, m: Val) -> str:
    """The dim of what mask `m` selects: one per mask value and tracing scope (as the frontend shares it)."""
    key = (p.scope_ids[-1], m.name)
    if key not in p.masks:
        p.masks[key] = p.fresh(p.size_of(m.shape[0]))
    return p.masks[key]


SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0])


def make_inputs(p: Program, sizes: dict, seed: int, special=False) -> list:
    """Arrays for `p`'s inputs with symbols at `sizes`: floats are multiples of 1/4 in [-2, 2] (with `special`,
    some NaN, inf, -inf and -0.0 too), signed ints in [-4, 4], unsigned in [0, 4]."""
    rng = np.random.default_rng(seed)
    out = []
    for v in p.inputs:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in v.shape)
        if v.dtype == "bool":
            a = rng.random(shape) < 0.5
        elif v.dtype in INTS:
            a = rng.integers(0 if v.dtype.startswith("u") else -4, 5, shape).astype(v.dtype)
        else:
            a = (rng.integers(-8, 9, shape) / 4).astype(v.dtype)
            if special:
                a = np.where(rng.random(shape) < 0.3, rng.choice(SPECIAL, shape), a).astype(v.dtype)
        out.append(np.asarray(a))
    return out
