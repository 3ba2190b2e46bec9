"""The canonical dim algebra (ir/dim_algebra.py): normal forms, decided and undecided comparisons, the output
formulas of conv / pool / slice / split, and a CNN with symbolic B, H, W compiled once (F and ONNX).

Every rewrite is cross-checked independently: random dim expressions are evaluated as written (Python's own
ints, through `ir.dims.parse_dim`) and in canonical form, over many symbol values; the comparisons that the
algebra decides are checked the same way."""
import itertools
import random

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.dim_algebra import dim_bounds, dim_compare, dims_equal, simplify_dim
from dyntvm.ir.dims import parse_dim
from dyntvm.ir.ops_nn import window_out_dim
from dyntvm.ir.shapes import broadcast_dims, slice_length, unify_dims
from dyntvm.ir.types import ShapeError, TensorType, dim_add, dim_floordiv, dim_max, dim_min, dim_mod, dim_mul, dim_sub


# ----------------------------------------------------------------------------------------------- normal forms
@pytest.mark.parametrize("expr, canonical", [
    ("(H - 1) + 1", "H"),
    ("(H + 2 - 3) // 1 + 1", "H"),                         # 3x3 conv, pad 1, stride 1
    ("(H + 2*1 - 3) // 2 + 1", "((H + 1) // 2)"),         # 3x3 conv, pad 1, stride 2
    ("(H - 1) // 2 + 1", "((H + 1) // 2)"),               # 1x1 conv, stride 2: the same dim
    ("(H - 2) // 2 + 1", "(H // 2)"),                     # 2x2 pool, stride 2
    ("2 * (N // 2) + N % 2", "N"),
    ("(N % 3) + 3 * (N // 3) - N", 0),
    ("(2*N) // 2", "N"),
    ("(2*N + 1) // 2", "N"),
    ("(4*N) % 2", 0),
    ("(4*N + 3) % 2", 1),
    ("(6*N + 4) // 4", "((N + (N // 2)) + 1)"),           # (4N + 4 + 2N) // 4 == N + 1 + (2N) // 4
    ("(2*N + 2) % 4", "(2 * ((N + 1) % 2))"),
    ("min(N, N + 2)", "N"),
    ("max(N, N + 2)", "(N + 2)"),
    ("min(N, 1) * 0", 0),
    ("min(N, 0)", 0),
    ("max(N, 0)", "N"),
    ("min(min(N, M), min(N, 3))", "min(M, N, 3)"),       # nested, flattened, sorted, constants last
    ("max(M, max(N, M))", "max(M, N)"),
    ("min(2*N, 2*M)", "(2 * min(M, N))"),
    ("N + M - N", "M"),                                   # associativity / commutativity
    ("(M + N) * 2", "((2 * M) + (2 * N))"),             # constants distributed
    ("N * M + M * N", "(2 * (M * N))"),
    ("(N + 1) * (N - 1)", "((N * N) - 1)"),
    ("N - 1 - N", -1),
    ("1 - N", "(1 - N)"),
    ("(N // 2) // 3", "(N // 6)"),                        # nested floordiv
    ("((N + 1) // 2 + 1) // 2", "((N + 3) // 4)"),        # a stride-2 conv then a stride-2 pool
    ("N % 4 % 2", "(N % 2)"),
    ("(N - 1) // -1", "(1 - N)"),                         # negative divisors turn around
    ("N // 1", "N"), ("N % 1", 0),
    ("max((N - 1), 0)", "max((N - 1), 0)"),               # stays as slice_length writes it (bounds stay tight)
])
def test_normal_forms(expr, canonical):
    assert simplify_dim(expr) == canonical
    assert simplify_dim(str(canonical)) == canonical      # idempotent: the canonical form is a fixed point


def test_equal_expressions_are_equal_strings_however_built():
    forms = {simplify_dim("(H + 2*1 - 3) // 2 + 1"), simplify_dim("((H - 1) // 2) + 1"),
             dim_add(dim_floordiv(dim_sub(dim_add("H", 2), 3), 2), 1),
             dim_add(dim_floordiv(dim_add("H", -1), 2), 1), simplify_dim("(1 + H) // 2")}
    assert forms == {"((H + 1) // 2)"}
    assert dim_add(dim_mul(2, dim_floordiv("N", 2)), dim_mod("N", 2)) == "N"
    assert dim_sub(dim_add("N", "M"), "M") == "N" and dim_mul(dim_min("N", 1), 0) == 0
    assert dim_min("N", dim_add("N", 2)) == "N" and dim_max("N", dim_add("N", 2)) == "(N + 2)"
    # stored in canonical form by every TensorType, and old non-canonical strings still parse and evaluate
    assert TensorType(("((H - 1) + 1)", "(N * 2)", "4")).shape == ("H", "(2 * N)", 4)
    assert parse_dim("((((H + 2) - 3) // 1) + 1)").evaluate({"H": 7}) == 7


