"""Shape tensors as data (issue 22, part 3): `F.zeros / ones / full / broadcast_to / expand / reshape / tile` take a
1-d integer shape tensor whose entries may be computed at run time, `F.one_hot` a depth tensor, `F.slice` bound /
step / axes tensors. Entries known while tracing (`frontend/shape_values.py`: ``F.shape_of(x)`` is x's shape)
become the dims, symbols kept, and a fully known operand gives the static op; the rest are dims known when the
op runs (a DYNAMIC_SHAPE node), its operand checked then.

Each compiled result is compared with an independent numpy expression at several sizes, 0 and 1 included."""
import functools

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.errors import ExecutionError, TraceError
from dyntvm.ir.types import eval_dim
from helpers import ops_in

S = dt.TensorSpec
SIZES = (0, 1, 5)


def _x(n, m=3, seed=0):
    return np.random.default_rng(seed + n).standard_normal((n, m)).astype(np.float32)


def _types(g):
    return [tuple(v.type.shape) for v in g.outputs]


def _same_dims(got, want) -> bool:
    """Equal shapes: a plain symbol must be kept as it is, an expression may be written another way (the dim
    algebra's canonical form) but must have the same value at every size tried."""
    if len(got) != len(want) or any(len(a) != len(b) for a, b in zip(got, want)):
        return False
    for a, b in zip(sum(map(list, got), []), sum(map(list, want), [])):
        if a == b:
            continue
        if not (isinstance(a, str) and isinstance(b, str)) or b.isidentifier():
            return False
        envs = [dict(N=n, M=m, S=k) for n in (0, 1, 3, 7) for m in (0, 2, 5) for k in (1, 4)]
        if any(eval_dim(a, e) != eval_dim(b, e) for e in envs):
            return False
    return True


def _count(g, op):
    return sum(1 for n in g.walk() if n.op == op)


# ------------------------------------------------------------------------------------------ the seed's examples
def _seed(x, v):
    s = F.shape_of(x)
    kept = F.cast(F.sum(x > 0), "int64")                    # a size read from the data
    shape_t = F.stack([s[0], kept])
    return (F.zeros(F.shape_of(x)), F.ones(s[::-1]), F.full(shape_t, 2.0),
            F.broadcast_to(v, F.concat([F.reshape(kept, (1,)), F.shape_of(v)[1:]])))


def _seed_numpy(x, v):
    kept = int((x > 0).sum())
    return (np.zeros(x.shape, np.float32), np.ones(x.shape[::-1], np.float32), np.full((x.shape[0], kept), 2.0,
            np.float32), np.broadcast_to(v, (kept, v.shape[1])))


def test_seed_examples_keep_symbols_and_compile():
    g = dt.trace(_seed, S(("N", 3)), S((1, 3)))
    zeros, ones, full, bcast = _types(g)
    assert zeros == ("N", 3) and ones == (3, "N")           # known entries: x's dims, the static op
    assert full[0] == "N" and full[1].startswith("_") and bcast[0].startswith("_") and bcast[1] == 3
    assert _count(g, "full") == 2 and _count(g, "broadcast_to_dyn") == 2
    compiled = dt.compile(g)
    v = np.arange(3, dtype=np.float32)[None]
    for n in SIZES:
        x = _x(n)
        want = _seed_numpy(x, v)
        for got in (compiled(x, v), _seed(x, v)):           # compiled, and eager
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and a.shape == b.shape, (n, a.shape, b.shape)
                np.testing.assert_array_equal(a, b)


def test_shape_entries_as_a_list_of_scalars():
    g = dt.trace(lambda x: F.zeros((F.shape_of(x)[1], 2, F.shape_of(x)[0]), "int32"), S(("N", "M")))
    assert _types(g) == [("M", 2, "N")] and g.outputs[0].type.dtype == "int32"
    np.testing.assert_array_equal(dt.run_reference(g, np.ones((4, 3), np.float32)), np.zeros((3, 2, 4), np.int32))


