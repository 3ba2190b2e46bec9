"""Gradients through cond / case / foreach / while_loop (nested, both memory strategies) against finite differences
and torch autograd; the while_loop case torch gets wrong (d(w + w^2 + w^3)/dw at 2 is 17); compiled gradients
equal eager ones at several sizes."""
from __future__ import annotations

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from grad_check import check_grad, weighted_loss

S = dt.TensorSpec


def r(*shape, seed=0, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed + 7 * sum(shape)).uniform(lo, hi, shape)


def branchy(x, w):
    return F.cond(F.sum(x) > 0, lambda: F.tanh(x * w), lambda: F.sin(x) * w * w)


@pytest.mark.parametrize("sign", (1.0, -1.0))
@pytest.mark.parametrize("n", (0, 1, 3))
def test_cond_takes_the_branch_vjp(n, sign):
    check_grad(branchy, sign * np.abs(r(n, 2)) + (0.01 if sign > 0 else 0), r(2, seed=1))


@pytest.mark.parametrize("shift", (-2.0, 0.0, 2.0))
def test_case(shift):
    def f(x, w):
        s = F.sum(x)
        return F.case([(s > 1, lambda: x * w), (s < -1, lambda: F.exp(x) * w)], lambda: x * x, exclusive=True)
    check_grad(f, r(3) + shift, r(3, seed=1))


def rnn(xs, h0, W, U):
    hs, (h,) = F.foreach(lambda x, st: _rnn_step(x, st, W, U), xs, [h0])
    return hs, h


def _rnn_step(x, st, W, U):
    h = F.tanh(F.matmul(x, W) + F.matmul(st[0], U))
    return h * 2, [h]


@pytest.mark.parametrize("memory", ("recompute", "save_all"))
@pytest.mark.parametrize("T", (0, 1, 4))
def test_foreach_rnn(T, memory):
    check_grad(rnn, r(T, 2, 3), r(2, 4, seed=1), r(3, 4, seed=2), r(4, 4, seed=3), memory=memory)


