"""A while_loop var that only grows by appending (`partition/append_carry.py`) becomes a step output and a
counter, so the body has static states and runs as a compiled loop. Each model is checked against a plain
Python loop over numpy written here, at zero, one and many iterations, and the rewritten loop's compiled loop
is counted; models whose body reads the var otherwise keep it (and stay correct)."""
import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.compiled_loop import compiled_loop_name, while_loop_plan

D = 4
_W = (np.random.default_rng(2).standard_normal((D, D)) / 2).astype(np.float32)


def _loops(model) -> list:
    """(while_loop node, has a compiled loop in the library) for every while_loop of the model."""
    out = []
    for n in model.graph.walk():
        if n.op == "while_loop":
            plan = while_loop_plan(n)
            found = False
            if plan is not None:
                try:
                    model.vm[compiled_loop_name(plan[0].attrs.name)]
                    found = True
                except Exception:  # noqa: BLE001 - not built
                    pass
            out.append((n, found))
    return out


def rows_until(x, limit):
    """Append 2 rows of tanh(last row @ W) (and its negation) while fewer than `limit` rows; the length read
    in the condition and in the body."""
    def cond(acc, last):
        return F.shape_of(acc)[0] < limit

    def body(acc, last):
        nxt = F.tanh(F.matmul(last, _W)) + F.cast(F.shape_of(acc)[0], "float32") * 0.01
        return [F.concat([acc, F.concat([nxt, -nxt], axis=0)], axis=0), nxt]
    acc, last = F.while_loop(cond, body, [x, x[-1:]])
    return acc, last


def rows_until_plain(x, limit):
    acc, last = x, x[-1:]
    while len(acc) < limit:
        nxt = np.tanh(last @ _W) + np.float32(len(acc)) * np.float32(0.01)
        acc, last = np.concatenate([acc, nxt, -nxt]), nxt
    return acc, last


def test_an_appended_matrix_runs_as_a_compiled_loop():
    model = dt.compile(rows_until, dt.TensorSpec(("N", D)), dt.TensorSpec((), "int64"))
    [(loop, compiled)] = _loops(model)
    assert compiled and loop.attrs.num_outputs == 1                     # the appended rows, stacked
    assert loop.subgraphs[1].inputs[0].type.shape == ()                 # the var is its length
    rng = np.random.default_rng(0)
    for n, limit in ((1, 0), (1, 1), (1, 2), (3, 8), (2, 9), (5, 40)):
        x = rng.standard_normal((n, D)).astype(np.float32)
        want = rows_until_plain(x, limit)
        for got in (model(x, np.int64(limit)), rows_until(x, np.int64(limit))):
            assert [g.shape for g in got] == [w.shape for w in want]
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def tokens_with_max(start, max_steps):
    """A 1-d token list that grows by one per step until a token is 0 or `max_steps` steps ran."""
    def body(tokens, last):
        nxt = (last * 7 + F.shape_of(tokens)[0]) % 11
        return nxt * 2, [F.concat([tokens, F.reshape(nxt, (1,))]), nxt]
    outs, (tokens, last) = F.while_loop(lambda t, last: last != 0, body, [start, start[-1]],
                                        max_iterations=max_steps)
    return outs, tokens, last


def tokens_plain(start, max_steps):
    tokens, last, outs = list(start), int(start[-1]), []
    while len(outs) < max_steps and last != 0:
        last = (last * 7 + len(tokens)) % 11
        tokens.append(last)
        outs.append(last * 2)
    return np.array(outs, np.int64), np.array(tokens, np.int64), np.int64(last)


def test_a_token_list_with_max_iterations_and_step_outputs():
    model = dt.compile(tokens_with_max, dt.TensorSpec(("P",), "int64"), dt.TensorSpec((), "int64"))
    [(loop, compiled)] = _loops(model)
    assert compiled and loop.attrs.num_outputs == 2
    seen = set()
    for start, max_steps in (([3], 0), ([3], 1), ([5, 4], 3), ([1, 2, 3], 50), ([0], 5), ([9], 50)):
        want = tokens_plain(start, max_steps)
        got = model(np.array(start, np.int64), np.int64(max_steps))
        seen.add(len(want[0]))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert 0 in seen and 1 in seen and max(seen) > 3


