"""Loop rewrites (partition/loops.py): hoisting out of foreach / while_loop bodies, and while_loop's condition
computed in its body. The graph before / after, then compiled == eager at several sizes incl. 0 and 1 steps."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.codegen.build import stats
from dyntvm.partition.partitioner import partition

from helpers import assert_same

# these tests count the executor's region calls (`model.kernel_calls`): models run in the executor
pytestmark = pytest.mark.usefixtures("executor_only")

RNG = np.random.default_rng(5)
W = (RNG.standard_normal((8, 16)) * 0.3).astype("float32")
U = (RNG.standard_normal((16, 16)) * 0.3).astype("float32")
V3 = (RNG.standard_normal((2, 8, 16)) * 0.3).astype("float32")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


def ops_of(g):
    return [n.op for n in g.nodes]


def region_ops(g):
    """Ops computed by `g` (a partitioned graph), looking into its regions but not into loop bodies."""
    out = []
    for n in g.nodes:
        out += [m.op for m in n.subgraphs[0].nodes] if n.op == "region" else [n.op]
    return out


def body_of(pg, op="foreach"):
    (loop,) = [n for n in pg.nodes if n.op == op]
    return loop, loop.subgraphs[-1]


def compiled(fn, *specs, cache_dir):
    before = stats.builds
    model = dt.compile(fn, *specs, cache_dir=cache_dir)
    assert stats.builds - before <= 1
    return model


# ------------------------------------------------------------------------------------ foreach
def test_lstm_input_projection_becomes_one_gemm_over_all_steps():
    ex = examples.get("lstm")
    g = dt.trace(ex.fn, *ex.specs)
    (fe,) = [n for n in g.nodes if n.op == "foreach"]
    assert ops_of(fe.subgraphs[0]).count("matmul") == 2            # before: x_t @ W and h @ U per step
    pg = partition(g)
    assert ops_of(pg) == ["region", "foreach"]
    gemm = pg.nodes[0].subgraphs[0]
    (mm,) = [n for n in gemm.nodes if n.op == "matmul"]
    assert mm.outputs[0].type.shape == ("T", "B", 1024)             # xs @ W: [T, B, 128] @ [128, 1024]
    loop, body = body_of(pg)
    assert loop.attrs.num_data == 1 and loop.inputs[0].name == mm.outputs[0].name   # the body reads its rows
    assert [n.op for n in body.nodes[0].subgraphs[0].nodes].count("matmul") == 1   # only h @ U is left
    assert body.inputs[0].type.shape == ("B", 1024)


def step_ops(x, states):
    """Every liftable kind of node on the data slice x[B, 8], plus one that is not (rank-growing broadcast)."""
    (h,) = states
    xw = F.matmul(x, W)                              # lifted: [T, B, 8] @ [8, 16]
    s = F.sum(xw, axis=1, keepdims=True)             # lifted reduce, axis shifted
    p = F.softmax(xw, axis=-1)                       # lifted, negative axis
    a, b = F.split(F.concat([xw, p], axis=1), 2, axis=1)     # lifted concat (both inputs lifted) and split
    m = F.mean(x)                                    # full reduce: axes of the step, 0-d per step
    e = F.expand_dims(F.cast(x > 0, "float32"), 0)   # [1, B, 8]
    h = F.tanh(a + b * 0.5 + F.matmul(h, U) + s * 0.01 + m)
    tx = F.transpose(x)                              # lifted: [T, 8, B], the sequence axis stays first
    return [h, F.sum(e, axis=(0, 2)) + F.sum(tx, axis=0)], [h]


@pytest.mark.parametrize("T,B", [(0, 2), (1, 1), (5, 3)])
def test_lifted_ops_equal_eager(T, B, cache_dir):
    def model(xs, h0):
        return F.foreach(step_ops, xs, [h0])
    specs = (dt.TensorSpec(("T", "B", 8)), dt.TensorSpec(("B", 16)))
    pg = partition(dt.trace(model, *specs))
    moved = region_ops(pg)[:-1]
    assert {"matmul", "sum", "softmax", "concat", "split", "mean", "cast", "greater", "expand_dims",
            "transpose"} <= set(moved)
    m = compiled(model, *specs, cache_dir=cache_dir)
    xs = RNG.standard_normal((T, B, 8)).astype("float32")
    h0 = RNG.standard_normal((B, 16)).astype("float32")
    assert_same(m(xs, h0), model(xs, h0), rtol=1e-4, atol=1e-5)


def test_not_liftable_nodes_stay_in_the_body(cache_dir):
    def model(xs, v, h0):
        def step(x, states):
            (h,) = states
            y = F.matmul(x, V3)                 # rhs rank 3: [2, B, 16] per step; lifted would broadcast T vs 2
            z = x[0] + v                        # slice: no lift rule; v is a capture
            w = F.max(x, axis=0)                # may raise on an empty axis: never moved
            r = F.sum(y, axis=0) + h + F.sum(z) + F.sum(w)
            return r, [r]
        return F.foreach(step, xs, [h0])
    specs = (dt.TensorSpec(("T", "B", 8)), dt.TensorSpec((8,)), dt.TensorSpec(("B", 16)))
    pg = partition(dt.trace(model, *specs))
    assert ops_of(pg) == ["foreach"]            # nothing moved out
    m = compiled(model, *specs, cache_dir=cache_dir)
    for T, B in [(0, 1), (3, 2)]:
        xs = RNG.standard_normal((T, B, 8)).astype("float32")
        v = RNG.standard_normal(8).astype("float32")
        h0 = np.zeros((B, 16), "float32")
        assert_same(m(xs, v, h0), model(xs, v, h0), rtol=1e-4, atol=1e-5)


def test_rank_growing_broadcast_is_not_lifted():
    """x_t is a scalar per step; x_t + v broadcasts to [4]. Lifted, [T] + [4] would be wrong: not moved."""
    v = np.arange(4, dtype="float32")

    def model(xs):
        return F.foreach(lambda x, s: (x + v, s), xs, [F.zeros(())])
    pg = partition(dt.trace(model, dt.TensorSpec(("T",))))
    assert "add" not in region_ops(pg)
    xs = np.arange(3, dtype="float32")
    assert_same(dt.run_reference(pg, xs), model(xs))


def test_invariant_nodes_of_a_foreach_body_move_out(cache_dir):
    def model(xs, w, h0):
        def step(x, states):
            (h,) = states
            w2 = F.tanh(w) * 2.0                  # captures only: computed once
            h = h + F.matmul(x, w2)
            return h, [h]
        return F.foreach(step, xs, [h0])
    specs = (dt.TensorSpec(("T", 3)), dt.TensorSpec((3, 5)), dt.TensorSpec((5,)))
    pg = partition(dt.trace(model, *specs))
    assert ops_of(pg) == ["region", "foreach"]
    outside = region_ops(pg)
    assert "tanh" in outside and "matmul" in outside      # w2 is computed outside, so x @ w2 is lifted too
    loop, body = body_of(pg)
    assert [m.op for n in body.nodes if n.op == "region" for m in n.subgraphs[0].nodes] == ["add"]
    m = compiled(model, *specs, cache_dir=cache_dir)
    for T in (0, 1, 4):
        args = (RNG.standard_normal((T, 3)).astype("float32"), RNG.standard_normal((3, 5)).astype("float32"),
                np.zeros(5, "float32"))
        assert_same(m(*args), model(*args), rtol=1e-4, atol=1e-5)


def test_hoisting_out_of_nested_loops():
    def model(xss, h0):
        def outer(xs, states):
            (h,) = states
            ys, (h,) = F.foreach(lambda x, s: (F.matmul(x, W), [s[0] + F.sum(F.matmul(x, W))]), xs, [h])
            return ys, [h]
        return F.foreach(outer, xss, [h0])
    specs = (dt.TensorSpec(("S", "T", 8)), dt.TensorSpec(()))
    pg = partition(dt.trace(model, *specs))
    assert ops_of(pg)[0] == "region"         # the inner x @ W left both loops: one GEMM over [S, T, 8]
    mms = [n for n in pg.nodes[0].subgraphs[0].nodes if n.op == "matmul"]
    assert mms and all(mm.outputs[0].type.shape == ("S", "T", 16) for mm in mms)
    xss = RNG.standard_normal((3, 4, 8)).astype("float32")
    assert_same(dt.run_reference(pg, xss, np.float32(0)), model(xss, np.float32(0)), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------- while_loop
def test_while_loop_invariants_and_condition_in_the_body(cache_dir):
    def model(x, w, n):
        def body(i, h):
            w2 = F.sigmoid(w) * 0.5               # invariant: moves out
            h = F.tanh(F.matmul(h, w2))
            return F.sum(h), [i + 1, h]
        return F.while_loop(lambda i, h: i < n, body, [F.zeros((), "int64"), x], max_iterations=6)
    specs = (dt.TensorSpec(("B", 4)), dt.TensorSpec((4, 4)), dt.TensorSpec((), "int64"))
    g = dt.trace(model, *specs)
    pg = partition(g)
    loop, body = body_of(pg, "while_loop")
    assert loop.attrs.cond_in_body
    assert ops_of(pg)[:1] == ["region"] and "sigmoid" in region_ops(pg)
    (r,) = [n for n in body.nodes if n.op == "region"]                   # body and next condition: one call
    assert "less" in [m.op for m in r.subgraphs[0].nodes] and body.outputs[-1].type.dtype == "bool"
    m = compiled(model, *specs, cache_dir=cache_dir)
    w = RNG.standard_normal((4, 4)).astype("float32")
    for B, n in [(1, 0), (2, 1), (3, 3), (1, 6), (2, 50)]:       # zero iterations, ..., the iteration limit
        x = RNG.standard_normal((B, 4)).astype("float32")
        before = m.kernel_calls
        got = m(x, w, np.int64(n))
        assert_same(got, model(x, w, np.int64(n)), rtol=1e-4, atol=1e-5)
        steps = min(n, 6)
        # the invariant region, the first condition, then the body (and next condition) compiled as one loop
        # call (test_compiled_loops.py), none for zero iterations
        assert m.kernel_calls - before == 2 + (steps > 0)


def test_a_condition_that_may_raise_stays_separate():
    def model(x, idx):
        return F.while_loop(lambda s: F.take(x, idx) > s, lambda s: ([], [s + 1.0]), [F.zeros(())],
                            max_iterations=3)
    pg = partition(dt.trace(model, dt.TensorSpec(("N",)), dt.TensorSpec((), "int64")))
    loop, _ = body_of(pg, "while_loop")
    assert not loop.attrs.cond_in_body


def test_decoder_condition_runs_in_the_body_region():
    ex = examples.get("decoder")
    pg = partition(dt.trace(ex.fn, *ex.specs))
    loop, body = body_of(pg, "while_loop")
    assert loop.attrs.cond_in_body
    assert [n.op for n in body.nodes] == ["region"]          # shape_of(tokens) too: one call per step


def test_rewritten_graph_round_trips_an_artifact(tmp_path, cache_dir):
    def model(x, w, n):
        return F.while_loop(lambda i, h: i < n, lambda i, h: ([], [i + 1, F.tanh(F.matmul(h, F.exp(w)))]),
                            [F.zeros((), "int64"), x], max_iterations=None)
    specs = (dt.TensorSpec((2, 4)), dt.TensorSpec((4, 4)), dt.TensorSpec((), "int64"))
    m = compiled(model, *specs, cache_dir=cache_dir)
    m.save(str(tmp_path / "art"))
    loaded = dt.load(str(tmp_path / "art"))
    x, w = RNG.standard_normal((2, 4)).astype("float32"), (RNG.standard_normal((4, 4)) * 0.1).astype("float32")
    for n in (0, 4):
        assert_same(loaded(x, w, np.int64(n)), model(x, w, np.int64(n)), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------- loops without a plan per step
def test_single_region_bodies_run_without_a_plan_per_step(monkeypatch, cache_dir):
    """A body that is one region is called directly (executor `_direct_body`): the plan machinery runs once
    per model call, not once per step; results equal eager, also for read-only and misaligned data."""
    from dyntvm.runtime import executor

    runs = [0]
    real = executor.Plan.run

    def counted(self, args):
        runs[0] += 1
        return real(self, args)
    monkeypatch.setattr(executor.Plan, "run", counted)

    def model(xs, h0, n):
        hs, (h,) = F.foreach(lambda x, s: (F.tanh(F.matmul(s[0], U) + x), [F.tanh(F.matmul(s[0], U) + x)]), xs, [h0])
        _, (i, g) = F.while_loop(lambda i, g: i < n, lambda i, g: ([], [i + 1, g * 0.5 + 1.0]),
                                 [F.zeros((), "int64"), h])
        return hs, g
    specs = (dt.TensorSpec(("T", 16)), dt.TensorSpec((16,)), dt.TensorSpec((), "int64"))
    m = compiled(model, *specs, cache_dir=cache_dir)
    base = np.zeros(41 * 16 + 1, "float32")
    xs = base[1:].reshape(41, 16)                 # misaligned (4-byte offset) ...
    xs[:] = RNG.standard_normal((41, 16))
    xs.flags.writeable = False                    # ... and read-only
    h0 = np.zeros(16, "float32")
    for T, n in [(0, 0), (1, 1), (41, 30)]:
        runs[0] = 0
        assert_same(m(xs[:T], h0, np.int64(n)), model(np.array(xs[:T]), h0, np.int64(n)), rtol=1e-4, atol=1e-5)
        assert runs[0] <= 2                   # the model's plan and while_loop's first condition


def test_hoisting_with_valid_length_lifts_only_row_wise_nodes(cache_dir):
    """With valid_length the body sees the active rows only: x @ W (row-wise) is lifted, a softmax or a sum over
    the rows is not (over all rows it would differ)."""
    def model(xs, h0, lens):
        def step(x, states):
            (h,) = states
            h = F.tanh(F.matmul(x, W) + F.softmax(x, axis=0)[:, :1] + F.sum(x, axis=0)[:1] + F.matmul(h, U))
            return h, [h]
        return F.foreach(step, xs, [h0], valid_length=lens)
    specs = (dt.TensorSpec(("T", "B", 8)), dt.TensorSpec(("B", 16)), dt.TensorSpec(("B",), "int64"))
    pg = partition(dt.trace(model, *specs))
    outside = region_ops(pg)
    assert "matmul" in outside and "softmax" not in outside and "sum" not in outside
    m = compiled(model, *specs, cache_dir=cache_dir)
    for T, lens in [(0, [0]), (4, [4, 1, 0, 3]), (3, [3, 3])]:
        xs = RNG.standard_normal((T, len(lens), 8)).astype("float32")
        h0 = RNG.standard_normal((len(lens), 16)).astype("float32")
        L = np.array(lens, np.int64)
        assert_same(m(xs, h0, L), model(xs, h0, L), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------- review regressions
def test_sequences_of_unrelated_lengths_are_not_lifted_together_and_still_checked(cache_dir):
    """Two data tensors with fresh length symbols: x + y is not lifted (its lengths may differ: the runner
    raises), and a sequence the body does not read keeps its length check."""
    def both(xs, ys):
        return F.foreach(lambda inp, st: (inp[0] + inp[1], st), [xs, ys], [])[0]

    def one(xs, ys):
        return F.foreach(lambda inp, st: (inp[0] * 2.0, st), [xs, ys], [])[0]
    specs = (dt.TensorSpec((None, 8)), dt.TensorSpec((None, 8)))
    for fn in (both, one):
        m = compiled(fn, *specs, cache_dir=cache_dir)
        a, b = RNG.standard_normal((5, 8)).astype("float32"), RNG.standard_normal((5, 8)).astype("float32")
        assert_same(m(a, b), fn(a, b))
        with pytest.raises(dt.ExecutionError, match="data tensors must have the same length"):
            m(a, b[:2])


def test_merged_regions_never_make_the_partition_cyclic():
    """{A, B} and {C, D} are each convex, but with A -> X -> D and C -> Y -> B merging both pairs is a cycle."""
    def fn(x, m):
        a = F.tanh(x) * 2.0
        y = F.boolean_mask(x, m)
        c = F.cast(F.arange(y.shape[0]), "float32") * 3.0
        xx = F.nonzero(a > 0.0)
        yy = F.boolean_mask(c, c > 2.0)
        return F.sum(F.cast(xx, "float32")) + 1.0, F.sum(yy) * 2.0, y
    specs = (dt.TensorSpec(("N", 4)), dt.TensorSpec(("N",), "bool"))
    pg = partition(dt.trace(fn, *specs))
    x, m = RNG.standard_normal((5, 4)).astype("float32"), RNG.random(5) > 0.3
    assert_same(dt.run_reference(pg, x, m), fn(x, m), rtol=1e-5, atol=1e-5)


def test_reduction_over_an_expression_dim_then_compare_compiles(cache_dir):
    """less(sum(concat([v, v[:1]])), 3): the sum gets N as a scalar parameter (its length is N + min(N, 1));
    TVM's FuseTIR segfaulted fusing it (codegen/fusion_guard.py). Also as a while_loop condition in the body."""
    def fn(v):
        c = F.less(F.sum(F.concat([v, v[:1]], 0)), 3.0)
        out, (w,) = F.while_loop(lambda w: F.sum(w) < 3.0, lambda w: (F.sum(w), [F.concat([w, w[:1] + 1.0])]),
                                 [v], max_iterations=4)
        return c, out, w
    m = compiled(fn, dt.TensorSpec(("N",)), cache_dir=cache_dir)
    for v in (np.array([1, 2, -0.5], "float32"), np.zeros(0, "float32"), np.array([-1.0], "float32")):
        assert_same(m(v), fn(v))