def test_canonical_strings_stay_in_the_dim_grammar():
    """A canonical string parses back (ints, symbols, + - * // %, min, max) to the same dim."""
    for e in ["(H + 2*1 - 3) // 2 + 1", "max(N - 1, 0) * N", "min(N, M, 3) - 2 * (K % 3)", "0 - N", "(N // M) % 5"]:
        s = simplify_dim(e)
        assert parse_dim(s).symbols == parse_dim(e).symbols
        for n, m, k in itertools.product(range(1, 5), repeat=3):
            env = {"N": n, "M": m, "K": k, "H": n + m}
            assert parse_dim(s).evaluate(env) == parse_dim(e).evaluate(env)


def test_products_of_many_sums_stay_short_enough_to_store():
    """Distributing (X0 + 1) * ... * (X7 + 1) would give 256 terms, past the longest dim `ir.dims` parses: the
    product stays factored where its expansion is too long, and is still stored, evaluated and canonical."""
    d = dim_mul(dim_mul("(X0 + 1)", "(X1 + 1)"), 1)
    for i in range(2, 8):
        d = dim_mul(d, f"(X{i} + 1)")
    assert len(d) < 1000 and TensorType((d,)).shape == (d,) and simplify_dim(d) == d
    assert parse_dim(d).evaluate({f"X{i}": i for i in range(8)}) == 40320
    assert simplify_dim("(A + 1) * (B + 1)") == "(((A + B) + (A * B)) + 1)"


# ------------------------------------------------------------------------- brute force: the independent check
_SYMS = ("N", "M")
_ENVS = [dict(zip(_SYMS, v)) for v in itertools.product(range(6), repeat=2)] + [{"N": 17, "M": 40}, {"N": 64, "M": 3}]


def _random_dim(r, depth):
    if depth == 0 or r.random() < 0.25:
        return r.choice(list(_SYMS) + [str(r.randint(-3, 5))])
    kind = r.random()
    if kind < 0.45:
        return f"({_random_dim(r, depth - 1)} {r.choice('+-*+-')} {_random_dim(r, depth - 1)})"
    if kind < 0.75:
        div = r.choice([str(r.randint(1, 6)), str(-r.randint(1, 4)), _random_dim(r, depth - 1)])
        return f"({_random_dim(r, depth - 1)} {r.choice(['//', '%'])} {div})"
    args = ", ".join(_random_dim(r, depth - 1) for _ in range(r.randint(2, 3)))
    return f"{r.choice(['min', 'max'])}({args})"


def _value(d, env):
    """The dim's value as Python computes what is written; None where it divides by zero."""
    try:
        return parse_dim(d).evaluate(env) if isinstance(d, str) else d
    except ZeroDivisionError:
        return None


def test_every_rewrite_holds_for_every_size():
    r = random.Random(22)
    checked = decided = 0
    for _ in range(400):
        e, f = _random_dim(r, 4), _random_dim(r, 3)
        s = simplify_dim(e)
        assert simplify_dim(s) == s, (e, s)
        lo, hi = dim_bounds(s)
        for env in _ENVS:
            want = _value(e, env)
            if want is None:
                continue
            got = _value(s, env)
            assert got == want and lo <= got <= hi, (e, s, env, got, want, (lo, hi))
            checked += 1
        for op in ("==", "!=", "<", "<=", ">", ">="):
            verdict = dim_compare(e, op, f)
            if verdict is None:
                continue
            decided += 1
            for env in _ENVS:
                a, b = _value(e, env), _value(f, env)
                if a is not None and b is not None:
                    assert {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b,
                            ">=": a >= b}[op] == verdict, (e, op, f, env)
    assert checked > 5000 and decided > 50           # the check is not vacuous


