"""`slice_dyn` (a slice with tensor starts, stops and steps) inside the VM program (`vm_dynamic.DynamicOps`).

A plan kernel computes, per axis of the data, Python's ``slice(start, stop, step).indices(n)`` (the numpy
kernel indexes with Python slices: ONNX Slice's clamping too) as (first index, step) and the output length,
and whether every step is nonzero; the program reads the lengths as a shape (``tensor_to_shape`` +
``match_cast``), then a gather kernel copies ``x[first + i * step, ...]``. A zero step: the numpy kernel is
called back instead, and raises its error (in Python the executor then runs the call).
"""
from __future__ import annotations

import tvm

_PLAN = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_a: T.handle, h_b: T.handle, h_s: T.handle, {dim_params}, h_p: T.handle, h_c: T.handle,
           h_ok: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    a = T.match_buffer(h_a, (T.int64({m}),), "int64")
    b = T.match_buffer(h_b, (T.int64({m}),), "int64")
    s = T.match_buffer(h_s, (T.int64({m}),), "int64")
    p = T.match_buffer(h_p, (T.int64({two_nd}),), "int64")
    c = T.match_buffer(h_c, (T.int64({nd}),), "int64")
    ok = T.match_buffer(h_ok, (), "bool")
    ok[()] = True
    st = T.alloc_buffer((T.int64(2),), "int64")
{defaults}
{axes}
'''

# one sliced axis: `i` its entry in the bounds, `ax` its axis, `d` its length; st: 0 start, 1 stop
_AXIS = '''    if s[{i}] == T.int64(0):
        ok[()] = False
    else:
        for e in range(2):
            st[e] = T.if_then_else(e == 0, a[{i}], b[{i}])
            if st[e] < T.int64(0):
                st[e] = st[e] + {d}
            if s[{i}] > T.int64(0):
                st[e] = T.max(T.int64(0), T.min(st[e], {d}))
            else:
                st[e] = T.max(T.int64(-1), T.min(st[e], {d} - T.int64(1)))
        p[{two_ax}] = st[0]
        p[{two_ax} + 1] = s[{i}]
        if s[{i}] > T.int64(0):
            c[{ax}] = T.if_then_else(st[1] > st[0], (st[1] - st[0] - T.int64(1)) // s[{i}] + T.int64(1), T.int64(0))
        else:
            c[{ax}] = T.if_then_else(st[0] > st[1], (st[0] - st[1] - T.int64(1)) // (T.int64(0) - s[{i}]) + T.int64(1),
                                     T.int64(0))
'''

_GATHER = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_x: T.handle, h_p: T.handle, h_o: T.handle):
    T.func_attr({{"tirx.noalias": True}})
{dim_vars}
    x = T.match_buffer(h_x, ({in_dims},), "{dtype}")
    p = T.match_buffer(h_p, (T.int64({two_nd}),), "int64")
    o = T.match_buffer(h_o, ({out_dims},), "{dtype}")
    for {idx} in T.grid({out_dims}):
        o[{idx}] = x[{src}]
'''


def plan_primfunc(name: str, nd: int, axes: tuple):
    """``plan(starts[m], stops[m], steps[m], d0, ..., p[2 nd], lengths[nd], ok[])`` for the sorted-out `axes`."""
    from tvm.script import tirx as T  # noqa: F401 - the script's namespace
    defaults = "\n".join(f"    p[{2 * j}] = T.int64(0)\n    p[{2 * j + 1}] = T.int64(1)\n    c[{j}] = d{j}"
                         for j in range(nd))
    body = "".join(_AXIS.format(i=i, ax=ax, two_ax=2 * ax, d=f"d{ax}") for i, ax in enumerate(axes))
    src = _PLAN.format(name=name, dim_params=", ".join(f"d{j}: T.int64" for j in range(nd)), m=len(axes),
                       two_nd=2 * nd, nd=nd, defaults=defaults, axes=body)
    return tvm.script.from_source(src)


def gather_primfunc(name: str, nd: int, dtype: str):
    """``gather(x, p[2 nd], out)``: ``out[i...] = x[p[0] + i0 * p[1], ...]``."""
    from tvm.script import tirx as T  # noqa: F401 - the script's namespace
    src = _GATHER.format(
        name=name, dtype=dtype, two_nd=2 * nd,
        dim_vars="\n".join(f"    n{j} = T.int64()\n    k{j} = T.int64()" for j in range(nd)),
        in_dims=", ".join(f"n{j}" for j in range(nd)), out_dims=", ".join(f"k{j}" for j in range(nd)),
        idx=", ".join(f"i{j}" for j in range(nd)),
        src=", ".join(f"p[{2 * j}] + i{j} * p[{2 * j + 1}]" for j in range(nd)))
    return tvm.script.from_source(src)
