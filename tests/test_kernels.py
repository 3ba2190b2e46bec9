"""Small-kernel schedules (issue 10, item 4), compared with numpy:

* full reductions of a 1-d input (sum / prod / mean / max / min / argmax / argmin): `te_kernels.te_lane_reduce`
  and the CPU "lanes" rule (vectors of lanes, blocks in parallel from 128k elements);
* one kernel per LSTM step: `cpu_schedule_fuse.merge_contractions` and the contraction-group rule;
* reductions over a non-trailing axis (softmax over axis 0 / 1): the axis-reduction rule;
* pure reshapes left unscheduled, so Relax makes them views.
"""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
import tvm  # noqa: E402
from tvm import relax, tirx  # noqa: E402
from tvm.relax import op as R  # noqa: E402

from dyntvm.codegen.backends.cpu import cpu_schedule  # noqa: E402
from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu, cpu_target, legalize_and_fuse, schedule_module  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(7)
# lengths around every boundary of te_lane_reduce: a row (128), a block (32 rows), the parallel variant
SIZES = (1, 2, 127, 128, 129, 1000, 4095, 4096, 4097, 65539, (1 << 17) + 129)


@pytest.fixture
def schedule_log(caplog):
    caplog.set_level(logging.DEBUG, logger=cpu_schedule.__name__)
    return caplog


def rule_log(caplog) -> str:
    return "\n".join(r.getMessage().splitlines()[0] for r in caplog.records)


def region_module(fn, *specs):
    return build_module(collect_regions(partition_graph(dt.trace(fn, *specs))))


def kernel_calls(ex) -> list[str]:
    """Names of the kernels the region functions of a VM executable call (builtins and VMShapeLower's shape_func
    left out; the VM program, `ir.vm_program.PROGRAM`, holds copies of the region bodies: not counted twice)."""
    from dyntvm.ir.vm_program import PROGRAM
    text = "\n".join(f for f in ex.as_text().split("\n@") if not f.startswith((f"{PROGRAM}:", f"@{PROGRAM}:")))
    return [m.group(1) for m in re.finditer(r"call\s+(\S+)\s+in:", text)
            if not m.group(1).startswith("vm.builtin") and m.group(1) != "shape_func"]


# ------------------------------------------------------------------------ full reductions of 1-d inputs
def all_reductions(x):
    return F.argmax(x), F.argmin(x), F.max(x), F.min(x), F.sum(x), F.mean(x)


