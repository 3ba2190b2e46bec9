"""Shared test helpers: trace a function, run the graph with the reference interpreter (before and after
a JSON round trip) and compare with eager execution of the same function on numpy arrays."""
from __future__ import annotations

import numpy as np

import dyntvm as dt
from dyntvm.ir.serialize import graph_from_json, graph_to_json, graphs_equal
from dyntvm.ir.tree import tree_flatten

_is_array = lambda a: isinstance(a, (np.ndarray, np.generic))


def flat(x) -> tuple[list, object]:
    """(leaves as numpy arrays, tree spec) of a nested result."""
    leaves, spec = tree_flatten(x, is_leaf=_is_array)
    return [np.asarray(a) for a in leaves], spec


def assert_same(got, want, rtol=1e-5, atol=1e-6, what="result"):
    """Same nesting, and per leaf the same dtype, shape and values (NaNs equal)."""
    g, gs = flat(got)
    w, ws = flat(want)
    assert gs == ws, f"{what}: structure {gs} != {ws}"
    for i, (a, b) in enumerate(zip(g, w)):
        assert a.dtype == b.dtype, f"{what}[{i}]: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{what}[{i}]: shape {a.shape} != {b.shape}"
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{what}[{i}]")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"{what}[{i}]")


def round_trip(graph):
    """JSON round trip; asserts the copy equals the original and lints."""
    text, params = graph_to_json(graph)
    copy = graph_from_json(text, params)
    assert graphs_equal(graph, copy), "graph changed in a JSON round trip"
    return copy.lint()


def assert_trace_matches_eager(fn, specs, inputs_list, rtol=1e-5, atol=1e-6):
    """Trace `fn` once with `specs`, then for each inputs tuple check that the reference interpreter (on the
    graph and on its JSON copy) gives exactly the eager result `fn(*inputs)`. Returns the graph."""
    graph = dt.trace(fn, *specs)          # trace() lints
    copy = round_trip(graph)
    for inputs in inputs_list:
        want = fn(*inputs)
        shapes = [np.shape(a) for a in inputs]
        for g, name in ((graph, "traced"), (copy, "json copy")):
            got = dt.run_reference(g, *inputs)
            assert_same(got, want, rtol, atol, f"{name} at input shapes {shapes}")
    return graph


def ops_in(graph) -> set:
    """Op names used anywhere in `graph` (subgraphs included)."""
    return {n.op for n in graph.walk()}


def vm_calls(model, args) -> int:
    """VM Call instructions (builtins, kernels, functions) one model call executes (the VM's instrument hook)."""
    vm = model._thread_executor().vm
    count = [0]

    def hook(func, symbol, before, ret, *a):
        count[0] += bool(before)
        return 0
    vm.set_instrument(hook)
    try:
        model(*args)
    finally:
        vm.set_instrument(None)
    return count[0]
