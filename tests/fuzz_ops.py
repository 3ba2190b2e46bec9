"""The fuzzer's flat ops: each `op_*(draw, p)` appends one statement to program `p` over values it can see, or
nothing when no value fits (see `fuzz_model.py` for what is tracked and why)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from dyntvm.ir.ops_nn import window_out_size

from fuzz_model import (ARITH, BOUND_LIMIT, COMPARE, FLOAT_UNARY, FLOATS, INTS, KNOWN_BUGS, SIZE_LIMIT,
                        UNARY, Val, broadcast_shape, broadcastable, derive, draw_from, exact_float, fused, is_float,
                        mask_over, numeric, operand, power_bound, render, result_dtype, selected_dim)


# ---------------------------------------------------------------------------------- elementwise
def op_float_unary(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.dtype != "bool"))
    if a is None:
        return
    op = draw_from(draw, FLOAT_UNARY)
    if fused(op, a) > SIZE_LIMIT or (op == "exp" and a.bound > 5) or (op in ("sin", "cos") and a.bound > 50):
        return
    arg = a.name
    if op in ("log", "sqrt", "rsqrt") and not a.exact:      # NaN/inf only where the input is exactly <= 0
        arg = f"F.abs({a.name}) + 1.0"
    bound = {"exp": lambda b: math.exp(b), "sqrt": lambda b: math.sqrt(b + 1), "gelu": lambda b: b,
             "log": lambda b: math.inf, "rsqrt": lambda b: math.inf}.get(op, lambda b: 1.0)(a.bound)
    dtype = a.dtype if is_float(a.dtype) else "float32"
    v = p.add(Val(p.name(), a.shape, dtype, exact=False, bound=bound, size=fused(op, a)))
    p.emit(f"{v.name} = F.{op}({arg})")


def op_unary(draw, p):
    op = draw_from(draw, UNARY)
    jumps = op in ("floor", "ceil", "round", "sign")
    a = draw_from(draw, p.visible(lambda v: v.dtype != "bool" and (v.exact or not jumps)))
    if a is None or fused(op, a) > SIZE_LIMIT:
        return
    v = p.add(replace(a, name=p.name(), size=fused(op, a), grid=0 if jumps else a.grid,
                      bound=1.0 if op == "sign" else a.bound + (1 if op in ("ceil", "round") else 0)))
    p.emit(f"{v.name} = F.{op}({a.name})")


def op_arith(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.dtype != "bool"))
    if a is None:
        return
    op = draw_from(draw, ARITH)
    b = operand(draw, p, a)
    (ea, ba, ga), (eb, bb, gb) = numeric(a), numeric(b)
    dtype = result_dtype(a, b)
    grid = ga + gb if op == "multiply" else max(ga, gb)
    if op == "divide":                     # by |b| + 1: never by zero
        dtype = "float64" if np.dtype(dtype).kind in "iu" else dtype
        den = repr(abs(b) + 1) if not isinstance(b, Val) else f"F.abs({b.name}) + 1"
        expr, exact, bound = f"F.divide({a.name}, {den})", False, ba
    elif op == "power":
        if bb > 3:
            return
        if np.dtype(dtype).kind in "iu":   # integer power: a non-negative exponent only
            exp = repr(abs(b)) if not isinstance(b, Val) else f"F.abs({b.name})"
            expr, exact, bound = f"F.power({a.name}, {exp})", True, max(ba, 1) ** 3
        else:                              # a positive base
            expr, exact, bound = f"F.power(F.abs({a.name}) + 0.5, {render(b)})", False, max(ba + 0.5, 2) ** 3
    else:
        first, second = (a, b) if draw(st.booleans()) else (b, a)
        expr = f"F.{op}({render(first)}, {render(second)})"
        bound = {"add": ba + bb, "subtract": ba + bb, "multiply": ba * bb}.get(op, max(ba, bb))
        exact = ea and eb and (np.dtype(dtype).kind in "iu" or exact_float(bound, grid))
    if bound > BOUND_LIMIT or fused(op, a, b) > SIZE_LIMIT:
        return
    v = p.add(Val(p.name(), broadcast_shape(a, b), dtype, exact=exact, bound=bound, grid=grid if exact else 0,
                  size=fused(op, a, b)))
    p.emit(f"{v.name} = {expr}")


def op_compare(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.exact and v.dtype != "bool"))
    if a is None:
        return
    b = operand(draw, p, a, lambda v: v.exact)
    op = draw_from(draw, COMPARE)
    if fused(op, a, b) > SIZE_LIMIT:
        return
    v = p.add(Val(p.name(), broadcast_shape(a, b), "bool", bound=1, grid=0, size=fused(op, a, b)))
    p.emit(f"{v.name} = F.{op}({a.name}, {render(b)})")


def op_logical(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.dtype == "bool"))
    if a is None:
        return
    op = draw_from(draw, ("logical_and", "logical_or", "logical_not"))
    if op == "logical_not":
        v = p.add(replace(a, name=p.name(), size=fused(op, a)))
        p.emit(f"{v.name} = F.logical_not({a.name})")
        return
    b = draw_from(draw, p.visible(lambda v: v.dtype == "bool" and broadcastable(a, v)))
    v = p.add(Val(p.name(), broadcast_shape(a, b), "bool", bound=1, grid=0, size=fused(op, a, b)))
    p.emit(f"{v.name} = F.{op}({a.name}, {b.name})")


def op_where(draw, p):
    c = draw_from(draw, p.visible(lambda v: v.dtype == "bool"))
    x = c and draw_from(draw, p.visible(lambda v: v.dtype != "bool" and broadcastable(c, v)))
    if x is None:
        return
    y = operand(draw, p, x, lambda v: broadcastable(c, v))
    (ex, bx, gx), (ey, by, gy) = numeric(x), numeric(y)
    if fused("where", c, x, y) > SIZE_LIMIT:
        return
    v = p.add(Val(p.name(), broadcast_shape(c, x, y), result_dtype(x, y), exact=ex and ey, bound=max(bx, by),
                  grid=max(gx, gy), size=fused("where", c, x, y)))
    p.emit(f"{v.name} = F.where({c.name}, {x.name}, {render(y)})")


def op_cast(draw, p):
    a = draw_from(draw, p.visible())
    if a is None:
        return
    to = draw_from(draw, FLOATS + INTS + ("bool",))
    if is_float(a.dtype) and (to in INTS or to == "bool" and not a.exact):
        return          # float -> int of NaN/inf is unspecified (inputs hold some); -> bool jumps at 0
    exact = a.exact and (to not in FLOATS or exact_float(a.bound, a.grid))
    v = p.add(replace(a, name=p.name(), dtype=to, exact=exact, bound=1 if to == "bool" else a.bound,
                      grid=0 if to not in FLOATS else a.grid, size=fused("cast", a)))
    p.emit(f"{v.name} = F.cast({a.name}, {to!r})")


def op_clip(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.dtype != "bool"))
    if a is None or fused("clip", a) > SIZE_LIMIT:
        return
    lo = draw_from(draw, (-1, 0, None))
    hi = draw_from(draw, (1, 2)) if lo is None or draw(st.booleans()) else None
    v = p.add(replace(a, name=p.name(), size=fused("clip", a)))
    p.emit(f"{v.name} = F.clip({a.name}, {lo!r}, {hi!r})")


# ---------------------------------------------------------------------------------- reductions
def _sum_dtype(dt, op):
    k = np.dtype(dt).kind
    if op == "mean":
        return dt if k == "f" else "float64"
    if op in ("sum", "prod") and k in "biu":
        return "uint64" if k == "u" else "int64"
    return dt


def op_reduce(draw, p):
    op = draw_from(draw, ("sum", "mean", "max", "min", "prod", "argmax", "argmin"))
    arg = op.startswith("arg")
    a = draw_from(draw, p.visible(lambda v: v.ndim > 0 and (v.exact or not arg)
                                  and (v.dtype != "bool" or op in ("sum", "max", "min"))))
    if a is None:
        return
    if arg:
        axes = [draw(st.integers(0, a.ndim - 1))]
    else:
        axes = draw(st.lists(st.integers(0, a.ndim - 1), min_size=1, max_size=a.ndim, unique=True))
    # numpy raises on an empty max/min/argmax: only over axes known to be non-empty
    if op in ("max", "min", "argmax", "argmin") and not all(isinstance(a.shape[i], int) and a.shape[i] > 0
                                                            for i in axes):
        return
    keep = draw(st.booleans())
    n = math.prod(p.size_of(a.shape[i]) for i in axes)
    shape = tuple(1 if i in axes else d for i, d in enumerate(a.shape) if keep or i not in axes)
    axis = axes[0] if len(axes) == 1 and (arg or draw(st.booleans())) else tuple(sorted(axes))
    if arg:
        v = Val(p.name(), shape, "int64", bound=n, grid=0)
    else:
        bound = {"sum": a.bound * n, "prod": power_bound(a.bound, n), "mean": a.bound}.get(op, a.bound)
        dtype = _sum_dtype(a.dtype, op)
        exact = a.exact and op != "mean" and (np.dtype(dtype).kind != "f" or exact_float(
            bound, a.grid * (n if op == "prod" else 1)))
        if bound > BOUND_LIMIT:
            return
        v = Val(p.name(), shape, dtype, exact=exact, bound=bound, grid=a.grid * (n if op == "prod" else 1))
    p.add(v)
    p.emit(f"{v.name} = F.{op}({a.name}, axis={axis!r}, keepdims={keep})")


def op_matmul(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim in (1, 2, 3) and v.dtype != "bool"))
    if a is None:
        return
    k = a.shape[-1]
    # partner: a value with the same last dim, transposed (batch dims only from a itself), or a constant
    partners = p.visible(lambda v: v.dtype != "bool" and v.shape[-1:] == (k,) and (v.ndim <= 2 or v is a))
    b = draw_from(draw, partners) if partners and (not isinstance(k, int) or draw(st.booleans())) else None
    if b is None:
        if not isinstance(k, int):
            return
        m = draw(st.integers(1, 3))
        cshape = (k, m) if draw(st.booleans()) else (k,)
        c = (np.arange(math.prod(cshape)).reshape(cshape) % 5 - 2) / 2.0
        rhs, bshape, eb, bb, gb, bdt = (f"np.array({c.tolist()!r}, 'float32')", cshape, True, 2.0, 1, "float32")
    else:
        perm = list(range(b.ndim))
        if b.ndim >= 2:
            perm[-2:] = perm[-1], perm[-2]
        rhs, bshape, eb, bb, gb, bdt = (f"F.transpose({b.name}, {tuple(perm)!r})", tuple(b.shape[i] for i in perm),
                                        b.exact, b.bound, b.grid, b.dtype)
    shape = broadcast_shape(Val("", a.shape[:-2], "f"), Val("", bshape[:-2], "f")) + \
        (a.shape[-2:-1] if a.ndim > 1 else ()) + (bshape[-1:] if len(bshape) > 1 else ())
    dtype = np.result_type(a.dtype, bdt).name
    bound = a.bound * bb * p.size_of(k)
    exact = a.exact and eb and (np.dtype(dtype).kind != "f" or exact_float(bound, a.grid + gb))
    if bound > BOUND_LIMIT:
        return
    v = p.add(Val(p.name(), shape, dtype, exact=exact, bound=bound, grid=a.grid + gb))
    p.emit(f"{v.name} = F.matmul({a.name}, {rhs})")


# ---------------------------------------------------------------------------------- shapes
def op_transpose(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 2))
    if a is None:
        return
    perm = draw(st.permutations(range(a.ndim)))
    v = derive(a, p, [a.shape[i] for i in perm])
    p.emit(f"{v.name} = F.transpose({a.name}, {tuple(perm)!r})")


def _slice_token(p, d, start, stop, step):
    if isinstance(d, int):
        return len(range(d)[start:stop:step])
    return p.token(f"{d}[{start}:{stop}:{step}]", p.size_of(d), (d,))


def op_slice(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1))
    if a is None:
        return
    ax = draw(st.integers(0, a.ndim - 1))
    d = a.shape[ax]
    if isinstance(d, int) and d > 0 and draw(st.integers(0, 3)) == 0:     # an int index drops the axis
        i = draw(st.integers(-d, d - 1))
        v = derive(a, p, a.shape[:ax] + a.shape[ax + 1:])
        p.emit(f"{v.name} = {a.name}[{', '.join([':'] * ax + [str(i)])}]")
        return
    bound = st.none() | st.integers(-4, 4)
    start, stop, step = draw(bound), draw(bound), draw(st.sampled_from((1, 1, 2, -1, -2)))
    v = derive(a, p, a.shape[:ax] + (_slice_token(p, d, start, stop, step),) + a.shape[ax + 1:])
    s = f"{'' if start is None else start}:{'' if stop is None else stop}" + (f":{step}" if step != 1 else "")
    p.emit(f"{v.name} = {a.name}[{', '.join([':'] * ax + [s])}]")


def op_reshape(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1))
    if a is None:
        return
    kind = draw(st.sampled_from(("flatten", "expand", "squeeze", "static", "minus1")))
    if kind == "flatten":
        s = draw(st.integers(0, a.ndim - 1))
        e = draw(st.integers(s, a.ndim - 1))
        group = a.shape[s:e + 1]
        merged = math.prod(group) if all(isinstance(d, int) for d in group) else \
            p.token(f"flat{group}", math.prod(p.size_of(d) for d in group), group)
        v = derive(a, p, a.shape[:s] + (merged,) + a.shape[e + 1:])
        p.emit(f"{v.name} = F.flatten({a.name}, {s}, {e})")
    elif kind == "expand":
        ax = draw(st.integers(0, a.ndim))
        v = derive(a, p, a.shape[:ax] + (1,) + a.shape[ax:])
        p.emit(f"{v.name} = F.expand_dims({a.name}, {ax})")
    elif kind == "squeeze":
        ones = [i for i, d in enumerate(a.shape) if d == 1]
        if not ones:
            return
        ax = draw_from(draw, ones)
        v = derive(a, p, a.shape[:ax] + a.shape[ax + 1:])
        p.emit(f"{v.name} = F.squeeze({a.name}, {ax})")
    else:
        # to (lead..., -1) or a static shape: keep the symbolic dims as they are (attrs then name them)
        static = math.prod(d for d in a.shape if isinstance(d, int))
        syms = [d for d in a.shape if not isinstance(d, int)]
        if kind == "static" and syms or static == 0:
            return
        divs = [k for k in range(1, static + 1) if static % k == 0]
        k = draw_from(draw, divs)
        if not syms:
            target, shape = (k, -1 if kind == "minus1" else static // k), (k, static // k)
        else:       # (*symbolic dims, k, static // k); no -1: numpy cannot infer it next to a 0 dim
            target = tuple(f"{a.name}.shape[{i}]" for i, d in enumerate(a.shape) if not isinstance(d, int)) + \
                (k, static // k)
            shape = tuple(syms) + (k, static // k)
        v = derive(a, p, shape)
        p.emit(f"{v.name} = F.reshape({a.name}, ({', '.join(map(str, target))},))")


def op_concat(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1))
    if a is None:
        return
    ax = draw(st.integers(0, a.ndim - 1))
    stack = draw(st.booleans())
    same = (lambda v: v.shape == a.shape) if stack else \
        (lambda v: v.ndim == a.ndim and all(x == y for i, (x, y) in enumerate(zip(v.shape, a.shape)) if i != ax))
    b = draw_from(draw, p.visible(lambda v: same(v) and (v.dtype == "bool") == (a.dtype == "bool")))
    dtype = np.result_type(a.dtype, b.dtype).name
    exact = a.exact and b.exact and (not is_float(dtype) or exact_float(max(a.bound, b.bound), max(a.grid, b.grid)))
    common = dict(dtype=dtype, exact=exact, bound=max(a.bound, b.bound), grid=max(a.grid, b.grid),
                  size=a.size + b.size)
    if stack:
        ax = draw(st.integers(0, a.ndim))
        v = derive(a, p, a.shape[:ax] + (2,) + a.shape[ax:], **common)
        p.emit(f"{v.name} = F.stack([{a.name}, {b.name}], axis={ax})")
        return
    x, y = a.shape[ax], b.shape[ax]
    n = x + y if isinstance(x, int) and isinstance(y, int) else \
        p.token(f"({x}+{y})", p.size_of(x) + p.size_of(y), (x, y))
    v = derive(a, p, a.shape[:ax] + (n,) + a.shape[ax + 1:], **common)
    p.emit(f"{v.name} = F.concat([{a.name}, {b.name}], axis={ax})")


def op_split(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1))
    if a is None:
        return
    ax = draw(st.integers(0, a.ndim - 1))
    d = a.shape[ax]
    if isinstance(d, int) and d > 1 and draw(st.booleans()):
        k = draw_from(draw, [k for k in range(2, d + 1) if d % k == 0])
        sizes, sec = [d // k] * k, k
    else:
        sec = sorted(draw(st.lists(st.integers(0, 4), min_size=1, max_size=2)))
        b = [None, *sec, None]
        sizes = [_slice_token(p, d, lo, hi, 1) for lo, hi in zip(b[:-1], b[1:])]
    names = [derive(a, p, a.shape[:ax] + (n,) + a.shape[ax + 1:]).name for n in sizes]
    p.emit(f"{', '.join(names)}, = F.split({a.name}, {sec!r}, axis={ax})")


def op_take(draw, p):
    a = draw_from(draw, p.visible(lambda v: any(isinstance(d, int) and d > 0 for d in v.shape)))
    if a is None:
        return
    ax = draw_from(draw, [i for i, d in enumerate(a.shape) if isinstance(d, int) and d > 0])
    n = a.shape[ax]
    ishape = draw(st.sampled_from(((), (1,), (3,), (2, 2), (0,))))
    idx = np.asarray(draw(st.lists(st.integers(-n, n - 1), min_size=math.prod(ishape),
                                   max_size=math.prod(ishape)))).reshape(ishape)
    dt = draw(st.sampled_from(("int32", "int64")))
    v = derive(a, p, a.shape[:ax] + ishape + a.shape[ax + 1:])
    p.emit(f"{v.name} = F.take({a.name}, np.array({idx.tolist()!r}, {dt!r}).reshape({ishape!r}), axis={ax})")



def op_pad_tile(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1))
    if a is None:
        return
    if draw(st.booleans()):
        pw = [(draw(st.integers(0, 2)), draw(st.integers(0, 1))) for _ in a.shape]
        shape = [d + lo + hi if isinstance(d, int) else
                 (d if lo + hi == 0 else p.token(f"pad({d},{lo + hi})", p.size_of(d) + lo + hi, (d,)))
                 for d, (lo, hi) in zip(a.shape, pw)]
        value = 0 if a.dtype == "bool" else draw_from(draw, (0.0, 1.5))
        v = derive(a, p, shape, bound=max(a.bound, abs(value)), size=1.0)
        p.emit(f"{v.name} = F.pad({a.name}, {tuple(pw)!r}, {value!r})")
        return
    reps = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=a.ndim + 1)))
    nd = max(a.ndim, len(reps))
    full_reps = (1,) * (nd - len(reps)) + reps
    src = (1,) * (nd - a.ndim) + a.shape
    shape = [d * r if isinstance(d, int) else (d if r == 1 else p.token(f"({d}*{r})", p.size_of(d) * r, (d,)))
             for d, r in zip(src, full_reps)]
    v = derive(a, p, shape, size=1.0)
    p.emit(f"{v.name} = F.tile({a.name}, {reps!r})")


def op_broadcast(draw, p):
    """broadcast_to a shape that names the value's own dims (x.shape[i]), growing its 1s."""
    a = draw_from(draw, p.visible(lambda v: 1 in v.shape))
    if a is None:
        return
    lead = draw(st.integers(0, 1))
    shape, target = [], []
    for i, d in enumerate(a.shape):
        if d == 1 and draw(st.booleans()):
            shape.append(3), target.append("3")
        else:
            shape.append(d), target.append(f"{a.name}.shape[{i}]" if isinstance(d, str) else str(d))
    v = derive(a, p, [2] * lead + shape, size=1.0)
    p.emit(f"{v.name} = F.broadcast_to({a.name}, ({', '.join(['2'] * lead + target)},))")


