"""Squeeze-excitation kernels on the CPU (issue 24, mobilenet_v3_small): a global mean / sum / max over the
symbolic spatial axes (`cpu_schedule_reduce._sched_interleaved_rows`: 8, 4 or 2 channels reduced side by side,
each its own accumulator) and a 1x1 conv on [N, C, 1, 1] whose epilogue is the broadcast multiply over
[N, C, H, W] (`cpu_schedule_conv.BROADCAST_POSITIONS_INNER`: positions innermost). Compared with independent
numpy expressions at odd sizes, batch 0 / 1 / more, symbolic dims; the tests count the kernels the new rule
scheduled and check the loop order, never time."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
import tvm  # noqa: E402
import tvm_ffi  # noqa: E402

from dyntvm.codegen.backends.cpu import cpu_schedule  # noqa: E402
from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(24)


@pytest.fixture
def rule_log(caplog):
    caplog.set_level(logging.DEBUG, logger=cpu_schedule.__name__)
    return caplog


def rules(caplog) -> tuple[dict, list]:
    first = [r.getMessage().splitlines()[0] for r in caplog.records]
    applied: dict = {}
    for m in first:
        if " rule applied" in m:
            label = m.split("cpu_schedule: ")[-1].split(" rule applied")[0]
            applied[label] = applied.get(label, 0) + 1
    return applied, [m for m in first if "rule failed" in m]


def scheduled_funcs(fn, spec) -> dict:
    """name -> scheduled PrimFunc of `fn`'s regions (one thread)."""
    mod = build_module(collect_regions(partition_graph(dt.trace(fn, spec))))
    target = cpu_schedule.cpu_target(1)
    with target:
        mod = tvm.transform.Sequential(cpu_schedule.fuse_passes(target) + [cpu_schedule.cpu_schedule_pass(target)])(mod)
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


REDUCTIONS = [
    ("mean_keepdims", lambda x: F.mean(x, axis=(2, 3), keepdims=True),
     lambda x: x.mean(axis=(2, 3), keepdims=True)),
    ("sum", lambda x: F.sum(x, axis=(2, 3)), lambda x: x.sum(axis=(2, 3))),
    ("max_keepdims", lambda x: F.max(x, axis=(2, 3), keepdims=True), lambda x: x.max(axis=(2, 3), keepdims=True)),
    ("sum_last", lambda x: F.sum(x, axis=-1), lambda x: x.sum(axis=-1)),
]


@pytest.mark.parametrize("channels", [16, 12, 6, 5])
@pytest.mark.parametrize("case", REDUCTIONS, ids=[c[0] for c in REDUCTIONS])
def test_spatial_reduction_matches_numpy(case, channels, rule_log):
    _, fn, ref = case
    m = dt.compile(fn, S(("B", channels, "H", "W")), use_cache=False)
    sizes = [(1, channels, 1, 1), (2, channels, 7, 9), (1, channels, 56, 56), (3, channels, 13, 1),
             (1, channels, 2, 17)]
    if case[0] != "max_keepdims":        # numpy's max of nothing raises; mean of nothing is NaN with a warning
        sizes.append((0, channels, 5, 5))
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        got, want = np.asarray(m(x)), ref(x)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=str(shape))
    applied, failed = rules(rule_log)
    assert not failed, failed
    # 8, 4 or 2 rows side by side where the channel count is a multiple of one (5 is not: the row rule); a sum
    # over W alone has a symbolic row loop (H) last: the row rule
    fits = channels != 5 and case[0] != "sum_last"
    assert applied.get("interleaved_rows", 0) == (1 if fits else 0), applied


def test_mean_of_an_empty_plane_is_nan():
    m = dt.compile(lambda x: F.mean(x, axis=(2, 3), keepdims=True), S(("B", 8, "H", "W")), use_cache=False)
    got = np.asarray(m(np.zeros((2, 8, 0, 3), "float32")))
    assert got.shape == (2, 8, 1, 1) and np.isnan(got).all()


