"""End to end on CPU: dt.compile(...)(inputs) equals eager numpy, one TVM build per model."""
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.codegen.build import stats
from dyntvm.ir.tree import tree_flatten

# these tests count the executor's region calls (`model.kernel_calls`): models run in the executor
pytestmark = pytest.mark.usefixtures("executor_only")


def assert_same(got, want, rtol=1e-4, atol=1e-4):
    g, w = tree_flatten(got)[0], tree_flatten(want)[0]
    assert len(g) == len(w)
    for a, b in zip(g, w):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


def compile_once(fn, *specs, cache_dir, **kw):
    before = stats.builds
    model = dt.compile(fn, *specs, cache_dir=cache_dir, **kw)
    assert stats.builds - before <= 1
    return model


# ------------------------------------------------------------------------------------- examples
@pytest.mark.parametrize("name", examples.NAMES)
def test_example_matches_eager_with_one_build(name, cache_dir):
    ex = examples.get(name)
    before = stats.builds
    model = dt.compile(ex.fn, *ex.specs, cache_dir=cache_dir, use_cache=False)
    assert stats.builds == before + 1
    rng = np.random.default_rng(0)
    for sizes in ex.test_sizes:
        inputs = ex.make_inputs(rng, **sizes)
        assert_same(model(*inputs), ex.fn(*inputs))
    assert stats.builds == before + 1, "running at new sizes must not rebuild"


# --------------------------------------------------------------------------------- op groups
def elementwise(x, y):
    u = [F.neg(x), F.abs(x), F.exp(x), F.log(F.abs(x) + 1.0), F.sqrt(F.abs(x)), F.rsqrt(F.abs(x) + 1.0),
         F.tanh(x), F.sigmoid(x), F.relu(x), F.gelu(x), F.erf(x), F.sin(x), F.cos(x), F.floor(x), F.ceil(x),
         F.round(x * 3.0), F.sign(x)]
    b = [x + y, x - y, x * y, x / (F.abs(y) + 1.0), F.power(F.abs(x), y), F.maximum(x, y), F.minimum(x, y),
         F.where(x > y, x, y), x @ F.transpose(y)]
    c = [x == y, x != y, x < y, x <= y, x > y, x >= y, F.logical_and(x > 0, y > 0), F.logical_or(x > 0, y > 0),
         F.logical_not(x > 0), F.isnan(x)]
    return u, b, c


def reductions(x):
    return [F.sum(x), F.sum(x, axis=1), F.mean(x, axis=0, keepdims=True), F.max(x, axis=-1), F.min(x, axis=1),
            F.prod(x, axis=1), F.argmax(x, axis=1), F.argmin(x, axis=0), F.argmax(x),
            F.softmax(x, axis=-1), F.log_softmax(x, axis=0)]


def shapes(x, idx):
    n = x.shape[0]
    parts = F.split(x, 2, axis=1)
    return [F.reshape(x, (-1,)), F.reshape(x, (n, 2, 2)), F.transpose(x), F.expand_dims(x, 1),
            F.squeeze(F.expand_dims(x, 0), 0), F.concat([x, x * 2.0], axis=0), F.stack([x, x], axis=1),
            parts[0], parts[1], x[1:, ::2], x[:, -1], F.take(x, idx, axis=0), F.broadcast_to(x[:, :1], (n, 4)),
            F.flatten(x), F.tile(x, (2, 1)), F.pad(x, ((1, 0), (0, 2)), 1.5), F.cast(x, "int32"),
            F.zeros_like(x), F.ones_like(x, dtype="int64"), F.full((2, 3), 7.0), F.arange(0, 5),
            F.topk(x, 2, axis=1)[0], F.topk(x, 2, axis=1)[1], F.embedding(idx, x),
            F.layer_norm(x, np.ones(4, "float32") * 1.5, np.arange(4, dtype="float32"))]


def dynamic(x, k):
    m = F.boolean_mask(x, F.sum(x, axis=1) > 0)
    return [m * 2.0, F.nonzero(x > 0), F.unique(F.cast(x * 2.0, "int64"), return_inverse=True, return_counts=True),
            F.arange(0, F.cast(F.sum(F.abs(x)), "int64")), F.shape_of(m), F.reshape(x, F.shape_of(x)[::-1]),
            F.topk(F.reshape(x, (-1,)), k)]


GROUPS = [
    ("elementwise", elementwise, [dt.TensorSpec(("N", 4)), dt.TensorSpec(("N", 4))],
     lambda r, n: (r.standard_normal((n, 4)).astype("float32"), r.standard_normal((n, 4)).astype("float32"))),
    ("reductions", reductions, [dt.TensorSpec(("N", 4))],
     lambda r, n: (r.standard_normal((n, 4)).astype("float32"),)),
    ("shapes", shapes, [dt.TensorSpec(("N", 4)), dt.TensorSpec(("K",), "int64")],
     lambda r, n: (r.standard_normal((n, 4)).astype("float32"), r.integers(0, n, 3) if n else np.zeros(0, "int64"))),
    ("dynamic", dynamic, [dt.TensorSpec(("N", 4)), dt.TensorSpec((), "int64")],
     lambda r, n: (r.standard_normal((n, 4)).astype("float32"), np.array(min(2, 4 * n)))),
]
MIN_N = {"reductions": 1, "shapes": 1}     # max/argmax of an empty axis is an error in numpy too


