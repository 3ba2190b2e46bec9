"""Partitioner tests in the torch.fx style: small functions, expected regions, numeric check."""
import networkx as nx
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.tree import tree_flatten
from dyntvm.partition import OpListSelector, Selector, partition


def regions_of(g):
    """Top-level region name -> sorted op names inside (constants left out)."""
    return {n.attrs.name: sorted(m.op for m in n.subgraphs[0].nodes if m.op != "constant")
            for n in g.nodes if n.op == "region"}


def top_ops(g):
    return [n.op for n in g.nodes]


def chain(x):
    return F.tanh(F.exp(x) + 1.0) * 2.0


def dyn_between(x):
    a = F.tanh(x)
    m = F.boolean_mask(a, a[:, 0] > 0)
    return F.sum(m) + F.sum(a)


def two_dyn(x):
    u = F.unique(F.cast(x, "int64"))
    n = F.nonzero(x > 0)
    return F.sum(F.cast(u, "float32")) + F.sum(F.cast(n, "float32")), x * 2.0


def only_dynamic(x):
    return F.nonzero(x)


CASES = [
    (chain, [dt.TensorSpec(("N", 3))], {"chain_r0": ["add", "exp", "multiply", "tanh"]}, ["region"]),
    (dyn_between, [dt.TensorSpec(("N", 4))],
     {"dyn_between_r0": ["greater", "slice", "squeeze", "sum", "tanh"], "dyn_between_r1": ["add", "sum"]},
     ["region", "boolean_mask", "region"]),
    (only_dynamic, [dt.TensorSpec(("N",))], {}, ["nonzero"]),
]


@pytest.mark.parametrize("fn, specs, expected, ops", CASES, ids=[c[0].__name__ for c in CASES])
def test_expected_regions(fn, specs, expected, ops):
    g = dt.trace(fn, *specs)
    pg = partition(g)
    assert regions_of(pg) == expected
    assert top_ops(pg) == ops
    pg.lint()


def _acyclic(pg):
    return nx.is_directed_acyclic_graph(pg.to_networkx())


def test_cycle_case_is_split():
    """A -> dyn -> B plus A -> B: A and B must not merge (that region would feed itself)."""
    pg = partition(dt.trace(dyn_between, dt.TensorSpec(("N", 4))))
    r0, dyn, r1 = pg.nodes
    assert dyn.inputs[0] in r0.outputs and any(v in r0.outputs for v in r1.inputs)
    assert dyn.outputs[0] in r1.inputs
    assert _acyclic(pg)


@pytest.mark.parametrize("n", [0, 1, 6])
def test_partitioned_graph_matches_eager(n):
    x = np.random.default_rng(n).standard_normal((n, 4)).astype("float32")
    for fn in (chain, dyn_between, two_dyn):
        g = dt.trace(fn, dt.TensorSpec(("N", 4)))
        got = tree_flatten(dt.run_reference(partition(g), x))[0]
        want = tree_flatten(fn(x))[0]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_partition_is_deterministic_and_leaves_input_untouched():
    g = dt.trace(two_dyn, dt.TensorSpec(("N",)))
    before = str(g)
    p1, p2 = partition(g), partition(g)
    assert str(p1) == str(p2)
    assert str(g) == before


