"""`dt.hybridize`'s ``dynamic`` argument: a malformed one is a CompileError naming it, when hybridize is called
(before: a TypeError from inside the first call, ``object of type 'int' has no len()``)."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F


@pytest.mark.parametrize("dynamic, what", [((0,), r"dynamic\[0\]"), (0, "dynamic must be"), ("N", "dynamic must be"),
                                           ((("N", 1.5),), r"dynamic\[0\]"), (("N",), r"dynamic\[0\]")])
def test_a_malformed_dynamic_is_a_compile_error(dynamic, what):
    with pytest.raises(dt.CompileError, match=what):
        dt.hybridize(lambda x: F.relu(x), dynamic=dynamic)


def test_well_formed_dynamic_still_compiles():
    for dynamic in ((("N", None),), [["N", None]], "all", (), ("all",)):
        fast = dt.hybridize(lambda x: F.relu(x) * 2.0, dynamic=dynamic)
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose(fast(x), np.maximum(x, 0) * 2.0)
