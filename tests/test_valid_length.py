"""`F.foreach(..., valid_length=...)`: variable-length batches. Eager mode, the reference interpreter, a compiled
model, its saved and loaded artifact and the device data path (on the CPU) all equal a plain numpy loop over
each row alone: outputs past a row's length are 0, each row's final state is its state at its own last step.
One TVM build for the whole file."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.build import stats
from dyntvm.ir.serialize import graph_from_json, graph_to_json
from helpers import assert_same, round_trip

S = dt.TensorSpec
IN, HID = 8, 16
_rng = np.random.default_rng(7)
W = (_rng.standard_normal((IN, 4 * HID)) * 0.3).astype(np.float32)
U = (_rng.standard_normal((HID, 4 * HID)) * 0.3).astype(np.float32)
BIAS = (_rng.standard_normal(4 * HID) * 0.1).astype(np.float32)


def lstm(xs, h, c, lengths, scale):
    """An LSTM over [T, B, IN] with per-row lengths; `scale` [HID] is captured by the body (not sliced)."""
    def step(x, states):
        h, c = states
        i, f, g, o = F.split(F.matmul(x, W) + F.matmul(h, U) + BIAS, 4, axis=-1)
        c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
        h = F.sigmoid(o) * F.tanh(c)
        return [h * scale, F.cast(F.sum(h, axis=-1) > 0, "int32")], [h, c]
    (hs, signs), (h, c) = F.foreach(step, xs, [h, c], valid_length=lengths)
    return hs, signs, h, c


SPECS = (S(("T", "B", IN), name="xs"), S(("B", HID), name="h"), S(("B", HID), name="c"),
         S(("B",), "int32", name="lengths"), S((HID,), name="scale"))


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def lstm_numpy(xs, h0, c0, lengths, scale):
    """The reference: each row alone, for its own number of steps; zeros past it."""
    T, B = xs.shape[:2]
    hs, signs = np.zeros((T, B, HID), np.float32), np.zeros((T, B), np.int32)
    h_out, c_out = h0.copy(), c0.copy()
    for b in range(B):
        h, c = h0[b], c0[b]
        for t in range(lengths[b]):
            i, f, g, o = np.split(xs[t, b] @ W + h @ U + BIAS, 4)
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
            hs[t, b], signs[t, b] = h * scale, np.sum(h) > 0
        h_out[b], c_out[b] = h, c
    return hs, signs, h_out, c_out


def inputs(T, lengths, seed=0):
    rng = np.random.default_rng(seed)
    B = len(lengths)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return f(T, B, IN), f(B, HID), f(B, HID), np.asarray(lengths, np.int32), 1 + f(HID) * 0.1


CASES = {                                  # name: (T, lengths)
    "sorted": (6, [6, 5, 3, 3, 1]),
    "sorted_with_0": (6, [6, 4, 4, 0]),
    "unsorted": (7, [2, 7, 0, 5, 3]),
    "ascending": (5, [0, 1, 2, 5]),
    "all_T": (5, [5, 5, 5]),
    "all_equal_short": (6, [3, 3, 3]),
    "all_0": (4, [0, 0, 0]),
    "B1": (5, [3]),
    "B1_full": (4, [4]),
    "T0": (0, [0, 0]),
    "B0": (3, []),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(traced graph, compiled, loaded, loaded on the device data path); one TVM build."""
    import tvm
    before = stats.builds
    graph = dt.trace(lstm, *SPECS)
    model = dt.compile(lstm, *SPECS, cache_dir=str(tmp_path_factory.mktemp("cache")), use_cache=False)
    assert stats.builds == before + 1
    path = str(tmp_path_factory.mktemp("art") / "varlen.dtvm")
    model.save(path)
    loaded, on_device = dt.load(path), dt.load(path)
    on_device._use_device_path(tvm.cpu())
    return graph, model, loaded, on_device


@pytest.mark.parametrize("case", CASES)
def test_every_mode_equals_the_per_row_loop(case, models):
    graph, model, loaded, on_device = models
    T, lengths = CASES[case]
    args = inputs(T, lengths)
    builds = stats.builds
    want = lstm_numpy(*args)
    got = {"eager": lstm(*args), "reference": dt.run_reference(graph, *args), "json copy":
           dt.run_reference(round_trip(graph), *args), "compiled": model(*args), "loaded": loaded(*args),
           "device path": on_device(*args)}
    for name, res in got.items():
        assert_same(list(res), list(want), rtol=1e-5, atol=1e-5, what=f"{name} ({case})")
        hs = res[0]
        for b, n in enumerate(lengths):         # past a row's length: exactly 0
            assert not hs[n:, b].any() and not res[1][n:, b].any(), (name, b)
    assert stats.builds == builds, "running at new sizes and lengths must not rebuild"