@pytest.mark.parametrize("name, fn, specs, make", GROUPS, ids=[g[0] for g in GROUPS])
def test_op_groups_match_eager(name, fn, specs, make, cache_dir):
    model = compile_once(fn, *specs, cache_dir=cache_dir)
    rng = np.random.default_rng(1)
    for n in (0, 1, 2, 5, 9):
        if n < MIN_N.get(name, 0):
            continue
        inputs = make(rng, n)
        assert_same(model(*inputs), fn(*inputs), rtol=2e-4, atol=2e-4)


# ---------------------------------------------------------------------------------- executor
W = np.random.default_rng(3).standard_normal((8, 8)).astype("float32") * 0.3


def rnn(xs, h):
    def step(x, states):
        (h,) = states
        h = F.tanh(F.matmul(x, W) + F.matmul(h, W))
        return h, [h]
    return F.foreach(step, xs, [h])


def test_foreach_body_is_one_kernel_call_per_step(cache_dir):
    model = compile_once(rnn, dt.TensorSpec(("T", "B", 8)), dt.TensorSpec(("B", 8)), cache_dir=cache_dir)
    (fe,) = [n for n in model.graph.nodes if n.op == "foreach"]
    assert [n.op for n in fe.subgraphs[0].nodes] == ["region"]
    assert [n.op for n in model.graph.nodes] == ["region", "foreach"]     # x @ W, hoisted: one GEMM for all steps
    for T, B in [(0, 1), (1, 1), (6, 3)]:
        xs = np.random.default_rng(T).standard_normal((T, B, 8)).astype("float32")
        h0 = np.zeros((B, 8), "float32")
        before = model.kernel_calls
        assert_same(model(xs, h0), rnn(xs, h0))
        assert model.kernel_calls - before == 2        # the GEMM, then the compiled loop (test_compiled_loops.py)
        assert_same(model(xs, h0, profile=True), rnn(xs, h0))     # step by step


def test_while_loop_growing_state(cache_dir):
    def grow(x):
        return F.while_loop(lambda s: F.sum(s) < 50.0, lambda s: (F.sum(s), [F.concat([s, s * 2.0])]), [x],
                            max_iterations=10)
    model = compile_once(grow, dt.TensorSpec(("N",)), cache_dir=cache_dir)
    for x in [np.array([1.0], "float32"), np.array([60.0], "float32"), np.array([1.0, 2.0, 3.0], "float32")]:
        assert_same(model(x), grow(x))


def test_validate_and_profile_modes(cache_dir):
    model = compile_once(rnn, dt.TensorSpec(("T", "B", 8)), dt.TensorSpec(("B", 8)), cache_dir=cache_dir)
    xs = np.ones((3, 2, 8), "float32")
    h0 = np.zeros((2, 8), "float32")
    assert_same(model(xs, h0, validate=True), rnn(xs, h0))
    model(xs, h0, profile=True)
    assert any("region" in k and calls == 3 for k, (calls, secs) in model.last_profile.items())


def test_compile_cache_makes_recompiles_fast(tmp_path):
    ex = examples.get("lstm")
    dt.compile(ex.fn, *ex.specs, cache_dir=str(tmp_path))
    before = stats.builds
    m = dt.compile(ex.fn, *ex.specs, cache_dir=str(tmp_path))
    assert stats.builds == before and m.info["cache"] == "hit"
    xs, h0 = ex.make_inputs(np.random.default_rng(0), T=3, B=2)[:2]
    assert_same(m(xs, h0, h0), ex.fn(xs, h0, h0))


def test_cache_key_covers_the_codegen_source(monkeypatch):
    """Changed converter/schedule code at the same version must not be served the old kernels."""
    from dyntvm.codegen import cache
    regions = [("r0", dt.trace(lambda x: F.tanh(x), dt.TensorSpec(("N",))))]
    key = cache.cache_key(regions, "llvm")
    assert cache.cache_key(regions, "llvm") == key
    monkeypatch.setattr(cache, "_code_digest", "0" * 16)       # as if a codegen file had changed
    assert cache.cache_key(regions, "llvm") != key


def test_input_errors(cache_dir):
    model = compile_once(rnn, dt.TensorSpec(("T", "B", 8)), dt.TensorSpec(("B", 8)), cache_dir=cache_dir)
    xs, h0 = np.ones((3, 2, 8), "float32"), np.zeros((2, 8), "float32")
    with pytest.raises(dt.InputError, match="takes 2 arguments"):
        model(xs)
    with pytest.raises(dt.InputError, match="dtype is float64, expected float32"):
        model(xs.astype("float64"), h0)
    with pytest.raises(dt.InputError, match="rank is 2"):
        model(xs[0], h0)
    with pytest.raises(dt.InputError, match="axis 2 has size 7, expected 8"):
        model(np.ones((3, 2, 7), "float32"), h0)
    with pytest.raises(dt.InputError, match="B=3, but B=2"):
        model(xs, np.zeros((3, 8), "float32"))
    with pytest.raises(dt.InputError, match="expected a numpy array"):
        model(xs, "nope")


