"""Each elementwise, reduction and arg-reduction op against an expression written here, independently of
`runtime/kernels.py`: eager mode, the reference interpreter and the executor share those kernels, so
`tests/test_ops.py` (eager == reference) cannot see a wrong one (np.sin registered for tan passes it). The
expressions are per element, in Python's `math` module and operators rather than the numpy ufuncs the
kernels call; eager results and compiled results (one compiled graph per input dtype) must match them."""
from __future__ import annotations

import math
import operator

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.ops import Group
from dyntvm.ir.ops import ops_in as ops_in_group

S = dt.TensorSpec
ELEMENTWISE = (Group.FLOAT_UNARY, Group.UNARY, Group.PREDICATE, Group.ARITH, Group.COMPARE, Group.LOGICAL)

UNARY = {
    "exp": math.exp, "log": math.log, "sqrt": math.sqrt, "rsqrt": lambda v: 1 / math.sqrt(v), "tanh": math.tanh,
    "sigmoid": lambda v: 1 / (1 + math.exp(-v)), "gelu": lambda v: v * (1 + math.erf(v / math.sqrt(2))) / 2,
    "erf": math.erf, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "neg": operator.neg, "abs": abs, "relu": lambda v: max(v, 0), "floor": math.floor, "ceil": math.ceil,
    "round": round, "sign": lambda v: (v > 0) - (v < 0),
    "logical_not": operator.not_, "isnan": math.isnan,
}
BINARY = {
    "add": operator.add, "subtract": operator.sub, "multiply": operator.mul, "divide": operator.truediv,
    "power": operator.pow, "maximum": max, "minimum": min, "fmod": math.fmod, "floor_divide": operator.floordiv,
    "mod": operator.mod, "equal": operator.eq, "not_equal": operator.ne, "less": operator.lt,
    "less_equal": operator.le, "greater": operator.gt, "greater_equal": operator.ge,
    "logical_and": lambda a, b: bool(a and b), "logical_or": lambda a, b: bool(a or b),
}
ROWS = {        # reductions over axis 1, per row (a Python list)
    "sum": math.fsum, "mean": lambda r: math.fsum(r) / len(r), "max": max, "min": min, "prod": math.prod,
    "argmax": lambda r: r.index(max(r)), "argmin": lambda r: r.index(min(r)),
}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}
BOOL_ONLY = {"logical_and", "logical_or", "logical_not"}


def _per_element(f, *arrays):
    """`f` over the elements (as Python numbers) of broadcast `arrays`, as a float64 / bool array."""
    a = np.broadcast_arrays(*arrays)
    out = [f(*(x.item() for x in xs)) for xs in zip(*(np.ravel(x) for x in a))]
    return np.array(out, dtype=bool if isinstance(out[0], bool) else np.float64).reshape(a[0].shape)


def _data(dtype):
    """(x, y): y never 0 (division), small positive exponents; log's domain is handled per op."""
    rng = np.random.default_rng(7)
    if dtype == "bool":
        return rng.random((5, 4)) < 0.5, rng.random((4,)) < 0.5
    if dtype == "int32":
        return rng.integers(-9, 10, (5, 4)).astype(dtype), np.array([3, -2, 1, -4], dtype)
    return rng.uniform(-2, 2, (5, 4)).astype(dtype), np.array([0.7, -1.3, 1.9, -0.4], dtype)


def _positive(x):
    """|x| + 1 (ints) or + 0.5: works on arrays and traced tensors (so the compiled graph gets the same inputs)."""
    return F.abs(x) + (1 if np.dtype(x.dtype).kind in "iu" else 0.5)


def _unary_input(name, x):
    return _positive(x) if name in POSITIVE_ONLY else x


def _binary_inputs(name, x, y):
    """power: a non-negative integer exponent (numpy raises on a negative one), a positive float base (numpy
    gives NaN where Python gives a complex number)."""
    if name != "power":
        return x, y
    return (x, F.abs(y)) if np.dtype(x.dtype).kind in "iu" else (_positive(x), y)


def _cases(dtype):
    """(name, function of (x, y), expected) for every op that takes `dtype`."""
    x, y = _data(dtype)
    out = []
    for name, f in UNARY.items():
        if (name == "logical_not") == (dtype == "bool"):
            xi = _unary_input(name, x)
            out.append((name, lambda a, b, n=name: getattr(F, n)(_unary_input(n, a)), _per_element(f, xi)))
    for name, f in BINARY.items():
        if (name in BOOL_ONLY) == (dtype == "bool"):
            out.append((name, lambda a, b, n=name: getattr(F, n)(*_binary_inputs(n, a, b)),
                        _per_element(f, *_binary_inputs(name, x, y))))
    if dtype != "bool":
        for name, f in ROWS.items():
            want = np.array([f(row) for row in x.astype(np.float64).tolist()])
            out.append((name, lambda a, b, n=name: getattr(F, n)(a, axis=1), want))
    return out


def _check(name, got, want, dtype):
    got = np.asarray(got)
    tol = 1e-5 if dtype == "float32" or np.asarray(got).dtype == np.float32 else 1e-12
    if want.dtype == bool:
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol, err_msg=name)


def test_every_op_has_an_independent_expression():
    ops = {n for g in ELEMENTWISE for n in ops_in_group(g)}
    assert ops - set(UNARY) - set(BINARY) == set()
    assert set(ops_in_group(Group.REDUCE) + ops_in_group(Group.ARG_REDUCE)) - set(ROWS) == set()


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bool"])
def test_eager_matches_independent_expression(dtype):
    x, y = _data(dtype)
    for name, fn, want in _cases(dtype):
        _check(f"{name} on {dtype}", fn(x, y), want, dtype)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_compiled_matches_independent_expression(dtype):
    """All ops of one dtype in one graph, compiled once."""
    x, y = _data(dtype)
    cases = _cases(dtype)
    graph = dt.trace(lambda a, b: [fn(a, b) for _, fn, _ in cases], S(("N", 4), dtype), S((4,), dtype))
    got = dt.compile(graph)(x, y)
    assert len(got) == len(cases)
    for (name, _, want), g in zip(cases, got):
        _check(f"{name} on {dtype} (compiled)", g, want, dtype)


@pytest.mark.parametrize("name", ["mod", "floor_divide", "fmod"])
@pytest.mark.parametrize("divisor", ["int64", "int32"])
def test_float_modulo_by_an_integer_scalar(name, divisor):
    """A float tensor mod / floor_divide an integer 0-d tensor (numpy promotes both to float64): the divisor is
    a cast of an integer in the fused kernel, and the Python-sign correction reads the truncmod twice. It made
    TVM's LLVM codegen fail with a raw InternalError ("Integer absolute value requires an integer type")."""
    f = BINARY[name]
    model = dt.compile(lambda a, k: getattr(F, name)(a, k), S(("B", "S", 4), "float32"), S((), divisor))
    rng = np.random.default_rng(3)
    for b, s in ((2, 3), (1, 1), (0, 5), (3, 7)):
        x = rng.uniform(-20, 20, (b, s, 4)).astype(np.float32)
        for k in (3, -4, 1):
            got = np.asarray(model(x, np.array(k, divisor)))
            want = np.array([f(float(v), k) for v in x.ravel().tolist()], np.float64).reshape(x.shape)
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{name} by {k} at {(b, s)}")