def float_inputs(n, dtype):
    x = RNG.standard_normal(n).astype(dtype)
    yield x
    ties = x.copy()                                   # the extreme several times: numpy's first index
    for i in (n - 1, n // 2, n // 3, 5 * n // 6):
        ties[i], ties[min(i + 1, n - 1)] = x.max(), x.min()
    yield ties
    if n > 2:
        nan = x.copy()                                # the first NaN wins argmax and argmin
        nan[[2 * n // 3, n - 1]] = np.nan
        yield nan
        last = x.copy()
        last[-1] = np.nan                             # only in the tail
        yield last
    yield np.full(n, -np.inf, dtype)
    yield np.full(n, np.inf, dtype)
    zeros = np.zeros(n, dtype)                        # -0.0 == +0.0: the first of them
    zeros[: n // 2] = -0.0
    yield zeros


def int_inputs(n, dtype):
    info = np.iinfo(dtype)
    yield RNG.integers(-3 if info.min < 0 else 0, 4, n).astype(dtype)     # many ties
    x = RNG.integers(info.min, info.max, n, endpoint=True).astype(dtype)
    x[n // 2] = info.max
    x[n - 1] = info.min
    yield x


def check_reductions(got, x):
    n = x.size
    assert int(got[0]) == int(np.argmax(x)) and got[0].dtype == np.int64
    assert int(got[1]) == int(np.argmin(x))
    for g, want in zip(got[2:4], (np.max(x), np.min(x))):
        assert g.dtype == want.dtype
        assert (np.isnan(g) and np.isnan(want)) or g == want, (g, want)
    want_sum, want_mean = np.sum(x), np.mean(x)
    assert got[4].dtype == want_sum.dtype and got[5].dtype == want_mean.dtype
    if x.dtype.kind == "f":
        tol = 1e-6 * np.sqrt(n) * max(1.0, float(np.nanmax(np.abs(x[np.isfinite(x)])) if np.isfinite(x).any() else 1))
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(got[4], want_sum, rtol=1e-5, atol=tol)
            np.testing.assert_allclose(got[5], want_mean, rtol=1e-5, atol=tol / n)
    else:
        assert got[4] == want_sum
        np.testing.assert_allclose(got[5], want_mean, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "int8", "uint8"])
def test_full_reductions_of_a_1d_input_match_numpy(dtype):
    model = dt.compile(all_reductions, S(("N",), dtype), use_cache=False)
    gen = float_inputs if np.dtype(dtype).kind == "f" else int_inputs
    for n in SIZES:
        for x in gen(n, dtype):
            check_reductions(model(x), x)


def test_prod_and_bool_reductions_of_a_1d_input():
    model = dt.compile(lambda x, b: (F.prod(x), F.argmax(b), F.argmin(b), F.max(b), F.min(b)),
                       S(("N",)), S(("M",), "bool"), use_cache=False)
    for n in (1, 129, 4097, (1 << 17) + 5):
        x = (1 + RNG.standard_normal(n) * 1e-3).astype("float32")
        b = RNG.integers(0, 2, n).astype(bool)
        got = model(x, b)
        np.testing.assert_allclose(got[0], np.prod(x), rtol=1e-4)
        want = (np.argmax(b), np.argmin(b), np.max(b), np.min(b))
        for g, w in zip(got[1:], want):
            assert g == w and g.dtype == np.asarray(w).dtype


def test_empty_1d_reductions():
    """The identity where numpy has one; argmax / max of nothing still raises numpy's error."""
    model = dt.compile(lambda x: (F.sum(x), F.prod(x), F.mean(x)), S(("N",)), use_cache=False)
    s, p, m = model(np.zeros(0, np.float32))
    assert s == 0 and p == 1 and np.isnan(m)
    for fn, op in ((F.argmax, "argmax"), (F.argmin, "argmin"), (F.max, "max"), (F.min, "min")):
        compiled = dt.compile(fn, S(("N",)), use_cache=False)
        with pytest.raises(dt.ExecutionError, match="attempt to get arg|zero-size array") as info:
            compiled(np.zeros(0, np.float32))
        assert info.value.op == op
        assert compiled(np.ones(3, np.float32)) == fn(np.ones(3, np.float32))


def test_static_lengths_keepdims_and_flattened_argmax():
    fns = lambda x: (F.argmax(x, keepdims=True), F.max(x, keepdims=True), F.sum(x, axis=0))  # noqa: E731
    for n in (1, 1000):
        model = dt.compile(fns, S((n,)), use_cache=False)
        x = RNG.standard_normal(n).astype("float32")
        for g, w in zip(model(x), fns(x)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)
            assert g.shape == np.shape(w)
    flat = dt.compile(lambda x: (F.argmax(x), F.argmin(x, keepdims=True)), S(("N", 3)), use_cache=False)
    x = RNG.integers(0, 3, (700, 3)).astype("float32")
    got = flat(x)
    assert got[0] == np.argmax(x) and np.array_equal(got[1], np.argmin(x, keepdims=True))


def test_lane_reductions_are_vectorized_with_a_parallel_variant(schedule_log):
    target = cpu_target(num_cores=2)  # the parallel variant needs > 1 core (also on a 1-core machine)
    mod = legalize_and_fuse(target)(region_module(all_reductions, S(("N",))))
    after = schedule_module(mod, target)
    lanes = [f for gv, f in after.functions_items() if gv.name_hint.startswith("dt_lanes_")]
    assert len(lanes) == 5       # mean is the sum's kernel (the same PrimFunc) and a division
    for func in lanes:
        script = func.script()
        assert "T.vectorized" in script and "T.parallel" in script
        assert func.attrs.get("tirx.is_scheduled", False)
    assert "rule failed" not in schedule_log.text
    assert schedule_log.text.count("lanes rule applied") == 5


def test_single_core_lane_reductions_have_no_parallel_loop():
    target = cpu_target(num_cores=1)
    after = schedule_module(legalize_and_fuse(target)(region_module(lambda x: F.argmax(x), S(("N",)))), target)
    (func,) = [f for gv, f in after.functions_items() if gv.name_hint.startswith("dt_lanes_")]
    assert "T.parallel" not in func.script() and "T.vectorized" in func.script()


def test_single_core_flattened_argmax_builds_and_matches_numpy():
    """On one core (a container given one CPU) the lane argmax / argmin of a flattened [N, 3] input keeps its two
    variants, both without a parallel loop: its lone variant failed LLVM's verification in TVM 0.27 (TIR's CSE
    hoisted a bound out of the loop defining it) and `dt.compile` raised. Equal to numpy at N = 1, 5, 700 (one
    and several lane blocks), first index of ties."""
    fn = lambda x: (F.argmax(x), F.argmin(x, keepdims=True))  # noqa: E731
    (name, body), = collect_regions(partition_graph(dt.trace(fn, S(("N", 3)))))
    ex = build_cpu(build_module([(name, body)]), cpu_target(num_cores=1))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for n in (1, 5, 700):
        x = RNG.integers(0, 3, (n, 3)).astype("float32")
        got = vm[name](tvm.runtime.tensor(x))
        assert int(got[0].numpy()) == np.argmax(x)
        assert np.array_equal(got[1].numpy(), np.argmin(x, keepdims=True))


# ------------------------------------------------------------------------------- one kernel per LSTM step
def lstm_step_numpy(x, h, c, w, u, b):
    z = x @ w + h @ u + b
    i, f, g, o = np.split(z, 4, axis=-1)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    c = sig(f) * c + sig(i) * np.tanh(g)
    return c, sig(o) * np.tanh(c)


@pytest.mark.parametrize("cores", [None, 1])
def test_lstm_step_is_one_kernel(cores):
    from dyntvm.examples.lstm import EXAMPLE, U, W, b
    graph = partition_graph(dt.trace(EXAMPLE.fn, *EXAMPLE.specs))
    # x @ W is hoisted out of the loop (partition/loops.py): the step's region gets x_t @ W as an input
    (name, body), = [(n, g) for n, g in collect_regions(graph) if "body" in n]
    ex = build_cpu(build_module([(name, body)]), cpu_target(num_cores=cores))
    calls = kernel_calls(ex)
    assert len(calls) == 1 and calls[0].startswith("fused_contraction"), calls
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for bsz in (0, 1, 2, 3, 4, 5, 16):    # tiles of hidden units while B < 4, 4-row matmul tiles from 4
        x, h, c = (RNG.standard_normal(s).astype("float32") for s in [(bsz, 128), (bsz, 256), (bsz, 256)])
        named = {"h": h, "c": c, "xw": (x @ W).astype("float32")}
        order = [{1024: "xw"}.get(v.type.shape[-1]) or ("h" if k == 0 else "c") for k, v in enumerate(body.inputs)]
        assert sorted(order) == ["c", "h", "xw"]
        got = vm[name](*[tvm.runtime.tensor(named[k]) for k in order])
        for g, w in zip(got, lstm_step_numpy(x, h, c, W, U, b)):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-5)


def test_contraction_groups(schedule_log):
    """Matmuls whose sum feeds an epilogue, with and without a split into gates, static and symbolic
    rows; a matmul whose result is reshaped is not merged (its kernels as before)."""
    k1, k2, n = 48, 32, 192
    w1 = (RNG.standard_normal((k1, n)) / np.sqrt(k1)).astype("float32")
    w2 = (RNG.standard_normal((k2, n)) / np.sqrt(k2)).astype("float32")
    bias = RNG.standard_normal(n).astype("float32")

    def gates(x, h, c):     # 3 gates of 64
        a, g, o = F.split(F.matmul(x, w1) + F.matmul(h, w2) + bias, 3, axis=-1)
        c = F.sigmoid(a) * c + F.tanh(g)
        return c, F.sigmoid(o) * F.tanh(c)

    def one_gate(x, h, c):
        return F.tanh(F.matmul(x, w1) + F.matmul(h, w2) + bias)[:, :64] * c

    def reshaped(x, h, c):
        return F.reshape(F.matmul(x, w1), (-1, 2, 96)) * 2.0

    def np_gates(x, h, c):
        a, g, o = np.split(x @ w1 + h @ w2 + bias, 3, axis=-1)
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sig(a) * c + np.tanh(g)
        return c, sig(o) * np.tanh(c)

    refs = {"gates": np_gates, "one_gate": lambda x, h, c: np.tanh(x @ w1 + h @ w2 + bias)[:, :64] * c,
            "reshaped": lambda x, h, c: (x @ w1).reshape(-1, 2, 96) * 2.0}
    fns = {"gates": gates, "one_gate": one_gate, "reshaped": reshaped}
    for rows in ("B", 1, 3, 8):
        specs = (S((rows, k1)), S((rows, k2)), S((rows, 64)))
        for name, fn in fns.items():
            model = dt.compile(fn, *specs, use_cache=False)
            merged = [c for c in kernel_calls(model.lib) if c.startswith("fused_contraction")]
            assert len(merged) == (0 if name == "reshaped" else 1), (name, kernel_calls(model.lib))
            for bsz in ((0, 1, 2, 5, 9) if rows == "B" else (rows,)):
                x, h, c = (RNG.standard_normal((bsz, k)).astype("float32") for k in (k1, k2, 64))
                got = model(x, h, c)
                want = refs[name](x, h, c)
                for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    text = rule_log(schedule_log)
    assert "contraction_group rule applied" in text
    assert "rule failed" not in text


def test_merged_kernels_of_a_module():
    """gates and one_gate become one kernel each, the reshaped matmul keeps FuseOps' kernels."""
    k, n = 32, 128
    w1, w2 = RNG.standard_normal((k, n)).astype("float32"), RNG.standard_normal((k, n)).astype("float32")
    bb = relax.BlockBuilder()
    for fname, body in (
            ("gates", lambda x, h: R.multiply(R.sigmoid(R.strided_slice(R.add(R.matmul(x, relax.const(w1)),
                                                                               R.matmul(h, relax.const(w2))),
                                                                         axes=[1], begin=[0], end=[64])),
                                              R.tanh(R.strided_slice(R.matmul(x, relax.const(w1)),
                                                                     axes=[1], begin=[64], end=[128])))),
            ("reshaped", lambda x, h: R.reshape(R.add(R.matmul(x, relax.const(w1)), R.matmul(h, relax.const(w2))),
                                                (x.ty.shape[0], 2, 64)))):
        x = relax.Var("x", relax.TensorType((tirx.Var("B", "int64"), k), "float32"))
        h = relax.Var("h", relax.TensorType((x.ty.shape[0], k), "float32"))
        with bb.function(fname, [x, h]):
            with bb.dataflow():
                out = bb.emit_output(body(x, h))
            bb.emit_func_output(out)
    mod = bb.get()
    vm = relax.VirtualMachine(build_cpu(mod), tvm.cpu())
    for bsz in (1, 6):
        x, h = RNG.standard_normal((bsz, k)).astype("float32"), RNG.standard_normal((bsz, k)).astype("float32")
        z = x @ w1 + h @ w2
        np.testing.assert_allclose(vm["gates"](tvm.runtime.tensor(x), tvm.runtime.tensor(h)).numpy(),
                                   1 / (1 + np.exp(-z[:, :64])) * np.tanh((x @ w1)[:, 64:]), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(vm["reshaped"](tvm.runtime.tensor(x), tvm.runtime.tensor(h)).numpy(),
                                   z.reshape(bsz, 2, 64), rtol=1e-4, atol=1e-4)


def test_merging_can_be_switched_off(monkeypatch):
    from dyntvm.examples.lstm import EXAMPLE
    regions = collect_regions(partition_graph(dt.trace(EXAMPLE.fn, *EXAMPLE.specs)))
    monkeypatch.setattr(cpu_schedule, "FUSE_CONTRACTIONS", False)
    calls = kernel_calls(build_cpu(build_module(regions)))
    assert len(calls) > 1 and not any(c.startswith("fused_contraction") for c in calls)


# --------------------------------------------------------------------------- reductions over a leading axis
def test_reductions_over_a_non_trailing_axis(schedule_log):
    def fn(x, y, z):
        return (F.softmax(x, axis=0), F.log_softmax(y, axis=1), z - F.mean(z, axis=0, keepdims=True),
                F.softmax(y, axis=-1))

    def ref(x, y, z):
        def sm(a, axis):
            e = np.exp(a - a.max(axis, keepdims=True))
            return e / e.sum(axis, keepdims=True)
        return sm(x, 0), np.log(sm(y, 1)), z - z.mean(0, keepdims=True), sm(y, -1)

    model = dt.compile(fn, S(("N", 64)), S((4, "M", 32)), S(("K", 48)), use_cache=False)
    for n in (1, 5, 300):
        args = (RNG.standard_normal((n, 64)).astype("float32"), RNG.standard_normal((4, n, 32)).astype("float32"),
                RNG.standard_normal((n, 48)).astype("float32"))
        for g, w in zip(model(*args), ref(*args)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert rule_log(schedule_log).count("axis_reduction rule applied") == 2   # the softmaxes over axis 0 and 1


# ---------------------------------------------------------------------------------------- reshape views
def test_pure_reshapes_are_views_not_kernels():
    bb = relax.BlockBuilder()
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            flat = bb.emit(R.reshape(x, (n * 4,)))
            out = bb.emit_output(R.add(R.reshape(flat, (n, 2, 2)), relax.const(1.0, "float32")))
        bb.emit_func_output(out)
    ex = build_cpu(bb.get())
    assert not any("reshape" in c for c in kernel_calls(ex)), kernel_calls(ex)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for rows in (0, 3):
        a = RNG.standard_normal((rows, 4)).astype("float32")
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(a)).numpy(), a.reshape(rows, 2, 2) + 1)
