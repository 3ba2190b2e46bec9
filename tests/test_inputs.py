"""What a careless caller passes a compiled model: big-endian arrays, Python lists, keyword arguments, inputs
whose results do not fit in memory. Each gives the right result or a clear dyntvm error, never a raw one."""
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

from helpers import assert_same

S = dt.TensorSpec


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


def two_args(x, states):
    h, c = states
    return F.tanh(x) * 2.0 + h, c * 3


@pytest.fixture(scope="module")
def model(cache_dir):
    return dt.compile(two_args, S(("N", 3), name="x"), [S((3,), name="h"), S((2,), "int64", name="c")],
                      cache_dir=cache_dir)


def args(n=2):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) / 7
    return x, [np.ones(3, np.float32), np.array([1, -2])]


def test_big_endian_arrays_are_converted(model):
    x, (h, c) = args()
    want = two_args(x, [h, c])
    assert_same(model(x.astype(">f4"), [h.astype(">f4"), c.astype(">i8")]), want)
    assert_same(model(x.astype(">f4"), [h, c]), model(x, [h, c]))


def test_nested_lists_are_arrays_where_the_model_takes_a_tensor(model):
    x, (h, c) = args()
    want = two_args(x, [h, c])
    assert_same(model(x.tolist(), [h.tolist(), c.tolist()]), want)        # lists of floats and ints
    assert_same(model(x, [tuple(h.tolist()), c]), want)                   # a tuple where a tensor is expected
    with pytest.raises(dt.InputError, match=re.escape("input 0 ('x'): cannot convert list to float32[N,3]")):
        model([[1.0, 2.0, 3.0], [4.0]], [h, c])                                # ragged
    with pytest.raises(dt.InputError, match=re.escape("input 2 ('c'): a Python list (float64) does not convert "
                                                      "to int64[2] without losing data")):
        model(x, [h, [1.5, 2.0]])
    with pytest.raises(dt.InputError, match=re.escape(
            "arguments are nested as [*, [*, *, *]], expected [*, [*, *]]: (x: float32[N,3], [h: float32[3], "
            "c: int64[2]])")):
        model(x, [h, c, c])
    with pytest.raises(dt.InputError, match=re.escape("arguments are nested as [*, (*, *)], expected [*, [*, *]]")):
        model(x, (h, c))                                                      # a tuple where a list was traced


def test_lists_and_scalars_that_do_not_fit_the_dtype_raise(cache_dir):
    """A list or scalar is read as an array only if that loses no data: ints out of range used to wrap
    ([2**40] as int32 gave 0), finite floats too large became inf."""
    m = dt.compile(lambda a, b, c: (a + 1, b * 1, c + 0), S(("N",), "int32", name="a"), S(("N",), name="b"),
                   S((), "uint8", name="c"), cache_dir=cache_dir)
    ok = m([2**31 - 1, -2**31], [0.1, 1e-300], 255)               # in range; float rounding is no loss
    assert_same(ok, (np.array([-2**31, -2**31 + 1], "int32"), np.array([0.1, 0], "float32"), np.uint8(255)))
    assert_same(m([1, 2], [np.inf, np.nan], True)[1], np.array([np.inf, np.nan], "float32"))
    for args, msg in [(([2**40, 2**31], [1.0, 2.0], 0), "input 0 ('a'): the list holds 1099511627776, which does "
                                                        "not fit int32 (converting to int32[N] would lose data)"),
                      (([1, 2], [1e300, 1e-300], 0), "input 1 ('b'): the list holds 1e+300, which does not fit float32"),
                      (([1], [1.0], -1), "input 2 ('c'): the int holds -1, which does not fit uint8"),
                      (([1], [1.0], 256), "input 2 ('c'): the int holds 256, which does not fit uint8"),
                      (([1], [1.0], 2.0), "input 2 ('c'): a Python float (float64) does not convert to uint8[]")]:
        with pytest.raises(dt.InputError, match=re.escape(msg)):
            m(*args)



def test_keyword_arguments_are_an_input_error(model):
    x, hc = args()
    with pytest.raises(dt.InputError, match=re.escape(
            "the model takes its inputs by position: model(x: float32[N,3], [h: float32[3], c: int64[2]]); "
            "got keyword argument 'states'")):
        model(x, states=hc)
    with pytest.raises(dt.InputError, match=re.escape("got keyword arguments 'x', 'states'")):
        model(x=x, states=hc)
    fast = dt.hybridize(two_args)          # used to raise a raw TypeError
    with pytest.raises(dt.InputError, match=re.escape("a hybridized function takes its inputs by position; got "
                                                      "keyword arguments 'x', 'states'")):
        fast(x=x, states=hc)
    assert not fast.compiled


