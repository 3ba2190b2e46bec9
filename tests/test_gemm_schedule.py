"""GEMM schedule (issue 24 item 2): register tiles sized from the target's ISA features, packed weight panels,
fused epilogues, one build for every row count; results vs numpy at odd and symbolic sizes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.relax import op as R

from dyntvm.codegen.backends.cpu import cpu_schedule
from dyntvm.codegen.backends.cpu.cpu_prepack import packed_value, panel_columns
from dyntvm.codegen.backends.cpu.cpu_sched_helpers import PREPACKED, vector_lanes, vector_registers
from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu, cpu_target, legalize_and_fuse, schedule_module
from dyntvm.codegen.backends.cpu.cpu_schedule_matmul import PACK_MIN_ROWS, matmul_rows, tile_columns
from test_cpu_schedule import check, const, make_module, rand, run, scaled, sym


def _target(**cfg):
    return tvm.target.Target({"kind": "llvm", "num-cores": 2, **cfg})


ISAS = {  # target -> (fp32 lanes, vector registers): from the CPU features, whatever the -mcpu name says
    "znver3": (_target(mcpu="znver3"), 8, 16),       # AVX2 (TVM's llvm_get_vector_width says 512 here)
    "haswell": (_target(mcpu="haswell"), 8, 16),
    "znver4": (_target(mcpu="znver4"), 16, 32),      # AVX-512
    "skylake-avx512": (_target(mcpu="skylake-avx512"), 16, 32),
    "aarch64": (_target(mtriple="aarch64-linux-gnu"), 4, 32),   # NEON
}


@pytest.mark.parametrize("isa", list(ISAS))
def test_vector_width_and_tile_from_isa_features(isa):
    target, lanes, regs = ISAS[isa]
    assert vector_lanes(target, "float32") == lanes
    assert vector_registers(target) == regs
    for mr in (1, matmul_rows(target)):
        vecs = tile_columns(mr, target, "float32") // lanes
        # accumulators + the broadcast input value + the weight vectors reused by several rows (one row's
        # weights are FMA memory operands) fit the registers
        assert mr * vecs + (vecs if mr > 1 else 0) + 1 <= regs, (isa, mr, vecs)


def _scheduled_text(target, m, k=512, n=512):
    w = np.ones((k, n), "float32")
    mod = make_module([("main", [("x", (m, k), "float32")], lambda x: R.matmul(x, const(w)))])
    mod = schedule_module(legalize_and_fuse(target)(mod), target)
    prims = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert len(prims) == 1      # one kernel for every row count: the variants are branches inside it
    return prims[0].script()


@pytest.mark.parametrize("isa", ["znver3", "znver4"])
def test_symbolic_rows_pack_weight_panels_and_vectorize_native_width(isa):
    target, lanes, _ = ISAS[isa]
    text = _scheduled_text(target, sym("M"))
    # the packed panel: a K x nr copy of the weight (`_pack_panel`), allocated per column panel
    assert "B_global" in text
    assert re.search(r'T\.sblock\("B_global"\)', text)
    widths = {int(w) for w in re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", text)}
    assert widths == {lanes}, widths    # native vectors only: no <16 x float> on AVX2
    # the row-count branches: GEMV tile below 4 rows, unpacked below PACK_MIN_ROWS, packed above
    assert f"M < T.int64({PACK_MIN_ROWS})" in text and "M < T.int64(4)" in text



@pytest.mark.parametrize("isa", ["znver3", "znver4"])
def test_symbolic_rows_below_packing_use_a_4_row_tile(isa):
    """4 <= M < PACK_MIN_ROWS: a 4-row tile whatever the ISA's (AVX2's 6-row tile computed branchy's 8 rows as 12)."""
    target = ISAS[isa][0]
    text = _scheduled_text(target, sym("M"), k=32, n=32)
    assert "(M + T.int64(3)) // T.int64(4) * T.int64(4)" in text
    assert ("(M + T.int64(5)) // T.int64(6)" in text) == (matmul_rows(target) == 6)   # the packed tile: the ISA's

