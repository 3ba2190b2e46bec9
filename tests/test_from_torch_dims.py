"""`dt.from_torch` and torch.export's size relations: `Dim` ranges checked on each call (InputError naming the dim
and its range), derived Dims (``2 * B``) as dyntvm expression dims, and torch's value asserts (`torch._check` on
an unbacked size: `_assert_scalar`, `sym_constrain_range*` nodes) enforced when the model runs."""
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dyntvm as dt  # noqa: E402
from dyntvm.frontend import torch_asserts  # noqa: E402
from dyntvm.frontend.torch_ops import TorchImportError  # noqa: E402
from torch.export import Dim  # noqa: E402

from helpers import assert_same  # noqa: E402


def eager(module, *arrays):
    with torch.no_grad():
        out = module(*[torch.from_numpy(a) for a in arrays])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


class HeadAndDouble(torch.nn.Module):
    def forward(self, x, y):
        return x[:, :3] + 1, y * 2


@pytest.fixture(scope="module")
def ranged():
    batch = Dim("B", min=2, max=64)
    graph = dt.from_torch(HeadAndDouble(), (torch.randn(4, 5), torch.randn(8)),
                          dynamic_shapes={"x": {0: batch}, "y": {0: 2 * batch}})
    return graph, dt.compile(graph)


def test_dim_range_and_derived_dim_become_the_graphs_checks(ranged):
    graph, _ = ranged
    assert graph.dim_ranges == {"B": (2, 64)}
    assert [v.type.shape for v in graph.inputs] == [("B", 5), ("(2 * B)",)]


@pytest.mark.parametrize("b", [2, 5, 64])
def test_sizes_inside_the_range_equal_torch_eager(ranged, b):
    _, model = ranged
    rng = np.random.default_rng(b)
    x, y = rng.standard_normal((b, 5)).astype(np.float32), rng.standard_normal(2 * b).astype(np.float32)
    assert_same(list(model(x, y)), eager(HeadAndDouble(), x, y))


@pytest.mark.parametrize("b", [0, 1, 65])
def test_a_size_outside_the_range_is_an_input_error_naming_dim_and_range(ranged, b):
    _, model = ranged
    with pytest.raises(dt.InputError, match=rf"dim B is {b} \(input 0 \('x'\) axis 0\), outside its range "
                                            r"2 <= B <= 64"):
        model(np.zeros((b, 5), np.float32), np.zeros(2 * b, np.float32))


def test_a_derived_dim_that_does_not_fit_is_an_input_error(ranged):
    _, model = ranged
    with pytest.raises(dt.InputError, match=r"input 1 \('y'\): axis 0 has size 7, which does not fit its dim "
                                            r"\(2 \* B\)"):
        model(np.zeros((3, 5), np.float32), np.zeros(7, np.float32))


def test_the_range_survives_save_and_load(ranged, tmp_path):
    _, model = ranged
    model.save(tmp_path / "m")
    loaded = dt.load(tmp_path / "m")
    with pytest.raises(dt.InputError, match="outside its range 2 <= B <= 64"):
        loaded(np.zeros((65, 5), np.float32), np.zeros(130, np.float32))


class AtLeastTwoPositive(torch.nn.Module):
    def forward(self, x):
        idx = torch.nonzero(x > 0)
        torch._check(idx.shape[0] >= 2)           # an unbacked size: torch records an _assert_scalar node
        return idx * 3


@pytest.fixture(scope="module")
def asserting():
    graph = dt.from_torch(AtLeastTwoPositive(), (torch.randn(6),), dynamic_shapes={"x": {0: Dim("N")}})
    return dt.compile(graph)


@pytest.mark.parametrize("x", [[1.0, -1.0, 2.0, 3.0], [5.0, 4.0], [-1.0, 2.0, 0.0, 1.0, -3.0, 7.0, 8.0]])
def test_torch_check_that_holds_runs_as_torch_eager(asserting, x):
    x = np.array(x, np.float32)
    assert_same([asserting(x)], eager(AtLeastTwoPositive(), x))


@pytest.mark.parametrize("x", [[1.0, -1.0, -2.0], [], [3.0]])
def test_torch_check_that_fails_is_an_execution_error_quoting_it(asserting, x):
    x = np.array(x, np.float32)
    with pytest.raises(RuntimeError):                           # torch eager refuses it too
        AtLeastTwoPositive()(torch.from_numpy(x))
    with pytest.raises(dt.ExecutionError, match=r"torch's run-time assertion .*u0 >= 2.* failed when the model ran"):
        asserting(x)


class SizeAtMostFour(torch.nn.Module):
    def forward(self, x):
        idx = torch.nonzero(x > 0)
        torch._check_is_size(idx.shape[0], max=4)
        return idx + 1


def test_size_constraint_is_enforced_at_run_time():
    model = dt.compile(dt.from_torch(SizeAtMostFour(), (torch.randn(6),), dynamic_shapes={"x": {0: Dim("N")}}))
    for x in ([1.0, -1.0, 2.0], [1.0, 2.0, 3.0, 4.0, -5.0], []):
        x = np.array(x, np.float32)
        assert_same([model(x)], eager(SizeAtMostFour(), x))
    with pytest.raises(dt.ExecutionError, match="torch's run-time assertion"):
        model(np.ones(5, np.float32))


def test_an_assertion_decided_false_while_importing_is_refused_by_name():
    node = types.SimpleNamespace(meta={"stack_trace": 'File "/m/model.py", line 7, in forward\n    torch._check(n > 9)'},
                                 name="ge", target=None)
    with pytest.raises(TorchImportError, match=r"'u0 > 9' can never hold .* at model.py:7: torch._check\(n > 9\)"):
        torch_asserts._assert_scalar(None, None, node, (False, "u0 > 9"), {})
    assert torch_asserts._assert_scalar(None, None, node, (True, "holds"), {}) is None


class GuardedIndex(torch.nn.Module):
    def forward(self, x):
        v = x[x > 0]
        torch._check(v.shape[0] >= 2)             # guards the reads of v[1] and v[-2] below
        return (v[-2] + v[1]) * 3.0, v[1:] * 2.0, x + 1.0


def test_an_assertion_is_checked_before_the_ops_it_guards():
    """Review 34 #11: the check was tied into the last output only, so the guarded index ran first on a too short
    `v` and failed with the index's error; now it raises torch's assertion, before. (An op that takes the size as
    a symbolic shape, `torch.zeros(v.shape[0] - 2)`, depends on no tensor to gate: it may still fail first, with
    its own error, `a dim must be >= 0`.)"""
    model = dt.compile(dt.from_torch(GuardedIndex(), (torch.tensor([1.0, 2.0, -1.0, 3.0]),),
                                     dynamic_shapes={"x": {0: Dim("N")}}))
    for x in ([1.0, 2.0, -1.0], [4.0, 5.0], [-1.0, 2.0, 0.5, 1.0, -3.0, 7.0, 8.0]):
        x = np.array(x, np.float32)
        assert_same(list(model(x)), eager(GuardedIndex(), x))
    for x in ([1.0, -2.0, -3.0], [], [-1.0]):
        with pytest.raises(RuntimeError):                           # torch eager refuses it too
            GuardedIndex()(torch.tensor(x))
        with pytest.raises(dt.ExecutionError, match=r"torch's run-time assertion .*u0 >= 2.* failed when the model"):
            model(np.array(x, np.float32))
