"""The dense convolution kernel's register tile and loop order (issue 24, item 1; `cpu_schedule_conv`): the
reduction as input-channel blocks x kernel taps x unrolled channels (channel counts the block does and does not
divide, fewer channels than a block), the epilogue iterated channels-innermost and vectorized per tile (bias,
relu, residual add), the register tiles of AVX2 and AVX-512 (built for an AVX-512 target, not run). Results
against `test_conv_schedules.ref_conv` (numpy, float64) at several sizes of the symbolic dims, 1 included; each
test counts the kernels the conv rule scheduled."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.errors import ExecutionError

pytest.importorskip("tvm")
import tvm  # noqa: E402

from dyntvm.codegen import te_conv  # noqa: E402
from dyntvm.codegen.backends.cpu import cpu_schedule  # noqa: E402
from dyntvm.codegen.backends.cpu.cpu_schedule import legalize_and_fuse, schedule_module  # noqa: E402
from dyntvm.codegen.backends.cpu.cpu_schedule_conv import CHANNEL_BLOCK  # noqa: E402
from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402
from test_conv_schedules import conv_rules, ref_conv  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(36)


# (id, C, O, kernel, stride, pad, epilogue, spec dims, sizes (N, C, *S)); the channel blocks named are those of
# CHANNEL_BLOCK 8 (`test_unrolled_channel_blocks_match_numpy`; the default, 1, runs the channels unblocked)
CASES = [
    # 20 input channels: blocks of 4 (8 does not divide 20); stride 2 over odd sizes, 1 x 1 input included
    ("3x3_stride2_c20", 20, 32, (3, 3), (2, 2), 1, "bias_relu", ("N", 20, "H", "W"),
     [(1, 20, 1, 1), (2, 20, 9, 13), (1, 20, 16, 16)]),
    # 24 channels: three blocks of 8; the residual add read per tile
    ("3x3_c24_residual", 24, 24, (3, 3), (1, 1), 1, "bias_relu_res", ("N", 24, "H", "W"),
     [(1, 24, 1, 1), (3, 24, 7, 5), (1, 24, 14, 15)]),
    # 9 channels: no block divides it (blocks of 1)
    ("3x3_c9_bias", 9, 16, (3, 3), (1, 1), 1, "bias", ("N", 9, "H", "W"), [(1, 9, 1, 1), (2, 9, 6, 11)]),
    # 1 x 1: the GEMM micro-kernel, 12 channels in blocks of 4
    ("1x1_c12", 12, 48, (1, 1), (1, 1), 0, "bias_relu", ("N", 12, "H", "W"), [(1, 12, 1, 1), (2, 12, 5, 9)]),
    # the 7 x 7 stem: 3 channels (one block of 3), stride 2
    ("7x7_stem_c3", 3, 16, (7, 7), (2, 2), 3, "bias_relu", ("N", 3, "H", "W"), [(1, 3, 1, 1), (1, 3, 23, 17)]),
    # no padding, ragged rows: the whole tiles past a row read its last input (no padded copy), the run-time size
    # check (the output is empty below 3 x 3) read in that bound
    ("3x3_nopad_c16", 16, 32, (3, 3), (1, 1), 0, "bias_relu", ("N", 16, "H", "W"),
     [(1, 16, 3, 3), (2, 16, 9, 14), (1, 16, 5, 30)]),
    ("1x1_stride2_nopad", 32, 64, (1, 1), (2, 2), 0, "bias", ("N", 32, "H", "W"),
     [(1, 32, 1, 1), (2, 32, 15, 9), (1, 32, 56, 56)]),
    # one spatial axis, 10 channels (blocks of 2)
    ("conv1d_c10", 10, 16, (3,), (1,), 1, "bias_relu", ("N", 10, "L"), [(1, 10, 1), (2, 10, 13)]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dense_conv_matches_numpy(case, conv_log):
    _check_case(case, conv_log)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("3x3_stride2_c20", "3x3_c24_residual", "3x3_c9_bias",
                                                                "7x7_stem_c3")], ids=lambda c: c[0])
def test_unrolled_channel_blocks_match_numpy(case, conv_log, monkeypatch):
    """The reduction as (channel blocks, taps, 8 unrolled channels) - the schedule before CHANNEL_BLOCK 1, kept for
    `benchmarks/bench_conv_variants.py`: blocks of 8, 4 and 1 channels, and the stem's 3 in one block."""
    from dyntvm.codegen.backends.cpu import cpu_schedule_conv
    monkeypatch.setattr(cpu_schedule_conv, "CHANNEL_BLOCK", 8)
    _check_case(case, conv_log)


