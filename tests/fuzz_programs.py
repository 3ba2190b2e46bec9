"""Random dyntvm programs, valid by construction, for the differential fuzzer (`test_fuzz.py`): the `programs`
strategy, and the control-flow ops, whose branches and bodies are nested blocks of random statements.

A program is Python source over `F` (`Program.source`), so a failure prints a runnable repro; `fuzz_model.py`
says what the generator tracks about each value, `fuzz_ops.py` holds the flat ops.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from fuzz_model import INTS, MAX_OUTPUTS, Program, Skip, Val, draw_from, exact_float
from fuzz_ops import FLAT_OPS

# ---------------------------------------------------------------------------------- control flow
MAX_DEPTH = 2


def _predicate(draw, p) -> str | None:
    """A 0-d bool expression that is computed exactly (so every mode takes the same branch)."""
    cands = p.visible(lambda v: v.exact and (v.dtype == "bool" or exact_float(
        v.bound * math.prod(p.size_of(d) for d in v.shape), v.grid)))
    v = draw_from(draw, cands)
    if v is None:
        return None
    c = draw_from(draw, (0, 1) if v.dtype == "bool" else (0.0, 1.5, -2.0))
    return f"F.greater(F.sum({v.name}), {c!r})"


def _carried(draw, p, init: Val, inner: Val) -> tuple[Val, str]:
    """The new value of a loop-carried `init` (seen in the body as `inner`): a body value of the same type that
    keeps what the body assumed of `inner` (exact on its grid; |x| <= its bound, clipped back if needed)."""
    cands = p.visible(lambda v: v.dtype == inner.dtype and v.shape == inner.shape and p.stable(v) and
                      (v.exact or not inner.exact) and (not v.exact or v.grid <= inner.grid))
    v = draw_from(draw, cands) or inner
    if v.bound <= inner.bound or inner.dtype == "bool":
        return v, v.name
    lim = inner.bound if np.dtype(inner.dtype).kind == "f" else int(inner.bound)
    return v, f"F.clip({v.name}, {-lim!r}, {lim!r})"


def op_cond(draw, p, depth):
    if depth >= MAX_DEPTH:
        return
    pred = _predicate(draw, p)
    templates = draw(st.lists(st.sampled_from(p.visible()), min_size=1, max_size=2)) if pred else None
    if not templates:
        return
    c = p.name("c")
    chosen = []
    for branch in ("then", "else"):
        with p.block(f"def {branch}_{c}():"):
            gen_block(draw, p, draw(st.integers(0, 2)), depth + 1)
            outs = [draw_from(draw, p.visible(lambda v: v.dtype == t.dtype and v.ndim == t.ndim)) for t in templates]
            p.emit(f"return [{', '.join(v.name for v in outs)}]")
        chosen.append(outs)
    res = []
    for a, b in zip(*chosen):
        shape = tuple(x if x == y else p.fresh(max(p.size_of(x), p.size_of(y))) for x, y in zip(a.shape, b.shape))
        res.append(p.add(Val(p.name(), shape, a.dtype, exact=a.exact and b.exact, bound=max(a.bound, b.bound),
                             grid=max(a.grid, b.grid))))
    p.emit(f"{', '.join(v.name for v in res)}, = F.cond({pred}, then_{c}, else_{c})")


def op_foreach(draw, p, depth):
    data = draw_from(draw, p.visible(lambda v: v.ndim >= 1)) if depth < MAX_DEPTH else None
    if data is None:
        return
    states = draw(st.lists(st.sampled_from(p.visible()), max_size=2, unique_by=lambda v: v.name))
    f = p.name("f")
    with p.block(f"def body_{f}(row_{f}, states_{f}):", loop=True):
        row = p.add(replace(data, name=f"row_{f}", shape=data.shape[1:], size=1.0))
        inner = [p.add(replace(s, name=p.name(), size=1.0)) for s in states]
        if inner:
            p.emit(f"[{', '.join(v.name for v in inner)}] = states_{f}")
        gen_block(draw, p, draw(st.integers(1, 3)), depth + 1)
        n_out = draw(st.integers(0 if states else 1, 2))
        outs = [draw_from(draw, p.visible(p.stable)) for _ in range(n_out)]
        new = [_carried(draw, p, s, i) for s, i in zip(states, inner)]
        p.emit(f"return [{', '.join(v.name for v in outs)}], [{', '.join(e for _, e in new)}]")
    stacked = [p.add(replace(o, name=p.name(), shape=(data.shape[0],) + o.shape, size=1.0)) for o in outs]
    final = [p.add(replace(s, name=p.name(), size=1.0, exact=s.exact and v.exact)) for s, (v, _) in zip(states, new)]
    p.emit(f"[{', '.join(v.name for v in stacked)}], [{', '.join(v.name for v in final)}] = "
           f"F.foreach(body_{f}, {data.name}, [{', '.join(s.name for s in states)}])")


def op_while(draw, p, depth):
    v0 = draw_from(draw, p.visible()) if depth < MAX_DEPTH else None
    if v0 is None:
        return
    w = p.name("w")
    k = draw(st.integers(0, 3))
    grow = v0.ndim >= 1 and draw(st.booleans())
    limit = draw(st.sampled_from((None, None, 1, 2, 4)))
    steps = min(k, limit if limit is not None else k)
    lead = p.fresh((p.size_of(v0.shape[0]) + 4) * 2 ** steps) if grow else None
    i_name, v_name = p.name("i"), p.name()
    vtype = replace(v0, name=v_name, shape=((lead,) + v0.shape[1:]) if grow else v0.shape, size=1.0)
    cond = f"F.less({i_name}, {k})"
    if vtype.exact and draw(st.booleans()) and exact_float(vtype.bound * 4096, vtype.grid):
        cond = f"F.logical_and({cond}, F.greater(F.sum({v_name}), {draw_from(draw, (0, 1))}))"
    with p.block(f"def cond_{w}({i_name}, {v_name}):"):
        p.emit(f"return {cond}")
    with p.block(f"def body_{w}({i_name}, {v_name}):", loop=True):
        if grow:
            p.loops[-1].add(lead)
        i = p.add(Val(i_name, (), "int64", bound=k, grid=0))
        v = p.add(vtype)
        gen_block(draw, p, draw(st.integers(0, 3)), depth + 1)
        outs = [draw_from(draw, p.visible(p.stable)) for _ in range(draw(st.integers(0, 2)))]
        if grow:
            ext = draw_from(draw, p.visible(lambda x: x.dtype == v.dtype and x.shape[1:] == v.shape[1:] and
                                            x.ndim == v.ndim and (x.exact or not v.exact) and x.bound <= v.bound
                                            and (not x.exact or x.grid <= v.grid)))
            new_v, expr = v, f"F.concat([{v.name}, {ext.name}], axis=0)"
        else:
            new_v, expr = _carried(draw, p, v0, v)
        p.emit(f"return [{', '.join(o.name for o in outs)}], [{i.name} + 1, {expr}]")
    n = p.fresh(max(steps, 1))
    stacked = [p.add(replace(o, name=p.name(), shape=(n,) + o.shape, size=1.0)) for o in outs]
    i_out = p.add(Val(p.name(), (), "int64", bound=k, grid=0))
    v_out = p.add(replace(vtype, name=p.name(), shape=((p.fresh(p.dmax[lead]),) + v0.shape[1:]) if grow
                          else v0.shape, exact=v0.exact and new_v.exact))
    lim = "" if limit is None else f", max_iterations={limit}"
    p.emit(f"[{', '.join(o.name for o in stacked)}], [{i_out.name}, {v_out.name}] = F.while_loop(cond_{w}, body_{w}, "
           f"[F.zeros((), 'int64'), {v0.name}]{lim})")


# ---------------------------------------------------------------------------------- programs
NESTED_OPS = [op_cond, op_foreach, op_while]


def gen_block(draw, p: Program, steps: int, depth: int):
    for _ in range(steps):
        op = draw(st.sampled_from(FLAT_OPS + NESTED_OPS))
        n_lines, sizes = len(p.lines), [len(s) for s in p.scopes]
        try:
            if op in NESTED_OPS:
                op(draw, p, depth)
            else:
                op(draw, p)
        except Skip:                   # drop what the op had added
            del p.lines[n_lines:]
            for s, n in zip(p.scopes, sizes):
                del s[n:]


@st.composite
def programs(draw, max_steps=10):
    """A random `Program` over 1-3 inputs with dims from N, M and small ints."""
    p = Program()
    dims = st.sampled_from(("N", 3, "M", 1, "N", 2, 4, 0))
    for _ in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(dims, min_size=draw(st.sampled_from((1, 2, 0))), max_size=3)))
        dtype = draw(st.sampled_from(("float32", "float32", "float32", "float64", "int32", "int64", "int8", "uint8",
                                      "bool")))
        v = Val(p.name(), shape, dtype, bound=1 if dtype == "bool" else 4, grid=0 if dtype in INTS + ("bool",) else 2)
        p.inputs.append(p.add(v))
    gen_block(draw, p, draw(st.integers(1, max_steps)), 0)
    made = p.scopes[0][len(p.inputs):] or p.scopes[0]
    p.outputs = made[-MAX_OUTPUTS:]            # every value made (not only the last): all are checked
    return p