# ------------------------------------------------------------------------------------------ known values
KNOWN = [
    ("arange of shape_of", lambda x: F.arange(F.shape_of(x)[0]), [("N",)]),
    ("arange bounds", lambda x: F.arange(F.shape_of(x)[1], F.shape_of(x)[0] + 3), [("max(((N + 3) - M), 0)",)]),
    ("reshape to another's shape", lambda x: F.reshape(F.transpose(x), F.shape_of(x)), [("N", "M")]),
    ("reshape with -1", lambda x: F.reshape(x, F.concat([F.shape_of(x)[1:], np.array([-1])])), [("M", "N")]),
    ("arithmetic", lambda x: F.zeros(F.stack([F.shape_of(x)[0] * 2 + 1, F.prod(F.shape_of(x)),
                                              F.shape_of(x)[1] // 2, F.maximum(F.shape_of(x)[0], 4)])),
     [("((N * 2) + 1)", "(N * M)", "(M // 2)", "max(N, 4)")]),
    ("exporter's where", lambda x: F.ones(F.where(F.equal(F.shape_of(x), -1), np.int64(1), F.shape_of(x))),
     [("N", "M")]),
    ("static entry of a symbolic shape", lambda x: F.slice(F.reshape(x, (-1,)), [0],
                                                           F.reshape(F.shape_of(x)[1] // 2, (1,))),
     [("min((M // 2), (N * M))",)]),
    ("slice bound from shape_of", lambda x, y: F.slice(x, [0], F.shape_of(y)[:1]), [("min(S, N)", "M")]),
    ("tile", lambda x: F.tile(x, F.stack([np.int64(2), F.shape_of(x)[0]])), [("(N * 2)", "(M * N)")]),
    ("expand", lambda x: F.expand(F.sum(x, axis=0, keepdims=True), F.shape_of(x)), [("N", "M")]),
    ("one_hot", lambda x: F.one_hot(F.argmax(x, axis=1), F.shape_of(x)[1]), [("N", "M")]),
    ("cast and unsqueeze", lambda x: F.ones(F.expand_dims(F.cast(F.shape_of(x)[0], "int32"), 0)), [("N",)]),
]


@pytest.mark.parametrize("fn, want", [(fn, want) for _, fn, want in KNOWN], ids=[k[0] for k in KNOWN])
def test_known_values_keep_symbols(fn, want):
    specs = [S(("N", "M"))] + ([S(("S", 2))] if fn.__code__.co_argcount == 2 else [])
    g = dt.trace(fn, *specs)
    assert _same_dims(_types(g), want), (_types(g), want)
    assert not any(n.opdef.kind.name == "DYNAMIC_SHAPE" for n in g.walk()), "a fully known operand: static ops"
    for n, m in ((0, 3), (1, 1), (4, 6)):                   # the reference run agrees with eager numpy semantics
        args = [_x(n, m)] + ([_x(3, 2)] if len(specs) == 2 else [])
        np.testing.assert_array_equal(dt.run_reference(g, *args), fn(*args))


def test_known_values_reach_control_flow_bodies():
    """A body that captures a shape vector sees its entries too."""
    def fn(x, p):
        s = F.shape_of(x)
        return F.cond(p, lambda: F.zeros(s), lambda: F.ones(s))
    g = dt.trace(fn, S(("N", 3)), S((), "bool"))
    assert _types(g) == [("N", 3)]
    assert not any(n.op == "broadcast_to_dyn" for n in g.walk())


def test_python_ints_of_a_known_vector_fold():
    """`F.arange(F.shape_of(x)[1])` with a static axis is a static arange (the ONNX `.chunk` pattern)."""
    g = dt.trace(lambda x: F.arange(F.shape_of(x)[1] // 3), S(("N", 9)))
    assert _types(g) == [(3,)] and "arange_dyn" not in ops_in(g)


# ------------------------------------------------------------------------------------------ data-dependent operands
def _dynamic(x):
    k = F.cast(F.sum(x > 0), "int64")                       # computed from the data
    two = F.minimum(k, np.int64(2))
    tiled = F.tile(x, F.stack([two, np.int64(1)]))
    hot = F.one_hot(F.argmax(x, axis=1), k + 1, dtype="int32")
    sliced = F.slice(x, F.stack([np.int64(0), two]), F.stack([k, np.int64(3)]))
    by_axes = F.slice(x, F.reshape(two - 1, (1,)), np.array([100]), np.array([1]), F.reshape(two - 1, (1,)))
    reshaped = F.reshape(x, F.stack([k * 0 + 3, np.int64(-1)]))
    return tiled, hot, sliced, by_axes, reshaped


def _dynamic_numpy(x):
    k = int((x > 0).sum())
    two = min(k, 2)
    hot = (x.argmax(axis=1)[:, None] == np.arange(k + 1)).astype(np.int32) if x.shape[0] else \
        np.zeros((0, k + 1), np.int32)
    by_axes = x[two - 1:] if two - 1 == 0 else x[:, two - 1:] if two - 1 == 1 else x
    return np.tile(x, (two, 1)), hot, x[0:k, two:3], by_axes, x.reshape(3, -1)


@functools.cache
def _dynamic_compiled():
    g = dt.trace(_dynamic, S(("N", 3)))
    return g, dt.compile(g)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_tile_one_hot_slice_with_tensor_operands(n):
    g, compiled = _dynamic_compiled()        # compiled once for every size
    assert {"tile_dyn", "slice_dyn", "slice_axes_dyn", "reshape_dyn", "broadcast_to_dyn"} <= ops_in(g)
    for k in range(3):
        x = _x(n, seed=k)
        want = _dynamic_numpy(x)
        for got in (compiled(x), _dynamic(x)):
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and a.shape == b.shape, (n, k, a.shape, b.shape)
                np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------ bad operands
BAD = [
    ("negative size", lambda x: F.zeros(F.stack([F.cast(F.sum(x), "int64") - 100, np.int64(2)])),
     "negative entry"),
    ("too large", lambda x: F.ones(F.stack([F.cast(F.sum(x), "int64") + 2 ** 40, np.int64(2 ** 20)])),
     "more than this machine's memory"),
    ("reshape does not fit", lambda x: F.reshape(x, F.stack([F.cast(F.sum(x), "int64") + 7, np.int64(-1)])),
     "cannot reshape"),
    ("two -1", lambda x: F.reshape(x, F.stack([F.cast(F.sum(x), "int64") * 0 - 1, np.int64(-1)])),
     "more than one -1"),
    ("negative repeats", lambda x: F.tile(x, F.stack([F.cast(F.sum(x), "int64") - 9, np.int64(1)])),
     "negative entry"),
    ("negative depth", lambda x: F.one_hot(F.argmax(x, axis=1), F.cast(F.sum(x), "int64") - 9), "negative entry"),
    ("broadcast mismatch", lambda x: F.broadcast_to(x, F.stack([np.int64(2), F.cast(F.sum(x), "int64") + 4])),
     "cannot broadcast"),
    ("expand mismatch", lambda x: F.expand(x, F.stack([np.int64(1), F.cast(F.sum(x), "int64") + 4])),
     "cannot broadcast"),
    ("slice axis out of range", lambda x: F.slice(x, np.array([0]), np.array([1]), np.array([1]),
                                                  F.reshape(F.cast(F.sum(x), "int64") + 5, (1,))), "out of range"),
    ("slice axes repeat", lambda x: F.slice(x, np.array([0, 0]), np.array([1, 1]), np.array([1, 1]),
                                            F.stack([F.cast(F.sum(x), "int64") * 0, np.int64(0)])),
     "repeat an axis"),
]


@pytest.mark.parametrize("fn, match", [(fn, m) for _, fn, m in BAD], ids=[b[0] for b in BAD])
def test_bad_operands_raise_execution_errors(fn, match):
    x = np.ones((2, 3), np.float32)
    g = dt.trace(fn, S(("N", 3)))
    with pytest.raises((ExecutionError, TraceError), match=match):
        fn(x)                   # eager (a slice with array operands is a static one there: a TraceError)
    with pytest.raises(ExecutionError, match=match):
        dt.run_reference(g, x)
    with pytest.raises(ExecutionError, match=match):
        dt.compile(g)(x)


def test_known_bad_operands_are_trace_errors():
    with pytest.raises(TraceError, match="negative entry"):
        dt.trace(lambda x: F.zeros(F.shape_of(x) - 5), S((2, 3)))
    with pytest.raises(TraceError, match="negative entry"):
        dt.trace(lambda x: F.tile(x, np.array([-1, 1])), S(("N", 3)))
    with pytest.raises(TraceError, match="slice step cannot be zero"):
        dt.trace(lambda x: F.slice(x, F.shape_of(x)[:1] * 0, F.shape_of(x)[:1], F.shape_of(x)[:1] * 0), S(("N", 3)))
    with pytest.raises(TraceError, match="shape tensor must be a 1-d integer"):
        dt.trace(lambda x: F.zeros(F.cast(F.shape_of(x), "float32")), S(("N", 3)))


def test_saved_graph_keeps_known_dims(tmp_path):
    """The dims of a partly known operand survive a save / load (attrs `dims`), and the loaded model runs."""
    def fn(x):
        return F.full(F.stack([F.shape_of(x)[0], F.cast(F.sum(x > 0), "int64")]), 1.5)
    compiled = dt.compile(fn, S(("N", 3)))
    path = str(tmp_path / "m")
    compiled.save(path)
    loaded = dt.load(path)
    for n in SIZES:
        x = _x(n)
        want = np.full((n, int((x > 0).sum())), 1.5, np.float32)
        np.testing.assert_array_equal(loaded(x), want)