def _check_case(case, conv_log):
    _, c, o, kernel, stride, pad, epilogue, dims, sizes = case
    w = (RNG.standard_normal((o, c, *kernel)) / np.sqrt(c * np.prod(kernel))).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    n_sp = len(kernel)

    def model(x):
        y = F.conv(x, w, b if "bias" in epilogue else None, stride=stride, padding=pad)
        if "res" in epilogue:
            y = y + x
        return F.relu(y) if "relu" in epilogue else y
    m = dt.compile(model, S(dims), use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        want = ref_conv(x, w, stride, (1,) * n_sp, [(pad, pad)] * n_sp, 1)
        if "bias" in epilogue:
            want = want + b.reshape((1, o) + (1,) * n_sp)
        if "res" in epilogue:
            want = want + x
        if "relu" in epilogue:
            want = np.maximum(want, 0)
        got = m(x)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
    assert conv_rules(conv_log) == (1, [])


def _scheduled_conv(target, c=32, o=64, residual=True, kernel=3, stride=1) -> str:
    """The scheduled conv kernel (3x3, bias, residual add, relu; symbolic N, H, W) for `target`, as TIR text,
    after checking that it builds for that target."""
    w = RNG.standard_normal((o, c, kernel, kernel)).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    pad = kernel // 2 if stride == 1 else 0

    def block(x, *r):
        y = F.conv(x, w, b, padding=pad, stride=stride)
        return F.relu(y + r[0]) if residual else F.relu(y)
    specs = [S(("N", c, "H", "W"))] + ([S(("N", o, "H", "W"))] if residual else [])
    graph = partition_graph(dt.trace(block, *specs))
    mod = schedule_module(legalize_and_fuse(target)(build_module(collect_regions(graph))), target)
    (func,) = [f for gv, f in mod.functions_items() if "dt_conv" in gv.name_hint]
    tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    return func.script()


@pytest.mark.parametrize("isa,bits,lanes,tile,registers", [("znver3", 256, 8, 4, 8), ("znver3", 256, 8, 5, 10),
                                                          ("znver4", 512, 16, 8, 10)])
def test_register_tile_and_loop_order_from_isa_features(isa, bits, lanes, tile, registers, monkeypatch, conv_log):
    """A symbolic row in whole tiles of 16 channels x 5 positions on AVX2 (two vectors a position: 10 accumulators,
    `te_conv.ROW_ACC_REGISTERS_AVX2`; x 4 with it at 8), x 8 on AVX-512 (one vector; up to 14 where a static row
    allows). Built for the target's ISA (an AVX-512 build is compiled, not run, on an AVX2 machine)."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: bits)   # te_conv sizes the tile for the host
    monkeypatch.setattr(te_conv, "ROW_ACC_REGISTERS_AVX2", registers)
    text = _scheduled_conv(tvm.target.Target({"kind": "llvm", "mcpu": isa, "num-cores": 2}))
    assert conv_rules(conv_log) == (1, [])
    assert f'"dt_conv_row_tile": {tile}' in text
    # (the epilogue's copy from its tile buffer to NCHW: the tile's positions a vector, `OCV_EPILOGUE_TILE`, where
    # the tile is a multiple of 4 positions)
    from dyntvm.codegen.backends.cpu.cpu_schedule_conv import OCV_EPILOGUE_TILE
    assert {int(v) for v in re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", text)} == (
        {lanes, tile} if OCV_EPILOGUE_TILE and tile % 4 == 0 else {lanes})
    # the reduction in the packed weight's order: the 32 input channels, then the 3 x 3 taps, the tile inside
    assert CHANNEL_BLOCK == 1
    assert re.search(r"for rc, rk0, rk1 in T\.grid\(T\.int64\(32\), T\.int64\(3\), T\.int64\(3\)\):\s+"
                     rf"for i\d_1 in T\.unroll\(T\.int64\({tile}\)\)", text), text
    # the fused epilogue (bias, residual, relu) under the tile: positions unrolled, channels vectorized, the
    # accumulator tile read [position, channel]
    assert re.search(rf"for ax\d in T\.unroll\(T\.int64\({tile}\)\):"
                     r"(\s+for ax\d_0 in T\.unroll\(T\.int64\(\d+\)\):)?"
                     rf"\s+for ax\d(_1)? in T\.vectorized\(T\.int64\({lanes}\)\):\s+with T\.sblock\(\"relu\"\)",
                     text), text
    # (32 x 9 multiply-adds an output: a tile of a row, not of flattened positions - `te_conv.FLAT_MIN_REDUCTION`)
    assert re.search(r"dt_conv_ocv\w*\[v0, v1, v2, v3\]", text[text.index('T.sblock("relu")'):])
    assert te_conv.FLAT_ATTR not in text


# (id, C, O, kernel, stride, dilation, pad, groups, residual, spec dims, sizes (N, C, *S)) of convs whose row the
# register tile does not divide: computed over the flattened positions of each plane (`te_conv.FLAT_POSITIONS`)
FLAT_CASES = [
    ("3x3_res", 16, 16, (3, 3), (1, 1), (1, 1), 1, 1, True, ("N", 16, "H", "W"),
     [(0, 16, 7, 7), (1, 16, 1, 1), (3, 16, 7, 7), (1, 16, 13, 14), (2, 16, 14, 15), (1, 16, 15, 1)]),
    ("3x3_stride2_dil2", 8, 32, (3, 3), (2, 2), (2, 2), 2, 1, False, ("N", 8, "H", "W"),
     [(1, 8, 1, 1), (3, 8, 13, 7), (1, 8, 14, 15), (1, 8, 15, 14)]),
    ("3x3_groups2", 16, 32, (3, 3), (1, 1), (1, 1), 1, 2, False, ("N", 16, "H", "W"),
     [(1, 16, 7, 13), (3, 16, 14, 1)]),
    ("1x1_stride2_nopad", 24, 32, (1, 1), (2, 2), (1, 1), 0, 1, False, ("N", 24, "H", "W"),
     [(1, 24, 1, 1), (3, 24, 13, 15), (1, 24, 14, 7)]),
    ("3d_3x3x3", 16, 16, (3, 3, 3), (1, 1, 1), (1, 1, 1), 1, 1, True, ("N", 16, "D", "H", "W"),
     [(1, 16, 1, 1, 1), (2, 16, 3, 7, 13), (1, 16, 2, 14, 15)]),
    # a static 14-wide row: flattened too (196 positions, no ragged tile per row)
    ("static_14", 16, 16, (3, 3), (1, 1), (1, 1), 1, 1, False, ("N", 16, 14, 14), [(0, 16, 14, 14), (3, 16, 14, 14)]),
]


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "rows"])
@pytest.mark.parametrize("case", FLAT_CASES, ids=[c[0] for c in FLAT_CASES])
def test_flat_positions_match_numpy(case, flat, conv_log, monkeypatch):
    """A plane of a symbolic (or 7-, 14-wide) row as flattened positions h * W + w in whole tiles (a tile may span
    two rows; the positions past H * W read the last one's inputs and are cut), and the per-row form it replaced
    (FLAT_POSITIONS False): stride, dilation, groups, no padding, 3 spatial axes, batch 0 / 1 / 3, against numpy;
    the bias / residual add / relu fused into the conv's kernel either way (one kernel the conv rule scheduled)."""
    monkeypatch.setattr(te_conv, "FLAT_POSITIONS", flat)
    monkeypatch.setattr(te_conv, "FLAT_MIN_REDUCTION", 0)     # (these have few channels)
    _, c, o, kernel, stride, dilation, pad, groups, residual, dims, sizes = case
    w = (RNG.standard_normal((o, c // groups, *kernel)) / np.sqrt(c * np.prod(kernel))).astype("float32")
    b = RNG.standard_normal(o).astype("float32")

    def model(x):
        y = F.conv(x, w, b, stride=stride, padding=pad, dilation=dilation, groups=groups)
        if residual:
            y = y + x
        return F.relu(y)
    m = dt.compile(model, S(dims), use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        want = (ref_conv(x, w, stride, dilation, [(pad, pad)] * len(kernel), groups)
                + b.reshape((1, o) + (1,) * len(kernel)))
        want = np.maximum(want + x if residual else want, 0)
        got = m(x)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
    assert conv_rules(conv_log) == (1, [])


def test_flat_positions_kernel_form(conv_log, monkeypatch):
    """The flat form's kernel (symbolic N, H, W; AVX2 tile; 256 input channels x 9 taps: above FLAT_MIN_REDUCTION):
    the conv block over ceil(H * W / 6) * 6 positions (16 channels x 6 positions: `te_conv.FLAT_ACC_REGISTERS_AVX2`
    12 accumulators, 4 in the per-row form), the padded input a loop nest of its own before it, the
    epilogue (bias, residual, relu) under the tile, in the conv's kernel."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 256)
    text = _scheduled_conv(tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2}), c=256, o=256)
    assert f'"{te_conv.FLAT_ATTR}": 1' in text
    assert "(H * W + T.int64(5)) // T.int64(6) * T.int64(6)" in text
    assert te_conv.FLAT_ACC_REGISTERS_AVX2 == 12
    assert text.index('T.sblock("dt_conv_pad")') < text.index("for n in range(N)")
    assert text.index('T.sblock("relu")') > text.index('T.sblock("dt_conv_ocv_update")')
    assert "T.sblock(\"T_add" not in text
    assert conv_rules(conv_log) == (1, [])


# (id, C, O, residual, spec dims, sizes (N, C, *S)) of pointwise convs (1x1, stride 1, no padding) with few input
# channels (below FLAT_MIN_REDUCTION): over flattened positions (`te_conv.FLAT_POINTWISE`, up to
# FLAT_POINTWISE_MAX_CHANNELS output channels)
POINTWISE_CASES = [
    ("c16_o72", 16, 72, False, ("N", 16, "H", "W"),
     [(0, 16, 5, 5), (1, 16, 1, 1), (1, 16, 1, 3), (3, 16, 7, 7), (1, 16, 13, 14), (2, 16, 56, 56)]),
    ("c88_o24_res", 88, 24, True, ("N", 88, "H", "W"), [(1, 88, 1, 1), (3, 88, 9, 11), (1, 88, 28, 28)]),
    ("static_w14", 24, 32, False, ("N", 24, "H", 14), [(0, 24, 3, 14), (1, 24, 1, 14), (3, 24, 14, 14)]),
    ("3d", 16, 32, True, ("N", 16, "D", "H", "W"), [(1, 16, 1, 1, 1), (2, 16, 3, 5, 7)]),
]


@pytest.mark.parametrize("pointwise", [True, False], ids=["flat", "rows"])
@pytest.mark.parametrize("case", POINTWISE_CASES, ids=[c[0] for c in POINTWISE_CASES])
def test_pointwise_flat_positions_match_numpy(case, pointwise, conv_log, monkeypatch):
    """A pointwise conv (1x1, stride 1, no padding) with a short reduction, over flattened positions
    (`te_conv.FLAT_POINTWISE`; False: per row) at the committed FLAT_MIN_REDUCTION: batch 0 / 1 / 3, planes smaller
    than a tile, odd sizes, a static 14-wide row, 3 spatial axes, the residual add and relu fused, against numpy."""
    monkeypatch.setattr(te_conv, "FLAT_POINTWISE", pointwise)
    monkeypatch.setattr(te_conv, "POSITION_LANES", False)     # (`test_conv_pointwise_lanes.py`)
    _, c, o, residual, dims, sizes = case
    n_sp = len(dims) - 2
    w = (RNG.standard_normal((o, c) + (1,) * n_sp) / np.sqrt(c)).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    r_dims = (dims[0], o) + tuple(dims[2:])

    def model(x, *r):
        y = F.conv(x, w, b)
        return F.relu(y + r[0] if residual else y)
    m = dt.compile(model, S(dims), *([S(r_dims)] if residual else []), use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        r = RNG.standard_normal((shape[0], o) + shape[2:]).astype("float32")
        want = np.einsum("oc,nc...->no...", w.reshape(o, c).astype("float64"), x) + b.reshape((1, o) + (1,) * n_sp)
        want = np.maximum(want + r if residual else want, 0)
        got = m(x, r) if residual else m(x)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
    assert conv_rules(conv_log) == (1, [])


def test_pointwise_kernel_form(conv_log, monkeypatch):
    """A pointwise conv of 32 input channels (a reduction far below FLAT_MIN_REDUCTION) and 64 output channels is
    computed over flattened positions, its epilogue in the kernel; a strided 1x1 (resnet's downsampling) and a padded
    3x3 of as few channels stay per row, and so does the pointwise conv with more output channels than
    FLAT_POINTWISE_MAX_CHANNELS, or with FLAT_POINTWISE False."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 256)
    monkeypatch.setattr(te_conv, "POSITION_LANES", False)     # (`test_conv_pointwise_lanes.py`)
    assert te_conv.FLAT_POINTWISE and te_conv.FLAT_POINTWISE_MAX_CHANNELS >= 64
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    text = _scheduled_conv(target, kernel=1)
    assert f'"{te_conv.FLAT_ATTR}": 1' in text
    assert "(H * W + T.int64(5)) // T.int64(6) * T.int64(6)" in text
    assert te_conv.FLAT_ACC_REGISTERS_AVX2 == 12
    assert "dt_conv_pad" not in text
    assert text.index('T.sblock("relu")') > text.index('T.sblock("dt_conv_ocv_update")')
    assert te_conv.FLAT_ATTR not in _scheduled_conv(target, residual=False, kernel=1, stride=2)
    assert te_conv.FLAT_ATTR not in _scheduled_conv(target)
    monkeypatch.setattr(te_conv, "FLAT_POINTWISE_MAX_CHANNELS", 48)
    assert te_conv.FLAT_ATTR not in _scheduled_conv(target, kernel=1)
    monkeypatch.setattr(te_conv, "FLAT_POINTWISE_MAX_CHANNELS", None)
    monkeypatch.setattr(te_conv, "FLAT_POINTWISE", False)
    assert te_conv.FLAT_ATTR not in _scheduled_conv(target, kernel=1)
    assert conv_rules(conv_log) == (5, [])


def test_unpadded_conv_reads_the_input_without_a_padded_copy(conv_log, monkeypatch):
    """A strided 1x1 convolution (resnet's downsampling) with a symbolic width in the channels form: no padded copy
    of the input in the kernel (the tail tile's index clamped to the row), a 3x3 with padding keeps it. In the
    positions form (`te_conv.STRIDED_POSITION_LANES`, `test_conv_strided_pointwise.py`) its one copy is that of the
    strided positions."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    text = _scheduled_conv(target, residual=False, kernel=1, stride=2)
    assert te_conv.STRIDED_BLOCK in text and 'T.sblock("dt_conv_pad")' not in text
    monkeypatch.setattr(te_conv, "STRIDED_POSITION_LANES", False)
    assert "dt_conv_pad" not in _scheduled_conv(target, residual=False, kernel=1, stride=2)
    assert "dt_conv_pad" in _scheduled_conv(target, residual=False)
    assert conv_rules(conv_log) == (3, [])


def test_unpadded_conv_too_small_input_is_an_error():
    """The run-time check in front of an unpadded kernel with a symbolic width (no padded copy carries it): an
    input smaller than the kernel is numpy's error, not a read out of bounds."""
    w = RNG.standard_normal((16, 8, 3, 3)).astype("float32")
    m = dt.compile(lambda x: F.conv(x, w), S(("N", 8, "H", "W")), use_cache=False)
    np.testing.assert_allclose(m(np.ones((1, 8, 3, 4), "float32")),
                               ref_conv(np.ones((1, 8, 3, 4)), w, (1, 1), (1, 1), [(0, 0), (0, 0)], 1), rtol=1e-4,
                               atol=1e-4)
    with pytest.raises(ExecutionError, match="smaller than the dilated kernel"):
        m(np.ones((1, 8, 3, 2), "float32"))


def test_padded_copy_reads_the_guard_in_its_condition(monkeypatch):
    """mobilenet_v3_small's stem form (3 -> 16 channels, 3 x 3 / 2, padding 1, symbolic N, H, W, behind a run-time
    size check): the padded copy pads with the constant 0 and reads the check's guard in its condition
    (`te_conv._guarded`; read as the padding value, a load in the padding branch only, the copy stayed a scalar
    loop); results equal numpy at odd sizes, 1 x 1 included, with the switch on and off."""
    seen = []
    schedule_func = cpu_schedule._schedule_func

    def observe(func, target, name=""):
        new = schedule_func(func, target, name)
        seen.append(new.script())
        return new
    monkeypatch.setattr(cpu_schedule, "_schedule_func", observe)
    w = RNG.standard_normal((16, 3, 3, 3)).astype("float32")
    for on in (True, False):
        monkeypatch.setattr(te_conv, "GUARD_IN_CONDITION", on)
        seen.clear()
        m = dt.compile(lambda x: F.relu(F.conv(x, w, stride=2, padding=1)), S(("N", 3, "H", "W")), use_cache=False)
        pads = [line for text in seen for line in text.splitlines()
                if "dt_conv_pad[" in line and "if_then_else" in line]
        assert pads and all(("T.float32(0.0))" in line) == on for line in pads)
        assert all(("== T.int64(0)" in line) == on for line in pads)
        for shape in [(1, 3, 1, 1), (2, 3, 9, 13), (1, 3, 30, 31)]:
            x = RNG.standard_normal(shape).astype("float32")
            ref = np.maximum(ref_conv(x.astype("float64"), w, (2, 2), (1, 1), [(1, 1), (1, 1)], 1), 0)
            np.testing.assert_allclose(m(x), ref, rtol=1e-4, atol=1e-4)
