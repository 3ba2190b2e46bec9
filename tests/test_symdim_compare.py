"""`x.shape[i] == k` / `!= k` of a symbolic dim while tracing: the answer where it holds for every size, else a
TraceError at the user's line (was: str comparison, so `== 1` was always False, silently). Comparisons with
strings keep str semantics, so dims still serve as dict keys and set members."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.types import SymDim, is_static_dim, same_dim

S = dt.TensorSpec


def _trace_refused(fn, spec, text):
    with pytest.raises(dt.TraceError, match="has no value while tracing") as e:
        dt.trace(fn, spec)
    msg = str(e.value)
    assert "F.shape_of(x)[i]" in msg and "at test_symdim_compare.py:" in msg and text in msg, msg


def test_equality_with_an_int_is_decided_where_it_holds_for_every_size():
    seen = {}

    def f(x):
        n = x.shape[0]
        seen["decided"] = (n == -1, n != -1, n + 1 == 0, n + 1 != 0, (n + 2) // 2 == -3, n == np.int64(-1),
                           np.int64(-1) == n, -1 != n)
        seen["static"] = (x.shape[1] == 3, x.shape[1] != 3, x.shape[1] == 2)
        if n + 1 != 0 and n != -5:          # decided: the traced program keeps this branch for every size
            return x * 2.0
        return x
    graph = dt.trace(f, S(("N", 3)))
    assert seen["decided"] == (False, True, False, True, False, False, False, True)
    assert seen["static"] == (True, False, False)
    model = dt.compile(graph)
    for n in (0, 1, 4):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(model(x), x * 2.0)


def test_equality_that_depends_on_the_size_is_refused_at_the_users_line():
    def is_one(x):
        return -x if x.shape[0] == 1 else x

    def not_three(x):
        return -x if x.shape[0] != 3 else x

    def expression(x):
        return -x if x.shape[0] * 2 == 4 else x

    def reversed_int(x):
        return -x if 1 == x.shape[0] else x

    def numpy_int_first(x):
        return -x if np.int64(1) == x.shape[0] else x
    _trace_refused(is_one, S(("N", 2)), "'N' == 1")
    _trace_refused(is_one, S(("N", 2)), "x.shape[0] == 1")           # the user's line, quoted
    _trace_refused(not_three, S(("N", 2)), "'N' != 3")
    _trace_refused(expression, S(("N", 2)), "'(2 * N)' == 4")
    _trace_refused(reversed_int, S(("N", 2)), "'N' == 1")
    _trace_refused(numpy_int_first, S(("N", 2)), "'N' == 1")


def test_in_a_tuple_of_ints_compares_each_entry():
    def undecided(x):
        return -x if x.shape[0] in (0, 1) else x
    _trace_refused(undecided, S(("N", 2)), "'N' == 0")
    seen = {}

    def decided(x):
        n = x.shape[0]
        seen["in"] = (n in (-1, -2), n + 1 not in (0,), x.shape[1] in (0, 1), x.shape[1] in (2, 5), n in ("N", 2),
                      (n, 2) == ("N", 2), n in [x.shape[0]])
        return x
    dt.trace(decided, S(("N", 2)))
    assert seen["in"] == (False, True, False, True, True, True, True)


def test_comparisons_with_strings_keep_str_semantics():
    n, m = SymDim("N"), SymDim("M")
    assert n == "N" and n != "M" and not (n == m) and n != m and n == SymDim("N") and "N" == n
    assert hash(n) == hash("N") and {"N": 1}[n] == 1 and n in {"N", "K"} and {n: 2}["N"] == 2
    assert sorted([n, "B", m]) == ["B", "M", "N"] and n < "Z"
    assert n != 1.5 and not (n == None) and not (n == True) and n != False    # noqa: E711, E712 (not an int)
    assert len({n, "N", SymDim("N")}) == 1


def test_internal_dim_checks():
    """What dyntvm's own code asks of a dim, instead of `d == 1`: whether it is that known int."""
    n = SymDim("N")
    assert is_static_dim(1, 1) and is_static_dim(np.int64(0), 0) and is_static_dim(3) and not is_static_dim(3, 1)
    assert not is_static_dim(n, 1) and not is_static_dim(n) and not is_static_dim(True, 1) and not is_static_dim("N")
    assert same_dim(n, "N") and same_dim(3, 3) and not same_dim(n, 3) and not same_dim(3, n) and not same_dim(n, "M")


def test_dims_from_x_shape_flow_through_the_frontend():
    """Ops whose frontend looks at dims of x.shape still trace (they used to compare those with ints): the
    one-hot depth check, conv's bias check and expand with a symbolic entry; checked at several sizes."""
    def f(x, idx, w, b):
        y = F.expand(x, (x.shape[0], 3))
        y = y + F.sum(F.one_hot(idx, F.reshape(F.shape_of(idx)[0], (1,)), axis=-1), axis=0).astype("float32")[:1]
        c = F.conv(F.reshape(y, (1, 1, x.shape[0], 3)), w, b)
        return y, c
    specs = [S(("N", 1)), S(("K",), "int64"), S((2, 1, 1, 1)), S((2,))]
    model = dt.compile(dt.trace(f, *specs))
    w = np.array([[[[2.0]]], [[[-1.0]]]], np.float32)
    b = np.array([0.5, 1.0], np.float32)
    for n in (1, 3):
        x = np.arange(n, dtype=np.float32).reshape(n, 1)
        idx = np.array([0, 1], np.int64)
        y, c = model(x, idx, w, b)
        ref_y = np.broadcast_to(x, (n, 3)) + 1.0
        np.testing.assert_allclose(y, ref_y)
        np.testing.assert_allclose(c, np.stack([2.0 * ref_y + 0.5, -ref_y + 1.0])[None], rtol=1e-6)
