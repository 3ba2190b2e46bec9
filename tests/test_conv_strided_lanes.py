"""Session 44 (issue 24): strided depthwise convs reading their padded input with lane-strided loads
(`te_conv.STRIDED_LANES`: no phases copy; the CPU build writes each ``x[Ramp(base, s, L)]`` as contiguous vector loads
and a shuffle, `cpu_strided_loads`) and expanding pointwise convs reading a copy of their input extended to whole tiles
of positions (`te_conv.PADDED_POSITIONS`). Results against independent numpy expressions (the depthwise taps summed
over strided slices of a zero-padded array, `test_conv_epilogue_tiles.want_conv`; the pointwise conv as an einsum) at
odd sizes, widths 1 and 2, batch 0 / 1 / 3, static and symbolic dims, bias + relu / hardswish (and a residual add)
fused, each switch on and off; the rewrite alone on vectors of 8 and 16 lanes and strides 2-4 (the loads end at the
strided load's last element: the input exactly that long); the kernels' form for AVX2 and AVX-512 builds."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
import tvm  # noqa: E402
from tvm import s_tir, te, tirx  # noqa: E402

from dyntvm.codegen import te_conv  # noqa: E402
from dyntvm.codegen.backends.cpu import cpu_strided_loads  # noqa: E402
from dyntvm.codegen.backends.cpu.cpu_schedule import (_lowering_context, legalize_and_fuse, schedule_module,  # noqa: E402
                                                    tir_pipeline)
from dyntvm.codegen.build import collect_regions  # noqa: E402
from dyntvm.codegen.relax_builder import build_module  # noqa: E402
from dyntvm.pipeline import partition_graph  # noqa: E402
from test_conv_epilogue_tiles import _model, want_conv  # noqa: E402
from test_conv_schedules import conv_rules  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(44)

# (id, C, O, k, stride, dilation, pads, groups, act, spec dims, sizes (N, C, H, W))
DEPTHWISE = [
    ("dw3x3_s2_sym", 24, 24, 3, 2, 1, ((1, 1), (1, 1)), 24, "relu", ("N", 24, "H", "W"),
     [(1, 24, 17, 17), (3, 24, 9, 30), (1, 24, 1, 1), (1, 24, 2, 2), (0, 24, 5, 5), (1, 24, 56, 56)]),
    ("dw3x3_s2_hs_width", 16, 16, 3, 2, 1, ((1, 1), (1, 1)), 16, "hs", (2, 16, 13, "W"),
     [(2, 16, 13, 13), (2, 16, 13, 1), (2, 16, 13, 64), (2, 16, 13, 33)]),
    ("dw3x3_s2_dil2_asym", 8, 8, 3, 2, 2, ((2, 1), (0, 2)), 8, "relu", ("N", 8, "H", "W"),
     [(1, 8, 13, 19), (3, 8, 6, 5)]),
    ("dw3x3_s3_sym", 12, 12, 3, 3, 1, ((1, 1), (1, 1)), 12, "hs", ("N", 12, "H", "W"),
     [(1, 12, 25, 31), (3, 12, 4, 7), (1, 12, 1, 1)]),
    ("groups2_s2_static", 12, 6, 3, 2, 1, ((1, 1), (1, 1)), 6, "hs", (3, 12, 15, 21), [(3, 12, 15, 21)]),
    ("dw3x3_s2_static_wide", 16, 16, 3, 2, 1, ((1, 1), (1, 1)), 16, "relu", (1, 16, 29, 129), [(1, 16, 29, 129)]),
    # 5 taps a row: the phases form (`STRIDED_LANES_MAX_TAPS`), unchanged
    ("dw5x5_s2_sym", 16, 16, 5, 2, 1, ((2, 2), (2, 2)), 16, "hs", ("N", 16, "H", "W"),
     [(1, 16, 28, 28), (3, 16, 7, 13)]),
]


@pytest.mark.parametrize("on", [True, False], ids=["lanes", "phases"])
@pytest.mark.parametrize("case", DEPTHWISE, ids=[c[0] for c in DEPTHWISE])
def test_strided_depthwise_matches_numpy(case, on, conv_log, monkeypatch):
    monkeypatch.setattr(te_conv, "STRIDED_LANES", on)
    _, c, o, k, stride, dilation, pads, groups, act, dims, sizes = case
    w = (RNG.standard_normal((o, c // groups, k, k)) / k).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    m = dt.compile(_model(w, b, stride, dilation, pads, groups, act), S(dims), use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        want = want_conv(x, w, b, stride, dilation, pads, groups, act)
        got = m(x)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
    applied, failed = conv_rules(conv_log)
    assert not failed, failed
    assert applied == 1


def _strided_gather(lanes: int, stride: int, n: int):
    """y[i] = x[stride * i + 1] * 2 over n outputs, vectorized by `lanes` (a ``Ramp(base, stride, lanes)`` load); x
    is exactly as long as the last load needs."""
    length = stride * (n - 1) + 2
    x = te.placeholder((length,), "float32", name="x")
    y = te.compute((n,), lambda i: x[i * stride + 1] * tirx.const(2, "float32"), name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    (i,) = sch.get_loops(sch.get_sblock("y"))
    _, inner = sch.split(i, [None, lanes])
    sch.vectorize(inner)
    return sch.mod["main"].with_attr("global_symbol", "main"), length


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("stride", [2, 3, 4])
def test_strided_loads_rewrite(lanes, stride, monkeypatch):
    """The rewrite alone: no lane-strided load left, a shuffle per vector, and y == numpy's strided slice."""
    n = 3 * lanes
    func, length = _strided_gather(lanes, stride, n)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})
    texts = []
    rewrite = cpu_strided_loads.rewrite_strided_loads

    def recorded(f):
        out = rewrite(f)
        texts.append(out.script())
        return out
    monkeypatch.setattr(cpu_strided_loads, "rewrite_strided_loads", recorded)
    with _lowering_context():
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline=tir_pipeline())
    x = RNG.standard_normal(length).astype("float32")
    y = tvm.runtime.tensor(np.zeros(n, "float32"))
    lib["main"](tvm.runtime.tensor(x), y)
    text = "\n".join(texts)
    strides = re.findall(r"T\.Ramp\(.*?, (?:T\.int\d+\()?(\d+)\)?, (\d+)\)", text)
    assert strides and all(st == "1" for st, _ in strides) and "T.Shuffle(" in text, text
    np.testing.assert_array_equal(y.numpy(), x[1::stride][:n] * 2)


