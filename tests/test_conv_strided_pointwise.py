"""Strided 1x1 convolutions (resnet's downsampling) vectorized along their positions (`te_conv.STRIDED_POSITION_LANES`,
``dt_conv_pwp`` on ``dt_conv_pad_strided``): the strided input positions copied into a buffer stored flattened, with
zeros up to whole tiles of positions, then the GEMM [O, Ho * Wo] = W[O, C] x X[C, Ho * Wo] per image. Results
against an independent numpy einsum over the strided view ``x[:, :, ::sh, ::sw]`` at odd sizes, planes that are and
are not multiples of the tile, batch 0 / 1 / 3, strides 2 and (3, 2), static and symbolic dims, with the bias / relu /
residual add fused, the switch on and off, the AVX-512 variant's tiles; the kernel form (whole-vector reads of the
copy, vector FMAs and stores, one workspace a call: the copy) and the channel bound."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
import tvm  # noqa: E402

from dyntvm.codegen import te_conv  # noqa: E402
from dyntvm.codegen.backends.cpu.cpu_schedule import legalize_and_fuse, schedule_module  # noqa: E402
from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402
from test_conv_schedules import conv_rules  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(7)


# (id, C, O, stride, epilogue, spec dims, sizes (N, C, H, W))
CASES = [
    ("c64_o128_bias_relu", 64, 128, (2, 2), "bias_relu", ("N", 64, "H", "W"),
     [(0, 64, 5, 5), (1, 64, 1, 1), (1, 64, 2, 7), (3, 64, 13, 9), (1, 64, 56, 56)]),
    ("c13_o48_residual", 13, 48, (2, 2), "bias_res", ("N", 13, "H", "W"),
     [(1, 13, 1, 1), (3, 13, 9, 11), (2, 13, 4, 8), (1, 13, 14, 14)]),
    ("c24_o16_static", 24, 16, (2, 2), "bias_relu_res", ("N", 24, 55, 55),
     [(0, 24, 55, 55), (1, 24, 55, 55), (3, 24, 55, 55)]),
    ("c8_o16_stride3x2", 8, 16, (3, 2), "relu", ("N", 8, "H", "W"), [(1, 8, 1, 1), (2, 8, 10, 9), (1, 8, 31, 17)]),
    ("c16_o32_static_b2", 16, 32, (2, 2), "bias", (2, 16, 7, 7), [(2, 16, 7, 7)]),
    # above STRIDED_POSITION_LANES_MAX_CHANNELS (the channels form) and O not a multiple of 8 (the spatial one)
    ("c288_o16", 288, 16, (2, 2), "bias_relu", ("N", 288, "H", "W"), [(1, 288, 3, 3), (2, 288, 9, 6)]),
    ("c16_o13", 16, 13, (2, 2), "bias_relu", ("N", 16, "H", "W"), [(1, 16, 1, 1), (2, 16, 7, 9)]),
]


def _model(w, b, stride, epilogue):
    def model(x, *r):
        y = F.conv(x, w, b if "bias" in epilogue else None, stride=stride)
        if "res" in epilogue:
            # the residual's (symbolic) H, W stated equal to the conv's output sizes
            y = y + F.assert_dims_equal(y, F.assert_dims_equal(y, r[0], 2, 2), 3, 3)
        return F.relu(y) if "relu" in epilogue else y
    return model


def _want(x, w, b, r, stride, epilogue):
    o, c = w.shape[:2]
    xs = x[:, :, ::stride[0], ::stride[1]].astype(np.float64)
    want = np.einsum("oc,nchw->nohw", w.reshape(o, c).astype(np.float64), xs)
    if "bias" in epilogue:
        want = want + b.reshape(1, o, 1, 1)
    if "res" in epilogue:
        want = want + r
    return np.maximum(want, 0) if "relu" in epilogue else want


def _check(case, sizes) -> None:
    """Compile `case`'s conv + epilogue and compare it with `_want` (numpy einsum) at each of `sizes`."""
    _, c, o, stride, epilogue, dims, _ = case
    w = (RNG.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    residual = "res" in epilogue
    out_dims = tuple(d if isinstance(d, str) else (d - 1) // s + 1 for d, s in zip(dims[2:], stride))
    specs = [S(dims)] + ([S((dims[0], o) + tuple(f"{d}o" if isinstance(d, str) else d for d in out_dims))]
                         if residual else [])
    m = dt.compile(_model(w, b, stride, epilogue), *specs, use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        out_hw = tuple((d - 1) // s + 1 for d, s in zip(shape[2:], stride))
        r = RNG.standard_normal((shape[0], o) + out_hw).astype("float32")
        got = m(x, r) if residual else m(x)
        want = _want(x, w, b, r, stride, epilogue)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))


@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "ocv"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_strided_pointwise_match_numpy(case, lanes, conv_log, monkeypatch):
    monkeypatch.setattr(te_conv, "STRIDED_POSITION_LANES", lanes)
    _check(case, case[6])
    assert conv_rules(conv_log) == (1, [])


@pytest.mark.parametrize("case", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_strided_pointwise_avx512_tiles_match_numpy(case, conv_log, monkeypatch):
    """The AVX-512 variant's tiles (6 output channels x 32 positions, the copy in whole tiles of 32) built for this
    machine (LLVM splits the 16-lane vectors), so its schedule's results are checked here whatever the CPU."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 512)
    _check(case, case[6])
    assert conv_rules(conv_log) == (1, [])


def _scheduled(target, c=64, o=128):
    """The scheduled kernel of a strided 1x1 conv + bias + relu on symbolic N, H, W: its TIR text and assembly."""
    w = RNG.standard_normal((o, c, 1, 1)).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    graph = partition_graph(dt.trace(lambda x: F.relu(F.conv(x, w, b, stride=2)), S(("N", c, "H", "W"))))
    mod = schedule_module(legalize_and_fuse(target)(build_module(collect_regions(graph))), target)
    (func,) = [f for gv, f in mod.functions_items() if "dt_conv" in gv.name_hint]
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    return func.script(), lib.mod.inspect_source("asm") if hasattr(lib, "mod") else lib.inspect_source("asm")


def test_strided_pointwise_kernel_form(conv_log, monkeypatch):
    """On AVX2 (znver3): the strided copy stored flattened and read by the GEMM at its flat position (no division),
    the tile 4 output channels x 16 positions, the relu in the kernel; vector FMAs and stores, no gather, one
    workspace (the copy, once a call). 288 channels (above the bound) or the switch off: the ``dt_conv_ocv`` form."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 256)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    text, asm = _scheduled(target)
    assert te_conv.STRIDED_BLOCK in text and f'"{te_conv.ROW_TILE_ATTR}": 16' in text
    assert re.search(rf"{te_conv.STRIDED_BLOCK}\[v_n, v_rc, v_p\]", text)
    assert text.index('T.sblock("relu")') > text.index(f'T.sblock("{te_conv.PWP_BLOCK}_update")')
    assert len(re.findall(r"vfmadd\w+\s+[^\n]*%ymm", asm)) >= 8       # the tile: 4 rows x 2 vectors
    assert re.search(r"vmovups\s+%ymm\d+, [^\n]*\(", asm)
    assert "vgather" not in asm
    # one workspace a call (the copy of the strided positions), none a tile (an accumulator tile sized at run time)
    assert len(re.findall(r"TVMBackendAllocWorkspace@GOTPCREL", asm)) == 1
    assert te_conv.STRIDED_POSITION_LANES_MAX_CHANNELS == 256
    text, _ = _scheduled(target, c=288, o=96)
    assert te_conv.STRIDED_BLOCK not in text and te_conv.OCV_BLOCK in text
    monkeypatch.setattr(te_conv, "STRIDED_POSITION_LANES", False)
    text, _ = _scheduled(target)
    assert te_conv.STRIDED_BLOCK not in text and te_conv.OCV_BLOCK in text
    assert conv_rules(conv_log) == (3, [])


def test_strided_pointwise_avx512_kernel_form(monkeypatch):
    """Built for an AVX-512 CPU (znver4; not run here): 6 output channels x 32 positions on zmm vectors, one
    workspace (the copy)."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 512)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    text, asm = _scheduled(target, c=64, o=96)
    assert f'"{te_conv.ROW_TILE_ATTR}": 32' in text and f'"{te_conv.PWP_ROWS_ATTR}": 6' in text
    assert len(re.findall(r"vfmadd\w+\s+[^\n]*%zmm", asm)) >= 12
    assert re.search(r"vmovups\s+%zmm\d+, [^\n]*\(", asm)
    assert len(re.findall(r"TVMBackendAllocWorkspace@GOTPCREL", asm)) == 1