def test_compiled_runs_only_the_steps_some_row_reaches(models):
    _, model, _, _ = models
    args = inputs(8, [3, 1, 2])
    model(*args)
    per_call = model.kernel_calls
    model(*inputs(8, [8, 8, 8]))
    full = model.kernel_calls - per_call
    before = model.kernel_calls
    model(*args)
    outside = sum(n.op == "region" for n in model.graph.nodes)    # x @ W, hoisted out of the loop: once per call
    assert outside == 1
    assert (model.kernel_calls - before - outside) * 8 == (full - outside) * 3      # 3 steps of 8 run


def _shapes_seen(lengths, T=5):
    """The batch the body gets at each step (eager), and whether its data slice is a view of the data."""
    seen = []
    xs, h, c, lens, scale = inputs(T, lengths)

    def step(x, states):
        seen.append((x.shape[0], np.shares_memory(x, xs)))
        return x[:, :2], [s + 1 for s in states]
    outs, states = F.foreach(step, xs, [h], valid_length=lens)
    return seen, outs, states


def test_the_body_sees_the_active_rows():
    seen, outs, (h,) = _shapes_seen([5, 3, 3, 0])            # sorted: a prefix, views of the data
    assert seen == [(3, True)] * 3 + [(1, True)] * 2
    seen, _, _ = _shapes_seen([5, 5, 5])                     # all active: the whole batch, no copies
    assert seen == [(3, True)] * 5
    seen, _, _ = _shapes_seen([1, 4, 0, 2])                  # unsorted: sorted first (copies)
    assert seen == [(3, False), (2, False), (1, False), (1, False)]
    seen, _, _ = _shapes_seen([2, 1], T=6)                   # steps past max(valid_length) do not run
    assert [n for n, _ in seen] == [2, 1]


def test_states_without_outputs_and_list_data(tmp_path):
    """A pure scan over two data tensors, a static batch and a lengths constant: final states per row; compiled
    (one build: the body's rows stay symbolic although the batch is static)."""
    lengths = np.array([1, 3, 0, 2])

    def f(xs, ys, s):
        return F.foreach(lambda d, st: ([], [st[0] + d[0] * d[1]]), [xs, ys], [s], valid_length=lengths)[1][0]
    rng = np.random.default_rng(3)
    xs, ys = rng.standard_normal((3, 4, 2)).astype(np.float32), rng.standard_normal((3, 4, 2)).astype(np.float32)
    s0 = np.ones((4, 2), np.float32)
    want = s0 + np.stack([(xs[:n, b] * ys[:n, b]).sum(0) for b, n in enumerate(lengths)])
    specs = (S(("T", 4, 2)), S(("T", 4, 2)), S((4, 2)))
    graph = dt.trace(f, *specs)
    assert graph.nodes[-1].outputs[0].type.shape == (4, 2)
    assert_same(f(xs, ys, s0), want)
    assert_same(dt.run_reference(graph, xs, ys, s0), want)
    before = stats.builds
    model = dt.compile(f, *specs, cache_dir=str(tmp_path), use_cache=False)
    assert_same(model(xs, ys, s0), want)
    assert_same(model(np.zeros((4, 4, 2), np.float32), ys[:1].repeat(4, 0), s0), s0)     # another T
    assert stats.builds == before + 1


def test_graph_records_valid_length_and_round_trips(models):
    graph = models[0]
    node = next(n for n in graph.nodes if n.op == "foreach")
    assert node.attrs.has_valid_length and node.inputs[3] is graph.inputs[3]
    body = node.subgraphs[0]
    assert [v.type.shape for v in body.inputs[:3]] == [("B_active", IN), ("B_active", HID), ("B_active", HID)]
    assert [v.type.shape for v in node.outputs] == [("T", "B", HID), ("T", "B"), ("B", HID), ("B", HID)]
    text, params = graph_to_json(graph)
    assert '"has_valid_length": true' in text
    assert graph_from_json(text, params).nodes[-1].attrs.has_valid_length