def op_softmax(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1 and is_float(v.dtype) and v.bound <= 50))
    if a is None:
        return
    ax = draw(st.integers(-a.ndim, a.ndim - 1))
    op = draw_from(draw, ("softmax", "log_softmax") if a.ndim < 3 or not KNOWN_BUGS else ("softmax",))
    # (test_log_softmax_of_a_symbolic_3d_tensor_is_deterministic)
    v = derive(a, p, a.shape, exact=False, bound=1.0 if op == "softmax" else 2 * a.bound + 20, size=1.0)
    p.emit(f"{v.name} = F.{op}({a.name}, axis={ax})")


def op_full_like(draw, p):
    a = draw_from(draw, p.visible())
    if a is None:
        return
    to = draw_from(draw, (None, "float32", "int64", "bool"))
    fill = draw_from(draw, (0, 1, 2)) if to != "bool" else True
    v = derive(a, p, a.shape, dtype=to or a.dtype, exact=True, bound=abs(fill), grid=0, size=1.0)
    p.emit(f"{v.name} = F.full_like({a.name}, {fill!r}, {to!r})")

# ---------------------------------------------------------------------------------- dynamic shapes
def op_boolean_mask(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1))
    if a is None:
        return
    ax = draw(st.integers(0, a.ndim - 1))
    m = mask_over(draw, p, a.shape[ax])
    if m is None:
        return
    v = derive(a, p, a.shape[:ax] + (selected_dim(p, m),) + a.shape[ax + 1:], size=1.0)
    p.emit(f"{v.name} = F.boolean_mask({a.name}, {m.name}, axis={ax})")


