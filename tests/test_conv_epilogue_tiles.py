"""Conv epilogues and copies (session 43, issue 24). Depthwise and small-group convolutions (the ``dt_conv_spv``
form) with `cpu_schedule_conv.SPV_EPILOGUE_VECTORS` (the epilogue of whole ragged tiles - a symbolic width -
vectorized over the tile's positions, its ``w < W`` test ``likely``: LoopPartition splits off the last, cut tile) and
`te_conv.SPLIT_ROWS` (the padded / phases copy's row loop split into padding and interior rows too); dense
(``dt_conv_ocv``, per row) ones with `cpu_schedule_conv.OCV_EPILOGUE_TILE` (the epilogue writes a [positions,
channels] tile buffer, copied to NCHW positions-innermost). Results against an independent numpy expression - the
taps summed over strided slices of a zero-padded array, written here - for strides 1 / 2, 3x3 / 5x5 / 7x7 kernels, a
dilation, asymmetric padding, groups, widths 1, 2 and odd ones, batch 0 / 1 / 3, static and symbolic dims, with bias
+ relu / hardswish (and a residual add) fused, each switch on and off; and the kernels' form (AVX2 and an AVX-512
build)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
import tvm  # noqa: E402

from dyntvm.codegen import te_conv  # noqa: E402
from dyntvm.codegen.backends.cpu import cpu_schedule_conv  # noqa: E402
from dyntvm.codegen.backends.cpu.cpu_schedule import legalize_and_fuse, schedule_module  # noqa: E402
from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402
from test_conv_schedules import conv_rules  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(43)


def want_conv(x, w, b, stride, dilation, pads, groups, act, residual=None):
    """numpy: x zero-padded, then per output channel the sum over its group's input channels and the kernel taps of
    the tap's weight times the strided slice of the padded input it reads (float64); bias and activation after."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = pads
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    oh = (h + pt + pb - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + pl + pr - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for ci in range(cg):
            for i in range(kh):
                for j in range(kw):
                    rows = xp[:, g * cg + ci, i * dilation:i * dilation + (oh - 1) * stride + 1:stride,
                              j * dilation:j * dilation + (ow - 1) * stride + 1:stride]
                    out[:, oc] += w[oc, ci, i, j] * rows
    out += b.reshape(1, o, 1, 1)
    if residual is not None:
        out += residual
    if act == "relu":
        return np.maximum(out, 0)
    return out * np.clip(out / 6 + 0.5, 0, 1)        # hardswish


def _model(w, b, stride, dilation, pads, groups, act):
    def model(x, *r):
        y = F.conv(x, w, b, stride=stride, padding=pads, dilation=dilation, groups=groups)
        if r:
            y = y + r[0]
        if act == "relu":
            return F.relu(y)
        return y * F.minimum(F.maximum(y * np.float32(1 / 6) + np.float32(0.5), np.float32(0)), np.float32(1))
    return model


# (id, C, O, k, stride, dilation, pads ((top, bottom), (left, right)), groups, act, spec dims, sizes (N, C, H, W))
CASES = [
    ("dw3x3_s2_sym", 24, 24, 3, 2, 1, ((1, 1), (1, 1)), 24, "relu", ("N", 24, "H", "W"),
     [(1, 24, 17, 17), (3, 24, 9, 30), (1, 24, 1, 1), (1, 24, 2, 2), (0, 24, 5, 5), (1, 24, 56, 56)]),
    ("dw5x5_s2_hs_sym", 16, 16, 5, 2, 1, ((2, 2), (2, 2)), 16, "hs", ("N", 16, "H", "W"),
     [(1, 16, 28, 28), (3, 16, 7, 13), (1, 16, 1, 3)]),
    ("dw3x3_s1_sym", 12, 12, 3, 1, 1, ((1, 1), (1, 1)), 12, "relu", ("N", 12, "H", "W"),
     [(1, 12, 11, 23), (3, 12, 1, 1), (1, 12, 2, 9), (0, 12, 3, 3)]),
    ("dw5x5_s1_hs_width_sym", 8, 8, 5, 1, 1, ((2, 2), (2, 2)), 8, "hs", (2, 8, 14, "W"),
     [(2, 8, 14, 14), (2, 8, 14, 7), (2, 8, 14, 1)]),
    ("dw3x3_s2_dil2_asym", 8, 8, 3, 2, 2, ((2, 1), (0, 2)), 8, "relu", ("N", 8, "H", "W"),
     [(1, 8, 13, 19), (3, 8, 6, 5)]),
    ("groups2_s2_static", 12, 6, 3, 2, 1, ((1, 1), (1, 1)), 6, "hs", (3, 12, 15, 21), [(3, 12, 15, 21)]),
    ("dw3x3_s2_static", 16, 16, 3, 2, 1, ((1, 1), (1, 1)), 16, "relu", (1, 16, 29, 29), [(1, 16, 29, 29)]),
]


def _check(case, residual=False) -> None:
    _, c, o, k, stride, dilation, pads, groups, act, dims, sizes = case
    w = (RNG.standard_normal((o, c // groups, k, k)) / k).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    specs = [S(dims)] + ([S((dims[0], o) + tuple(dims[2:]))] if residual else [])
    m = dt.compile(_model(w, b, stride, dilation, pads, groups, act), *specs, use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        r = RNG.standard_normal((shape[0], o) + shape[2:]).astype("float32") if residual else None
        got = m(x, r) if residual else m(x)
        want = want_conv(x, w, b, stride, dilation, pads, groups, act, r)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))


@pytest.mark.parametrize("rows", [True, False], ids=["rows", "columns"])
@pytest.mark.parametrize("vectors", [True, False], ids=["vectors", "scalar"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_depthwise_matches_numpy(case, vectors, rows, conv_log, monkeypatch):
    monkeypatch.setattr(cpu_schedule_conv, "SPV_EPILOGUE_VECTORS", vectors)
    monkeypatch.setattr(te_conv, "SPLIT_ROWS", rows)
    _check(case)
    applied, failed = conv_rules(conv_log)
    assert not failed, failed
    assert applied == 1


# dense convs (``dt_conv_ocv`` per row), the same fields; the residual cases' spec is the output's (stride 1)
DENSE = [
    ("stem3x3_s2_hs_sym", 3, 16, 3, 2, 1, ((1, 1), (1, 1)), 1, "hs", ("N", 3, "H", "W"),
     [(1, 3, 224, 224), (3, 3, 9, 13), (1, 3, 1, 1), (1, 3, 2, 7), (0, 3, 5, 5)]),
    ("stem7x7_s2_relu_static", 3, 16, 7, 2, 1, ((3, 3), (3, 3)), 1, "relu", (2, 3, 33, 47), [(2, 3, 33, 47)]),
    ("3x3_o8_relu_static_exact", 8, 8, 3, 1, 1, ((1, 1), (1, 1)), 1, "relu", (1, 8, 12, 16), [(1, 8, 12, 16)]),
    ("3x3_s1_o32_hs_width", 16, 32, 3, 1, 1, ((1, 1), (1, 1)), 1, "hs", (1, 16, 9, "W"),
     [(1, 16, 9, 13), (1, 16, 9, 1), (1, 16, 9, 4)]),
    ("3x3_g2_o32_dil2_asym", 16, 32, 3, 2, 2, ((2, 1), (0, 2)), 2, "relu", ("N", 16, "H", "W"),
     [(1, 16, 11, 17), (3, 16, 6, 5)]),
]
RESIDUAL = [
    ("3x3_c16_o16_res_sym", 16, 16, 3, 1, 1, ((1, 1), (1, 1)), 1, "relu", ("N", 16, "H", "W"),
     [(1, 16, 13, 11), (3, 16, 1, 1), (1, 16, 7, 16), (0, 16, 3, 3)]),
]


@pytest.mark.parametrize("tile", [True, False], ids=["tile", "scalar"])
@pytest.mark.parametrize("case", DENSE + RESIDUAL, ids=[c[0] for c in DENSE + RESIDUAL])
def test_dense_epilogue_tile_matches_numpy(case, tile, conv_log, monkeypatch):
    monkeypatch.setattr(cpu_schedule_conv, "OCV_EPILOGUE_TILE", tile)
    _check(case, residual=case in RESIDUAL)
    applied, failed = conv_rules(conv_log)
    assert not failed, failed
    assert applied == 1


def _dense_scheduled(target):
    """The scheduled kernel of mobilenet_v3_small's stem (3 -> 16, 3x3 / 2, bias + hardswish, symbolic N, H, W):
    its TIR text and its assembly."""
    w = RNG.standard_normal((16, 3, 3, 3)).astype("float32")
    b = RNG.standard_normal(16).astype("float32")
    graph = partition_graph(dt.trace(_model(w, b, 2, 1, 1, 1, "hs"), S(("N", 3, "H", "W"))))
    mod = schedule_module(legalize_and_fuse(target)(build_module(collect_regions(graph))), target)
    (func,) = [f for gv, f in mod.functions_items() if "dt_conv" in gv.name_hint]
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    return func.script(), lib.mod.inspect_source("asm") if hasattr(lib, "mod") else lib.inspect_source("asm")


@pytest.mark.parametrize("bits, mcpu", [(256, "znver3"), (512, "znver4")], ids=["avx2", "avx512"])
def test_dense_epilogue_tile_form(bits, mcpu, monkeypatch):
    """The stem: the epilogue writes the tile buffer (``*_global``, [n, h, w, o]) and a copy block writes the result
    from it, channels unrolled, positions a vector under a ``likely`` test; the tile buffer is on the stack (no
    more workspace allocations than without it: AVX2 4 x 16 floats, AVX-512 8 x 16). Off: no such copy."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: bits)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    text, asm = _dense_scheduled(target)
    copies = re.findall(r'for \w+ in T\.vectorized\(T\.int64\((\d+)\)\):\s+with T\.sblock\("(\w+_global)"\)', text)
    assert copies and {int(n) for n, _ in copies} == {4 if bits == 256 else 8}, text
    copy = text[text.index(f'T.sblock("{copies[0][1]}")'):]
    assert "T.likely(" in copy[:copy.index("\n", copy.index("T.where"))]
    monkeypatch.setattr(cpu_schedule_conv, "OCV_EPILOGUE_TILE", False)
    text, asm_off = _dense_scheduled(target)
    assert "_global\")" not in text
    # (the padded input and the accumulator tile's workspaces, as before: none more for the tile buffer)
    assert asm.count("TVMBackendAllocWorkspace") == asm_off.count("TVMBackendAllocWorkspace")


def _scheduled(target, stride=2, act="relu"):
    """The scheduled conv kernel of a 3x3 depthwise conv + bias + `act` on symbolic N, H, W, as TIR text."""
    w = RNG.standard_normal((24, 1, 3, 3)).astype("float32")
    b = RNG.standard_normal(24).astype("float32")
    graph = partition_graph(dt.trace(_model(w, b, stride, 1, 1, 24, act), S(("N", 24, "H", "W"))))
    mod = schedule_module(legalize_and_fuse(target)(build_module(collect_regions(graph))), target)
    (func,) = [f for gv, f in mod.functions_items() if "dt_conv" in gv.name_hint]
    return func.script()


def _epilogue(text: str, name: str) -> tuple[str, str]:
    """(the innermost loop over the epilogue block `name` in `text`, the block up to its predicate)."""
    at = text.index(f'T.sblock("{name}")')
    return text[text.rindex("for ", 0, at):at], text[at:text.index("T.where", at) + 400]


@pytest.mark.parametrize("bits, mcpu", [(256, "znver3"), (512, "znver4")], ids=["avx2", "avx512"])
def test_depthwise_kernel_form(bits, mcpu, monkeypatch):
    """A symbolic width (whole ragged tiles of 8 positions): the epilogue (relu) vectorized by 8 under the tile, its
    predicate ``likely`` (LoopPartition then splits off the last tile), the strided conv's phases copy testing
    its rows and columns under ``likely``; with the switches off the epilogue is a scalar loop under the old
    predicate and only the columns are ``likely``. The AVX-512 build (16 lanes) takes vectors of 8 likewise."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: bits)
    monkeypatch.setattr(te_conv, "STRIDED_LANES", False)     # (3 taps: else no phases copy, session 44)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    text = _scheduled(target)
    loop, block = _epilogue(text, "relu")
    assert "T.vectorized(T.int64(8))" in loop and "T.likely(" in block.split("T.where", 1)[1].split("\n")[0], text
    phases = text[text.index(f'T.sblock("{te_conv.PHASES_BLOCK}")'):]
    phases = phases[:phases.index("\n", phases.index("T.if_then_else"))]
    assert len(re.findall(r"T\.likely\(", phases)) == 4, phases        # rows and columns, both bounds
    monkeypatch.setattr(cpu_schedule_conv, "SPV_EPILOGUE_VECTORS", False)
    monkeypatch.setattr(te_conv, "SPLIT_ROWS", False)
    text = _scheduled(target)
    loop, block = _epilogue(text, "relu")
    assert "T.vectorized" not in loop and "T.likely(" not in block.split("T.where", 1)[1].split("\n")[0], text
    phases = text[text.index(f'T.sblock("{te_conv.PHASES_BLOCK}")'):]
    phases = phases[:phases.index("\n", phases.index("T.if_then_else"))]
    assert len(re.findall(r"T\.likely\(", phases)) == 2, phases        # the columns only