# ---------------------------------------------------------------------------------------------- comparisons
@pytest.mark.parametrize("a, op, b, verdict", [
    ("N + 1", ">", "N", True), ("N + 1", "<=", "N", False), ("N", "<", "N + 1", True),
    ("N", "==", "(N - 1) + 1", True), ("N", "!=", "N + 2", True), ("N + 2", "==", "N", False),
    ("N", ">=", 0, True), ("N", ">", 0, None), ("N", "==", "M", None), ("N", "==", "2 * N", None),
    ("min(N, 2)", "<=", 2, True), ("N % 3", "<", 3, True), ("max(N, 3)", ">=", "N", True),
    ("N // 2", "<=", "N", True), ("N - M", "<", 0, None), ("N + M", ">=", "M", True), (5, ">", 3, True),
])
def test_decided_and_undecided_comparisons(a, op, b, verdict):
    assert dim_compare(a, op, b) is verdict


def test_decided_comparisons_of_traced_dims_need_no_value():
    """`x.shape[0] >= 0` is true for every size, so Python code may ask it while tracing; `> 0` is not decided."""
    seen = {}

    def f(x):
        n = x.shape[0]
        seen["decided"] = (n >= 0, n + 1 > 0, n < 0, (n + 2) // 2 <= n + 1)
        with pytest.raises(dt.TraceError, match="has no value while tracing"):
            _ = n > 0
        return x
    dt.trace(f, dt.TensorSpec(("N", 2)))
    assert seen["decided"] == (True, True, False, True)


def test_dims_equal():
    assert dims_equal("H", "((H + 2) - 3) + 1") is True and dims_equal("N", "N + 1") is False
    assert dims_equal("N", "M") is None and dims_equal(3, "N") is None and dims_equal(3, 4) is False
    assert dims_equal("2 * (N // 2)", "N - N % 2") is True
    with pytest.raises(ValueError, match="unknown dim comparison"):
        dim_compare("N", "=<", 1)


def test_broadcast_and_unify_decide_what_is_decidable():
    assert broadcast_dims("H", "((H - 1) + 1)") == "H" and unify_dims("((H + 2) - 3) + 1", "H", "concat") == "H"
    assert broadcast_dims("N", "min(N, 1)") == "N" and broadcast_dims("N", 1) == "N"
    with pytest.raises(ShapeError, match="differ for every size"):
        unify_dims("N", "N + 1", "concat")
    with pytest.raises(ShapeError, match="not known to be equal"):          # undecidable: still refused here
        broadcast_dims("N", "M")
    with pytest.raises(ShapeError, match="not known to be equal"):
        unify_dims("N", "2 * N", "concat")


# ----------------------------------------------------------------------------------- op output formulas
@pytest.mark.parametrize("k, stride, pad, dilation, want", [
    (3, 1, 1, 1, "H"), (3, 2, 1, 1, "((H + 1) // 2)"), (1, 2, 0, 1, "((H + 1) // 2)"), (2, 2, 0, 1, "(H // 2)"),
    (5, 1, 2, 1, "H"), (3, 1, 2, 2, "H"), (7, 2, 3, 1, "((H + 1) // 2)"), (3, 1, 0, 1, "(H - 2)"),
])
def test_window_formulas_simplify(k, stride, pad, dilation, want):
    got = window_out_dim("H", k, stride, dilation, pad, pad)
    assert got == want
    for h in range(max(dilation * (k - 1) + 1 - 2 * pad, 1), 20):
        assert parse_dim(got).evaluate({"H": h}) == (h + 2 * pad - dilation * (k - 1) - 1) // stride + 1


def test_ceil_mode_pool_formula_is_exact():
    got = window_out_dim("H", 3, 2, 1, 1, 1, ceil_mode=True)
    for h in range(1, 30):      # torch / ONNX ceil_mode: the last window must start inside the padded input
        out = -(-(h + 2 - 3) // 2) + 1
        if (out - 1) * 2 >= h + 1:
            out -= 1
        assert parse_dim(got).evaluate({"H": h}) == out, h


def test_slice_and_split_formulas_simplify():
    assert slice_length("N", 1, None, 1) == "max((N - 1), 0)" and slice_length("N", None, None, 2) == "((N + 1) // 2)"
    # the two halves of 2N rows (a split / chunk in two) add back to 2N; N - N // 2 and N // 2 add to N
    first, second = dim_floordiv(dim_mul(2, "N"), 2), dim_sub(dim_mul(2, "N"), dim_floordiv(dim_mul(2, "N"), 2))
    assert first == second == "N" and dim_add(dim_sub("N", dim_floordiv("N", 2)), dim_floordiv("N", 2)) == "N"
    x = dt.trace(lambda x: F.split(x, 2, axis=0)[0] + F.split(x, 2, axis=0)[1], dt.TensorSpec((dim_mul(2, "N"), 3)))
    assert str(x.outputs[0].type) == "float32[N,3]"


# ------------------------------------------------------------------------------------------ CNN, compiled once
C, CLASSES = 4, 5


def _weights():
    r = np.random.default_rng(22)
    w = lambda *s: (r.standard_normal(s) * 0.3).astype("float32")
    return {"w1": w(C, 3, 3, 3), "b1": w(C), "w2": w(C, C, 3, 3), "b2": w(C), "wd": w(C, C, 3, 3),
            "ws": w(C, C, 1, 1), "fc": w(C, CLASSES)}


def _cnn(x, p):
    y = F.relu(F.conv(x, p["w1"], p["b1"], padding=1))                    # 3x3 pad 1: H stays H
    y = F.relu(F.conv(y, p["w2"], p["b2"], padding=1) + y)                # residual add: H + ((H - 1) + 1)
    down = F.conv(y, p["wd"], stride=2, padding=1) + F.conv(y, p["ws"], stride=2)   # 3x3 s2 p1 and 1x1 s2
    z = F.max_pool(F.relu(down), 3, stride=2, padding=1)
    return F.matmul(F.mean(z, axis=(2, 3)), p["fc"])                      # global average pool, classifier


def _np_conv(x, w, b=None, stride=1, pad=0):
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.shape[-1]
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    out = np.einsum("bchwij,ocij->bohw", win.astype("float64"), w.astype("float64"))
    return out if b is None else out + b[None, :, None, None]


def _np_cnn(x, p):
    relu = lambda v: np.maximum(v, 0)
    y = relu(_np_conv(x, p["w1"], p["b1"], pad=1))
    y = relu(_np_conv(y, p["w2"], p["b2"], pad=1) + y)
    down = relu(_np_conv(y, p["wd"], stride=2, pad=1) + _np_conv(y, p["ws"], stride=2))
    padded = np.pad(down, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    z = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(4, 5))
    return z.mean(axis=(2, 3)) @ p["fc"]


@pytest.mark.slow
def test_cnn_with_symbolic_batch_and_spatial_dims_compiles_once(monkeypatch):
    import dyntvm.pipeline as pipeline
    builds = []
    real_build = pipeline.build
    monkeypatch.setattr(pipeline, "build", lambda *a, **k: builds.append(1) or real_build(*a, **k))
    p = _weights()
    spec = dt.TensorSpec(("B", 3, "H", "W"))
    g = dt.trace(lambda x: _cnn(x, p), spec)
    assert str(g.outputs[0].type) == f"float32[B,{CLASSES}]"
    model = dt.compile(g)
    assert len(builds) == 1
    convs = [n for r in model.graph.walk() if r.op == "region" for n in r.subgraphs[0].walk() if n.op == "conv"]
    assert len(convs) == 4                                  # the convs run compiled, not eagerly
    r = np.random.default_rng(0)
    for b, h, w in [(2, 8, 8), (1, 1, 1), (3, 7, 5), (1, 2, 9), (2, 13, 4)]:
        x = r.standard_normal((b, 3, h, w)).astype("float32")
        want = _np_cnn(x, p)
        np.testing.assert_allclose(model(x), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dt.run_reference(g, x), want, rtol=1e-4, atol=1e-4)     # numpy kernels too
    assert len(builds) == 1                                 # no size compiled anything again


def test_onnx_cnn_with_symbolic_spatial_dims_matches_onnxruntime():
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    r = np.random.default_rng(1)
    w1, b1 = (r.standard_normal((3, 3, 3, 3)) * 0.3).astype("float32"), r.standard_normal(3).astype("float32")
    w2 = (r.standard_normal((3, 3, 3, 3)) * 0.3).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Add", ["r1", "x"], ["res"]),                   # residual: H against the conv's H
             helper.make_node("Conv", ["res", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("MaxPool", ["res"], ["mp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Add", ["c2", "mp"], ["y"])]                    # both ((H + 1) // 2)
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, None, None])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    g = dt.from_onnx(proto)
    assert str(g.outputs[0].type) == "float32[N,3,((H + 1) // 2),((W + 1) // 2)]"
    model = dt.compile(g)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, h, w in [(1, 5, 7), (2, 8, 8), (1, 1, 1), (3, 4, 11)]:
        x = r.standard_normal((n, 3, h, w)).astype("float32")
        want, = sess.run(None, {"x": x})
        np.testing.assert_allclose(model(x), want, rtol=1e-4, atol=1e-4)
