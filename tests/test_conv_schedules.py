"""CPU convolution kernels (issue 24, item 1): `te_conv`'s two forms (output channels vectorized with the
weight packed at compile time; spatial vectorized for depthwise and small groups) under `cpu_schedule_conv`,
compared with an independent numpy convolution (a sliding-window view and einsum per group, in float64) at
odd sizes, batch 1 and more, symbolic batch and spatial dims, strides, dilations, asymmetric padding, groups,
1x1 / 3x3 / 5x5 / 7x7 kernels and 1 / 2 / 3 spatial axes; the fused epilogue (bias, activation, residual).
Each test also counts the convolution kernels the conv rule scheduled (and that no rule failed)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
from dyntvm.codegen.backends.cpu import cpu_schedule  # noqa: E402
from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(24)


def ref_conv(x, w, stride, dilation, pads, groups):
    """numpy's convolution of x [N, C, *S] with w [O, C / groups, *K]: zero padding, then for each group an
    einsum of the strided, dilated windows (float64)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n_sp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in pads])
    kernel = w.shape[2:]
    span = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, 2 + n_sp)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)
              + tuple(slice(None, None, d) for d in dilation)]            # [N, C, *out, *K]
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    sp, ks = list(range(2, 2 + n_sp)), list(range(10, 10 + n_sp))
    parts = [np.einsum(win[:, g * cg:(g + 1) * cg], [0, 1, *sp, *ks], w[g * og:(g + 1) * og], [20, 1, *ks],
                       [0, 20, *sp]) for g in range(groups)]
    return np.concatenate(parts, axis=1)


def conv_rules(caplog) -> tuple[int, list]:
    """(kernels the conv rule scheduled, messages of rules that failed)."""
    first = [r.getMessage().splitlines()[0] for r in caplog.records]
    return sum("conv rule applied" in m for m in first), [m for m in first if "rule failed" in m]


