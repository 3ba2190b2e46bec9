"""The batch in the convolutions' parallel loop (issue 24, batch 8; `cpu_schedule_conv.BATCH_IN_PARALLEL`): the
parallel variant of a conv kernel forks once per call over batch x output-channel blocks x rows (tiles), its padded
input a parallel loop nest of its own before it, instead of once per image for the padded copy and again for the
convolution. Results against `test_conv_schedules.ref_conv` (numpy's sliding windows and einsum, float64) at batch
0, 1, 3 and 8 of a symbolic N, odd sizes, with the switch on and off, for every form: dense 3x3 (per row and over
flattened positions), 1x1, strided without padding, grouped (dense and small groups), depthwise strided (the padded
input stored as phases) and the fused bias / relu / residual epilogue. The parallel variant alone is built
(`PARALLEL_MIN_WORK` 0), so the small sizes run it too; at batch 8 (2 cores) the variant parallel over the images
alone (`IMAGES_PER_CORE`), each image's padded copy in a buffer of the thread's own."""
from __future__ import annotations


import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
import tvm  # noqa: E402

from dyntvm.codegen import cache, te_conv  # noqa: E402
from dyntvm.codegen.backends.cpu import cpu_schedule_conv, cpu_schedule_dispatch  # noqa: E402
from test_conv_dense import _scheduled_conv  # noqa: E402
from test_conv_schedules import conv_rules, ref_conv  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(2408)
BATCHES = (0, 1, 3, 8)


# (id, C, O, kernel, stride, pad per axis, groups, residual, spec dims (N symbolic), spatial sizes run)
CASES = [
    ("3x3_rows_res", 16, 32, (3, 3), (1, 1), ((1, 1), (1, 1)), 1, False, ("N", 16, "H", "W"), [(8, 8), (5, 13)]),
    ("3x3_flat_res", 16, 16, (3, 3), (1, 1), ((1, 1), (1, 1)), 1, True, ("N", 16, "H", "W"), [(7, 7), (3, 11)]),
    ("1x1", 24, 48, (1, 1), (1, 1), ((0, 0), (0, 0)), 1, False, ("N", 24, "H", "W"), [(7, 9), (1, 1)]),
    ("1x1_stride2_nopad", 16, 32, (1, 1), (2, 2), ((0, 0), (0, 0)), 1, False, ("N", 16, "H", "W"), [(9, 13)]),
    ("3x3_stride2_asym", 8, 16, (3, 3), (2, 2), ((0, 1), (1, 0)), 1, False, ("N", 8, 11, 13), [(11, 13)]),
    ("grouped_ocv", 32, 32, (3, 3), (1, 1), ((1, 1), (1, 1)), 2, True, ("N", 32, "H", "W"), [(6, 9)]),
    ("grouped_spv", 8, 12, (3, 3), (1, 1), ((1, 1), (1, 1)), 4, False, ("N", 8, 9, 11), [(9, 11)]),
    ("depthwise_stride2", 24, 24, (3, 3), (2, 2), ((1, 1), (1, 1)), 24, False, ("N", 24, "H", "W"), [(17, 17), (8, 5)]),
    ("depthwise_5x5", 16, 16, (5, 5), (1, 1), ((2, 2), (2, 2)), 16, True, ("N", 16, "H", "W"), [(9, 14)]),
    ("conv1d", 16, 32, (3,), (1,), ((1, 1),), 1, False, ("N", 16, "L"), [(13,), (1,)]),
]


