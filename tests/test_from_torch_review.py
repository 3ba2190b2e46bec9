"""Review findings on `dt.from_torch`, each against torch eager at several sizes: split with sizes from symbolic
dims, max_pool's indices output (refused by name; the values alone still convert), torch.sym_min / sym_max as
dim expressions, nonzero of a 0-d tensor (torch's (1, 0) / (0, 0)), NaN's rank in sort / topk."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dyntvm as dt  # noqa: E402
from dyntvm.frontend.torch_ops import TorchImportError  # noqa: E402
from torch.export import Dim  # noqa: E402

from helpers import assert_same  # noqa: E402


def eager(module, *arrays):
    with torch.no_grad():
        out = module(*[torch.from_numpy(a) for a in arrays])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def check(model, module, *arrays):
    got = model(*arrays)
    got = list(got) if isinstance(got, tuple) else [got]
    want = eager(module, *arrays)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert_same(got, want)


rng = np.random.default_rng(0)


class SplitBySizes(torch.nn.Module):
    def forward(self, x, y):
        a, b = torch.split(torch.cat([x, y]) * 2, [x.shape[0], y.shape[0]])     # SymInt sizes N, M
        return a + 1, b.sum(0)


def test_split_with_symbolic_sizes_equals_torch_eager():
    module = SplitBySizes()
    model = dt.compile(dt.from_torch(module, (torch.randn(6, 3), torch.randn(4, 3)),
                                     dynamic_shapes={"x": {0: Dim("N")}, "y": {0: Dim("M")}}))
    for n, m in ((1, 4), (5, 0), (0, 2), (9, 1)):
        check(model, module, rng.standard_normal((n, 3)).astype(np.float32),
              rng.standard_normal((m, 3)).astype(np.float32))


class PoolWithIndices(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
        return values, indices


class PoolValues(torch.nn.Module):
    def forward(self, x):
        values, _ = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
        return values * 2


def test_max_pool_indices_used_are_refused_by_name():
    with pytest.raises(TorchImportError, match=r"max_pool2d_with_indices.default: the indices of the maxima "
                                               r"\(return_indices=True\) are used at test_from_torch_review.py:\d+"):
        dt.from_torch(PoolWithIndices(), (torch.randn(1, 2, 6, 6),))


def test_max_pool_with_indices_unused_converts():
    module = PoolValues()
    model = dt.compile(dt.from_torch(module, (torch.randn(1, 2, 6, 6),),
                                     dynamic_shapes={"x": {2: Dim("H", min=4), 3: Dim("W", min=4)}}))
    for h, w in ((4, 4), (5, 7), (9, 6)):
        check(model, module, rng.standard_normal((1, 2, h, w)).astype(np.float32))


class MinMax(torch.nn.Module):
    def forward(self, x, y):
        n = torch.sym_min(x.shape[0] * 2, y.shape[0] + 1)
        m = torch.sym_max(x.shape[0], y.shape[0] - 1)
        return torch.cat([x, x])[:n] * 2, torch.ones(m) * 3


def test_sym_min_and_sym_max_are_dim_expressions_equal_to_torch_eager():
    module = MinMax()
    graph = dt.from_torch(module, (torch.randn(5), torch.randn(3)),
                          dynamic_shapes={"x": {0: Dim("N")}, "y": {0: Dim("M", min=1)}})
    shapes = [v.type.shape for v in graph.outputs]
    assert any("min(" in str(d) for s in shapes for d in s) and any("max(" in str(d) for s in shapes for d in s)
    model = dt.compile(graph)
    for n, m in ((1, 4), (5, 3), (0, 2), (3, 7)):
        check(model, module, rng.standard_normal(n).astype(np.float32), rng.standard_normal(m).astype(np.float32))


class NonzeroOfScalar(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x.sum() > 0)


def test_nonzero_of_a_0d_tensor_has_torchs_shape():
    module = NonzeroOfScalar()
    model = dt.compile(dt.from_torch(module, (torch.randn(4),), dynamic_shapes={"x": {0: Dim("N")}}))
    for x in ([1.0, 2.0], [-1.0, -3.0], [], [0.5]):
        x = np.array(x, np.float32)
        check(model, module, x)                     # (1, 0) where the sum is positive, (0, 0) where not


class SortAndTopk(torch.nn.Module):
    def forward(self, x):
        down, up = torch.sort(x, dim=1, descending=True, stable=True), torch.sort(x, dim=0, stable=True)
        big, small = torch.topk(x, 3, dim=1), torch.topk(x, 2, dim=1, largest=False)
        return down.values, down.indices, up.values, up.indices, big.values, big.indices, small.values, small.indices


def test_sort_and_topk_rank_nan_as_torch_does():
    """Review 33 #13: torch ranks NaN above inf (a descending sort / largest topk puts NaN first, an ascending
    one last); F.topk, numpy's order, puts it last either way. Rows mixing NaN, inf, -inf and ties: the stable
    sorts' indices equal torch's; topk's order of ties is torch's choice, so its indices need only pick its
    values."""
    module = SortAndTopk()
    model = dt.compile(dt.from_torch(module, (torch.randn(4, 6),), dynamic_shapes={"x": {0: Dim("N")}}))
    row = np.array([1.0, np.nan, np.inf, -1.0, -np.inf, np.nan, 1.0, np.inf], np.float32)
    for n in (1, 2, 5):
        special = np.stack([rng.permutation(row)[:6] for _ in range(n)])
        for x in (special, rng.standard_normal((n, 6)).astype(np.float32)):
            got, want = model(x), eager(module, x)
            assert_same(list(got[:4]) + [got[4], got[6]], want[:4] + [want[4], want[6]], what=f"n={n}")
            for values, indices in ((got[4], got[5]), (got[6], got[7])):
                assert_same(np.take_along_axis(x, indices, axis=1), values, what="topk indices")