# (id, C, O, kernel, stride, dilation, pads per axis (before, after), groups, epilogue, spec dims, sizes)
# spec dims: the input's dims (a str: symbolic); sizes: the concrete inputs run (N, C, *S)
CASES = [
    ("3x3_pad1_sym_ocv_relu_residual", 32, 32, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 1, "bias_relu_res",
     ("N", 32, "H", "W"), [(1, 32, 13, 11), (2, 32, 7, 16), (3, 32, 1, 1), (1, 32, 30, 29), (0, 32, 5, 5)]),
    ("5x5_stride2_dil2_asym_vb8", 8, 24, (5, 5), (2, 2), (2, 2), ((1, 2), (0, 1)), 1, "bias",
     (2, 8, 19, 23), [(2, 8, 19, 23)]),
    ("7x7_stem_stride2", 3, 16, (7, 7), (2, 2), (1, 1), ((3, 3), (3, 3)), 1, "bias_relu",
     ("N", 3, 33, 47), [(1, 3, 33, 47), (2, 3, 33, 47)]),
    ("1x1_gemm", 64, 128, (1, 1), (1, 1), (1, 1), ((0, 0), (0, 0)), 1, "bias_relu",
     ("N", 64, "H", "W"), [(1, 64, 7, 7), (2, 64, 14, 5), (1, 64, 1, 1)]),
    ("1x1_stride2", 32, 64, (1, 1), (2, 2), (1, 1), ((0, 0), (0, 0)), 1, "none",
     (2, 32, 15, 9), [(2, 32, 15, 9)]),
    ("depthwise_3x3_stride2", 24, 24, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), 24, "bias_relu",
     ("N", 24, "H", "W"), [(1, 24, 17, 17), (2, 24, 8, 13), (1, 24, 112, 112)]),
    # strided depthwise: the phases copy's column loop split into padding and interior (`te_conv.SPLIT_PHASES`)
    ("depthwise_3x3_stride2_sym_small", 16, 16, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), 16, "bias_relu",
     ("N", 16, "H", "W"), [(1, 16, 1, 1), (1, 16, 2, 3), (2, 16, 3, 1), (1, 16, 5, 4), (1, 16, 9, 31),
                           (0, 16, 6, 6), (1, 16, 56, 57)]),
    ("depthwise_5x5_stride2_sym", 24, 24, (5, 5), (2, 2), (1, 1), ((2, 2), (2, 2)), 24, "bias",
     ("N", 24, "H", "W"), [(1, 24, 1, 2), (1, 24, 4, 3), (2, 24, 14, 14), (1, 24, 13, 29)]),
    ("depthwise_3x3_stride2_asym_pad", 8, 8, (3, 3), (2, 2), (1, 1), ((0, 1), (2, 0)), 8, "none",
     (1, 8, "H", "W"), [(1, 8, 2, 1), (1, 8, 6, 7), (1, 8, 11, 20)]),
    ("depthwise_3x3_stride2_unpadded", 8, 8, (3, 3), (2, 2), (1, 1), ((0, 0), (0, 0)), 8, "bias_relu",
     ("N", 8, "H", "W"), [(1, 8, 3, 3), (2, 8, 8, 17), (1, 8, 5, 40)]),
    ("depthwise_3x3_stride3_dil2", 8, 8, (3, 3), (3, 3), (2, 2), ((2, 1), (3, 2)), 8, "bias",
     (1, 8, "H", "W"), [(1, 8, 2, 1), (1, 8, 10, 26), (1, 8, 7, 64)]),
    ("depthwise_3d_stride2", 4, 4, (3, 3, 3), (1, 2, 2), (1, 1, 1), ((1, 1), (1, 1), (1, 1)), 4, "bias_relu",
     (1, 4, "D", "H", "W"), [(1, 4, 1, 1, 1), (1, 4, 3, 5, 9)]),
    # unstrided depthwise: the padded copy's column loop split (`te_conv.SPLIT_SPV_PADDING`)
    ("depthwise_5x5_sym_small", 12, 12, (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 12, "bias_relu",
     ("N", 12, "H", "W"), [(1, 12, 1, 1), (1, 12, 2, 3), (2, 12, 7, 7), (1, 12, 14, 15), (0, 12, 4, 4)]),
    ("depthwise_3x3_asym_pad_sym", 8, 8, (3, 3), (1, 1), (1, 1), ((2, 0), (0, 2)), 8, "bias",
     ("N", 8, "H", "W"), [(1, 8, 1, 1), (1, 8, 3, 2), (1, 8, 9, 33)]),
    ("depthwise_5x5_multiplier2", 8, 16, (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 8, "none",
     (1, 8, 9, 70), [(1, 8, 9, 70)]),
    ("grouped_2_ocv", 32, 64, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 2, "bias",
     (1, 32, 10, 12), [(1, 32, 10, 12)]),
    ("grouped_4_small_groups_spv", 8, 12, (3, 3), (1, 2), (1, 1), ((0, 1), (1, 0)), 4, "bias_relu",
     ("N", 8, 9, 11), [(1, 8, 9, 11), (3, 8, 9, 11)]),
    ("few_out_channels_spv", 16, 3, (3, 3), (1, 1), (2, 1), ((2, 2), (1, 1)), 1, "bias",
     (1, 16, 12, 20), [(1, 16, 12, 20)]),
    ("conv1d_sym_dilated", 16, 32, (3,), (1,), (2,), ((4, 0),), 1, "bias_relu",
     ("N", 16, "L"), [(1, 16, 1), (2, 16, 37), (1, 16, 100), (0, 16, 8)]),
    ("conv1d_depthwise", 16, 16, (5,), (2,), (1,), ((2, 2),), 16, "none",
     (2, 16, 31), [(2, 16, 31)]),
    ("one_input_channel_ocv", 1, 32, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 1, "bias",
     (2, 1, 10, 10), [(2, 1, 10, 10)]),
    ("conv3d", 4, 16, (3, 3, 3), (1, 1, 1), (1, 1, 1), ((1, 1), (1, 1), (0, 1)), 1, "bias_relu",
     (1, 4, 5, 6, 7), [(1, 4, 5, 6, 7)]),
    # static rows the AVX2 tile (4) does not divide: whole ragged tiles of 4 (`row_tile`'s estimate), cut
    ("static_14_wide_ragged", 32, 32, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 1, "bias_relu_res",
     (2, 32, 5, 14), [(2, 32, 5, 14)]),
    ("static_7_wide_stride2", 16, 32, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), 1, "bias_relu",
     (1, 16, 13, 13), [(1, 16, 13, 13)]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_matches_numpy(case, conv_log):
    _, c, o, kernel, stride, dilation, pads, groups, epilogue, dims, sizes = case
    w = (RNG.standard_normal((o, c // groups, *kernel)) / np.sqrt(c // groups * np.prod(kernel))).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    n_sp = len(kernel)
    bias_shape = (1, o) + (1,) * n_sp

    def model(x):
        y = F.conv(x, w, b if "bias" in epilogue else None, stride=stride, padding=pads, dilation=dilation,
                   groups=groups)
        if "relu" in epilogue:
            y = F.relu(y)
        if "res" in epilogue:
            y = y + x
        return y
    m = dt.compile(model, S(dims), use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        want = ref_conv(x, w, stride, dilation, pads, groups)
        if "bias" in epilogue:
            want = want + b.reshape(bias_shape)
        if "relu" in epilogue:
            want = np.maximum(want, 0)
        if "res" in epilogue:
            want = want + x
        got = m(x)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
    applied, failed = conv_rules(conv_log)
    assert not failed, failed
    assert applied == 1


def test_weight_from_an_input_is_packed_at_run_time(conv_log):
    """A weight that is not a constant (a model input) is packed by a kernel at every call; same results."""
    w = RNG.standard_normal((32, 8, 3, 3)).astype("float32")
    m = dt.compile(lambda x, k: F.conv(x, k, padding=1, stride=(2, 1)), S(("N", 8, 11, 9)), S((32, 8, 3, 3)),
                   use_cache=False)
    for n in (1, 2):
        x = RNG.standard_normal((n, 8, 11, 9)).astype("float32")
        np.testing.assert_allclose(m(x, w), ref_conv(x, w, (2, 1), (1, 1), [(1, 1), (1, 1)], 1), rtol=1e-4, atol=1e-4)
    applied, failed = conv_rules(conv_log)
    assert (applied, failed) == (1, [])


def test_float16_conv_sums_in_float32(conv_log):
    w = (RNG.standard_normal((16, 16, 3, 3)) / 12).astype("float16")
    m = dt.compile(lambda x: F.conv(x, w, padding=1), S((1, 16, 9, 10), "float16"), use_cache=False)
    x = RNG.standard_normal((1, 16, 9, 10)).astype("float16")
    got = m(x)
    assert got.dtype == np.float16
    want = ref_conv(x.astype(np.float32), w.astype(np.float32), (1, 1), (1, 1), [(1, 1), (1, 1)], 1)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)
    assert conv_rules(conv_log) == (1, [])


def test_conv_block_is_one_kernel(conv_log):
    """conv + bias + relu + residual add compile to one scheduled kernel (the epilogue fused per tile), besides
    the run-time checks of symbolic sizes."""
    w = RNG.standard_normal((16, 16, 3, 3)).astype("float32")
    b = RNG.standard_normal(16).astype("float32")

    def block(x):
        return F.relu(F.conv(x, w, b, padding=1)) + x
    graph = partition_graph(dt.trace(block, S((2, 16, 12, 12))))
    ex = build_cpu(build_module(collect_regions(graph)))
    calls = [m.group(1) for m in re.finditer(r"call\s+(\S+)\s+in:", ex.as_text())
             if not m.group(1).startswith("vm.builtin") and m.group(1) != "shape_func"]
    assert len(calls) == 1 and "dt_conv" in calls[0], calls
    assert conv_rules(conv_log) == (1, [])


@pytest.mark.parametrize("tiles,widths", [
    # AVX2, 16 channels: 4 positions, every tile latency-bound: fewest tiles (ragged 4 for 7, 14, 30; not 2 or 1)
    ((4, 2, 4, 4), {3: (3, True), 7: (4, False), 9: (3, True), 12: (4, True), 14: (4, False), 30: (4, False),
                    56: (4, True)}),
    # AVX-512, 16 channels: up to 14, 8 hide the latency: exact divisors where they are as fast
    ((14, 4, 8, 8), {7: (7, True), 14: (14, True), 16: (8, True), 17: (8, False), 28: (14, True), 30: (10, True),
                     56: (14, True)}),
])
def test_row_tile_takes_the_fewest_latency_bound_tiles(tiles, widths):
    """`row_tile` on static rows of the dense form: the tile of least estimated time (tiles x max(tile, latency)),
    exact on a tie; a symbolic row takes whole ragged tiles; the depthwise form's rule is the divisor one."""
    from dyntvm.codegen.te_conv import _SPV_TILES, row_tile
    assert {w: row_tile(w, tiles) for w in widths} == widths
    assert row_tile(tvm.tirx.Var("W", "int64"), tiles) == (tiles[2], False)
    assert row_tile(112, _SPV_TILES) == (56, True) and row_tile(14, _SPV_TILES) == (14, True)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("split", [False, True])
def test_depthwise_split_copy_switches(split, stride, monkeypatch, conv_log):
    """`te_conv.SPLIT_PHASES` / `SPLIT_SPV_PADDING` (a depthwise conv's phases / padded copy, its column loop split
    into padding and interior) off and on: both equal numpy at a symbolic odd width, width 1 and 2, and one conv
    kernel."""
    from dyntvm.codegen import te_conv
    monkeypatch.setattr(te_conv, "SPLIT_PHASES", split)
    monkeypatch.setattr(te_conv, "SPLIT_SPV_PADDING", split)
    monkeypatch.setattr(te_conv, "STRIDED_LANES", False)     # (the phases copy at stride 2, as before session 44)
    w = RNG.standard_normal((12, 1, 3, 3)).astype("float32")
    m = dt.compile(lambda x: F.conv(x, w, None, stride=stride, padding=1, groups=12), S(("N", 12, "H", "W")),
                   use_cache=False)
    for shape in [(1, 12, 7, 1), (2, 12, 5, 2), (1, 12, 10, 23)]:
        x = RNG.standard_normal(shape).astype("float32")
        want = ref_conv(x, w, (stride,) * 2, (1, 1), ((1, 1), (1, 1)), 12)
        np.testing.assert_allclose(m(x), want, rtol=1e-4, atol=1e-4)
    applied, failed = conv_rules(conv_log)
    assert not failed, failed
    assert applied == 1


def _blocks_under_loops(func) -> list:
    """[(loop extent, names of the blocks under the loop)] of every loop of `func`."""
    out = []
    loops = []
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, loops.append))
    for lp in loops:
        blocks = []
        tvm_ffi.structural_walk(lp.body, (tvm.s_tir.SBlock, lambda b: blocks.append(str(b.name_hint))))
        out.append((lp.extent, blocks))
    return out


@pytest.mark.parametrize("k,c", [(3, 64), (5, 64), (5, 144)])
@pytest.mark.parametrize("per_block", [False, True])
def test_strided_depthwise_copy_per_channel_block(per_block, k, c, monkeypatch, conv_log):
    """`cpu_schedule_depthwise.COPY_PER_CHANNEL_BLOCK`: a strided depthwise conv of 144 channels (36 blocks of 4,
    at least `COPY_BLOCKS_MIN`; its phases copy not split, `te_conv.SPLIT_PHASES_MAX_CHANNELS`) computes the copy
    under the conv's channel block loop (switch on), else once per image, as a 64-channel one (split) always does;
    all equal numpy at symbolic sizes (1 x 1, odd, 14 x 14, an empty batch) and are one conv kernel."""
    from dyntvm.codegen.backends.cpu import cpu_schedule_depthwise as dw
    from dyntvm.codegen.te_conv import PHASES_BLOCK, SPLIT_PHASES_MAX_CHANNELS, SPV_BLOCK
    from dyntvm.codegen import te_conv
    monkeypatch.setattr(dw, "COPY_PER_CHANNEL_BLOCK", per_block)
    monkeypatch.setattr(te_conv, "STRIDED_LANES", False)     # (3 taps: else no phases copy, session 44)
    w = RNG.standard_normal((c, 1, k, k)).astype("float32")
    b = RNG.standard_normal(c).astype("float32")

    def fn(x):
        return F.relu(F.conv(x, w, b, stride=2, padding=k // 2, groups=c))
    m = dt.compile(fn, S(("N", c, "H", "W")), use_cache=False)
    for shape in [(1, c, 1, 1), (1, c, 2, 3), (2, c, 14, 14), (1, c, 13, 29), (0, c, 5, 5)]:
        x = RNG.standard_normal(shape).astype("float32")
        want = np.maximum(ref_conv(x, w, (2, 2), (1, 1), ((k // 2,) * 2,) * 2, c)
                          + b.astype(np.float64)[:, None, None], 0)
        np.testing.assert_allclose(m(x), want, rtol=1e-4, atol=1e-4)
    applied, failed = conv_rules(conv_log)
    assert not failed, failed
    assert applied == 1
    mod = build_module(collect_regions(partition_graph(dt.trace(fn, S(("N", c, "H", "W"))))))
    target = cpu_schedule.cpu_target(2)
    with target:
        mod = tvm.transform.Sequential(cpu_schedule.fuse_passes(target) + [cpu_schedule.cpu_schedule_pass(target)])(mod)
    (func,) = [f for gv, f in mod.functions_items() if "dt_conv" in gv.name_hint]
    text = func.script()        # (the phases copy's condition: the epilogue's is `SPV_EPILOGUE_VECTORS`')
    copy = text[text.index(f'T.sblock("{PHASES_BLOCK}")'):]
    assert ("likely" in copy[:copy.index("\n", copy.index("T.if_then_else"))]) == (c < SPLIT_PHASES_MAX_CHANNELS)
    per_block_loops = [ext for ext, blocks in _blocks_under_loops(func)
                       if isinstance(ext, tvm.tirx.IntImm) and int(ext) == c // 4
                       and any(n.startswith(PHASES_BLOCK) for n in blocks)
                       and any(n.startswith(SPV_BLOCK) for n in blocks)]
    assert bool(per_block_loops) == (per_block and c >= SPLIT_PHASES_MAX_CHANNELS), func