def reads_the_values(x, limit):
    """The body reads the var's last row: not append-only, left as it is."""
    def body(acc):
        return F.concat([acc, F.tanh(acc[-1:] @ _W)], axis=0)
    return F.while_loop(lambda acc: F.shape_of(acc)[0] < limit, body, [x])[0]


@pytest.mark.parametrize("fn", [reads_the_values])
def test_a_var_read_otherwise_is_kept(fn):
    model = dt.compile(fn, dt.TensorSpec(("N", D)), dt.TensorSpec((), "int64"))
    [(loop, _compiled)] = _loops(model)
    assert loop.subgraphs[1].inputs[0].type.ndim == 2                   # still the matrix
    rng = np.random.default_rng(1)
    for n, limit in ((1, 0), (2, 3), (1, 7)):
        x = rng.standard_normal((n, D)).astype(np.float32)
        acc = x
        while len(acc) < limit:
            acc = np.concatenate([acc, np.tanh(acc[-1:] @ _W)])
        np.testing.assert_allclose(model(x, np.int64(limit)), acc, rtol=1e-5, atol=1e-5)


def nested(x, limit, rounds):
    """An append-only while_loop inside another while_loop's body, its final list reduced to a sum there."""
    def inner(acc):
        def body(a):
            return F.concat([a, F.tanh(F.matmul(x[-1:], _W)) + F.cast(F.shape_of(a)[0], "float32")], axis=0)
        return F.while_loop(lambda a: F.shape_of(a)[0] < limit, body, [acc])[0]

    def outer(i, total):
        return [i + 1, total + F.sum(inner(x))]
    return F.while_loop(lambda i, t: i < rounds, outer, [np.int64(0), np.float32(0)])[1]


def nested_plain(x, limit, rounds):
    total = np.float32(0)
    for _ in range(rounds):
        a = x
        while len(a) < limit:
            a = np.concatenate([a, np.tanh(x[-1:] @ _W) + np.float32(len(a))])
        total += a.sum()
    return total


def test_an_append_only_loop_inside_a_loop_body():
    model = dt.compile(nested, dt.TensorSpec(("N", D)), dt.TensorSpec((), "int64"), dt.TensorSpec((), "int64"))
    (outer, _), (inner, compiled) = _loops(model)
    assert compiled and inner.attrs.num_outputs == 1
    rng = np.random.default_rng(3)
    for n, limit, rounds in ((1, 0, 2), (2, 5, 1), (3, 9, 3), (1, 4, 0)):
        x = rng.standard_normal((n, D)).astype(np.float32)
        np.testing.assert_allclose(model(x, np.int64(limit), np.int64(rounds)), nested_plain(x, limit, rounds),
                                   rtol=1e-4, atol=1e-4)


def test_the_decoder_example_runs_its_while_loop_compiled():
    from dyntvm import examples
    ex = examples.get("decoder")
    model = dt.compile(ex.fn, *ex.specs)
    assert [c for _, c in _loops(model)] == [True]


def grows_per_round(x, rounds):
    """The inner loop's list is the outer loop's new var: its dim reaches the outer body's outputs, so the
    inner loop keeps its var (the outer loop's types name it)."""
    def outer(i, acc):
        def body(a):
            return F.concat([a, x[:1] * 0.5], axis=0)
        grown = F.while_loop(lambda a: F.shape_of(a)[0] < F.shape_of(acc)[0] + 2, body, [acc])[0]
        return [i + 1, grown]
    return F.while_loop(lambda i, acc: i < rounds, outer, [np.int64(0), x])[1]


def test_an_inner_list_reaching_the_outer_outputs_is_kept():
    model = dt.compile(grows_per_round, dt.TensorSpec(("N", D)), dt.TensorSpec((), "int64"))
    (_, _), (inner, _) = _loops(model)
    assert inner.subgraphs[1].inputs[0].type.ndim == 2                  # still the matrix
    rng = np.random.default_rng(4)
    for n, rounds in ((1, 3), (2, 0), (3, 1)):
        x = rng.standard_normal((n, D)).astype(np.float32)
        acc = x
        for _ in range(rounds):
            a = acc
            while len(a) < len(acc) + 2:
                a = np.concatenate([a, x[:1] * 0.5])
            acc = a
        np.testing.assert_allclose(model(x, np.int64(rounds)), acc, rtol=1e-5, atol=1e-5)