def test_few_static_rows_do_not_pack():
    target = ISAS["znver3"][0]
    assert "B_global" not in _scheduled_text(target, PACK_MIN_ROWS - 1)
    assert "B_global" in _scheduled_text(target, PACK_MIN_ROWS)


@pytest.fixture(scope="module")
def vm():
    """Built for this machine: matmuls with a constant weight and a symbolic row count M, odd K / N, a fused
    bias + relu + residual epilogue, a batched matmul with a symbolic batch."""
    shapes = {"big": (512, 512), "k1": (1, 70), "odd": (100, 13), "n24": (256, 24)}
    weights = {name: scaled(k, n, k=k) for name, (k, n) in shapes.items()}
    bias, w_epi = rand(96), scaled(64, 96, k=64)
    funcs = [(name, [("x", (sym("M"), k), "float32")], lambda x, w=weights[name]: R.matmul(x, const(w)))
             for name, (k, _) in shapes.items()]
    rows, batch = sym("M"), sym("B")
    funcs.append(("epilogue", [("x", (rows, 64), "float32"), ("r", (rows, 96), "float32")],
                  lambda x, r: R.add(R.nn.relu(R.add(R.matmul(x, const(w_epi)), const(bias))), r)))
    funcs.append(("bmm", [("a", (batch, sym("S"), 64), "float32"), ("b", (batch, 64, 40), "float32")],
                  R.matmul))
    mod = make_module(funcs)
    fused = legalize_and_fuse(cpu_target())(mod)
    # the epilogue stays fused with its matmul: one kernel per function
    assert sum(isinstance(f, tirx.PrimFunc) for f in fused.functions.values()) == len(funcs)
    return relax.VirtualMachine(build_cpu(mod, cpu_target()), tvm.cpu()), weights, (w_epi, bias)