def test_spatial_sum_interleaves_channels():
    """The sum's channels in blocks of 8, the block unrolled innermost under the (symbolic) H, W loops."""
    funcs = scheduled_funcs(lambda x: F.sum(x, axis=(2, 3), keepdims=True), S(("B", 24, "H", "W")))
    (func,) = [f for n, f in funcs.items() if n.startswith("sum")]
    loops = []
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, loops.append))
    unrolled = [lp for lp in loops if lp.kind == tvm.tirx.ForKind.UNROLLED and int(lp.extent) == 8]
    assert len(unrolled) >= 2, func          # init / update (and the write-back)


def se_block(c, c4):
    """(fn, numpy reference) of a squeeze-excitation over `c` channels, `c4` in the middle."""
    rng = np.random.default_rng(c * 1000 + c4)
    w1 = (rng.standard_normal((c4, c, 1, 1)) / np.sqrt(c)).astype("float32")
    b1 = rng.standard_normal(c4).astype("float32")
    w2 = (rng.standard_normal((c, c4, 1, 1)) / np.sqrt(c4)).astype("float32")
    b2 = rng.standard_normal(c).astype("float32")

    def fn(y):
        s = F.mean(y, axis=(2, 3), keepdims=True)
        s = F.relu(F.conv(s, w1, b1))
        s = F.minimum(F.maximum(F.conv(s, w2, b2) / 6.0 + 0.5, 0.0), 1.0)
        return y * s

    def ref(y):
        s = y.mean(axis=(2, 3))
        s = np.maximum(s @ w1[:, :, 0, 0].T + b1, 0)
        s = np.clip((s @ w2[:, :, 0, 0].T + b2) / 6 + 0.5, 0, 1)
        return y * s[:, :, None, None]
    return fn, ref


C, C4 = 24, 8
se, se_ref = se_block(C, C4)


# (channels, middle): the 1x1 convs' output-channel blocks (`te_conv.gemv_channel_block`) 8 / 8, 32 / 32, 64 / 64,
# 16 (144) / 8 (40)
@pytest.mark.parametrize("c,c4", [(24, 8), (96, 32), (128, 64), (144, 40)])
def test_squeeze_excitation_matches_numpy(c, c4, rule_log):
    fn, ref = se_block(c, c4)
    m = dt.compile(fn, S(("B", c, "H", "W")), use_cache=False)
    for shape in [(1, c, 1, 1), (2, c, 7, 9), (1, c, 28, 28), (3, c, 5, 1), (0, c, 4, 4)]:
        y = RNG.standard_normal(shape).astype("float32")
        got, want = np.asarray(m(y)), ref(y)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
    applied, failed = rules(rule_log)
    assert not failed, failed
    assert applied.get("conv", 0) == 2 and applied.get("interleaved_rows", 0) == 1, applied


def test_one_position_conv_packs_wide_channel_blocks():
    """The 1x1 convs on [B, C, 1, 1] (GEMVs) pack their weight in blocks of 64 / 32 channels where those divide O
    (a register tile of 8 / 4 AVX2 accumulators), not 16 as a conv over more positions."""
    funcs = scheduled_funcs(se_block(128, 32)[0], S(("B", 128, "H", "W")))
    blocks = sorted(int(p.shape[-1]) for f in funcs.values() for p in f.params if len(getattr(p, "shape", ())) == 5)
    assert blocks == [32, 64], blocks


def test_squeeze_excitation_multiply_iterates_positions_innermost():
    """The broadcast multiply after the 1x1 conv on [B, C, 1, 1]: its innermost loop runs over W (contiguous),
    not over the conv's output channels (stores H x W floats apart)."""
    funcs = scheduled_funcs(se, S(("B", C, "H", "W")))
    (func,) = [f for n, f in funcs.items() if "conv" in n and "multiply" in n and "maximum" in n]
    found = []

    def visit(s):
        if isinstance(s.body, tvm.s_tir.SBlockRealize):
            found.append((s.body.block.name_hint, s.extent))
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, visit))
    inner = [ext for name, ext in found if name.startswith("T_multiply")]
    assert len(inner) == 1 and isinstance(inner[0], tvm.tirx.Var) and inner[0].name == "W", (found, func)