def op_take_masked(draw, p):
    """take along any axis, with indices that are in range by construction: nonzero of a mask over it."""
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1))
    if a is None:
        return
    ax = draw(st.integers(0, a.ndim - 1))
    m = mask_over(draw, p, a.shape[ax])
    if m is None:
        return
    n = p.fresh(p.size_of(a.shape[ax]))
    v = derive(a, p, a.shape[:ax] + (n,) + a.shape[ax + 1:], size=1.0)
    p.emit(f"{v.name} = F.take({a.name}, F.nonzero({m.name})[0], axis={ax})")


def op_nonzero(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.exact))
    if a is None:
        return
    n = p.fresh(math.prod(p.size_of(d) for d in a.shape))
    v = p.add(Val(p.name(), (a.ndim, n), "int64", bound=max([p.size_of(d) for d in a.shape] + [1]), grid=0))
    p.emit(f"{v.name} = F.nonzero({a.name})")


def op_unique(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.exact))
    if a is None:
        return
    inv, cnt = draw(st.booleans()), draw(st.booleans())
    numel = math.prod(p.size_of(d) for d in a.shape)
    u = p.fresh(numel)
    outs = [p.add(replace(a, name=p.name(), shape=(u,), size=1.0))]
    if inv:
        outs.append(p.add(Val(p.name(), a.shape, "int64", bound=numel, grid=0)))
    if cnt:
        outs.append(p.add(Val(p.name(), (u,), "int64", bound=numel, grid=0)))
    p.emit(f"{', '.join(v.name for v in outs)} = F.unique({a.name}, return_inverse={inv}, return_counts={cnt})")


