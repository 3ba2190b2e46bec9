"""`from_torch`'s torch.cond (frontend/torch_cond.py): torch's asserts on a cond's output width decided while
importing, nested conds (``if / elif / else``) merged into one `case`; results equal to torch eager."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dyntvm as dt  # noqa: E402
from dyntvm.frontend.torch_cond import decide_over_choices  # noqa: E402
from dyntvm.runtime.model import partition_summary  # noqa: E402

from helpers import assert_same  # noqa: E402
import torch_examples as tex  # noqa: E402


def eager(module, *args):
    with torch.no_grad():
        out = module(*[torch.from_numpy(np.array(a, copy=True)) for a in args])
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]


def ops(graph) -> list:
    return [n.op for n in graph.walk()]


def kinds(model) -> dict:
    """{'region': n, 'cond': n, 'case': n, 'nonzero': n, ...} of a compiled model's partition."""
    out: dict = {}
    for ln in partition_summary(model.graph):
        key = "region" if ln.startswith("region") else ln.split("(")[-1].rstrip(")")
        out[key] = out.get(key, 0) + 1
    return out


class Chain(torch.nn.Module):
    """if m > 1: ... elif m > 0: ... elif m > -1: ... else: ...  (heads of widths 8, 3, 5, 3)"""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        for name, w in (("a", 8), ("b", 3), ("c", 5), ("d", 3)):
            self.register_buffer(name, torch.randn(4, w, generator=g))

    def forward(self, x):
        m = x.mean() * 2.0

        def third(h):
            return torch.cond(m + 1.0 > 0, lambda h: torch.tanh(h @ self.c), lambda h: h @ self.d, (h,))

        def second(h):
            return torch.cond(m > 0, lambda h: torch.relu(h @ self.b), third, (h,))
        y = torch.cond(m > 1.0, lambda h: h @ self.a, second, (x,))
        return y, y.sum(dim=1)


def test_an_elif_chain_is_one_case_with_no_run_time_check():
    m = Chain()
    x0 = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    g = dt.from_torch(m, (x0,), dynamic_shapes={"x": {0: "B"}})
    top = [n for n in g.nodes if n.op in ("cond", "case")]
    assert [n.op for n in top] == ["case"] and top[0].attrs.num_cases == 3
    assert "cond" not in ops(g)
    # torch asserts each cond's width range (u >= 3, u <= 8 ...): every branch's width satisfies it
    assert "nonzero" not in ops(g) and "assert_dims_equal" not in ops(g)
    model = dt.compile(g)
    widths = set()
    for B in (1, 2, 7):
        for shift in (2.0, 0.3, -0.3, -2.0):        # each of the four heads
            x = (np.random.default_rng(B).standard_normal((B, 4)) * 0.1 + shift).astype(np.float32)
            got = model(x)
            assert_same(list(got), eager(m, x), rtol=1e-5, atol=1e-5)
            widths.add(got[0].shape[1])
    assert widths == {8, 3, 5}


class ComputedInElse(torch.nn.Module):
    """The inner cond's branch reads a value the else branch computes: not merged (it would run unconditionally)."""

    def forward(self, x):
        m = x.mean()

        def other(x):
            s = m * 3.0
            return torch.cond(s > 0, lambda x: x * s, lambda x: x - s, (x,))
        return torch.cond(m > 1.0, lambda x: x + 1.0, other, (x,))


def test_a_chain_whose_branch_reads_the_else_branchs_values_stays_nested():
    m = ComputedInElse()
    x0 = np.ones((3, 2), np.float32)
    g = dt.from_torch(m, (x0,), dynamic_shapes={"x": {0: "B"}})
    assert "case" not in ops(g) and ops(g).count("cond") == 2
    model = dt.compile(g)
    for B in (1, 4):
        for shift in (2.0, 0.5, -0.5):
            x = (np.random.default_rng(B).standard_normal((B, 2)) * 0.1 + shift).astype(np.float32)
            assert_same([model(x)], eager(m, x), rtol=1e-5, atol=1e-5)


def test_size_comparisons_decided_over_a_conds_widths():
    choices = {"_u1": frozenset({24, 32}), "_u2": frozenset({"B", 16})}
    assert decide_over_choices(choices, "ge", "_u1", 24) is True
    assert decide_over_choices(choices, "le", "_u1", 32) is True
    assert decide_over_choices(choices, "gt", "_u1", 40) is False
    assert decide_over_choices(choices, "ge", "_u1", 30) is None          # 24 no, 32 yes: checked at run time
    assert decide_over_choices(choices, "ge", "_u2", 0) is True           # B >= 0 for every B
    assert decide_over_choices(choices, "le", "_u2", 16) is None          # depends on B
    assert decide_over_choices(choices, "eq", "_u1", "_u1") is True
    assert decide_over_choices(choices, "le", "N", 3) is None             # no cond's dim: not this rule's
    assert decide_over_choices(choices, "le", np.zeros(1), 3) is None


@pytest.mark.slow
def test_branchy_from_torch_has_the_partition_of_the_F_version():
    from dyntvm.examples import branchy as ex
    module = tex.Branchy()
    g = dt.from_torch(module, ex.make_inputs(np.random.default_rng(0), B=4), dynamic_shapes={"x": {0: "B"}})
    assert "nonzero" not in ops(g) and "assert_dims_equal" not in ops(g)   # 3 run-time width checks before
    t_model, f_model = dt.compile(g), dt.compile(ex.EXAMPLE.fn, *ex.EXAMPLE.specs)
    # the per-row cond is a select (`partition/cond_select.py`); in the F version hoisting then moves it all out
    # of the foreach, which goes; torch's rows are [1, 64] matmuls squeezed back (no lift rule): its foreach
    # stays, a body of one region (a compiled loop)
    assert kinds(f_model) == {"region": 7, "cond": 1, "case": 1}
    assert kinds(t_model) == {"region": 8, "foreach": 1, "cond": 1, "case": 1}
    (loop,) = [n for n in t_model.graph.nodes if n.op == "foreach"]
    assert [n.op for n in loop.subgraphs[0].nodes if n.op != "constant"] == ["region"]
    widths = set()
    for i, sizes in enumerate(ex.EXAMPLE.test_sizes):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        got = list(t_model(*inputs))
        assert_same(got, eager(module, *inputs), rtol=1e-4, atol=1e-4)
        assert_same(got, list(f_model(*inputs)), rtol=1e-4, atol=1e-4)
        widths.add(got[0].shape[1])
    assert len(widths) >= 3


def test_an_inner_condition_that_can_raise_is_not_hoisted_out_of_its_branch():
    """``elif e ** e > 1`` under ``if e < 0``: an integer to a negative power raises, so the inner condition
    must not run before the outer branch is chosen (it stays a nested cond); e = -2 takes the first branch in
    torch and in dyntvm alike."""
    class M(torch.nn.Module):
        def forward(self, x, e):
            def else_fn(x, e):
                return torch.cond(torch.pow(e, e) > 1, lambda x, e: x * 2.0, lambda x, e: x * 3.0, (x, e))
            return torch.cond(e < 0, lambda x, e: x + 1.0, else_fn, (x, e))
    m, x = M(), np.ones(3, np.float32)
    g = dt.from_torch(m, (x, np.array(2)))
    assert "case" not in [n.op for n in g.nodes]
    model = dt.compile(g)
    for e in (2, 0, -2):
        with torch.no_grad():
            want = m(torch.from_numpy(x), torch.tensor(e)).numpy()
        assert_same(model(x, np.array(e)), want)
