"""Every op and every F function: trace -> reference interpreter equals eager, at several sizes of each
symbolic dim (0, 1 and more), before and after a JSON round trip. Then F's semantics against numpy."""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.frontend import F as F_module
from dyntvm.ir.ops import CONTROL_FLOW, REGION, Group, all_ops
from dyntvm.ir.ops import ops_in as ops_in_group
from helpers import assert_same, assert_trace_matches_eager, ops_in

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")   # log(-x), mean of empty axes, ...

S = dt.TensorSpec
W = np.random.default_rng(1).uniform(-1, 1, (4, 3)).astype(np.float32)
V = np.random.default_rng(2).uniform(-1, 1, (4,)).astype(np.float32)


def rand(shape, dtype="float32", seed=0, positive=False):
    """Random test data: floats in [-2, 2) (or (0.1, 2)), small ints, bools."""
    rng = np.random.default_rng(seed)
    kind = np.dtype(dtype).kind
    if kind == "f":
        lo = 0.1 if positive else -2.0
        return rng.uniform(lo, 2.0, shape).astype(dtype)
    if kind == "b":
        return rng.random(shape) < 0.5
    lo = 0 if kind == "u" or positive else -3
    return rng.integers(lo, 4, shape).astype(dtype)


class Case(NamedTuple):
    id: str
    fn: Callable
    specs: list
    sizes: tuple = (0, 1, 5)         # every symbolic dim takes each of these sizes
    make: Callable | None = None     # n -> inputs; default: random data shaped like the specs
    positive: bool = False
    tol: float = 1e-5


def inputs_for(case: Case, n: int) -> tuple:
    if case.make is not None:
        return tuple(case.make(n))
    return tuple(rand(tuple(n if isinstance(d, str) else d for d in s.shape), s.dtype, seed=i + n,
                      positive=case.positive) for i, s in enumerate(case.specs))


X = S(("N", 4))
X3 = S(("N", 3, 2))
XI = S(("N", 4), "int32")
XB = S(("N", 4), "bool")
CASES: list[Case] = []


def add(id, fn, specs, **kw):
    CASES.append(Case(id, fn, list(specs), **kw))


# ------------------------------------------------------------------------------------ elementwise
for name in ops_in_group(Group.FLOAT_UNARY):
    add(f"{name}-f32", lambda x, n=name: getattr(F, n)(x), [X], positive=name in ("log", "sqrt", "rsqrt"))
    add(f"{name}-f64", lambda x, n=name: getattr(F, n)(x), [S(("N", 4), "float64")],
        positive=name in ("log", "sqrt", "rsqrt"))
    add(f"{name}-i32", lambda x, n=name: getattr(F, n)(x), [XI], positive=True)
for name in ops_in_group(Group.UNARY) + ("negative",):
    add(f"{name}-f32", lambda x, n=name: getattr(F, n)(x), [X])
    add(f"{name}-i32", lambda x, n=name: getattr(F, n)(x), [XI])
add("logical_not-bool", lambda x: F.logical_not(x), [XB])
add("logical_not-f32", lambda x: F.logical_not(x > 0), [X])
add("isnan", lambda x: F.isnan(F.log(x)), [X])
add("unary-0d", lambda x: F.exp(F.sum(x)), [X])
add("tan-range", lambda x: F.tan(x * 1.5), [X])
add("clip-f32", lambda x: F.clip(x, -0.5, 0.75), [X])
add("clip-method-lo", lambda x: x.clip(0.25), [X])
add("clip-hi-i32", lambda x: F.clip(x, a_max=2), [XI])
add("clip-float-bounds-i32", lambda x: F.clip(x, -1.5, 2.5), [XI])
add("clip-inverted", lambda x: F.clip(x, 1.0, -1.0), [X])
add("clip-nan", lambda x: F.clip(F.log(x), -1.0, 1.0), [X])

BINARY = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "fmod", "floor_divide", "mod",
          "equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]