def test_hybridize_compiles_once_per_signature(cache_dir):
    fast = dt.hybridize(rnn, dynamic=(("T", "B", None), ("B", None)), cache_dir=cache_dir)
    for T, B in [(2, 1), (5, 1), (3, 4)]:
        xs = np.ones((T, B, 8), "float32")
        h0 = np.zeros((B, 8), "float32")
        assert_same(fast(xs, h0), rnn(xs, h0))
    assert len(fast.compiled) == 1
    xs, h0 = np.ones((2, 1, 8), "float64"), np.zeros((1, 8), "float64")   # new dtype: a second compile
    assert_same(fast(xs, h0), rnn(xs, h0))
    assert len(fast.compiled) == 2


def test_constant_outputs_are_copies(cache_dir):
    """Mutating a returned constant (direct, from a branch, or a folded input-less region) must not
    change later results."""
    c = np.ones(4, "float32")

    def fn(x):
        return x + 1.0, F.cond(F.sum(x) > 0, lambda: c, lambda: c * 3.0), F.tanh(c * 2.0)
    model = compile_once(fn, dt.TensorSpec((4,)), cache_dir=cache_dir)
    assert not any(n.op == "region" and not n.inputs for n in model.graph.walk())
    x = np.ones(4, "float32")
    for out in model(x):
        out[:] = 99.0
    assert_same(model(x), fn(x))


def test_python_scalar_inputs_must_not_lose_data(cache_dir):
    model = compile_once(lambda i: i * 2, dt.TensorSpec((), "int64"), cache_dir=cache_dir)
    assert int(model(3)) == 6
    with pytest.raises(dt.InputError, match="does not convert to int64"):
        model(3.7)


def test_foreach_step_output_changing_shape_is_an_error(cache_dir):
    def fn(x):
        return F.foreach(lambda r, s: (F.boolean_mask(r, r > 0), s), x, [])[0]
    model = compile_once(fn, dt.TensorSpec(("T", 4)), cache_dir=cache_dir)
    x = np.array([[1, 2, -1, -1], [-1, -1, -1, 3]], "float32")
    with pytest.raises(dt.ExecutionError, match=re.escape("foreach: step output 0 changed shape between iterations "
                                                          "(float32[2] then float32[1])")):
        model(x)
    x = np.array([[1, 2, -1, -1], [-1, -1, 3, 3]], "float32")
    assert_same(model(x), fn(x))


@pytest.mark.parametrize("reps", [(1, 6, 4, 2), (7, 6, 4, 2), (2, 1, 1, 1, 3), (3,), (1, 1, 1, 1), (0, 2, 1, 1)])
def test_tile_at_sizes_llvm_miscompiled(reps):
    """Relax's own tile kernel gave wrong values for these on AVX-512 CPUs (an LLVM miscompile of its modulo
    reads, found by the ONNX conformance test test_tile); ours broadcasts instead."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    m = dt.compile(lambda a: F.tile(a, reps), dt.TensorSpec((2, 3, 4, 5)))
    np.testing.assert_array_equal(m(x), np.tile(x, reps))


F16_REDUCTIONS = {
    "matmul": lambda a, b: F.matmul(a, b),
    "sum": lambda a, b: F.sum(a, axis=-1),
    "mean": lambda a, b: F.mean(a, axis=-1),
    "softmax": lambda a, b: F.softmax(a, axis=-1),
    "log_softmax": lambda a, b: F.log_softmax(a, axis=-1),
}


@pytest.mark.parametrize("op", sorted(F16_REDUCTIONS))
def test_float16_reductions_accumulate_like_numpy(op):
    # numpy accumulates float16 dot products and (contiguous) sums in float32: compiled code too, so the two
    # agree to the bit where Relax's float16 accumulator was up to 25 ulps off (ONNX's fp16 attention tests)
    fn = F16_REDUCTIONS[op]
    model = dt.compile(dt.trace(fn, dt.TensorSpec((3, "K"), "float16"), dt.TensorSpec(("K", 5), "float16")))
    rng = np.random.default_rng(7)
    for k in (1, 64, 300, 0):
        a = (rng.standard_normal((3, k)) * 2).astype(np.float16)
        b = rng.standard_normal((k, 5)).astype(np.float16)
        if op != "matmul" and k == 0:
            continue            # (an empty row: mean nan with a warning, softmax empty; covered elsewhere)
        got, want = np.asarray(model(a, b)), np.asarray(fn(a, b))
        assert got.dtype == want.dtype == np.float16
        np.testing.assert_array_equal(got, want, err_msg=f"{op} K={k}")