def test_a_negative_symbolic_dim_names_its_node_not_out_of_memory(cache_dir):
    def fn(x):
        return F.tanh(x), F.full((x.shape[0] - 1, 2), 3.0)
    m = compiled(fn, dt.TensorSpec(("N", 4)), cache_dir=cache_dir)
    assert_same(m(np.ones((3, 4), "float32")), fn(np.ones((3, 4), "float32")))
    with pytest.raises(dt.ExecutionError, match=r"full node '\w+' failed: a dim must be >= 0, got float32\[-1, 2\]"):
        m(np.ones((0, 4), "float32"))


def test_a_row_reshaped_to_a_static_shape_is_hoisted_with_its_matmul(cache_dir):
    """``r.reshape(1, 8) @ W`` per row of a foreach: the reshape lifts to ``(-1, 1, 8)`` over the whole
    sequence, the matmul and the tanh with it, and the foreach, computing nothing then, is dropped."""
    def rows(xs):
        ys, _ = F.foreach(lambda r, s: (F.tanh(F.matmul(F.reshape(r, (1, 8)), W)), []), xs, [])
        return ys

    pg = partition(dt.trace(rows, dt.TensorSpec(("T", 8))))
    assert "matmul" in region_ops(pg) and "foreach" not in ops_of(pg)
    model = compiled(rows, dt.TensorSpec(("T", 8)), cache_dir=cache_dir)
    for t in (0, 1, 5):
        xs = RNG.standard_normal((t, 8)).astype("float32")
        assert_same(model(xs), np.tanh(xs.reshape(t, 1, 8) @ W), rtol=1e-5, atol=1e-5)


def test_a_reshape_of_symbolic_sizes_stays_in_the_body(cache_dir):
    """A reshape whose sizes are known only at run time may not fit (numpy raises): it is not hoisted out of a
    loop that may run no step."""
    def per_step(xs, y):
        ys, _ = F.foreach(lambda r, s: (F.reshape(y, (-1, 2)).sum() + r, []), xs, [])
        return ys

    pg = partition(dt.trace(per_step, dt.TensorSpec(("T", 2)), dt.TensorSpec(("M",))))
    loop, body = body_of(pg)
    assert "reshape" in [m.op for n in body.nodes if n.op == "region" for m in n.subgraphs[0].nodes] + \
        [n.op for n in body.nodes]
    model = compiled(per_step, dt.TensorSpec(("T", 2)), dt.TensorSpec(("M",)), cache_dir=cache_dir)
    assert_same(model(np.zeros((0, 2), np.float32), np.zeros(3, np.float32)), np.zeros((0, 2), np.float32))
    y = np.arange(4, dtype=np.float32)
    assert_same(model(np.ones((2, 2), np.float32), y), np.ones((2, 2), np.float32) + y.sum())
