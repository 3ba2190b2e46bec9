"""float32 erf and GELU on the CPU without libm's erff per element (`converters.elementwise`: `topi.fast_erf`
for erf; GELU as x / 2 * erfc(-x / sqrt(2)) with a Chebyshev erfc and `topi.fast_exp`): within a few 1e-7 of
the float64 reference (tighter than the suite's tolerance), NaN / infinities / signed zeros as numpy; other
dtypes and the GPU keep the exact lowering."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

erf64 = np.vectorize(__import__("math").erf, otypes=[np.float64])
REF = {"erf": lambda x: erf64(x), "gelu": lambda x: 0.5 * x * (1 + erf64(x / np.sqrt(2)))}


def _inputs(rng, n):
    x = (rng.standard_normal((n, 5)) * 4).astype(np.float32)
    if n:
        x[0] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    return x


@pytest.mark.parametrize("name", ["erf", "gelu"])
def test_fast_float32_erf_and_gelu_match_the_float64_reference(name):
    model = dt.compile(lambda x: getattr(F, name)(x), dt.TensorSpec(("N", 5)))
    rng = np.random.default_rng(0)
    for n in (0, 1, 3000):
        x = _inputs(rng, n)
        got = model(x)
        with np.errstate(invalid="ignore"):
            want = REF[name](x.astype(np.float64))
        assert got.dtype == np.float32 and got.shape == x.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        g, w = got[ok].astype(np.float64), want[ok]
        err = np.where(g == w, 0.0, np.abs(g - w))           # infinities equal, not inf - inf
        assert np.all(err <= 5e-7 + 1e-6 * np.abs(w)), float(np.max(err))
        if n:
            assert np.signbit(got[0, 3]) == np.signbit(want[0, 3])


def test_the_cpu_float32_lowering_calls_no_erf_and_float64_keeps_it():
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph

    def lowered(dtype, device_checks=False):
        g = partition_graph(dt.trace(lambda x: F.gelu(x) + F.erf(x), dt.TensorSpec(("N",), dtype)))
        mod = build_module(collect_regions(g), device_checks=device_checks)
        return "\n".join(f.script() for _, f in mod.functions_items())
    assert "T.erf" not in lowered("float32") and "R.nn.gelu" not in lowered("float32")
    assert "R.nn.gelu" in lowered("float64") and "R.erf" in lowered("float64")
    assert "R.nn.gelu" in lowered("float32", device_checks=True)       # the GPU: CUDA's erff is fast


def test_float64_gelu_unchanged():
    model = dt.compile(lambda x: F.gelu(x), dt.TensorSpec(("N",), "float64"))
    x = np.linspace(-8, 8, 101)
    np.testing.assert_allclose(model(x), REF["gelu"](x), rtol=1e-14, atol=1e-300)


def test_gelu_keeps_its_relative_accuracy_far_into_the_negative_tail():
    """The absolute term of the tolerance above hides the tail, where GELU is tiny (~1e-29 at x = -11): there
    the erfc form must stay relatively accurate (no 1 + erf(x) cancellation, which would give 0 or noise)."""
    model = dt.compile(lambda x: F.gelu(x), dt.TensorSpec(("N",)))
    x = np.linspace(-12.5, -2.0, 4001).astype(np.float32)
    got = model(x).astype(np.float64)
    erfc64 = np.vectorize(__import__("math").erfc, otypes=[np.float64])
    want = 0.5 * x.astype(np.float64) * erfc64(-x.astype(np.float64) / np.sqrt(2))   # 1 + erf would cancel here
    normal = np.abs(want) >= np.finfo(np.float32).tiny          # below it float32 has fewer digits
    assert normal.sum() > 3900
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert np.all(got[normal] < 0) and float(rel.max()) < 1e-4, float(rel.max())
