"""mobilenet-style blocks on the CPU with symbolic batch and spatial dims (issue 24, mobilenet_v3_small): a
strided convolution's output sizes are expressions of the input's (``(H - 1) // 2 + 1``), and the kernels
after it must still fuse (`converters/window_dims.py`): hardswish (bias, ``x * min(max(x + 3, 0), 6) / 6``,
NaN-propagating max / min), depthwise convolutions at stride 1 and 2, squeeze-excitation (global mean, 1x1
convolutions on [B, C, 1, 1], hardsigmoid, the broadcast multiply) and a residual add. Compared with an
independent numpy expression at several sizes per symbolic dim (1 included, odd sizes), and the number of
kernels the region calls is counted."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
from test_conv_schedules import ref_conv  # noqa: E402

from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu  # noqa: E402
from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(36)


def _weights(o, c, k):
    return (RNG.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype("float32")


C = 8
W_STEM, B_STEM = _weights(C, 3, 3), RNG.standard_normal(C).astype("float32")
W_DW, B_DW = _weights(C, 1, 5), RNG.standard_normal(C).astype("float32")
W_SE1, B_SE1 = _weights(4, C, 1), RNG.standard_normal(4).astype("float32")
W_SE2, B_SE2 = _weights(C, 4, 1), RNG.standard_normal(C).astype("float32")
W_DW1 = _weights(C, 1, 3)


def hardswish(y, xp):
    return y * xp.minimum(xp.maximum(y + 3.0, 0.0), 6.0) / 6.0


def model(x):
    """stem (3x3 stride 2) + hardswish -> depthwise 5x5 stride 2 + relu -> SE (hardsigmoid) -> depthwise 3x3
    stride 1 + residual."""
    y = hardswish(F.conv(x, W_STEM, B_STEM, stride=2, padding=1), F)
    y = F.relu(F.conv(y, W_DW, B_DW, stride=2, padding=2, groups=C))
    s = F.mean(y, axis=(2, 3), keepdims=True)
    s = F.relu(F.conv(s, W_SE1, B_SE1))
    s = F.minimum(F.maximum(F.conv(s, W_SE2, B_SE2) / 6.0 + 0.5, 0.0), 1.0)
    y = y * s
    return F.conv(y, W_DW1, padding=1, groups=C) + y


def reference(x):
    pad1, pad2 = [(1, 1), (1, 1)], [(2, 2), (2, 2)]
    y = hardswish(ref_conv(x, W_STEM, (2, 2), (1, 1), pad1, 1) + B_STEM.reshape(1, C, 1, 1), np)
    y = np.maximum(ref_conv(y, W_DW, (2, 2), (1, 1), pad2, C) + B_DW.reshape(1, C, 1, 1), 0)
    s = y.mean(axis=(2, 3), keepdims=True)
    s = np.maximum(ref_conv(s, W_SE1, (1, 1), (1, 1), [(0, 0), (0, 0)], 1) + B_SE1.reshape(1, 4, 1, 1), 0)
    s = np.clip((ref_conv(s, W_SE2, (1, 1), (1, 1), [(0, 0), (0, 0)], 1) + B_SE2.reshape(1, C, 1, 1)) / 6 + 0.5, 0, 1)
    y = y * s
    return ref_conv(y, W_DW1, (1, 1), (1, 1), pad1, C) + y


SIZES = [(1, 3, 1, 1), (1, 3, 17, 23), (2, 3, 32, 32), (3, 3, 9, 4), (1, 3, 61, 7)]


def test_mobile_block_matches_numpy_at_symbolic_sizes():
    m = dt.compile(model, S(("B", 3, "H", "W")), use_cache=False)
    for shape in SIZES:
        x = RNG.standard_normal(shape).astype("float32")
        got, want = m(x), reference(x)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))


def test_kernels_after_a_strided_conv_fuse():
    """Before window_dims, every elementwise op after the first strided conv was a kernel of its own (a
    hardswish alone was 12): the region called 27 kernels. With the window's result re-typed by a match_cast
    after the conv: 9, each strided conv apart from its epilogue. Now the output sizes are bound before the
    window kernel (one tiny `dt_window_sizes` kernel per new size pair): every conv is fused with its
    elementwise epilogue (bias, hardswish, relu, hardsigmoid, the SE multiply's consumer, the residual add)."""
    graph = partition_graph(dt.trace(model, S(("B", 3, "H", "W"))))
    ex = build_cpu(build_module(collect_regions(graph)))
    calls = [m.group(1) for m in re.finditer(r"call\s+(\S+)\s+in:", ex.as_text())
             if not m.group(1).startswith(("vm.builtin", "dt_check", "shape_func", "compute_symbolic_expr"))
             and m.group(1) != "reshape"]
    sizes = [c for c in calls if c.startswith("dt_window_sizes")]
    work = [c for c in calls if not c.startswith("dt_window_sizes")]
    assert len(sizes) == 2, calls                   # stem: H/2, W/2; the stride-2 depthwise: H/4, W/4
    assert len(work) == 7, calls                    # 5 convs with their epilogues, the SE mean (sum, divide)
    assert not [c for c in work if re.match(r"dt_conv\d*$", c)], calls     # no conv without its epilogue
    assert not [c for c in work if re.match(r"(where|tir_isnan|logical_or|minimum|maximum|multiply|add|divide)\d*$",
                                            c)], calls


@pytest.mark.parametrize("channels,k,stride", [(5, 3, 2), (6, 5, 1), (12, 3, 1), (9, 5, 2)])
def test_depthwise_channel_blocks_match_numpy(channels, k, stride):
    """The spv tile spans 4, 3, 2 or 1 output channels (`cpu_schedule_depthwise.spv_channel_block`: 5 channels
    none, 6 three, 12 four, 9 three) over a ragged row tile of 8 (a symbolic width)."""
    w = _weights(channels, 1, k)
    m = dt.compile(lambda x: F.conv(x, w, stride=stride, padding=k // 2, groups=channels),
                   S(("B", channels, "H", "W")), use_cache=False)
    for shape in [(1, channels, 1, 1), (2, channels, 7, 9), (1, channels, 16, 17), (1, channels, 3, 30)]:
        x = RNG.standard_normal(shape).astype("float32")
        pads = [(k // 2, k // 2)] * 2
        np.testing.assert_allclose(m(x), ref_conv(x, w, (stride, stride), (1, 1), pads, channels), rtol=1e-4,
                                   atol=1e-4, err_msg=str(shape))


def _dw_numpy(x, w, stride, dilation, pad, groups):
    """A grouped convolution written tap by tap: zero padding, then for each kernel tap the strided slice of the
    padded input times the tap's weight, summed over the group's input channels (float64)."""
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    ks = w.shape[2:]
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pad, pad)] * len(ks))
    out = [(s + 2 * pad - dilation * (k - 1) - 1) // stride + 1 for s, k in zip(x.shape[2:], ks)]
    y = np.zeros((n, o, *out))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for ci in range(cg):
            for tap in np.ndindex(*ks):
                sl = tuple(slice(t * dilation, t * dilation + (m - 1) * stride + 1, stride) for t, m in zip(tap, out))
                y[:, oc] += xp[(slice(None), g * cg + ci) + sl] * w[(oc, ci) + tap]
    return y


@pytest.mark.parametrize("channels,groups,k,stride,dilation,dims", [
    (8, 8, 3, 2, 1, 2), (7, 7, 5, 2, 1, 2), (6, 6, 3, 3, 1, 2), (5, 5, 3, 2, 2, 2), (6, 3, 3, 2, 1, 2),
    (4, 4, 5, 2, 1, 1)])
def test_strided_spatial_vectorized_conv_reads_phases(channels, groups, k, stride, dilation, dims):
    """A strided depthwise / small-group convolution (the spv form) reads its padded input stored as `stride`
    phases (`te_conv._padded_phases`), so that a row tile's taps are contiguous vectors: odd sizes, strides 2 and
    3, dilation, 1-D and 2-D, symbolic and static widths, batch 1 and 0, with a hardswish epilogue in the same
    kernel; compared with a tap-by-tap numpy expression."""
    from dyntvm.codegen.te_conv import PHASES_BLOCK
    w = (RNG.standard_normal((channels, channels // groups) + (k,) * dims) / k).astype("float32")
    b = RNG.standard_normal(channels).astype("float32")
    bias = b.reshape((1, channels) + (1,) * dims)

    def layer(x):
        return hardswish(F.conv(x, w, b, stride=stride, padding=k // 2, dilation=dilation, groups=groups), F)
    sym = ("B", channels) + ("H", "W")[2 - dims:]
    shapes = [(1, channels) + s[2 - dims:] for s in [(1, 1), (7, 9), (16, 17), (3, 30)]] + [(0, channels) + (5,) * dims]
    for spec, sizes in [(sym, shapes), ((1, channels) + (13,) * dims, [(1, channels) + (13,) * dims])]:
        graph = partition_graph(dt.trace(layer, S(spec)))
        text = build_cpu(build_module(collect_regions(graph))).as_text()
        assert len([c for c in re.findall(r"call\s+(\S+)\s+in:", text) if "conv" in c]) == 1, text
        m = dt.compile(layer, S(spec), use_cache=False)
        for shape in [s for s in sizes if min(s[2:]) + 2 * (k // 2) >= dilation * (k - 1) + 1]:
            x = RNG.standard_normal(shape).astype("float32")
            want = hardswish(_dw_numpy(x, w, stride, dilation, k // 2, groups) + bias, np)
            got = m(x)
            assert got.shape == want.shape, shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str((spec, shape)))
    from dyntvm.codegen.backends.cpu.cpu_schedule import cpu_target, legalize_and_fuse, schedule_module
    target = cpu_target()
    mod = schedule_module(legalize_and_fuse(target)(build_module(collect_regions(partition_graph(
        dt.trace(layer, S(sym)))))), target)
    # (up to `te_conv.STRIDED_LANES_MAX_TAPS` taps a row: the padded input read `stride` apart instead, session 44)
    from dyntvm.codegen import te_conv
    phased = not (te_conv.STRIDED_LANES and k <= te_conv.STRIDED_LANES_MAX_TAPS)
    assert any(PHASES_BLOCK in f.script() for gv, f in mod.functions_items() if "conv" in gv.name_hint) == phased


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_padding_around_an_empty_row(stride):
    """A row of width 0 padded into output columns (the spv form's padded copy, in phases at stride 2): zeros
    plus the bias, nothing loaded from the empty row."""
    w = RNG.standard_normal((4, 1, 1, 1)).astype("float32")
    b = RNG.standard_normal(4).astype("float32")
    m = dt.compile(lambda x: F.conv(x, w, b, stride=stride, padding=1, groups=4), S(("B", 4, "H", "W")),
                   use_cache=False)
    for shape in [(1, 4, 3, 0), (2, 4, 5, 1), (0, 4, 3, 3)]:
        x = RNG.standard_normal(shape).astype("float32")
        want = _dw_numpy(x, w, stride, 1, 1, 4) + b.reshape(1, 4, 1, 1)
        got = m(x)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(shape))