# ------------------------------------------------------------------------------------------ errors
def test_run_time_errors(models):
    graph, model, loaded, _ = models
    cases = [
        ([3, 2], "foreach: with valid_length, the batch (axis 1 of data, axis 0 of states, the size of valid_length) "
                 "must agree; got data[0]: 3, states[0]: 3, states[1]: 3, valid_length: 2"),
        ([3, -1, 2], "foreach: valid_length must be between 0 and the number of steps (4); got -1 for row 1"),
        ([3, 5, 2], "foreach: valid_length must be between 0 and the number of steps (4); got 5 for row 1"),
    ]
    for lengths, text in cases:
        xs, h, c, _, scale = inputs(4, [0, 0, 0])
        args = (xs, h, c, np.asarray(lengths, np.int32), scale)
        with pytest.raises(dt.TraceError, match=re.escape(text)):          # eager: at the user's line
            lstm(*args)
        if len(lengths) != 3:
            continue                        # compiled: the model's signature refuses it first (B must agree)
        for run in (lambda *a: dt.run_reference(graph, *a), model, loaded):
            with pytest.raises(dt.ExecutionError, match=r"foreach node '\w+' failed: " + re.escape(text)):
                run(*args)
    with pytest.raises(dt.InputError):
        model(*inputs(4, [1, 2])[:3], np.array([1, 2, 3], np.int32), inputs(4, [1])[4])


def test_run_time_batch_mismatch_in_the_reference():
    def f(xs, s, n):
        return F.foreach(lambda x, st: (x, [st[0] + x]), xs, [s], valid_length=n)
    graph = dt.trace(f, S(("T", "B", 2)), S(("B", 2)), S((None,), "int64"))    # an unknown size: checked when run
    x = np.ones((2, 3, 2), np.float32)
    with pytest.raises(dt.ExecutionError, match=re.escape("valid_length: 2")):
        dt.run_reference(graph, x, x[0], np.array([1, 2]))


def trace_error(fn, *specs, match):
    with pytest.raises(dt.TraceError, match=match) as info:
        dt.trace(fn, *specs)
    return str(info.value)


def _rnn(valid_length, state=None):
    def f(xs, h):
        return F.foreach(lambda x, st: (x, [st[0] + x]), xs, [h if state is None else state], valid_length=valid_length)
    return f


XS, H = S(("T", "B", 2)), S(("B", 2))


def test_trace_errors():
    msg = trace_error(_rnn(np.ones((2, 2), np.int64)), XS, H,
                      match=re.escape("foreach: valid_length must be a 1-d integer tensor (one length per batch row), "
                                      "got int64[2,2]"))
    assert "test_valid_length.py" in msg               # the user's line
    trace_error(_rnn(np.ones(2, np.float32)), XS, H, match=re.escape("must be a 1-d integer tensor (one length per "
                                                                     "batch row), got float32[2]"))
    trace_error(_rnn([1.5, 2.0]), XS, H, match="got float32")
    trace_error(_rnn(np.array([1, 2]), state=np.float32(0)), XS, H,
                match=re.escape("foreach: with valid_length, states[0] must have the batch as axis 0; got float32[]"))
    trace_error(_rnn(np.array([1, 2])), S(("T",)), H,
                match=re.escape("foreach: with valid_length, data[0] must be [steps, batch, ...] (axis 1 is the "
                                "batch); got float32[T]"))
    trace_error(_rnn(np.array([1, 2, 3])), S(("T", 2, 2)), S((2, 2)),
                match=re.escape("the size of valid_length) must agree; got data[0]: 2, states[0]: 2, valid_length: 3"))
    trace_error(_rnn(np.array([1, 2])), S(("T", "B", 2)), S(("N", 2)),
                match=re.escape("got data[0]: B, states[0]: N, valid_length: 2"))