@pytest.mark.parametrize("on", [True, False], ids=["batch_in_parallel", "per_image"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_matches_numpy_at_every_batch(case, on, conv_log, monkeypatch):
    monkeypatch.setattr(cpu_schedule_conv, "BATCH_IN_PARALLEL", on)
    monkeypatch.setattr(cpu_schedule_conv, "IMAGES_PER_CORE", 2)
    monkeypatch.setattr(cpu_schedule_dispatch, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(te_conv, "FLAT_MIN_REDUCTION", 0)
    _, c, o, kernel, stride, pads, groups, residual, dims, sizes = case
    w = (RNG.standard_normal((o, c // groups, *kernel)) / np.sqrt(c // groups * np.prod(kernel))).astype("float32")
    b = RNG.standard_normal(o).astype("float32")

    def model(x):
        y = F.conv(x, w, b, stride=stride, padding=pads, groups=groups)
        return F.relu(y + x if residual else y)
    m = dt.compile(model, S(dims), use_cache=False)
    for n in BATCHES:
        for sp in sizes:
            x = RNG.standard_normal((n, c, *sp)).astype("float32")
            want = ref_conv(x, w, stride, (1,) * len(kernel), pads, groups) + b.reshape((1, o) + (1,) * len(kernel))
            want = np.maximum(want + x if residual else want, 0)
            got = m(x)
            assert got.shape == want.shape, (n, sp)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str((n, sp)))
    assert conv_rules(conv_log) == (1, [])


@pytest.mark.parametrize("kernel,stride", [(3, 1), (1, 1), (1, 2)], ids=["3x3", "1x1", "1x1_stride2"])
def test_one_parallel_loop_over_the_batch(kernel, stride, monkeypatch, conv_log):
    """The parallel kernel (symbolic N, H, W) has no serial batch loop: its parallel loops (the padded copy's, the
    convolution's) start with N; with the switch off the batch is a serial loop around them. With IMAGES_PER_CORE
    (2 cores: N >= 4 and even) a variant chosen at run time is parallel over the images alone."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 256)
    monkeypatch.setattr(cpu_schedule_dispatch, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(cpu_schedule_conv, "IMAGES_PER_CORE", 0)
    # the per-row form (the images variant is not made for flattened positions, a pointwise conv's by default:
    # `te_conv.FLAT_POINTWISE`)
    monkeypatch.setattr(te_conv, "FLAT_POINTWISE", False)
    monkeypatch.setattr(te_conv, "POSITION_LANES", False)     # (nor the positions form's: no images variant either)
    monkeypatch.setattr(te_conv, "STRIDED_POSITION_LANES", False)
    for on in (True, False):
        monkeypatch.setattr(cpu_schedule_conv, "BATCH_IN_PARALLEL", on)
        text = _scheduled_conv(target, c=32, o=64, residual=False, kernel=kernel, stride=stride)
        parallel = [line.strip() for line in text.splitlines() if "T.parallel(" in line]
        assert parallel and all(("T.parallel(N *" in line) == on for line in parallel), parallel
        assert ("for n in range(N)" in text) != on
        assert ("dt_conv_pad" in text) == (kernel == 3)
    monkeypatch.setattr(cpu_schedule_conv, "IMAGES_PER_CORE", 2)
    monkeypatch.setattr(cpu_schedule_conv, "BATCH_IN_PARALLEL", True)
    text = _scheduled_conv(target, c=32, o=64, residual=False, kernel=kernel, stride=stride)
    assert "if T.int64(4) <= N and N % T.int64(2) == T.int64(0):" in text
    parallel = [line.strip() for line in text.splitlines() if "T.parallel(" in line]
    assert parallel[0] == "for n in T.parallel(N):" and all("T.parallel(N *" in line for line in parallel[1:])
    assert conv_rules(conv_log) == (3, [])


def test_switches_are_in_the_cache_key(monkeypatch):
    """A build with a switch flipped is not served the library built with it as committed."""
    for name, value in (("BATCH_IN_PARALLEL", not cpu_schedule_conv.BATCH_IN_PARALLEL), ("IMAGES_PER_CORE", 7)):
        assert ("backends.cpu.cpu_schedule_conv", name) in cache.SWITCHES
        before = cache.switches_digest()
        monkeypatch.setattr(cpu_schedule_conv, name, value)
        assert cache.switches_digest() != before
