"""Regions that compute the same function share one compiled function (codegen/shared_regions.py)."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.build import collect_regions
from dyntvm.pipeline import partition_graph


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


def _chain(x, scales):
    """Mask, then rescale, repeated (as a detector post-processes each class alike): the regions between the
    masks compute ``m * s - 1`` and the next mask's ``> 0``, equal where the scales are."""
    for s in scales:
        x = F.boolean_mask(x, x > 0.0) * s - 1.0
    return x


def _chain_ref(x, scales):
    for s in scales:
        x = x[x > 0] * np.float32(s) - np.float32(1)
    return x


def _names(pg):
    return [n.attrs.name for n in pg.walk() if n.op == "region"]


@pytest.mark.parametrize("scales, distinct", [((3.0, 3.0, 3.0, 3.0), 3), ((3.0, 2.0, 3.0, 3.0), 4)])
def test_equal_regions_share_a_function_and_constants_tell_them_apart(cache_dir, scales, distinct):
    spec = dt.TensorSpec(("N",))
    pg = partition_graph(dt.trace(lambda x: _chain(x, scales), spec))
    # x > 0 | m * s - 1 > 0 (three times) | m * s - 1: the middle ones are equal up to the mask's row count dim,
    # unless their scale differs (a constant of other content)
    assert len(_names(pg)) == 5 and len(set(_names(pg))) == distinct, _names(pg)
    assert len(collect_regions(pg)) == distinct
    model = dt.compile(lambda x: _chain(x, scales), spec, cache_dir=cache_dir)
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 100):
        x = rng.standard_normal(n).astype("float32") * 3
        np.testing.assert_allclose(model(x), _chain_ref(x, scales), rtol=1e-5, atol=1e-6)


def test_regions_of_different_dtypes_are_not_shared(cache_dir):
    def fn(x):
        x = F.astype(_chain(x, (3.0, 3.0)), "float64")
        return _chain(x, (3.0, 3.0))
    pg = partition_graph(dt.trace(fn, dt.TensorSpec(("N",))))
    # float32 `m * 3 - 1 > 0` and its float64 twin: the same ops, not the same function
    assert len(set(_names(pg))) == len(_names(pg)) == 5, _names(pg)
    model = dt.compile(fn, dt.TensorSpec(("N",)), cache_dir=cache_dir)
    x = np.linspace(-1, 2, 50).astype("float32")
    want = _chain_ref(_chain_ref(x, (3.0, 3.0)).astype("float64"), (3.0, 3.0))
    np.testing.assert_allclose(model(x), want, rtol=1e-6)


def test_regions_in_loop_bodies_keep_their_own_functions(cache_dir):
    """A loop body's region is compiled into its loop (compiled_loops): two equal loops keep two bodies."""
    def fn(xs, ys):
        a = F.foreach(lambda x, st: (x * 2.0, [st[0] + x]), xs, [F.zeros((4,))])
        b = F.foreach(lambda x, st: (x * 2.0, [st[0] + x]), ys, [F.zeros((4,))])
        return a[0], b[0]
    specs = (dt.TensorSpec(("T", 4)), dt.TensorSpec(("U", 4)))
    pg = partition_graph(dt.trace(fn, *specs))
    names = _names(pg)
    assert len(names) == len(set(names)) >= 2, names
    model = dt.compile(fn, *specs, cache_dir=cache_dir)
    xs, ys = np.ones((3, 4), "float32"), np.arange(8, dtype="float32").reshape(2, 4)
    got = model(xs, ys)
    np.testing.assert_allclose(got[0], xs * 2)
    np.testing.assert_allclose(got[1], ys * 2)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_a_shared_region_in_a_saved_artifact(tmp_path, cache_dir, n):
    scales = (3.0, 3.0, 3.0, 3.0)
    model = dt.compile(lambda x: _chain(x, scales), dt.TensorSpec(("N",)), cache_dir=cache_dir)
    path = str(tmp_path / "m.dyntvm")
    model.save(path)
    loaded = dt.load(path)
    x = np.linspace(-1, 3, n).astype("float32")
    np.testing.assert_allclose(loaded(x), _chain_ref(x, scales), rtol=1e-5, atol=1e-6)