def test_trace_errors_in_the_body():
    def sums(xs, h, n):
        return F.foreach(lambda x, st: (F.sum(x), st), xs, [h], valid_length=n)   # no batch axis
    trace_error(sums, XS, H, S(("B",), "int64"),
                match=re.escape("foreach: with valid_length, per-step outputs must have the active rows (B_active) as "
                                "axis 0, and only there; output 0 is float32[]"))

    def mixes(xs, h, n):
        return F.foreach(lambda x, st: (x, [st[0] * h]), xs, [h], valid_length=n)   # captures the full batch
    msg = trace_error(mixes, XS, H, S(("B",), "int64"),
                      match="the symbolic dim B_active and the symbolic dim B equal, but they are not known")
    assert "(B_active is the batch of rows still active at a step of foreach with valid_length; values the body " \
           "captures are not sliced)\n    at test_valid_length.py" in msg

    def grows(xs, h, n):
        return F.foreach(lambda x, st: (x, [F.concat([st[0], x], axis=1)]), xs, [h], valid_length=n)
    trace_error(grows, XS, H, S(("B",), "int64"),
                match=re.escape("foreach: with valid_length, new_states must keep the shape of init_states, with the "
                                "active rows (B_active) as axis 0; states[0] is float32[B_active,2] in and "
                                "float32[B_active,4] out"))


def test_eager_errors_in_the_body():
    xs, h = np.ones((3, 2, 2), np.float32), np.ones((2, 2), np.float32)
    with pytest.raises(dt.TraceError, match=re.escape("foreach: with valid_length, step output 0 must have the active "
                                                      "rows as axis 0 (1 at step 1); got float32[2]")):
        F.foreach(lambda x, st: (x[0], st), xs, [h], valid_length=[3, 1])
    with pytest.raises(dt.TraceError, match=re.escape("foreach: with valid_length, states keep their shape with the "
                                                      "active rows as axis 0 (2 rows here); states[0] is float32[2, 1], "
                                                      "expected float32[2, 2]")):
        F.foreach(lambda x, st: (x, [st[0][:, :1]]), xs, [h], valid_length=[3, 1])
    xs3 = np.ones((3, 2, 3), np.float32)       # all rows run every step (the plain loop): checked the same
    with pytest.raises(dt.TraceError, match=re.escape("step output 0 must have the active rows as axis 0 (2 at step "
                                                      "0); got float32[3]")):
        F.foreach(lambda x, st: (x[0], st), xs3, [h], valid_length=[3, 3])
    with pytest.raises(dt.TraceError, match=re.escape("states[0] is float32[2, 1], expected float32[2, 2]")):
        F.foreach(lambda x, st: (x, [st[0][:, :1]]), xs3, [h], valid_length=[3, 3])


def test_nested_valid_length_gets_its_own_rows_symbol():
    """valid_length loops inside a valid_length body: over the body's rows (B_active_active), and over a captured
    full batch (B again: its rows symbol must differ from the outer body's B_active)."""
    def f(xs, h, n):
        def outer(x, st):
            ys = F.expand_dims(x, 0) + F.zeros((3, 1, 1))
            _, (a,) = F.foreach(lambda y, s: ([], [s[0] + y]), ys, [st[0]], valid_length=F.minimum(st[0][:, 0] * 0 + 2,
                                                                                                    3).astype("int64"))
            _, (b,) = F.foreach(lambda y, s: ([], [s[0] + y]), F.expand_dims(h, 0) + F.zeros((3, 1, 1)), [h],
                                valid_length=F.minimum(n, 3))
            return x, [a + F.sum(b)]
        return F.foreach(outer, xs, [h], valid_length=n)
    graph = dt.trace(f, XS, H, S(("B",), "int64"))
    body = next(n for n in graph.nodes if n.op == "foreach").subgraphs[0]
    inner = [n.subgraphs[0].inputs[0].type.shape[0] for n in body.nodes if n.op == "foreach"]
    assert inner == ["B_active_active", "B_active2"]
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((4, 3, 2)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32),
            np.array([4, 0, 2]))
    assert_same(dt.run_reference(graph, *args), f(*args))


def test_lint_checks_the_valid_length_input(models):
    from dyntvm.errors import GraphError
    from dyntvm.ir.attrs import ForeachAttrs
    graph = round_trip(models[0])
    node = next(n for n in graph.nodes if n.op == "foreach")
    node.attrs = ForeachAttrs(1, 2, 2)                 # valid_length would be passed to the body as a capture
    with pytest.raises(GraphError, match="body inputs"):
        graph.lint()
    node.attrs = ForeachAttrs(1, 1, 2, True)           # input 2 (the state c) is not a 1-d integer tensor
    with pytest.raises(GraphError, match="valid_length must be a 1-d integer tensor, got float32"):
        graph.lint()