def _scheduled(target, model, spec) -> str:
    graph = partition_graph(dt.trace(model, spec))
    mod = schedule_module(legalize_and_fuse(target)(build_module(collect_regions(graph))), target)
    (func,) = [f for gv, f in mod.functions_items() if "dt_conv" in gv.name_hint]
    return func.script()


@pytest.mark.parametrize("bits, mcpu", [(256, "znver3"), (512, "znver4")], ids=["avx2", "avx512"])
def test_strided_depthwise_form(bits, mcpu, monkeypatch):
    """3x3 / 2 depthwise: no phases copy, the padded copy split (its columns ``likely``); the build's TIR pipeline
    with the rewrite. Off (or 5x5): the phases copy."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: bits)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    w = RNG.standard_normal((24, 1, 3, 3)).astype("float32")
    b = RNG.standard_normal(24).astype("float32")
    model = _model(w, b, 2, 1, ((1, 1), (1, 1)), 24, "relu")
    text = _scheduled(target, model, S(("N", 24, "H", "W")))
    assert te_conv.PHASES_BLOCK not in text and te_conv.PAD_BLOCK + te_conv.SPLIT_SUFFIX in text, text
    assert tir_pipeline() == "dyntvm_cpu:dyntvm.StridedLoadsAsShuffles"
    assert tir_pipeline(True) == "dyntvm_cpu:dyntvm.StridedLoadsAsShuffles+dyntvm.ElementAlignedArguments"
    monkeypatch.setattr(te_conv, "STRIDED_LANES", False)
    assert te_conv.PHASES_BLOCK in _scheduled(target, model, S(("N", 24, "H", "W")))
    assert tir_pipeline() == "default"
    assert tir_pipeline(True) == "dyntvm_cpu:dyntvm.ElementAlignedArguments"
    monkeypatch.setattr(te_conv, "STRIDED_LANES", True)
    w5 = RNG.standard_normal((24, 1, 5, 5)).astype("float32")
    assert te_conv.PHASES_BLOCK in _scheduled(target, _model(w5, b, 2, 1, ((2, 2), (2, 2)), 24, "relu"),
                                              S(("N", 24, "H", "W")))


# pointwise: (id, C, O, act, residual, spec dims, sizes)
POINTWISE = [
    ("c40_o240_hs_sym", 40, 240, "hs", False, ("N", 40, "H", "W"),
     [(1, 40, 14, 14), (3, 40, 7, 9), (1, 40, 1, 1), (0, 40, 5, 5), (1, 40, 16, 16), (2, 40, 3, 1)]),
    ("c48_o288_relu_sym", 48, 288, "relu", False, ("N", 48, "H", "W"), [(1, 48, 14, 14), (1, 48, 1, 2), (2, 48, 5, 7)]),
    ("c24_o120_res_sym", 24, 120, "relu", True, ("N", 24, "H", "W"), [(1, 24, 14, 14), (3, 24, 3, 5), (1, 24, 1, 1)]),
    ("c40_o240_static14", 40, 240, "hs", False, (1, 40, 14, 14), [(1, 40, 14, 14)]),
    ("c40_o240_static16", 40, 240, "hs", False, (2, 40, 16, 16), [(2, 40, 16, 16)]),
    ("c40_o96_sym", 40, 96, "relu", False, ("N", 40, "H", "W"), [(1, 40, 14, 14), (1, 40, 1, 1)]),
]


def _pointwise_model(w, b, act, residual):
    def model(x, *r):
        y = F.conv(x, w, b)
        if residual:
            y = y + F.assert_dims_equal(y, F.assert_dims_equal(y, r[0], 2, 2), 3, 3)
        if act == "relu":
            return F.relu(y)
        return y * F.minimum(F.maximum(y * np.float32(1 / 6) + np.float32(0.5), np.float32(0)), np.float32(1))
    return model


def _pointwise_want(x, w, b, r, act):
    y = np.einsum("nchw,oc->nohw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64)) + b[None, :, None, None]
    if r is not None:
        y = y + r
    return np.maximum(y, 0) if act == "relu" else y * np.clip(y / 6 + 0.5, 0, 1)


@pytest.mark.parametrize("on", [True, False], ids=["padded", "fallback"])
@pytest.mark.parametrize("case", POINTWISE, ids=[c[0] for c in POINTWISE])
def test_padded_positions_matches_numpy(case, on, conv_log, monkeypatch):
    monkeypatch.setattr(te_conv, "PADDED_POSITIONS", on)
    _, c, o, act, residual, dims, sizes = case
    w = (RNG.standard_normal((o, c, 1, 1)) / 4).astype("float32")
    b = RNG.standard_normal(o).astype("float32")
    specs = [S(dims)] + ([S((dims[0], o) + tuple(dims[2:]))] if residual else [])
    m = dt.compile(_pointwise_model(w, b, act, residual), *specs, use_cache=False)
    for shape in sizes:
        x = RNG.standard_normal(shape).astype("float32")
        r = RNG.standard_normal((shape[0], o) + shape[2:]).astype("float32") if residual else None
        got = m(x, r) if residual else m(x)
        want = _pointwise_want(x, w, b, r, act)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
    applied, failed = conv_rules(conv_log)
    assert not failed, failed
    assert applied == 1


@pytest.mark.parametrize("bits, mcpu", [(256, "znver3"), (512, "znver4")], ids=["avx2", "avx512"])
def test_padded_positions_form(bits, mcpu, monkeypatch):
    """Symbolic sizes and a static 14 x 14 plane: ``dt_conv_pwp`` on the copy (``STRIDED_BLOCK``); a static plane the
    tile divides (16 x 16: 256 positions, tiles of 16 / 32), fewer than PADDED_POSITIONS_MIN_CHANNELS output channels
    or the switch off: no copy; 48 -> 288 (above POSITION_LANES_MAX_CHANNELS) in the positions form only with it."""
    monkeypatch.setattr(te_conv, "_host_vector_bits", lambda: bits)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})

    def form(c, o, dims):
        w = RNG.standard_normal((o, c, 1, 1)).astype("float32")
        text = _scheduled(target, _pointwise_model(w, RNG.standard_normal(o).astype("float32"), "hs", False), S(dims))
        return te_conv.PWP_BLOCK in text, te_conv.STRIDED_BLOCK in text
    assert form(40, 240, ("N", 40, "H", "W")) == (True, True)
    assert form(40, 240, (1, 40, 14, 14)) == (True, True)
    assert form(40, 240, (1, 40, 16, 16)) == (True, False)
    assert form(40, 96, ("N", 40, "H", "W")) == (True, False)
    assert form(48, 288, ("N", 48, "H", "W")) == (True, True)
    monkeypatch.setattr(te_conv, "PADDED_POSITIONS", False)
    assert form(40, 240, ("N", 40, "H", "W")) == (True, False)
    assert form(48, 288, ("N", 48, "H", "W")) == (False, False)