for name in BINARY:
    pos = name == "power"
    add(f"{name}-bcast-row", lambda x, y, n=name: getattr(F, n)(x, y), [X, S((4,))], positive=pos)
    add(f"{name}-bcast-col", lambda x, y, n=name: getattr(F, n)(x, y), [S(("N", 1), "int64"), XI], positive=pos)
    add(f"{name}-0d", lambda x, y, n=name: getattr(F, n)(x, y), [S(()), X], positive=pos)
    add(f"{name}-pyscalar", lambda x, n=name: getattr(F, n)(x, 2), [XI], positive=pos)
    add(f"{name}-pyfloat-left", lambda x, n=name: getattr(F, n)(1.5, x), [X], positive=pos)
    add(f"{name}-numpy-const", lambda x, n=name: getattr(F, n)(x, V), [X], positive=pos)
    add(f"{name}-mixed-dtypes", lambda x, y, n=name: getattr(F, n)(x, y),
        [S(("N", 4), "int32"), S(("N", 4), "float32")], positive=pos)
for name in ["logical_and", "logical_or"]:
    add(f"{name}", lambda x, y, n=name: getattr(F, n)(x, y), [XB, S((4,), "bool")])
    add(f"{name}-pybool", lambda x, n=name: getattr(F, n)(x, True), [XB])
    add(f"{name}-operator", lambda x, y: (x & y) | ~x, [XB, XB])
add("where", lambda c, x: F.where(c, x, 0.5), [XB, X])
add("where-bcast", lambda x, y: F.where(x > 0, x, y), [S(("N", 1)), S((4,), "int32")])
add("where-scalars", lambda x: F.where(x > 0, 1, -1), [X])

# Python scalars next to tensors: numpy operators eagerly, F ops traced, identical dtypes (NEP 50 rules).
SCALAR_EXPRS = {
    "add-int": lambda x: x + 1, "radd-float": lambda x: 1.5 + x, "mul-float": lambda x: x * 0.5,
    "rmul-int": lambda x: 2 * x, "sub-int": lambda x: x - 1, "rsub-float": lambda x: 2.5 - x,
    "div-int": lambda x: x / 2, "rdiv-float": lambda x: 1.0 / (x + 5), "pow-int": lambda x: x ** 2,
    "rpow-int": lambda x: 2 ** x, "gt-float": lambda x: x > 0.5, "rlt-int": lambda x: 1 < x,
    "eq-int": lambda x: x == 2, "floordiv-int": lambda x: x // 2, "rfloordiv-float": lambda x: 7.5 // (x + 1),
    "mod-int": lambda x: x % 3, "rmod-int": lambda x: 7 % (x + 1),
    "neg": lambda x: -x, "bool-scalar": lambda x: x * True,
}
for dtype in ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64"]:
    for ename, expr in SCALAR_EXPRS.items():
        if dtype == "bool" and ename in ("sub-int", "rsub-float", "neg", "pow-int"):
            continue                 # numpy refuses - on bools; x ** 2 is np.square(x), int8 for bools
        if dtype in ("uint8", "int8") and ename in ("rsub-float", "neg", "rpow-int", "pow-int"):
            continue                 # wraps around
        add(f"scalar-{ename}-{dtype}", expr, [S(("N", 4), dtype)], positive=True)

# tensor-tensor operators with numpy semantics
add("op-matmul-T", lambda x: x @ x.T, [X])
add("op-matmul-const", lambda x: x @ W, [X])
add("op-rmatmul-const", lambda x: W.T @ x.T, [X])
add("op-mixed", lambda x, y: (x + y) * (x - y) / (y ** 2 + 1) - -x, [XI, X])
add("op-abs", lambda x: abs(x), [X])
add("op-compare", lambda x, y: [x < y, x <= y, x > y, x >= y, x == y, x != y], [X, S((4,))])

# --------------------------------------------------------------------------------------- matmul
add("matmul-2d", lambda x: F.matmul(x, W), [X])
add("matmul-vec", lambda x: F.matmul(x, V), [X])
add("matmul-vec-left", lambda y: F.matmul(V, y), [S((4, "N"))])
add("matmul-batch", lambda x, y: F.matmul(x, y), [S((2, "N", 4)), S((4, 3))])
add("matmul-batch-bcast", lambda x, y: F.matmul(x, y), [S((2, 1, "N", 4)), S((3, 4, 2))])
add("matmul-int", lambda x, y: F.matmul(x, y), [XI, S((4, 2), "int32")])
add("matmul-vecvec", lambda x, y: F.matmul(x, y), [S(("N",)), S(("N",))])

