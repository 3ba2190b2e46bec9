"""Per-row dense convs of stride 1 with several taps in a kernel row (resnet's 3x3 layers below
`te_conv.FLAT_MIN_REDUCTION`) take an AVX2 register tile of 16 channels x 5 positions (`te_conv.ROW_ACC_REGISTERS_AVX2`:
10 accumulators; 4 positions before, and for strided or 1-tap rows now). Results against an independent numpy einsum
over the zero-padded input at row widths around the tile (1, 4, 5, 6, 9, 11, 56), batch 0 / 1 / 3, symbolic and
static sizes, bias / relu / residual add fused, a (1, 3) kernel, stride 2 (not taken), the switch on and off and the
AVX-512 tiles (unchanged); the tiles chosen (the block's row tile annotation)."""
from __future__ import annotations

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
RNG = np.random.default_rng(5)

# (id, C, O, kernel, stride, pads (h, w), epilogue, spec dims, sizes (N, C, H, W)); C x taps < FLAT_MIN_REDUCTION
CASES = [
    ("c64_o64_bias_relu", 64, 64, (3, 3), 1, (1, 1), "bias_relu", ("N", 64, "H", "W"),
     [(1, 64, 7, 56), (0, 64, 5, 5), (3, 64, 6, 11), (1, 64, 1, 1), (2, 64, 4, 4), (1, 64, 3, 5), (1, 64, 9, 6)]),
    ("c32_o32_residual", 32, 32, (3, 3), 1, (1, 1), "bias_res_relu", ("N", 32, "H", "W"),
     [(1, 32, 5, 9), (3, 32, 2, 5), (1, 32, 8, 1), (2, 32, 13, 12)]),
    ("c16_o48_k1x3_nobias", 16, 48, (1, 3), 1, (0, 1), "relu", ("N", 16, "H", "W"), [(1, 16, 3, 7), (2, 16, 1, 10)]),
    ("c64_o32_static", 64, 32, (3, 3), 1, (1, 1), "bias", ("N", 64, 9, 11), [(0, 64, 9, 11), (3, 64, 9, 11)]),
    ("c64_o64_stride2", 64, 64, (3, 3), 2, (1, 1), "bias_relu", ("N", 64, "H", "W"), [(1, 64, 9, 11), (2, 64, 4, 5)]),
]


def _model(w, b, stride, pads, epilogue):
    def model(x, *r):
        y = F.conv(x, w, b if "bias" in epilogue else None, stride=stride, padding=pads)
        if "res" in epilogue:
            y = y + F.assert_dims_equal(y, F.assert_dims_equal(y, r[0], 2, 2), 3, 3)
        return F.relu(y) if "relu" in epilogue else y
    return model


def _out(size, k, stride, pad):
    return (size + 2 * pad - k) // stride + 1


def _want(x, w, b, r, stride, pads, epilogue):
    """The conv as an einsum over the zero-padded input's windows, in float64."""
    kh, kw = w.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[0]), (pads[1], pads[1])))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    want = np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64))
    if "bias" in epilogue:
        want = want + b.reshape(1, -1, 1, 1)
    if "res" in epilogue:
        want = want + r
    return np.maximum(want, 0) if "relu" in epilogue else want


def _check(case) -> None:
    _, c, o, kernel, stride, pads, epilogue, dims, sizes = case
    w = (RNG.standard_normal((o, c, *kernel)) / np.sqrt(c * kernel[0] * kernel[1])).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    residual = "res" in epilogue
    specs = [S(dims)] + ([S((dims[0], o, "Ho", "Wo"))] if residual else [])
    m = dt.compile(_model(w, b, stride, pads, epilogue), *specs, use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        out_hw = (_out(shape[2], kernel[0], stride, pads[0]), _out(shape[3], kernel[1], stride, pads[1]))
        r = RNG.standard_normal((shape[0], o) + out_hw).astype("float32")
        got = m(x, r) if residual else m(x)
        want = _want(x, w, b, r, stride, pads, epilogue)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))


@pytest.mark.parametrize("registers", [10, 8], ids=["tile5", "tile4"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_row_tile_match_numpy(case, registers, conv_log, monkeypatch):
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 256)
    monkeypatch.setattr(te_conv, "ROW_ACC_REGISTERS_AVX2", registers)
    _check(case)
    assert conv_rules(conv_log) == (1, [])


@pytest.mark.parametrize("case", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_row_tile_avx512_match_numpy(case, conv_log, monkeypatch):
    """AVX-512's tiles (one register of 16 channels, 14 accumulators: unchanged) built for this machine."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 512)
    assert te_conv._ocv_tiles(16, "float32", True) == te_conv._ocv_tiles(16, "float32", False)
    _check(case)
    assert conv_rules(conv_log) == (1, [])


def _row_tile(kernel=(3, 3), stride=1, dims=("N", 64, "H", "W")):
    """The row tile annotated on the conv block of a conv + bias + relu (AVX2 target)."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    w = RNG.standard_normal((32, dims[1], *kernel)).astype("float32")
    b = RNG.standard_normal(32).astype("float32")
    pads = tuple(k // 2 for k in kernel)
    graph = partition_graph(dt.trace(lambda x: F.relu(F.conv(x, w, b, stride=stride, padding=pads)), S(dims)))
    mod = legalize_and_fuse(target)(build_module(collect_regions(graph)))
    (func,) = [f for gv, f in mod.functions_items() if "dt_conv" in gv.name_hint]
    text = func.script()
    assert te_conv.FLAT_ATTR not in text
    tiles = [int(t) for t in __import__("re").findall(rf'"{te_conv.ROW_TILE_ATTR}": (\d+)', text)]
    schedule_module(mod, target)   # (schedules without a failed rule: checked by the caller's conv_log)
    return tiles[0]


def test_row_tiles_chosen(conv_log, monkeypatch):
    """AVX2: a symbolic row of a unit-stride 3x3 (or 1x3) conv in ragged tiles of 5, a stride-2 or 3x1 one in tiles of
    4; a static row of 56 in exact tiles of 4 (fewest latency-bound tiles, `row_tile`), of 11 in ragged tiles of 5;
    the switch at 8: tiles of 4."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: 256)
    assert _row_tile() == 5
    assert _row_tile(kernel=(1, 3)) == 5
    assert _row_tile(stride=2) == 4
    assert _row_tile(kernel=(3, 1)) == 4
    assert _row_tile(dims=("N", 64, 9, 56)) == 4
    assert _row_tile(dims=("N", 64, 9, 11)) == 5
    assert te_conv.row_tile(56, te_conv._ocv_tiles(16, "float32", True)) == (4, True)
    assert te_conv.row_tile(tvm.tirx.Var("W", "int64"), te_conv._ocv_tiles(16, "float32", True)) == (5, False)
    monkeypatch.setattr(te_conv, "ROW_ACC_REGISTERS_AVX2", 8)
    assert _row_tile() == 4
    assert conv_rules(conv_log) == (7, [])