@pytest.mark.parametrize("m", [0, 1, 5, 7, 16, 33, 64, 130])
def test_gemm_results_at_symbolic_and_odd_sizes(vm, m):
    machine, weights, (w_epi, bias) = vm
    for name, w in weights.items():
        x = rand(m, w.shape[0])
        check(run(machine, name, x), x @ w, rtol=1e-4, atol=1e-4)
    x, r = rand(m, 64), rand(m, 96)
    check(run(machine, "epilogue", x, r), np.maximum(x @ w_epi + bias, 0) + r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch, rows", [(1, 1), (3, 5), (2, 33), (16, 64)])
def test_batched_matmul_symbolic_batch(vm, batch, rows):
    machine = vm[0]
    a, b = rand(batch, rows, 64), scaled(batch, 64, 40, k=64)
    check(run(machine, "bmm", a, b), np.einsum("bsk,bkn->bsn", a, b), rtol=1e-4, atol=1e-4)


def test_pack_rule_applied_without_fallback(caplog):
    """The matmul rule (packed variant included) schedules the kernel itself: no rule failed on the way."""
    with caplog.at_level("DEBUG", logger=cpu_schedule.__name__):
        _scheduled_text(cpu_target(), sym("M"), 256, 384)
    assert "matmul rule applied" in caplog.text
    assert "rule failed" not in caplog.text


@pytest.fixture(scope="module")
def softmax_vm():
    """Attention's softmax: rows of symbolic length S (scores [B, heads, S, S]), fp32."""
    s = sym("S")
    mod = make_module([("smx", [("x", (sym("B"), 4, s, s), "float32")], lambda x: R.nn.softmax(x, axis=-1)),
                       ("logsmx", [("x", (sym("T"), sym("T")), "float32")], lambda x: R.nn.log_softmax(x, axis=-1))])
    fused = legalize_and_fuse(cpu_target())(mod)
    text = schedule_module(fused, cpu_target()).script()
    return relax.VirtualMachine(build_cpu(mod, cpu_target()), tvm.cpu()), text


def test_softmax_symbolic_rows_reduce_in_vector_lanes(softmax_vm):
    """max and sum over a symbolic row: partial results per lane, the lane loop a vector (a scalar chain before)."""
    text = softmax_vm[1]
    for name in ("T_max_lanes", "T_sum_lanes"):
        assert f'T.sblock("{name}_update")' in text, name
        block_at = text.index(f'T.sblock("{name}_update")')
        assert "T.vectorized(" in text[text.rindex("for ", 0, block_at - 40) - 200:block_at], name


def test_softmax_symbolic_rows_keep_exp_in_the_output(softmax_vm):
    """softmax over a symbolic row: exp(x - max) is stored in the output's row and divided in place (a row buffer
    of symbolic length was a workspace allocated and freed per row); log_softmax has no such intermediate."""
    text = softmax_vm[1]
    smx = text[text.index("def softmax"):]
    smx = smx[:smx.index("@T.prim_func")] if "@T.prim_func" in smx else smx
    assert "T_exp = T.sblock_alloc_buffer" not in smx and "T_exp" not in smx.replace('T.sblock("T_exp")', "")
    assert re.search(r"T_softmax\[[^\]]*\] = T_softmax\[", smx)


@pytest.mark.parametrize("s", [0, 1, 5, 15, 16, 17, 33, 130])
def test_softmax_symbolic_rows_results(softmax_vm, s):
    machine = softmax_vm[0]
    x = 5 * rand(2, 4, s, s)
    if s > 3:
        x[0, 1, 2, 3] = -np.inf      # a masked score
        x[1, 0, 0, :] = -1e9         # a fully masked row: uniform
    e = np.exp(x - (x.max(-1, keepdims=True) if s else 0))
    check(run(machine, "smx", x), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    y = x[0, 0]
    if s:
        want = y - y.max(-1, keepdims=True) - np.log(np.exp(y - y.max(-1, keepdims=True)).sum(-1, keepdims=True))
        check(run(machine, "logsmx", y), want, rtol=1e-5, atol=1e-5)


def _contraction_kernel(text: str) -> str:
    """The fused_contraction PrimFunc of a module's script."""
    start = text.index("def fused_contraction")
    end = text.find("\n    @", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_contraction_group_reads_weights_packed_at_compile_time_at_odd_batches():
    """An LSTM-like cell (x @ Wx + h @ Wh + b, gate math) merged into one kernel: its constant weights are packed
    once, at compile time, into panels [N / nr, K, nr] (rows 4H floats apart evicted each other), and the kernel
    reads them without a per-call copy; where the weight is an input, from 4 rows each call copies its panels.
    Results at batches around the 4-row tile."""
    wx, wh, b = scaled(64, 512, k=64), scaled(128, 512, k=128), rand(512)
    bv, bw = sym("B"), sym("B")
    mod = make_module([("cell", [("x", (bv, 64), "float32"), ("h", (bv, 128), "float32")],
                        lambda x, h: R.tanh(R.add(R.add(R.matmul(x, const(wx)), R.matmul(h, const(wh))),
                                                  const(b)))),
                       ("cell_w", [("x", (bw, 64), "float32"), ("h", (bw, 128), "float32"),
                                   ("wh", (128, 512), "float32")],
                        lambda x, h, w: R.sigmoid(R.add(R.add(R.matmul(x, const(wx)), R.matmul(h, w)), const(b))))])
    for isa in ("znver3", "znver4"):   # AVX2 and AVX-512 tiles: scheduled by the group rule, and they build
        target = ISAS[isa][0]
        fused = legalize_and_fuse(target)(mod)
        nr = panel_columns(512, target, "float32")
        kernels = {gv.name_hint: f for gv, f in fused.functions_items() if gv.name_hint.startswith("fused_contr")}
        assert len(kernels) == 2, isa
        packed = {name: {int(k): int(v) for k, v in f.attrs[PREPACKED].items()} for name, f in kernels.items()}
        assert sorted(len(p) for p in packed.values()) == [1, 2], (isa, packed)   # wh as an input: not packed
        for name, f in kernels.items():
            for n, width in packed[name].items():
                assert width == nr and [int(d) for d in f.params[n].shape] in ([512 // nr, 64, nr],
                                                                             [512 // nr, 128, nr]), isa
        scheduled = schedule_module(fused, target)
        for name, f in kernels.items():
            text = scheduled[name].script()
            # a panel copy per call: a `_global` block; prepacked weights have none
            assert text.count('_global")') == 2 - len(packed[name]), (isa, name)
    build_cpu(mod, ISAS["znver4"][0])
    target = cpu_target()
    vm = relax.VirtualMachine(build_cpu(mod, target), tvm.cpu())
    for bsz in (0, 1, 3, 4, 5, 17, 33):
        x, h = rand(bsz, 64), rand(bsz, 128)
        check(run(vm, "cell", x, h), np.tanh(x @ wx + h @ wh + b), rtol=1e-4, atol=1e-5)
        check(run(vm, "cell_w", x, h, wh), 1 / (1 + np.exp(-(x @ wx + h @ wh + b))), rtol=1e-4, atol=1e-5)


def test_packed_value_is_the_panel_layout():
    w = rand(3, 8)
    p = packed_value(w, 4)
    assert p.shape == (2, 3, 4) and p.flags["C_CONTIGUOUS"]
    for k in range(3):
        for j in range(8):
            assert p[j // 4, k, j % 4] == w[k, j]


def _numpy_lstm(xs, h, c):
    """The lstm example in numpy, step by step (gates i, f, g, o)."""
    from dyntvm.examples.lstm import U, W, b
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    hs = []
    for x in xs:
        i, f, g, o = np.split(x @ W + h @ U + b, 4, axis=-1)
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        hs.append(h)
    return np.stack(hs) if hs else np.zeros((0,) + h.shape, "float32"), h


def test_lstm_step_kernel_reads_prepacked_recurrent_weight(tmp_path, monkeypatch):
    """The lstm example (one build, batch symbolic): its step kernel (the merged contraction group) takes U in
    the panel layout, packed once at compile time, and neither of its variants (the B < 4 GEMV tiles, the
    packed B >= 4 tiles) copies a panel per call; results equal a numpy LSTM at B 0, 1, 3, 16, 17."""
    import dyntvm as dt
    from dyntvm import examples
    from dyntvm.examples.lstm import HIDDEN
    got = {}
    orig = cpu_schedule._schedule_func

    def capture(func, target, name=""):
        new = orig(func, target, name)
        if name.startswith("fused_contraction"):
            got[name] = (func, new, target)
        return new
    monkeypatch.setattr(cpu_schedule, "_schedule_func", capture)
    lstm = examples.get("lstm")
    model = dt.compile(lstm.fn, *lstm.specs, cache_dir=str(tmp_path))
    assert len(got) == 1, sorted(got)
    (func, new, target), = got.values()
    packed = {int(k): int(v) for k, v in new.attrs[PREPACKED].items()}
    nr = panel_columns(4 * HIDDEN, target, "float32")
    assert packed == {1: nr}
    assert [int(d) for d in new.params[1].shape] == [4 * HIDDEN // nr, HIDDEN, nr]
    text = new.script()
    assert "_global" not in text                               # no per-call panel copy
    assert not re.search(rf"alloc_buffer\(\(T\.int64\({HIDDEN}\), T\.int64\({4 * HIDDEN}\)\)", text)
    assert text.count("T.sblock_alloc_buffer") < str(func).count("T.sblock_alloc_buffer")
    rng = np.random.default_rng(3)
    for bsz in (0, 1, 3, 16, 17):
        xs, h0, c0 = lstm.make_inputs(rng, T=5, B=bsz)
        h0, c0 = rng.standard_normal(h0.shape).astype("float32"), rng.standard_normal(c0.shape).astype("float32")
        hs, h = model(xs, h0, c0)
        want_hs, want_h = _numpy_lstm(xs, h0, c0)
        np.testing.assert_allclose(np.asarray(hs), want_hs, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------- symbolic M and N multiples of the tile (exact)


def _attention_scores_module():
    """q.k^T of attention with its scale and additive key mask: [B, 4, S, 32] @ [B, 4, 32, S], S symbolic for
    both M and N; and probabilities @ v ([B, 4, S, S] @ [B, 4, S, 32]: a symbolic M and K)."""
    b, s, b2, s2 = sym("B"), sym("S"), sym("B"), sym("S")
    scale = const(np.array(32 ** -0.5, "float32"))
    return make_module([
        ("scores", [("q", (b, 4, s, 32), "float32"), ("kt", (b, 4, 32, s), "float32"),
                    ("mask", (b, 1, 1, s), "float32")],
         lambda q, kt, mask: R.add(R.multiply(R.matmul(q, kt), scale), mask)),
        ("pv", [("p", (b2, 4, s2, s2), "float32"), ("v", (b2, 4, s2, 32), "float32")], R.matmul)])


@pytest.mark.parametrize("isa", ["znver3", "znver4"])
def test_symbolic_tile_multiples_get_an_exact_variant(isa):
    """A symbolic M / N that the tile divides gets a variant without padding or predicates, with a column tile
    over a symbolic N; its accumulator tile is a constant-size buffer once lowered (a symbolic one was a
    workspace per call, every FMA a load and a store), in both kernels."""
    target = ISAS[isa][0]
    mod = schedule_module(legalize_and_fuse(target)(_attention_scores_module()), target)
    prims = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}
    assert len(prims) == 2      # the scale and mask stay fused with q.k^T
    nr = 2 * vector_lanes(target, "float32") if isa == "znver3" else 4 * vector_lanes(target, "float32")
    for name, func in prims.items():
        text = func.script()
        assert "S % T.int64(4) == T.int64(0)" in text, name
        if "32), S), \"float32\")" in text.split("def main")[1].split("\n")[0]:   # q.k^T: N symbolic
            assert f"S % T.int64({nr}) == T.int64(0)" in text, name
        lowered = tvm.s_tir.transform.CompactBufferAllocation()(tvm.s_tir.transform.ConvertBlocksToOpaque()(
            tvm.s_tir.transform.PlanAndUpdateBufferAllocationLocation()(tvm.s_tir.transform.LowerInitBlock()(
                tvm.IRModule({"main": func})))))["main"].script()
        # the accumulator tile (the intermediate of q.k^T + epilogue, the cache tile of p.v)
        shapes = [ln.split("sblock_alloc_buffer(")[1].split(")")[0] for ln in lowered.splitlines()
                  if "sblock_alloc_buffer(" in ln and ln.strip().startswith(("matmul_intermediate =", "matmul_global ="))]
        assert shapes and all("S" not in shp and "B" not in shp for shp in shapes), (name, shapes)


@pytest.fixture(scope="module")
def attention_vm():
    return relax.VirtualMachine(build_cpu(_attention_scores_module(), cpu_target()), tvm.cpu())


@pytest.mark.parametrize("batch, s", [(1, 0), (1, 1), (2, 3), (1, 4), (3, 7), (2, 12), (1, 16), (2, 17), (1, 24),
                                      (2, 32), (1, 33), (2, 48), (1, 64), (2, 100), (1, 128)])
def test_attention_matmuls_exact_and_ragged_sizes(attention_vm, batch, s):
    """Multiples of 4 / 6 / 16 (the exact variants) and the sizes between them (padded tiles), vs numpy."""
    q, kt, v = rand(batch, 4, s, 32), rand(batch, 4, 32, s), rand(batch, 4, s, 32)
    mask = np.where(rand(batch, 1, 1, s) > 0.5, 0, -1e9).astype("float32")
    want = np.einsum("bhsk,bhkt->bhst", q, kt) * np.float32(32 ** -0.5) + mask
    check(run(attention_vm, "scores", q, kt, mask), want, rtol=1e-4, atol=1e-4)
    p = rand(batch, 4, s, s) / np.float32(max(s, 1))
    check(run(attention_vm, "pv", p, v), np.einsum("bhst,bhtk->bhsk", p, v), rtol=1e-4, atol=1e-4)