def op_topk(draw, p):
    a = draw_from(draw, p.visible(lambda v: v.exact and v.ndim >= 1))
    if a is None:
        return
    ax = draw(st.integers(0, a.ndim - 1))
    m = mask_over(draw, p, a.shape[ax])            # k = number of true entries: never more than the axis holds
    if m is None:
        return
    k = p.fresh(p.size_of(a.shape[ax]))
    shape = a.shape[:ax] + (k,) + a.shape[ax + 1:]
    vals = derive(a, p, shape, size=1.0)
    idx = p.add(Val(p.name(), shape, "int64", bound=p.size_of(a.shape[ax]), grid=0))
    largest = draw(st.booleans())
    p.emit(f"{vals.name}, {idx.name} = F.topk({a.name}, F.sum({m.name}), axis={ax}, largest={largest})")



def op_shape_ops(draw, p):
    """Data-dependent shapes from shape tensors: reshape to F.shape_of(x), arange to a count."""
    a = draw_from(draw, p.visible(lambda v: v.ndim >= 1))
    if a is None:
        return
    if draw(st.booleans()):
        dims = tuple(p.fresh(p.size_of(d)) for d in a.shape)
        v = derive(a, p, dims, size=1.0)
        p.emit(f"{v.name} = F.reshape(F.flatten({a.name}), F.shape_of({a.name}))")
        return
    m = mask_over(draw, p, a.shape[0])
    if m is None:
        return
    v = p.add(Val(p.name(), (p.fresh(p.size_of(a.shape[0])),), "int64", bound=p.size_of(a.shape[0]), grid=0))
    p.emit(f"{v.name} = F.arange(F.sum({m.name}))")


