"""Pointwise 2-D convolutions vectorized along their positions (`te_conv.POSITION_LANES`, ``dt_conv_pwp``): the
GEMM [O, H * W] = W[O, C] x X[C, H * W] per image, a register tile of output channels x 2 vectors of positions,
the last, partial tile of a plane cut by ``likely`` predicates (TIR's LoopPartition splits it off). Results against
an independent numpy einsum at planes that are and are not multiples of the tile (1, 7, 55 x 55 positions), batch
0 / 1 / 3, C = 3 / 13 / 16 / 24, O = 8 / 48 / 72 (and O = 1 / 13: not this form), static and symbolic dims, with the
bias / relu / residual add fused; the kernel form (vector FMAs and stores in the assembly); the switch off."""
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
RNG = np.random.default_rng(42)


# (id, C, O, epilogue, spec dims, sizes (N, C, H, W))
CASES = [
    ("c16_o72_bias_relu", 16, 72, "bias_relu", ("N", 16, "H", "W"),
     [(0, 16, 5, 5), (1, 16, 1, 1), (1, 16, 1, 7), (3, 16, 7, 1), (1, 16, 55, 55), (2, 16, 8, 4)]),
    ("c3_o8", 3, 8, "", ("N", 3, "H", "W"), [(1, 3, 1, 1), (3, 3, 7, 7), (1, 3, 17, 3)]),
    ("c13_o48_residual", 13, 48, "bias_res", ("N", 13, "H", "W"), [(1, 13, 1, 1), (3, 13, 9, 11), (1, 13, 4, 8)]),
    ("c24_o16_static", 24, 16, "bias_relu_res", ("N", 24, 55, 55), [(0, 24, 55, 55), (1, 24, 55, 55),
                                                                    (3, 24, 55, 55)]),
    ("c16_o32_static_7", 16, 32, "relu", (2, 16, 7, 7), [(2, 16, 7, 7)]),
    # not this form (O not a multiple of 8: the spatial-vectorized kernel), checked all the same
    ("c16_o13", 16, 13, "bias_relu", ("N", 16, "H", "W"), [(1, 16, 1, 1), (2, 16, 7, 9)]),
    ("c16_o1", 16, 1, "bias", ("N", 16, "H", "W"), [(1, 16, 1, 1), (3, 16, 5, 7)]),
]


def _model(w, b, epilogue):
    def model(x, *r):
        y = F.conv(x, w, b if "bias" in epilogue else None)
        if "res" in epilogue:
            y = y + r[0]
        return F.relu(y) if "relu" in epilogue else y
    return model


def _want(x, w, b, r, epilogue):
    o, c = w.shape[:2]
    want = np.einsum("oc,nchw->nohw", w.reshape(o, c).astype(np.float64), x.astype(np.float64))
    if "bias" in epilogue:
        want = want + b.reshape(1, o, 1, 1)
    if "res" in epilogue:
        want = want + r
    return np.maximum(want, 0) if "relu" in epilogue else want


@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "ocv"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_pointwise_position_lanes_match_numpy(case, lanes, conv_log, monkeypatch):
    monkeypatch.setattr(te_conv, "POSITION_LANES", lanes)
    _check(case, case[5])
    assert conv_rules(conv_log) == (1, [])


def _check(case, sizes) -> None:
    """Compile `case`'s conv + epilogue and compare it with `_want` (numpy einsum) at each of `sizes`."""
    _, c, o, epilogue, dims, _ = case
    w = (RNG.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    residual = "res" in epilogue
    specs = [S(dims)] + ([S((dims[0], o) + tuple(dims[2:]))] if residual else [])
    m = dt.compile(_model(w, b, epilogue), *specs, use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        r = RNG.standard_normal((shape[0], o) + shape[2:]).astype("float32")
        got = m(x, r) if residual else m(x)
        want = _want(x, w, b, r, epilogue)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))