def test_nested_control_flow_bodies_are_partitioned():
    W = np.random.default_rng(0).standard_normal((4, 4)).astype("float32")

    def model(xs, h):
        def step(x, states):
            (h,) = states
            h2 = F.tanh(F.matmul(x, W) + h)
            h3 = F.cond(F.sum(h2) > 0, lambda: h2 * 2.0, lambda: F.boolean_mask(h2, h2[:, 0] > 0)[:1] + h2)
            return h3, [h3]
        return F.foreach(step, xs, [h])
    g = dt.trace(model, dt.TensorSpec(("T", 1, 4)), dt.TensorSpec((1, 4)))
    pg = partition(g)
    assert [n.op for n in pg.nodes] == ["region", "foreach"]         # x @ W over all steps (hoisted)
    (fe,) = [n for n in pg.nodes if n.op == "foreach"]
    body = fe.subgraphs[0]
    assert [n.op for n in body.nodes] == ["region", "cond"]
    cond = body.nodes[1]
    then_g, else_g = cond.subgraphs
    assert [n.op for n in then_g.nodes] == ["region"]
    assert [n.op for n in else_g.nodes] == ["region", "boolean_mask", "region"]
    names = [n.attrs.name for n in pg.walk() if n.op == "region"]
    assert len(names) == len(set(names)) == 5
    assert all(name.isidentifier() for name in names)
    xs = np.random.default_rng(1).standard_normal((5, 1, 4)).astype("float32")
    h0 = np.zeros((1, 4), "float32")
    for got, want in zip(tree_flatten(dt.run_reference(pg, xs, h0))[0], tree_flatten(model(xs, h0))[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_custom_selector_excludes_ops():
    g = dt.trace(chain, dt.TensorSpec(("N", 3)))
    pg = partition(g, OpListSelector(exclude={"exp"}))
    assert "exp" in top_ops(pg)
    assert all("exp" not in ops for ops in regions_of(pg).values())

    class Nothing(Selector):
        def select(self, node):
            return False
    assert "region" not in top_ops(partition(g, Nothing()))


def test_filter_can_prune_a_region():
    class NoTinyRegions(OpListSelector):
        def filter(self, nodes):
            return nodes if len(nodes) > 1 else []
    g = dt.trace(lambda x: F.nonzero(F.exp(x)), dt.TensorSpec(("N",)))
    assert top_ops(partition(g, NoTinyRegions())) == ["exp", "nonzero"]


def test_constants_are_copied_into_regions():
    c = np.arange(3, dtype="float32")
    g = dt.trace(lambda x: F.boolean_mask(x + c, x > 0) * c, dt.TensorSpec((3,)))
    pg = partition(g)
    assert "constant" not in top_ops(pg)
    for n in pg.nodes:
        if n.op == "region":
            assert any(m.op == "constant" for m in n.subgraphs[0].nodes)


def test_region_after_a_later_independent_dynamic_node():
    """A region whose first node comes early but which reads a dynamic node defined later must be
    placed after that node (regression: the order was computed from already-rewired inputs)."""
    def f(x, s):
        a = F.exp(x)
        n = F.cast(F.nonzero(s)[0, :1], "float32")
        return a * n
    g = dt.trace(f, dt.TensorSpec(("N",)), dt.TensorSpec(("M",)))
    pg = partition(g)
    assert top_ops(pg) == ["nonzero", "region"]
    x, s = np.ones(3, "float32"), np.ones(5, "float32")
    np.testing.assert_allclose(dt.run_reference(pg, x, s), f(x, s))


def test_view_only_regions_stay_in_numpy():
    """A region of nothing but views (slice/squeeze/reshape...) would only add a VM call and copies."""
    g = dt.trace(lambda x: F.nonzero(F.boolean_mask(x, x > 0)[1:].reshape((-1, 1))), dt.TensorSpec(("N",)))
    pg = partition(g)
    assert top_ops(pg) == ["region", "boolean_mask", "slice", "reshape", "nonzero"]
    x = np.array([1.0, -2.0, 3.0, 4.0], "float32")
    np.testing.assert_array_equal(dt.run_reference(pg, x), F.nonzero(F.boolean_mask(x, x > 0)[1:].reshape((-1, 1))))


def test_constant_folding_is_its_own_pass():
    """partition() leaves input-less regions (at every level) as regions; `fold_constants`, the pass the
    pipeline runs next, evaluates them into constants named `<region>_const<k>`."""
    from dyntvm.runtime.fold import fold_constants

    def fn(x):
        return x + 1.0, F.cond(F.sum(x) > 0, lambda: F.tanh(F.full((4,), 0.5)), lambda: x * 3.0), \
            F.exp(F.full((2,), 1.0)) * 2.0
    g = dt.trace(fn, dt.TensorSpec((4,)))
    pg = partition(g)
    inputless = sorted(n.attrs.name for n in pg.walk() if n.op == "region" and not n.inputs)
    assert inputless == ["fn_5then_r0", "fn_r1"]     # x + 1 and sum(x) > 0: one region; the input-less one apart
    folded = fold_constants(pg)
    assert not any(n.op == "region" and not n.inputs for n in folded.walk())
    assert {f"{r}_const0" for r in inputless} <= {n.name for n in folded.walk() if n.op == "constant"}
    x = np.ones(4, "float32")
    for got, want in zip(tree_flatten(dt.run_reference(folded, x))[0], tree_flatten(fn(x))[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("fn", [lambda x: F.arange(x.shape[0]), lambda x: F.full((x.shape[0] - 1, 2), 1.5),
                                lambda x: F.zeros((x.shape[0] * 3 // 2,)) + 1,
                                lambda x: F.arange(x.shape[0]) * 2 + F.sum(x)])
def test_region_whose_attrs_use_input_symbols_gets_a_carrier_input(fn, tmp_path):
    """A region of creation ops with dims from x.shape (no tensor input of its own) takes a value whose shape
    holds the symbol as an input, so the compiled function can bind it (it used to fail lint, or fold wrongly)."""
    model = dt.compile(fn, dt.TensorSpec(("N",)), cache_dir=str(tmp_path))
    regions = [n for n in model.graph.walk() if n.op == "region"]
    assert regions and all(n.inputs for n in regions)
    for n in (1, 2, 6):
        x = np.arange(n, dtype="float32")
        want, got = fn(x), model(x)
        assert got.shape == want.shape and got.dtype == want.dtype and np.allclose(got, want)