def _window_dim(p, d, k, s, lo, hi, ceil):
    if isinstance(d, int):
        return window_out_size(d, k, s, 1, lo, hi, ceil)
    return p.token(f"{d}~w{k},{s},{lo},{hi},{int(ceil)}", max(window_out_size(p.size_of(d), k, s, 1, lo, hi, ceil), 1),
                   (d,))


def op_window(draw, p):
    """conv / max_pool / avg_pool over the spatial axes of an (N, C, spatial...) value with a static C. The
    padding makes every size valid (a max_pool, which never counts padding, takes static sizes >= the kernel),
    so each window has a tap inside the input or counted padding: no -inf / NaN from empty windows."""
    a = draw_from(draw, p.visible(lambda v: v.dtype != "bool" and (v.ndim in (1, 2) or v.ndim in (3, 4) and
                                                                   isinstance(v.shape[1], int) and v.shape[1] >= 1)))
    if a is None:
        return
    src = a.name
    if a.ndim < 3:            # a [L] value as [1, 1, L], an [A, B] one as [A, 1, B]
        src = f"F.expand_dims({a.name}, 1)" if a.ndim == 2 else f"F.expand_dims(F.expand_dims({a.name}, 0), 0)"
        a = replace(a, shape=(a.shape[0], 1, a.shape[1]) if a.ndim == 2 else (1, 1, a.shape[0]))
    kind = draw_from(draw, ("conv", "max_pool", "avg_pool"))
    ks = tuple(draw(st.integers(1, 3)) for _ in a.shape[2:])
    strides = tuple(draw(st.integers(1, 2)) for _ in ks)
    ceil = kind != "conv" and draw(st.booleans())
    if kind == "max_pool":
        if not all(isinstance(d, int) and d >= k for d, k in zip(a.shape[2:], ks)):
            return
        pads = tuple((draw(st.integers(0, (k - 1) // 2)), draw(st.integers(0, (k - 1) // 2))) for k in ks)
    elif not is_float(a.dtype):
        return
    else:
        pads = tuple((lo, max(k - lo, draw(st.integers(0, k)))) for k in ks for lo in [draw(st.integers(0, k))])
    shape = a.shape[:2] + tuple(_window_dim(p, d, k, s, lo, hi, ceil) for d, k, s, (lo, hi) in
                                zip(a.shape[2:], ks, strides, pads))
    if kind == "max_pool":
        v = p.add(replace(a, name=p.name(), shape=shape, size=1.0))
        p.emit(f"{v.name} = F.max_pool({src}, {ks!r}, {strides!r}, {pads!r}, ceil_mode={ceil})")
    elif kind == "avg_pool":
        v = p.add(Val(p.name(), shape, a.dtype, exact=False, bound=a.bound, grid=0))
        p.emit(f"{v.name} = F.avg_pool({src}, {ks!r}, {strides!r}, {pads!r}, ceil_mode={ceil}, "
               "count_include_pad=True)")
    else:
        c = a.shape[1]
        g = draw(st.sampled_from((1, c)))
        o = g * draw(st.integers(1, 2))
        w = (np.arange(o * (c // g) * math.prod(ks)).reshape((o, c // g) + ks) % 5 - 2) / 2.0
        bound = a.bound * (c // g) * math.prod(ks)
        if bound > BOUND_LIMIT:
            return
        v = p.add(Val(p.name(), (shape[0], o) + shape[2:], a.dtype, exact=a.exact and exact_float(bound, a.grid + 1),
                      bound=bound, grid=a.grid + 1))
        p.emit(f"{v.name} = F.conv({src}, np.array({w.tolist()!r}, {a.dtype!r}), stride={strides!r}, "
               f"padding={pads!r}, groups={g})")


FLAT_OPS = [op_float_unary, op_unary, op_arith, op_arith, op_compare, op_logical, op_where, op_cast, op_clip,
            op_reduce, op_matmul, op_transpose, op_slice, op_slice, op_reshape, op_concat, op_split, op_take,
            op_boolean_mask, op_take_masked, op_nonzero, op_unique, op_topk, op_pad_tile, op_broadcast, op_softmax,
            op_full_like, op_shape_ops, op_window, op_window]
