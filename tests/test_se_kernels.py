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
    sizes = [(1, channels, 1, 1), (2, channels, 7, 9), (1, channels, 56, 56), (3, channels, 13, 1), (1, channels, 2, 17)]
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


C, C4 = 24, 8
W1 = (RNG.standard_normal((C4, C, 1, 1)) / np.sqrt(C)).astype("float32")
B1 = RNG.standard_normal(C4).astype("float32")
W2 = (RNG.standard_normal((C, C4, 1, 1)) / np.sqrt(C4)).astype("float32")
B2 = RNG.standard_normal(C).astype("float32")


def se(y):
    s = F.mean(y, axis=(2, 3), keepdims=True)
    s = F.relu(F.conv(s, W1, B1))
    s = F.minimum(F.maximum(F.conv(s, W2, B2) / 6.0 + 0.5, 0.0), 1.0)
    return y * s


def se_ref(y):
    s = y.mean(axis=(2, 3))
    s = np.maximum(s @ W1[:, :, 0, 0].T + B1, 0)
    s = np.clip((s @ W2[:, :, 0, 0].T + B2) / 6 + 0.5, 0, 1)
    return y * s[:, :, None, None]


def test_squeeze_excitation_matches_numpy(rule_log):
    m = dt.compile(se, S(("B", C, "H", "W")), use_cache=False)
    for shape in [(1, C, 1, 1), (2, C, 7, 9), (1, C, 28, 28), (3, C, 5, 1), (0, C, 4, 4)]:
        y = RNG.standard_normal(shape).astype("float32")
        got, want = np.asarray(m(y)), se_ref(y)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
    applied, failed = rules(rule_log)
    assert not failed, failed
    assert applied.get("conv", 0) == 2 and applied.get("interleaved_rows", 0) == 1, applied


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
