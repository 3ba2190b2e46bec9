"""Compile time stays linear in the depth of fused elementwise chains (counted, not timed).

A chain ``h = op(h)`` is one fused PrimFunc. What TVM's lowering and LLVM codegen work on is measured
on the scheduled module (before TVM builds it), two ways:

* `tree_nodes`: expression nodes of every PrimFunc, each occurrence counted (what TVM's passes walk);
* `expanded_nodes`: every stored value with each ``Let`` variable replaced by its value (LLVM codegen
  binds each ``Let`` in an arithmetic analyzer that simplifies the value in this expanded form).

Before the fix a 4-deep tanh chain took > 40 s to compile: the tanh's expanded value names its input
~77 times, so depth d expanded to 77^d nodes; the NaN-exact maximum names each operand 3 times, so its
TIR tree itself grew 3^d. Both counts must now grow linearly: from depth 4 to 8 about twice what they
grew from 2 to 4.
"""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

tvm = pytest.importorskip("tvm")
import tvm_ffi  # noqa: E402
from tvm import tirx  # noqa: E402

from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.backends.cpu.cpu_schedule import cpu_target, legalize_and_fuse, schedule_module  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402

SPEC = dt.TensorSpec(("N", 16))
CHAINS = {
    "tanh": lambda h, x: F.tanh(h),                       # fast tanh (Let-bound polynomial)
    "sigmoid": lambda h, x: F.sigmoid(h),
    "maximum": lambda h, x: F.maximum(h * 0.9, x),        # NaN-exact: reads each operand 3 times
    "mixed": lambda h, x: F.sigmoid(F.maximum(F.tanh(h) * 0.9, x)),
}


def chain(name, depth):
    def model(x):
        h = x
        for _ in range(depth):
            h = CHAINS[name](h, x)
        return h
    return model


def scheduled(name, depth) -> list:
    """The PrimFuncs of the chain's region, fused and scheduled for the CPU."""
    mod = build_module(collect_regions(partition_graph(dt.trace(chain(name, depth), SPEC))))
    target = cpu_target()
    with target:
        mod = schedule_module(legalize_and_fuse(target)(mod), target)
    return [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]


def tree_nodes(funcs) -> int:
    n = [0]
    for f in funcs:
        tvm_ffi.structural_walk(f.body, (tvm.ir.expr.Expr, lambda e: n.__setitem__(0, n[0] + 1)))
    return n[0]


def _expanded(expr, bound: dict, memo: dict) -> int:
    """Tree size of `expr`, Let variables replaced by (the size of) their values."""
    h = expr.__chandle__()
    if h in memo:
        return memo[h]
    if isinstance(expr, tirx.Var):
        return bound.get(h, 1)
    if isinstance(expr, tirx.Let):
        bound[expr.var.__chandle__()] = _expanded(expr.value, bound, memo)
        size = _expanded(expr.body, bound, memo)
    else:
        kids = []
        tvm_ffi.structural_walk(expr, lambda e: kids.append(e) or tvm_ffi.WalkResult.SKIP
                                if isinstance(e, tvm.ir.expr.Expr) and not e.same_as(expr) else None,
                                order="pre")
        size = 1 + sum(_expanded(k, bound, memo) for k in kids)
    memo[h] = size
    return size


def expanded_nodes(funcs) -> int:
    stores = []
    for f in funcs:
        tvm_ffi.structural_walk(f.body, (tirx.BufferStore, stores.append))
    return sum(_expanded(s.value, {}, {}) for s in stores)


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_fused_chain_size_is_linear_in_depth(name):
    funcs = {d: scheduled(name, d) for d in (2, 4, 8)}
    for count in (tree_nodes, expanded_nodes):
        c2, c4, c8 = (count(funcs[d]) for d in (2, 4, 8))
        # linear growth: c8 - c4 == 2 (c4 - c2); exponential growth (3^d, 77^d) is > 40x
        assert 0 < c4 - c2 and c8 - c4 <= 4 * (c4 - c2), (count.__name__, c2, c4, c8)
        assert c8 <= 8 * c2, (count.__name__, c2, c4, c8)


@pytest.mark.parametrize("name", ["tanh", "maximum", "mixed"])
def test_deep_chain_compiles_and_matches_eager(name):
    model = chain(name, 9)                 # 9 (27 ops for "mixed"): minutes before the fix
    compiled = dt.compile(model, SPEC, use_cache=False)
    x = np.random.default_rng(0).standard_normal((33, 16)).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    np.testing.assert_allclose(compiled(x), model(x), rtol=1e-5, atol=1e-6, equal_nan=True)