def test_a_result_larger_than_memory_is_an_execution_error(cache_dir, monkeypatch):
    """364 TiB: more than any address space, so it fails whatever the OS overcommits. The region is not
    re-run with the numpy reference to find the failing op (that would allocate as much again)."""
    def outer(x):
        return F.reshape(x, (-1, 1)) + F.reshape(x, (1, -1))
    model = dt.compile(outer, S(("N",)), cache_dir=cache_dir)
    assert_same(model(np.ones(3, np.float32)), np.full((3, 3), 2, np.float32))
    from dyntvm.runtime import executor
    monkeypatch.setattr(executor, "Interpreter", None)          # any re-run would fail with a TypeError
    # refused by the region's size guard before TVM allocates (runtime/region_sizes.py), or TVM's bad_alloc
    with pytest.raises(dt.ExecutionError, match=re.escape("region node 'outer_r0' failed: out of memory (") + ".*" +
                       re.escape("); its largest value is float32[10000000, 10000000] (364 TiB), from add node")) as e:
        model(np.ones(10_000_000, np.float32))
    assert e.value.op == "region" and "test_inputs.py" in str(e.value) and e.value.__cause__ is not None


def test_expression_dims_of_inputs_are_checked(tmp_path):
    """Inputs whose spec dims are expressions must fit them (a contract violation is an InputError in every
    mode), and a symbol that occurs only inside an expression is solved from the size."""
    def f(a, b):
        return a * 2, b
    specs = [dt.TensorSpec(("N % 3",)), dt.TensorSpec(("N",))]
    model = dt.compile(f, *specs, cache_dir=str(tmp_path))
    graph = dt.trace(f, *specs)
    for run in (lambda *x: dt.run_reference(graph, *x), model):
        with pytest.raises(dt.InputError, match=r"size 1, which does not fit its dim \(N % 3\)"):
            run(np.ones(1, "float32"), np.ones(5, "float32"))
        out = run(np.ones(2, "float32"), np.ones(5, "float32"))
        assert out[0].shape == (2,)
    g2 = dt.trace(lambda a: a + 1, dt.TensorSpec(("2*N",)))
    m2 = dt.compile(lambda a: a + 1, dt.TensorSpec(("2*N",)), cache_dir=str(tmp_path))
    for run in (lambda x: dt.run_reference(g2, x), m2):
        with pytest.raises(dt.InputError, match=r"does not fit its dim \(2 \* N\)"):
            run(np.ones(5, "float32"))
        assert run(np.ones(6, "float32")).shape == (6,)


def test_numpy_scalars_of_the_dtype_take_the_fast_check(cache_dir, monkeypatch):
    """A numpy scalar of a 0-d input's dtype is that input as it is: the per-model check takes it without the
    full conversion path (`check_inputs`, which a call on such inputs must not reach); other scalars still go
    through it and convert or raise as before."""
    from dyntvm.runtime import model as model_mod
    m = dt.compile(lambda x, k: x * F.cast(k, "float32"), S(("N",)), S((), "int64"), cache_dir=cache_dir)
    x = np.arange(4, dtype=np.float32)
    slow = []
    real = model_mod.check_inputs
    monkeypatch.setattr(model_mod, "check_inputs", lambda g, a: slow.append(a) or real(g, a))
    assert_same(m(x, np.int64(3)), x * 3)
    assert slow == []
    assert_same(m(x, 3), x * 3)                        # a Python int: converted by the full check
    assert len(slow) == 1
    with pytest.raises(dt.InputError, match="int64"):
        m(x, np.float32(3))                            # a numpy scalar of another dtype: the full check's error


def test_the_fast_input_check_passes_only_arguments_that_fit():
    """`runtime/model._fast_check` (the function written out for a model's signature) gives the arguments back only
    where each is a numpy array of its input's dtype and rank, static dims equal, a repeated symbol the same size
    and within its range; anything else is None (the general check then runs and writes the error)."""
    from dyntvm.runtime.model import _fast_check
    f32, i64 = np.dtype("float32"), np.dtype("int64")
    check = _fast_check([(f32, 2, ((1, 3),), ((0, "N"),)), (i64, 1, (), ((0, "N"),))], (("N", 1, 8),))
    x, k = np.zeros((5, 3), np.float32), np.zeros(5, np.int64)
    out = check((x, k))
    assert len(out) == 2 and out[0] is x and out[1] is k
    for bad in ((x,), (x, k, k), (x.astype(np.float64), k), (x, k.astype(np.int32)), (np.zeros((5, 2), np.float32), k),
                (x, np.zeros(4, np.int64)), (np.zeros((9, 3), np.float32), np.zeros(9, np.int64)),
                (np.zeros((0, 3), np.float32), np.zeros(0, np.int64)), (x.tolist(), k), (x[None], k)):
        assert check(bad) is None
    assert _fast_check([(f32, 1, (), ((0, "N"),))], (("M", 0, None),)) is None    # a range no input binds
    unbounded = _fast_check([(f32, 1, (), ((0, "N"),))], (("N", 0, None),))
    assert unbounded((np.zeros(0, np.float32),)) is not None and unbounded((np.zeros(10**6, np.float32),)) is not None