def test_foreach_rnn_matches_torch():
    torch = pytest.importorskip("torch")
    args = [r(5, 2, 3), r(2, 4, seed=1), r(3, 4, seed=2), r(4, 4, seed=3)]
    ours = dt.grad(lambda *a: F.sum(rnn(*a)[0] ** 2) + F.sum(rnn(*a)[1]), argnums=(0, 1, 2, 3))(*args)
    xs, h, W, U = [torch.tensor(a, requires_grad=True) for a in args]
    h_, outs = h, []
    for t in range(5):
        h_ = torch.tanh(xs[t] @ W + h_ @ U)
        outs.append(h_ * 2)
    loss = (torch.stack(outs) ** 2).sum() + h_.sum()
    loss.backward()
    for g, t in zip(ours, (xs, h, W, U)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def powers(w):
    """w + w^2 + w^3 by a while_loop (torch 2.13's while_loop backward gives 4.0 at w = 2; the answer is 17)."""
    i0, p0, acc0 = np.int64(0), F.ones_like(w), F.zeros_like(w)
    _, _, acc = F.while_loop(lambda i, p, acc: i < 3, lambda i, p, acc: [i + 1, p * w, acc + p * w], [i0, p0, acc0])
    return acc


@pytest.mark.parametrize("memory", ("recompute", "save_all"))
def test_while_loop_gradient_is_17(memory):
    value, g = dt.value_and_grad(powers, memory=memory)(np.float64(2.0))
    assert float(value) == 14.0 and float(g) == 17.0


@pytest.mark.parametrize("memory", ("recompute", "save_all"))
@pytest.mark.parametrize("start", (0.5, 3.0, 20.0))
def test_while_loop_data_dependent_count(start, memory):
    """The trip count depends on the data (0 iterations from 20); per-step outputs stacked too."""
    def f(x, w):
        def body(x, k):
            y = x * w + F.sin(x)
            return F.sum(y * y), [y, k + 1]
        steps, (y, _) = F.while_loop(lambda x, k: F.sum(x) < 10.0, body, [x, np.int64(0)])
        return y, steps
    check_grad(f, np.full(3, start) + r(3) * 0.1, 1.3 + r(3, seed=1) * 0.1, memory=memory)


def test_nested_while_in_foreach_in_cond():
    def f(xs, w):
        def step(x, st):
            def grow(v):
                return v * w + x
            (v,) = F.while_loop(lambda v: F.sum(F.abs(v)) < 4.0, lambda v: [grow(v)], [st[0]], max_iterations=5)
            return v, [F.cond(F.sum(v) > 0, lambda: v * 0.5, lambda: -v)]
        return F.cond(F.sum(xs) > -100.0, lambda: F.foreach(step, xs, [F.ones_like(w)])[0], lambda: xs * 1.0)
    check_grad(f, r(4, 2), 1.2 + r(2, seed=1) * 0.1)


@pytest.mark.parametrize("memory", ("recompute", "save_all"))
def test_lstm_example_gradient_matches_torch(memory):
    torch = pytest.importorskip("torch")
    from dyntvm.examples import lstm as ex
    rng = np.random.default_rng(0)
    xs, h0, c0 = ex.make_inputs(rng, T=3, B=2)
    c0 = rng.standard_normal(c0.shape).astype(np.float32)
    ours = dt.grad(lambda xs, h0, c0: F.sum(ex.lstm(xs, h0, c0)[0] ** 2), argnums=(0, 1, 2),
                   memory=memory)(xs, h0, c0)
    txs, th, tc = [torch.tensor(a, requires_grad=True) for a in (xs, h0, c0)]
    W, U, b = (torch.tensor(a) for a in (ex.W, ex.U, ex.b))
    h, c, hs = th, tc, []
    for t in range(3):
        i, f, g, o = torch.split(txs[t] @ W + h @ U + b, ex.HIDDEN, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
    (torch.stack(hs) ** 2).sum().backward()
    for g, t in zip(ours, (txs, th, tc)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=2e-4, atol=2e-5)


def mlp_masked(x, w):
    h = F.tanh(F.matmul(x, w))
    keep = F.boolean_mask(h, F.sum(x, axis=1) > 0)
    return F.sum(F.log_softmax(keep, axis=-1) * keep) + F.sum(F.layer_norm(h, w[0], w[1])) * 0.1


def _check_compiled(fn, specs, make, sizes):
    """One build of the gradient function, run at several sizes (0 and 1 included), equals the eager gradient."""
    model = dt.compile(fn, *specs)
    for n in sizes:
        args = make(n)
        got, want = model(*args), fn(*args)
        for a, b in zip(_flat(got), _flat(want)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return model


def test_compiled_while_loop_gradient():
    model = _check_compiled(dt.value_and_grad(powers), (S(()),), lambda n: (np.float32(n / 2),), (1, 4))
    assert [float(v) for v in model(np.float32(2.0))] == [14.0, 17.0]


@pytest.mark.slow
def test_compiled_mask_softmax_layer_norm_gradient():
    _check_compiled(dt.value_and_grad(mlp_masked, argnums=(0, 1)), (S(("N", 3)), S((3, 3))),
                    lambda n: (r(n, 3).astype(np.float32), r(3, 3, seed=1).astype(np.float32)), (0, 1, 7))


@pytest.mark.slow
@pytest.mark.parametrize("memory", ("recompute", "save_all"))
def test_compiled_foreach_gradient(memory):
    _check_compiled(dt.grad(lambda xs, h0, W, U: F.sum(rnn(xs, h0, W, U)[0]), argnums=(0, 1, 2, 3), memory=memory),
                    (S(("T", "B", 3), "float64"), S(("B", 4), "float64"), S((3, 4), "float64"),
                     S((4, 4), "float64")),
                    lambda n: (r(n, 2, 3), r(2, 4, seed=1), r(3, 4, seed=2), r(4, 4, seed=3)), (0, 1, 5))


def _flat(x):
    if isinstance(x, (tuple, list)):
        return [y for e in x for y in _flat(e)]
    return [np.asarray(x)]


@pytest.mark.slow
def test_train_lstm_example_loss_decreases(tmp_path):
    from dyntvm.examples import train_lstm
    losses = train_lstm.train(steps=60)
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), (losses[:10], losses[-10:])
    train_lstm.plot(losses, tmp_path / "loss.png")
    assert (tmp_path / "loss.png").stat().st_size > 1000


@pytest.mark.parametrize("lengths", ([4, 2, 0], [1, 3, 4], [4, 4, 4]))
def test_foreach_valid_length_active_rows_only(lengths):
    vl = np.array(lengths)

    def f(xs, h0, W):
        def step(x, st):
            h = F.tanh(F.matmul(x, W) + st[0])
            return h * h, [h]
        hs, (h,) = F.foreach(step, xs, [h0], valid_length=vl)
        return hs, h
    xs, h0, W = r(4, 3, 2), r(3, 2, seed=1), r(2, 2, seed=2)
    gx, gh, gw = check_grad(f, xs, h0, W)
    for b, n in enumerate(lengths):
        assert not gx[n:, b].any()          # steps a row did not run get no gradient


def test_memory_strategies_differ_in_what_the_reverse_pass_recomputes():
    """recompute: the reverse body runs the forward body's ops again; save_all: it reads them from the saved
    stacks (more per-step outputs saved by the forward), only those its vjp reads: ``sin(p)`` (the vjp of
    ``sin(p) * w`` reads it) and ``p * w`` (tanh's output, a carry, is recomputed from it), not
    ``sin(p) * w`` (the vjp of a sum reads neither term)."""
    def f(w):
        def body(i, p, acc):
            return [i + 1, F.tanh(p * w), acc + F.sin(p) * w]
        _, _, acc = F.while_loop(lambda i, p, acc: i < 3, body, [np.int64(0), F.ones_like(w), F.zeros_like(w)])
        return acc

    def count(memory):
        g = dt.trace(dt.grad(f, memory=memory), S((), "float64"))
        loops = {n.op: n for n in g.walk() if n.op in ("while_loop", "foreach")}
        saving, reverse = loops["while_loop"], loops["foreach"]
        ops = [n.op for n in reverse.subgraphs[0].walk()]
        return saving.attrs.num_outputs, ops.count("sin"), ops.count("multiply")
    saved_r, sin_r, _ = count("recompute")
    saved_s, sin_s, _ = count("save_all")
    assert (saved_r, sin_r) == (3, 1) and (saved_s, sin_s) == (3 + 2, 0)     # the carries; + sin(p), p * w
    for w in (0.3, -1.2):
        np.testing.assert_allclose(dt.grad(f, memory="save_all")(np.float64(w)), dt.grad(f)(np.float64(w)))
    check_grad(f, np.float64(0.7), memory="save_all")


def _long_loop(x, w, n):
    """The while_loop of benchmarks/bench_grad.py (the memory of the two strategies is measured on it)."""
    def body(i, x):
        return [i + 1, (F.tanh(F.sin(x) * w + x) + x) * 0.5]
    _, x = F.while_loop(lambda i, x: i < n, body, [np.int64(0), x])
    return F.sum(x * x)


@pytest.mark.parametrize("memory", ("recompute", "save_all"))
def test_the_forward_loop_runs_once(memory):
    """The loop run again to save its carries takes the forward loop's place: one while_loop (forward and saving)
    and one foreach (the reverse pass), not a second forward."""
    g = dt.trace(dt.value_and_grad(_long_loop, argnums=(0, 1), memory=memory), S((5,)), S((5,)), S((), "int64"))
    ops = [n.op for n in g.nodes]
    assert ops.count("while_loop") == 1 and ops.count("foreach") == 1
    (saving,) = [n for n in g.nodes if n.op == "while_loop"]
    # the carries; save_all: also the body's float intermediates its vjp reads (sin for `* w`, tanh's output),
    # not the body's outputs nor `* w`, `+ x`, `+ x` (the vjps of a sum and of a product by a constant read none)
    assert saving.attrs.num_outputs == (2 if memory == "recompute" else 2 + 2)


def test_recompute_is_not_lifted_out_of_the_reverse_loop():
    """memory="recompute": the reverse body recomputes the step's forward at each step; the loop rewrite lifts
    nothing that reads the step's rows over all steps (that would hold every step's recomputed intermediates at
    once). save_all: the vjp's own per-step nodes on saved values (cos of the saved carry) are lifted."""
    from dyntvm.partition.loops import rewrite_loops

    def lifted_ops(memory):
        g = dt.trace(dt.grad(_long_loop, memory=memory), S((5,)), S((5,)), S((), "int64"))
        (reverse,) = [n for n in g.nodes if n.op == "foreach"]
        assert reverse.attrs.hoist_rows == (memory != "recompute")
        before = {id(n) for n in g.nodes}
        rewrite_loops(g)
        return [n.op for n in g.nodes if id(n) not in before], [n.op for n in reverse.subgraphs[0].nodes]
    moved, body = lifted_ops("recompute")
    assert not {"sin", "cos", "tanh"} & set(moved) and {"sin", "cos", "tanh"} <= set(body)
    moved, body = lifted_ops("save_all")
    assert "cos" in moved and "sin" not in body
    x, w = r(5), r(5, seed=1)
    for n in (0, 1, 7):
        np.testing.assert_allclose(dt.grad(_long_loop, argnums=(0, 1))(x, w, np.int64(n)),
                                   dt.grad(_long_loop, argnums=(0, 1), memory="save_all")(x, w, np.int64(n)))


def test_save_all_sums_the_weight_gradients_after_the_loop():
    """save_all: the rnn's dW = sum_t x_t^T dg_t and dU = sum_t h_t^T dg_t leave the reverse loop: it carries no
    cotangent of W or U (only h's), stacks dg once, and two matmuls after it sum all steps; dxs_t = dg_t @ W^T
    leaves it too (a third matmul after it, over all steps' rows), so the reverse body keeps one matmul (the
    carry's dh = dg @ U^T). recompute keeps them as the loop's states and per-step outputs. Both equal finite
    differences (test_foreach_rnn) and each other."""
    def reverse_loop(memory):
        g = dt.trace(dt.grad(lambda *a: F.sum(rnn(*a)[0] ** 2), argnums=(0, 1, 2, 3), memory=memory),
                     S(("T", 2, 3)), S((2, 4)), S((3, 4)), S((4, 4)))
        (rev,) = [n for n in g.nodes if n.op == "foreach"][1:]          # after the forward
        after = g.nodes[g.nodes.index(rev) + 1:]
        in_body = [n.op for n in rev.subgraphs[0].walk()].count("matmul")
        return rev.attrs, in_body, [n.op for n in after].count("matmul")
    attrs, in_body, matmuls = reverse_loop("save_all")
    assert (attrs.num_states, attrs.num_outputs, in_body, matmuls) == (1, 1, 1, 3)     # dh; the stacked dg
    attrs, in_body, matmuls = reverse_loop("recompute")
    assert (attrs.num_states, attrs.num_outputs, matmuls) == (3, 1, 0)        # dh, dW, dU; dxs
    args = [r(4, 2, 3), r(2, 4, seed=1), r(3, 4, seed=2), r(4, 4, seed=3)]
    for T in (0, 1, 4):
        a = [args[0][:T]] + args[1:]
        grads = [dt.grad(lambda *a: F.sum(rnn(*a)[0] ** 2), argnums=(0, 1, 2, 3), memory=m)(*a)
                 for m in ("recompute", "save_all")]
        for x, y in zip(*grads):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


def _rnn_data_terms(xs, h0, W, U):
    """x_t's cotangent has a term ``dg_t @ W^T`` (moved after the loop by save_all), one through ``x * x`` (a
    product with x: stays per step) and one straight from the output (a per-step input: moved as is)."""
    def step(x, st):
        h = F.tanh(F.matmul(x, W) + F.matmul(st[0], U)) + F.matmul(x * x, W) * 0.5
        return h + F.matmul(x, W), [h]
    hs, (h,) = F.foreach(step, xs, [h0])
    return hs, h


@pytest.mark.parametrize("T", (0, 1, 4))
def test_save_all_data_gradient_after_the_loop(T):
    """save_all: the data cotangents dx_t = Q_t @ M (M loop-invariant) are one matmul over all steps after the
    reverse loop, the other terms of dx_t stay per step; equal to finite differences and to recompute's."""
    args = [r(T, 2, 3), r(2, 4, seed=1), r(3, 4, seed=2), r(4, 4, seed=3)]
    got = check_grad(_rnn_data_terms, *args, memory="save_all")
    want = dt.grad(weighted_loss(_rnn_data_terms, args), argnums=(0, 1, 2, 3))(*args)
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    g = dt.trace(dt.grad(lambda *a: F.sum(_rnn_data_terms(*a)[0]), argnums=(0, 1, 2, 3), memory="save_all"),
                 S(("T", 2, 3)), S((2, 4)), S((3, 4)), S((4, 4)))
    rev = [n for n in g.nodes if n.op == "foreach"][1]
    after = [n.op for n in g.nodes[g.nodes.index(rev) + 1:]]
    # in the body: dh = dg @ U^T (the carry) and the x * x term's d(x * x) @ W^T (kept per step: it is then
    # multiplied by x); after it: dx's matmuls by W^T (of dg and of the output's cotangent), dW's three, dU's
    body = [n.op for n in rev.subgraphs[0].walk()]
    assert (body.count("matmul"), after.count("matmul")) == (2, 6)


def test_save_all_reads_only_the_seeded_outputs_vjp():
    """save_all finds the intermediates to save from the vjp of the outputs that get a cotangent: a step output
    the loss does not use, made by an op without a vjp rule (`prod`), is no error (as with recompute)."""
    def f(xs, w):
        def step(x, st):
            h = F.tanh(x * w + st[0])
            return [h * h, F.prod(h, axis=-1)], [h]
        (hs, ps), _ = F.foreach(step, xs, [F.zeros_like(w)])
        return F.sum(hs)
    for T in (0, 1, 3):
        args = (r(T, 2), r(2, seed=1))
        got = dt.grad(f, argnums=(0, 1), memory="save_all")(*args)
        for x, y in zip(got, dt.grad(f, argnums=(0, 1))(*args)):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14)
    check_grad(f, r(3, 2), r(2, seed=1), memory="save_all")


def test_growing_carry_refused_by_name():
    def f(x):
        (y,) = F.while_loop(lambda y: F.sum(y) < 10.0,
                            lambda y: [F.concat([y, y], axis=0)], [x])
        return F.sum(y)
    with pytest.raises(dt.TraceError, match="while_loop loop var 0 changes shape"):
        dt.grad(f)(np.ones(2))