# ----------------------------------------------------------------------------------- reductions
for name in ["sum", "mean", "max", "min", "prod"]:
    nonempty = (1, 5) if name in ("max", "min") else (0, 1, 5)
    add(f"{name}-all", lambda x, n=name: getattr(F, n)(x), [X], sizes=nonempty)
    add(f"{name}-axis0", lambda x, n=name: getattr(F, n)(x, axis=0), [X], sizes=nonempty)
    add(f"{name}-axis1-keep", lambda x, n=name: getattr(F, n)(x, axis=-1, keepdims=True), [X])
    add(f"{name}-axes", lambda x, n=name: getattr(F, n)(x, axis=(0, 2)), [X3], sizes=nonempty)
    add(f"{name}-int", lambda x, n=name: getattr(F, n)(x, axis=1), [S(("N", 4), "int8")])
    add(f"{name}-bool", lambda x, n=name: getattr(F, n)(x, axis=1), [XB])
    add(f"{name}-method", lambda x, name=name: getattr(x, name)(axis=1), [X])
for name in ["argmax", "argmin"]:
    add(f"{name}-all", lambda x, n=name: getattr(F, n)(x), [X], sizes=(1, 5))
    add(f"{name}-axis1", lambda x, n=name: getattr(F, n)(x, axis=1), [XI])
    add(f"{name}-keep", lambda x, n=name: getattr(F, n)(x, axis=0, keepdims=True), [X], sizes=(1, 5))
    add(f"{name}-all-keep", lambda x, n=name: getattr(F, n)(x, keepdims=True), [X3], sizes=(1, 5))