def _scheduled(target, c=16, o=72, residual=True):
    """The scheduled kernel of a pointwise conv + bias (+ residual) + relu on symbolic N, H, W: its TIR text and
    its x86 assembly."""
    w = RNG.standard_normal((o, c, 1, 1)).astype("float32")
    b = RNG.standard_normal(o).astype("float32")

    def block(x, *r):
        y = F.conv(x, w, b)
        return F.relu(y + r[0]) if residual else F.relu(y)
    specs = [S(("N", c, "H", "W"))] + ([S(("N", o, "H", "W"))] if residual else [])
    graph = partition_graph(dt.trace(block, *specs))
    mod = schedule_module(legalize_and_fuse(target)(build_module(collect_regions(graph))), target)
    (func,) = [f for gv, f in mod.functions_items() if "dt_conv" in gv.name_hint]
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    return func.script(), lib.mod.inspect_source("asm") if hasattr(lib, "mod") else lib.inspect_source("asm")


def test_pointwise_position_lanes_kernel_form(conv_log, monkeypatch):
    """On AVX2 (znver3): the tile 4 output channels x 16 positions (2 vectors), the residual add and relu in the
    kernel, positions vectorized; the assembly multiplies-adds, loads and stores whole ymm vectors, gathers
    nothing and allocates no workspace (an accumulator tile sized at run time did). 288 input channels (above
    POSITION_LANES_MAX_CHANNELS) or POSITION_LANES False: the ``dt_conv_ocv`` form."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 256)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    text, asm = _scheduled(target)
    assert f'"{te_conv.ROW_TILE_ATTR}": 16' in text and f'"{te_conv.PWP_ROWS_ATTR}": 4' in text
    assert text.index('T.sblock("relu")') > text.index(f'T.sblock("{te_conv.PWP_BLOCK}_update")')
    assert "T.likely(" in text
    # where 16 positions do not divide H * W (checked at run time): the block as a dt_conv_ocv one (8 channels a
    # vector, positions broadcast) - both variants in the kernel
    assert "H * W % T.int64(16) == T.int64(0)" in text
    assert {int(v) for v in re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", text)} == {8}
    assert len(re.findall(r"vfmadd\w+\s+[^\n]*%ymm", asm)) >= 8       # the tile: 4 rows x 2 vectors
    assert re.search(r"vmovups\s+%ymm\d+, [^\n]*\(", asm)               # a vector store
    assert "vgather" not in asm
    assert "TVMBackendAllocWorkspace" not in asm
    # more input (or output) channels than POSITION_LANES_MAX_CHANNELS: the channels form
    assert te_conv.POSITION_LANES_MAX_CHANNELS == 256
    text, _ = _scheduled(target, c=288, o=96, residual=False)
    assert te_conv.PWP_BLOCK not in text and te_conv.OCV_BLOCK in text
    monkeypatch.setattr(te_conv, "POSITION_LANES", False)
    text, _ = _scheduled(target)
    assert te_conv.PWP_BLOCK not in text and te_conv.OCV_BLOCK in text
    assert conv_rules(conv_log) == (3, [])


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[3]], ids=[CASES[i][0] for i in (0, 2, 3)])
def test_pointwise_position_lanes_avx512_tiles_match_numpy(case, conv_log, monkeypatch):
    """The AVX-512 variant's tiles (6 output channels x 2 vectors of 16 positions, its run-time check that 32
    positions divide H * W) built for this machine (LLVM splits the 16-lane vectors where the CPU has narrower
    ones), so its schedule's results are checked here whatever the CPU: equal to numpy at planes that are and
    are not multiples of 32 positions."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 512)
    _, c, _, _, dims, sizes = case
    extra = [] if not isinstance(dims[2], str) else [(1, c, 8, 4), (2, c, 4, 16), (1, c, 28, 28)]
    _check(case, sizes + extra)
    assert conv_rules(conv_log) == (1, [])


def test_pointwise_position_lanes_avx512_kernel_form(monkeypatch):
    """Built for an AVX-512 CPU (znver4; not run here): the tile 6 output channels x 32 positions (768 bytes: under
    TVM's 1024-byte stack limit, else a workspace allocation a tile), its multiply-adds and stores on zmm vectors,
    no workspace."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 512)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    text, asm = _scheduled(target)
    assert f'"{te_conv.ROW_TILE_ATTR}": 32' in text and f'"{te_conv.PWP_ROWS_ATTR}": 6' in text
    assert "H * W % T.int64(32) == T.int64(0)" in text
    assert len(re.findall(r"vfmadd\w+\s+[^\n]*%zmm", asm)) >= 12      # the tile: 6 rows x 2 vectors
    assert re.search(r"vmovups\s+%zmm\d+, [^\n]*\(", asm)
    assert "TVMBackendAllocWorkspace" not in asm
