"""Float ``x ** k`` with a constant k in 0..4 is computed by multiplying (`converters.elementwise`
`_power_by_multiplying`: libm's pow per element was GPT-2's slowest kernel), equal to numpy within a couple of
ulp (float64's x * x * x rounds twice: up to ~1.6 ulp from pow), specials included; other exponents keep pow."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from helpers import assert_same


def _relax_ops(fn, spec):
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph
    mod = build_module(collect_regions(partition_graph(dt.trace(fn, spec))))
    return "\n".join(f.script() for _, f in mod.functions_items())


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 2.5, -1, 5])
def test_constant_power_equals_numpy(dtype, k):
    exponent = np.array(k, dtype)
    model = dt.compile(lambda x: F.power(x, exponent), dt.TensorSpec(("N", 3), dtype))
    rng = np.random.default_rng(0)
    for n in (0, 1, 40):
        x = (rng.standard_normal((n, 3)) * 3).astype(dtype)
        if n:
            x[0] = [np.nan, np.inf, -0.0]
        with np.errstate(all="ignore"):
            want = np.power(x, exponent)
        assert_same(model(x), want, rtol=2e-3 if dtype == "float16" else 1e-6, atol=0)


def test_small_integer_exponents_multiply_and_others_call_pow():
    spec = dt.TensorSpec(("N",))
    cubed = _relax_ops(lambda x: F.power(x, np.float32(3.0)), spec)
    assert "R.power" not in cubed and cubed.count("R.multiply") == 2
    assert "R.power" in _relax_ops(lambda x: F.power(x, np.float32(2.5)), spec)
    # a per-element exponent (not one constant) keeps pow
    assert "R.power" in _relax_ops(lambda x: F.power(x, np.array([2.0, 3.0], np.float32)),
                                   dt.TensorSpec((2,)))