# ---------------------------------------------------------------------------------------- shapes
add("reshape-flat", lambda x: F.reshape(x, -1), [X])
add("reshape-minus1", lambda x: x.reshape(-1, 2), [X])
add("reshape-minus1-last", lambda x: x.reshape(2, -1), [X])
add("reshape-sym", lambda x: x.reshape(x.shape[0], 2, 2), [X])
add("reshape-sym-arith", lambda x: x.reshape((x.shape[0] * 2, -1)), [X], sizes=(1, 5))  # numpy: -1 with 0
add("reshape-sym-div", lambda x: x.reshape(x.shape[0] // 2, 8), [X], sizes=(0, 2, 6))
add("reshape-ambiguous-floor", lambda x: x.reshape(-1, 4), [S(("N", 6))], sizes=(0, 2, 4))
add("reshape-zero-dim", lambda x: x.reshape(-1), [S(("N", 0))])
add("reshape-static", lambda x: x.reshape(3, -1, 2), [S((4, 3))])
add("reshape-shape-tensor", lambda x: F.reshape(x, F.shape_of(x)[::-1]), [X])
add("reshape-shape-input", lambda x, s: F.reshape(x, s), [X, S((3,), "int64")],
    make=lambda n: (rand((n, 4)), np.array([2, n, 2], np.int64)))
add("reshape-shape-numpy", lambda x: F.reshape(x, np.array([-1, 2])), [X])
add("flatten", lambda x: F.flatten(x), [X3])
add("flatten-from1", lambda x: F.flatten(x, 1), [X3])
add("flatten-0d", lambda x: F.flatten(F.sum(x)), [X])
add("transpose", lambda x: F.transpose(x), [X3])
add("transpose-axes", lambda x: F.transpose(x, (1, 0, 2)), [X3])
add("transpose-method", lambda x: x.transpose(2, 0, 1), [X3])
add("T", lambda x: x.T, [X3])
add("expand_dims-0", lambda x: F.expand_dims(x, 0), [X])
add("expand_dims-last", lambda x: F.expand_dims(x, -1), [X])
add("expand_dims-mid", lambda x: F.expand_dims(x, 1), [X])
add("squeeze-axis", lambda x: F.squeeze(x, 1), [S(("N", 1, 4))])
add("squeeze-axes", lambda x: F.squeeze(x, (0, 2)), [S((1, "N", 1))])
add("squeeze-all-static", lambda x: F.squeeze(x), [S((1, 4, 1))])
add("squeeze-symbolic", lambda x: F.squeeze(x[:1], 0), [X], sizes=(1, 5))
add("concat-axis0", lambda x, y: F.concat([x, y]), [X, S(("M", 4))])
add("concat-axis1", lambda x, y: F.concatenate([x, y], axis=1), [X, S(("N", 2), "int32")])
add("concat-three", lambda x: F.concat([x, x * 2, V[None]], axis=0), [X])
add("stack-0", lambda x, y: F.stack([x, y]), [X, X])
add("stack-last", lambda x: F.stack([x, x + 1, x * 2], axis=-1), [X])
add("stack-mixed", lambda x, y: F.stack([x, y], axis=1), [XI, X])
add("split-equal", lambda x: F.split(x, 2, axis=1), [X])
add("split-indices", lambda x: F.split(x, [1, 3], axis=-1), [X])
add("split-symbolic-axis", lambda x: F.split(x, [1], axis=0), [X], sizes=(1, 5))
add("split-symbolic-equal", lambda x: F.split(x, 2, axis=0), [X], sizes=(0, 2, 6))
add("slice", lambda x: F.slice(x, [1, 0], [None, 3], [1, 2]), [X])
add("slice-axes", lambda x: F.slice(x, [-3], [-1], axes=[1]), [X])
add("strided_slice", lambda x: F.strided_slice(x, [None], [None], [-1]), [X])
add("take", lambda x, i: F.take(x, i), [X, S(("K",), "int64")],
    make=lambda n: (rand((n, 4)), np.array([0, -1, n - 1] if n else [], np.int64)))
add("take-axis1", lambda x: F.take(x, np.array([[3, 0], [1, 1]]), axis=1), [X])
add("take-0d", lambda x: F.take(x, np.int64(2), axis=1), [X])
add("embedding", lambda ids: F.embedding(ids, W.T), [S(("N", 2), "int64")],
    make=lambda n: (rand((n, 2), "int64", positive=True) % 3,))
add("broadcast_to-sym", lambda x, y: F.broadcast_to(x, y.shape), [S((4,)), X])
add("broadcast_to-col", lambda x: F.broadcast_to(x, (x.shape[0], 4)), [S(("N", 1))])
add("broadcast_to-static", lambda x: F.broadcast_to(x, (2, 3, 4)), [S((3, 1))])
add("tile", lambda x: F.tile(x, (2, 1)), [X])
add("tile-int", lambda x: F.tile(x, 3), [X])
add("tile-more-reps", lambda x: F.tile(x, (2, 1, 2)), [X])
# shape operands computed from the data (tests/test_shape_tensors.py has more)
add("tile-reps-tensor", lambda x: F.tile(x, F.stack([F.sum(x > 0), np.int64(1)])), [X])
add("full-shape-tensor", lambda x: F.full(F.stack([F.shape_of(x)[0], F.sum(x > 0)]), 2.5), [X])
add("expand-shape-tensor", lambda x: F.expand(x[:, :1], F.stack([np.int64(1), F.sum(x > 0) + 1])), [X])
add("one_hot", lambda x: F.one_hot(F.argmax(x, axis=1), 4, axis=0), [X])
add("one_hot-depth-tensor", lambda x: F.one_hot(F.argmax(x, axis=1), F.sum(x > 0), dtype="int32"), [X])
add("slice-axes-tensor", lambda x, a: F.slice(x, np.array([1]), np.array([3]), np.array([1]), a),
    [X, S((1,), "int64")], make=lambda n: (rand((n, 4)), np.array([n % 2], np.int64)))
add("pad", lambda x: F.pad(x, ((1, 2), (0, 1)), 1.5), [X])
add("pad-int", lambda x: F.pad(x, 1), [XI])
for src, dst in [("float32", "int32"), ("int32", "float32"), ("bool", "float32"), ("float32", "bool"),
                 ("int64", "int8"), ("float32", "float16")]:
    add(f"cast-{src}-{dst}", lambda x, dst=dst: F.cast(x, dst), [S(("N", 4), src)])
add("astype", lambda x: F.astype(x, "float64"), [XI])
add("astype-method", lambda x: x.astype(np.int64), [X])

# ------------------------------------------------------------------------------------ nn ops
add("softmax", lambda x: F.softmax(x), [X])
add("softmax-axis0", lambda x: F.softmax(x, axis=0), [X])
add("softmax-int", lambda x: F.softmax(x), [XI])
add("log_softmax", lambda x: F.log_softmax(x), [X])
add("log_softmax-axis0", lambda x: F.log_softmax(x, axis=0), [X])
add("layer_norm", lambda x: F.layer_norm(x, V, V * 2), [X])
add("layer_norm-inputs", lambda x, g, b: F.layer_norm(x, g, b, eps=1e-3), [X3, S((3, 2)), S((3, 2))])

# ----------------------------------------------------------------------------------- creation
add("full-static", lambda x: F.full((2, 3), 7.5) + F.sum(x), [X])
add("full-sym", lambda x: F.full((x.shape[0], 4), 2) + x, [X])
add("full-bool", lambda x: F.full(x.shape, True), [X])
add("zeros", lambda x: F.zeros((x.shape[0], 3)) + x[:, :3], [X])
add("zeros-int", lambda x: F.zeros(x.shape, x.dtype), [XI])
add("ones", lambda x: F.ones((x.shape[0] * 2,), "int32"), [X])
add("full_like", lambda x: F.full_like(x, 3), [X])
add("full_like-dtype", lambda x: F.full_like(x, 1.5, "float64"), [XI])
add("zeros_like", lambda x: F.zeros_like(x), [XI])
add("ones_like", lambda x: F.ones_like(x, "bool"), [X])
add("arange-static", lambda x: F.arange(5) + F.sum(x > 0), [X])
add("arange-step", lambda x: F.arange(1, 7, 2), [X])
add("arange-float", lambda x: F.arange(0.0, 1.0, 0.25) * F.sum(x), [X])
add("arange-sym", lambda x: F.arange(x.shape[0]), [X])
add("arange-sym-step", lambda x: F.arange(1, x.shape[0] * 2, 3), [X])
add("arange-sym-neg-step", lambda x: F.arange(x.shape[0], 0, -2), [X])
add("arange-tensor", lambda x: F.arange(F.sum(x > 0)), [X])
add("arange-tensor-bounds", lambda a, b: F.arange(a, b, 2), [S((), "int32"), S((), "int32")],
    make=lambda n: (np.int32(-n), np.int32(n + 1)))
add("arange-tensor-float", lambda x: F.arange(0.0, F.max(x), 0.5), [X], sizes=(1, 5))
add("arange-tensor-empty", lambda x: F.arange(F.sum(x > 100)), [X])

# ---------------------------------------------------------------------------- dynamic shapes
add("boolean_mask", lambda x: F.boolean_mask(x, x[:, 0] > 0), [X])
add("boolean_mask-axis1", lambda x: F.boolean_mask(x, np.array([True, False, True, True]), axis=1), [X])
def _masked_pair(x, y):
    m = y > 0                    # one mask value: both results share its unknown length
    return F.boolean_mask(x, m) + F.boolean_mask(y, m)[:, None]


add("boolean_mask-shared-dim", _masked_pair, [X, S(("N",))])
add("boolean_mask-int", lambda x, m: F.boolean_mask(x, m), [XI, S(("N",), "bool")])
add("nonzero", lambda x: F.nonzero(x > 0), [X])
add("nonzero-1d", lambda x: F.nonzero(x), [S(("N",), "int32")])
add("nonzero-float", lambda x: F.nonzero(F.relu(x)), [X3])
add("unique", lambda x: F.unique(x), [XI])
add("unique-all", lambda x: F.unique(x, return_inverse=True, return_counts=True), [XI])
add("unique-inverse", lambda x: F.unique(x, return_inverse=True), [X])
add("unique-counts", lambda x: F.unique(x > 0, return_counts=True), [X])
add("unique-axis-unsorted", lambda x: F.unique(F.fmod(x, 2), return_index=True, return_inverse=True, return_counts=True,
                                               axis=0, sorted=False), [XI])
add("unique-index-axis1", lambda x: F.unique(x > 0, return_index=True, axis=-1), [X])
add("slice_dyn", lambda x: F.slice(x, F.shape_of(x) - 3, F.shape_of(x), None, [0, 1]), [X])
add("slice_dyn-steps", lambda x: F.slice(x, [None, 1], F.shape_of(x) - 5, [-1, 2], [0, 1]), [XI])
add("shape_of", lambda x: F.shape_of(x), [X3])
add("shape_of-arith", lambda x: F.shape_of(x) * 2 + 1, [X])
add("topk", lambda x: F.topk(x, 2), [X])
add("topk-smallest", lambda x: F.topk(x, 3, axis=1, largest=False), [XI])
add("topk-axis0", lambda x: F.topk(x, 1, axis=0), [X], sizes=(1, 5))
add("topk-uint8", lambda x: F.topk(x, 4), [S(("N", 4), "uint8")])
add("topk-bool", lambda x: F.topk(x, 2), [XB])
add("topk-tensor-k", lambda x, k: F.topk(x, k), [X, S((), "int64")],
    make=lambda n: (rand((n, 4)), np.int64(n % 5)))
add("topk-tensor-k-computed", lambda x: F.topk(x, F.sum(x[0] > 0), axis=-1), [X], sizes=(1, 5))
add("topk-numpy-k", lambda x: F.topk(x, np.array(2)), [X])

# ----------------------------------------------------------------------------------- indexing
add("getitem-slices", lambda x: x[1:, ::2], [X])
add("getitem-last", lambda x: x[-1], [X], sizes=(1, 5))
add("getitem-first-col", lambda x: x[:, 0], [X])
add("getitem-neg-col", lambda x: x[:, -1], [X])
add("getitem-none", lambda x: x[None], [X])
add("getitem-none-mid", lambda x: x[:, None, 1:3], [X])
add("getitem-ellipsis", lambda x: x[..., 0], [X3])
add("getitem-ellipsis-mid", lambda x: x[1:, ..., 1], [X3])
add("getitem-int-slice", lambda x: x[0, 1:], [X], sizes=(1, 5))
add("getitem-reverse", lambda x: x[::-1], [X])
add("getitem-step-sym", lambda x: x[::2], [X])
add("getitem-head", lambda x: x[:2], [X], sizes=(2, 5))
add("getitem-tail", lambda x: x[-2:], [X], sizes=(2, 5))
add("getitem-drop-ends", lambda x: x[1:-1], [X])
add("getitem-int-tensor", lambda x, i: x[i], [X, S(("K",), "int64")],
    make=lambda n: (rand((n, 4)), np.arange(n, dtype=np.int64)[::-1].copy()))
add("getitem-int-tensor-2d", lambda x: x[np.array([[0, 1], [1, 0]])], [X], sizes=(2, 5))
add("getitem-list", lambda x: x[[0, 0]], [X], sizes=(1, 5))
add("getitem-bool-tensor", lambda x: x[x[:, 1] > 0], [X])
add("getitem-F", lambda x: F.getitem(x, (slice(None), slice(1, 3))), [X])
add("getitem-0d-int-tensor", lambda x, i: x[i], [X, S((), "int64")], sizes=(1, 5),
    make=lambda n: (rand((n, 4)), np.int64(n - 1)))

# ------------------------------------------------------------------------ lists (tests/test_lists.py)
def _lists(x, sizes):
    rows = F.split_to_list(x, None, 0, False)                   # N rows of [4]
    grown = F.list_insert(F.list_append(rows, x[0] * 2.0), x[-1], 0)
    return [F.list_stack(F.list_erase(grown, 1), 1), F.list_at(grown, -1), F.list_length(F.split_to_list(x, sizes)),
            F.list_concat(F.make_list(x, x), 1), F.list_stack(F.list_empty("float32", (2,)), 0)]


add("lists", _lists, [X, S(("K",), "int64")], sizes=(1, 5), make=lambda n: (rand((n, 4)), np.array([n], np.int64)))

# --------------------------------------------------------------------------------- attributes
add("attr-shape-dtype", lambda x: F.zeros(x.shape, x.dtype) + x.ndim, [XI])
add("attr-shape-arith", lambda x: F.reshape(x, (x.shape[1], x.shape[0])), [X])

# ------------------------------------------------------------- sliding windows (tests/test_window_ops.py)
KW = np.random.default_rng(3).uniform(-1, 1, (4, 1, 3, 2)).astype(np.float32)
add("conv-pools", lambda x: [F.conv(x, KW, V, stride=(2, 1), padding=((1, 0), (0, 1)), dilation=(1, 2), groups=2),
                             F.max_pool(x, 2, 1, ceil_mode=True), F.avg_pool(x, 3, 2, 1, count_include_pad=False)],
    [S(("N", 2, 6, 5))])

# ---------------------------------------------------- index / detection ops (tests/test_onnx_new_ops.py)
from dyntvm.frontend.ops import apply  # noqa: E402
from dyntvm.ir.ops_index import NmsAttrs, RoiAlignAttrs, ScatterAttrs  # noqa: E402

add("assert_dims_equal", lambda x, y: x * 2.0 + F.assert_dims_equal(x, y, 0, 0), [X, S(("M", 4))])  # N == M here
ROIS = np.array([[0.5, 0.5, 3.0, 4.0], [1.0, 0.0, 4.5, 2.5]], np.float32)
add("cumsum", lambda x: [F.cumsum(x, axis=1), F.cumsum(x, 0)], [X])
add("cumsum-int", lambda x: F.cumsum(x, axis=-1), [XI])
add("scatter_flat", lambda x: apply("scatter", "scatter_flat", [F.reshape(x, (-1,)), np.array([3, 0, 3], np.int64),
                                                               np.array([1, 2, 3], np.float32)], ScatterAttrs("add"))[0],
    [X], sizes=(1, 5))
add("roi_align", lambda x: apply("roi_align", "roi_align", [x, ROIS, np.zeros(2, np.int64)],
                                 RoiAlignAttrs(2, 3, 0, 1.0, "avg", True))[0], [S(("N", 2, 5, 6))], sizes=(1, 3))
add("nms", lambda b, s: apply("nms", "nms", [b, s, np.int64(3), np.float32(0.3), np.float32(0.2)],
                              NmsAttrs(False, True))[0], [S((1, "N", 4)), S((1, 2, "N"))],
    make=lambda n: (np.sort(rand((1, n, 4)), axis=-1).reshape(1, n, 2, 2).transpose(0, 1, 3, 2).reshape(1, n, 4),
                    rand((1, 2, n), seed=1)))

CASE_IDS = [c.id for c in CASES]
assert len(set(CASE_IDS)) == len(CASE_IDS), "duplicate case ids"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_trace_matches_eager(case):
    assert_trace_matches_eager(case.fn, case.specs, [inputs_for(case, n) for n in case.sizes],
                               rtol=case.tol, atol=case.tol)


def test_every_op_is_covered():
    """Every registered op except control flow (tests/test_control_flow.py) appears in some case."""
    covered = set()
    for c in CASES:
        covered |= ops_in(dt.trace(c.fn, *c.specs))
    want = {n for n, d in all_ops().items() if d.kind not in (CONTROL_FLOW, REGION)}
    assert want - covered == set()


def test_every_F_function_is_covered(monkeypatch):
    """Every public F function is called by some case (F.getitem through x[...] counts only if called)."""
    called = set()
    for name in F.all_ops_names():
        orig = getattr(F_module, name)

        def spy(*a, _n=name, _f=orig, **k):
            called.add(_n)
            return _f(*a, **k)
        monkeypatch.setattr(F_module, name, spy)
    for c in CASES:
        dt.trace(c.fn, *c.specs)
    assert set(F.all_ops_names()) - called == set()


# ------------------------------------------------------------------- F's semantics against numpy
def _x(n=5, seed=0):
    return rand((n, 4), seed=seed)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_softmax_formula(n):
    x = _x(n)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(F.softmax(x), e / e.sum(axis=-1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(F.log_softmax(x), np.log(e / e.sum(axis=-1, keepdims=True)), rtol=1e-5, atol=1e-6)


def test_unary_formulas():
    x = _x()
    np.testing.assert_allclose(F.sigmoid(x), 1 / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_allclose(F.rsqrt(np.abs(x)), 1 / np.sqrt(np.abs(x)), rtol=1e-6)
    np.testing.assert_array_equal(F.relu(x), np.maximum(x, 0))
    from math import erf
    np.testing.assert_allclose(F.erf(x), np.vectorize(erf)(x), rtol=1e-6)
    np.testing.assert_allclose(F.gelu(x), 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2))), rtol=1e-5)
    assert F.exp(np.arange(3)).dtype == np.float32          # ints go to the default float dtype


def test_layer_norm_formula():
    x, g, b = _x(), V, V * 2
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(F.layer_norm(x, g, b), (x - m) / np.sqrt(v + 1e-5) * g + b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_nonzero_is_numpy_stack_nonzero(n):
    x = _x(n) > 0
    np.testing.assert_array_equal(F.nonzero(x), np.stack(np.nonzero(x)))
    assert F.nonzero(x).dtype == np.int64 and F.nonzero(x).shape == (2, int(x.sum()))


@pytest.mark.parametrize("n", [0, 1, 5])
def test_unique_is_numpy_unique(n):
    x = rand((n, 4), "int32", seed=n)
    u, inv, cnt = F.unique(x, return_inverse=True, return_counts=True)
    nu, ninv, ncnt = np.unique(x, return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(u, nu)
    np.testing.assert_array_equal(inv.reshape(-1), ninv.reshape(-1))
    np.testing.assert_array_equal(cnt, ncnt)
    assert inv.shape == x.shape and inv.dtype == cnt.dtype == np.int64
    np.testing.assert_array_equal(u[inv], x)


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8", "bool"])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_sorted_values_and_indices(dtype, largest):
    x = rand((5, 6), dtype, seed=3)
    vals, idx = F.topk(x, 3, axis=1, largest=largest)
    order = np.argsort(-x.astype(np.float64) if largest else x, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, order, axis=1))
    assert vals.dtype == x.dtype and idx.dtype == np.int64


def test_topk_tensor_k_matches_int_k():
    x = _x()
    for k in range(5):
        assert_same(F.topk(x, np.int64(k)), F.topk(x, k))


@pytest.mark.parametrize("n", [0, 1, 5])
def test_boolean_mask_is_numpy_indexing(n):
    x = _x(n)
    m = x[:, 0] > 0
    np.testing.assert_array_equal(F.boolean_mask(x, m), x[m])
    cm = np.array([True, False, False, True])
    np.testing.assert_array_equal(F.boolean_mask(x, cm, axis=1), x[:, cm])


def test_getitem_is_numpy_indexing():
    x = rand((5, 4, 3))
    for idx in [(slice(1, None), slice(None, None, 2)), -1, None, (Ellipsis, 0), (0, None, slice(1, 3)),
                (slice(None, None, -1),), (slice(-2, None), Ellipsis, -1), np.array([4, 0, 0]),
                np.array([True, False, True, False, True])]:
        np.testing.assert_array_equal(F.getitem(x, idx), x[idx])


def test_arange_is_numpy_arange():
    for args in [(5,), (1, 7, 2), (7, 1, -2), (0, 0), (3, 1)]:
        np.testing.assert_array_equal(F.arange(*args), np.arange(*args))
        assert F.arange(*args).dtype == np.int64
    np.testing.assert_allclose(F.arange(0.0, 1.0, 0.25), np.arange(0.0, 1.0, 0.25))
    assert F.arange(0.0, 1.0, 0.25).dtype == np.float32     # dyntvm's default float dtype
    np.testing.assert_array_equal(F.arange(np.int32(2), np.int32(9), 3), np.arange(2, 9, 3))


def test_reshape_split_and_friends_are_numpy():
    x = rand((6, 4))
    np.testing.assert_array_equal(F.reshape(x, (-1, 3)), x.reshape(-1, 3))
    np.testing.assert_array_equal(F.reshape(x, np.array([4, -1])), x.reshape(4, -1))
    for a, b in zip(F.split(x, [1, 4], axis=0), np.split(x, [1, 4], axis=0)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(F.tile(x, (2, 1)), np.tile(x, (2, 1)))
    np.testing.assert_array_equal(F.pad(x, 1, 2.0), np.pad(x, 1, constant_values=2.0))
    np.testing.assert_array_equal(F.shape_of(x), np.array([6, 4]))
    assert F.shape_of(x).dtype == np.int64


def test_reductions_match_numpy_dtypes():
    for dtype in ["bool", "int8", "int32", "uint16", "float16", "float32"]:
        x = rand((3, 4), dtype)
        for name in ["sum", "prod", "max", "min", "mean"]:
            got, want = getattr(F, name)(x, axis=0), getattr(np, name)(x, axis=0)
            assert got.dtype == want.dtype, (name, dtype)
            np.testing.assert_allclose(got, want, rtol=1e-3)


def test_traced_attributes():
    seen = {}

    def f(x):
        seen.update(shape=x.shape, dtype=x.dtype, ndim=x.ndim, Tshape=x.T.shape)
        seen["dim_expr"] = x.shape[0] * 2 + 1
        return x

    dt.trace(f, S(("N", 4), "int32"))
    assert seen["shape"] == ("N", 4) and seen["dtype"] == np.dtype("int32") and seen["ndim"] == 2
    assert seen["Tshape"] == (4, "N")
    assert seen["dim_expr"] == "((2 * N) + 1)"          # canonical form of N * 2 + 1


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "int64", "float16", "float32", "float64"])
@pytest.mark.parametrize("scalar", [True, 3, 1.5])
def test_python_scalar_dtypes_follow_numpy(dtype, scalar):
    """F ops (eager and traced) give a Python scalar next to a tensor numpy's dtype."""
    x = rand((2, 3), dtype, positive=True)
    for name in ["add", "multiply", "maximum", "divide", "less"]:
        f = getattr(F, name)
        want = getattr(np, {"divide": "true_divide"}.get(name, name))(x, scalar).dtype
        assert f(x, scalar).dtype == want, (name, dtype, scalar)
        assert f(scalar, x).dtype == getattr(np, {"divide": "true_divide"}.get(name, name))(scalar, x).dtype
        g = dt.trace(lambda t: f(t, scalar), S((2, 3), dtype))
        assert g.outputs[0].type.dtype == want.name
