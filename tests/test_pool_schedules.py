"""CPU max pool kernel (`te_window.te_max_pool` under `cpu_schedule_pool`: the input padded per output row, the
window unrolled, the row's loop vectorized), compared with an independent numpy max pool (the input padded
with -inf / the integer minimum, a strided, dilated sliding-window view, numpy's max: NaN propagates) at odd
sizes, batch 0 / 1 / more, symbolic batch and spatial dims, strides, dilations, asymmetric padding, ceil_mode,
1 / 2 / 3 spatial axes, float and int dtypes. Each test counts the kernels the max_pool rule scheduled (and
that no rule failed)."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
from dyntvm.codegen.backends.cpu import cpu_schedule  # noqa: E402

S = dt.TensorSpec
RNG = np.random.default_rng(38)


def _out(n, k, s, d, lo, hi, ceil_mode):
    span = d * (k - 1) + 1
    out = (n + lo + hi - span) // s + 1 if not ceil_mode else -(-(n + lo + hi - span) // s) + 1
    if ceil_mode and (out - 1) * s >= n + lo:      # the last window must start inside the input or its padding
        out -= 1
    return max(out, 0)


def ref_max_pool(x, kernel, stride, dilation, pads, ceil_mode):
    n_sp = x.ndim - 2
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    outs = [_out(x.shape[2 + i], kernel[i], stride[i], dilation[i], *pads[i], ceil_mode) for i in range(n_sp)]
    if 0 in outs or x.shape[0] == 0:
        return np.full(x.shape[:2] + tuple(outs), low, x.dtype)
    span = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(outs, stride, dilation, kernel)]
    after = [max(sp - (x.shape[2 + i] + pads[i][0]), 0) for i, sp in enumerate(span)]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i][0], after[i]) for i in range(n_sp)], constant_values=low)
    wins = np.lib.stride_tricks.sliding_window_view(
        xp, [d * (k - 1) + 1 for k, d in zip(kernel, dilation)], axis=tuple(range(2, 2 + n_sp)))
    wins = wins[(slice(None), slice(None)) + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(outs, stride))
                + tuple(slice(None, None, d) for d in dilation)]
    return wins.reshape(wins.shape[:2 + n_sp] + (-1,)).max(-1)


@pytest.fixture
def pool_log(caplog):
    caplog.set_level(logging.DEBUG, logger=cpu_schedule.__name__)
    return caplog


def pool_rules(caplog) -> tuple[int, list]:
    first = [r.getMessage().splitlines()[0] for r in caplog.records]
    return sum("max_pool rule applied" in m for m in first), [m for m in first if "rule failed" in m]


# (id, kernel, stride, dilation, pads per axis, ceil_mode, spec dims, sizes, dtype)
CASES = [
    ("resnet_stem", (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False, ("N", 5, "H", "W"),
     [(1, 5, 112, 112), (2, 5, 17, 9), (0, 5, 7, 7), (1, 5, 1, 1)], "float32"),
    ("ceil_asym", (3, 2), (2, 3), (1, 1), ((1, 0), (0, 1)), True, ("N", 3, "H", "W"),
     [(2, 3, 11, 13), (1, 3, 2, 4), (3, 3, 8, 7)], "float32"),
    ("dilated_nopad", (2, 3), (1, 2), (2, 1), ((0, 0), (0, 0)), False, ("N", 4, "H", "W"),
     [(1, 4, 9, 10), (2, 4, 5, 3)], "float32"),
    ("nopad_ceil", (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), True, ("N", 2, "H", "W"),
     [(1, 2, 7, 9), (2, 2, 4, 4)], "float32"),
    ("static_1d", (5,), (3,), (1,), ((2, 1),), False, (2, 3, 31), [(2, 3, 31)], "float32"),
    ("sym_3d", (3, 3, 3), (2, 1, 2), (1, 1, 1), ((1, 1), (0, 1), (1, 0)), False, ("N", 2, "D", "H", "W"),
     [(1, 2, 5, 6, 7), (2, 2, 3, 3, 4)], "float32"),
    ("int32", (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False, ("N", 3, "H", "W"),
     [(1, 3, 9, 8), (2, 3, 4, 5)], "int32"),
    ("float16", (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), True, ("N", 3, "H", "W"),
     [(1, 3, 9, 8), (2, 3, 4, 5)], "float16"),
    ("int8_3d_static", (2, 2, 2), (2, 2, 2), (1, 1, 1), ((0, 1), (1, 0), (0, 0)), False, (2, 3, 5, 4, 6),
     [(2, 3, 5, 4, 6)], "int8"),
    ("large_window", (7, 7), (1, 1), (1, 1), ((3, 3), (3, 3)), False, ("N", 2, "H", "W"),
     [(1, 2, 10, 9)], "float32"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_max_pool_matches_numpy(case, pool_log):
    _, kernel, stride, dilation, pads, ceil_mode, dims, sizes, dtype = case
    m = dt.compile(lambda x: F.max_pool(x, kernel, stride, pads, dilation=dilation, ceil_mode=ceil_mode),
                   S(dims, dtype), use_cache=False)
    for shape in sizes:
        if dtype.startswith("int"):
            x = RNG.integers(-100, 100, shape).astype(dtype)
        else:
            x = RNG.standard_normal(shape).astype(dtype)
            if x.size:
                x.reshape(-1)[::11] = np.nan            # NaN propagates through the max
                x.reshape(-1)[5::13] = -np.inf
        want = ref_max_pool(x, kernel, stride, dilation, pads, ceil_mode)
        got = np.asarray(m(x))
        assert got.dtype == want.dtype and got.shape == want.shape, (shape, got.shape, want.shape)
        np.testing.assert_array_equal(got, want, err_msg=str(shape))
    applied, failed = pool_rules(pool_log)
    assert not failed, failed
    assert applied == 1


def test_max_pool_then_relu_is_correct(pool_log):
    """Elementwise ops after the pool, fused into its kernel: same results as numpy."""
    m = dt.compile(lambda x: F.relu(F.max_pool(x, 3, 2, 1)) * 2.0, S(("N", 4, "H", "W")), use_cache=False)
    for shape in [(1, 4, 13, 12), (2, 4, 6, 5)]:
        x = RNG.standard_normal(shape).astype("float32")
        want = np.maximum(ref_max_pool(x, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False), 0) * 2.0
        np.testing.assert_allclose(np.asarray(m(x)), want, rtol=1e-6)
    applied, failed = pool_rules(pool_log)
    assert not failed, failed
    assert applied == 1       # the relu and multiply computed per output row of the pool


def test_ref_max_pool_agrees_with_a_loop():
    """The numpy reference itself, against a plain loop over the windows (2-D, ceil_mode, dilation)."""
    x = RNG.standard_normal((1, 2, 7, 8)).astype("float32")
    k, s, d, pads = (3, 2), (2, 3), (1, 2), ((1, 0), (2, 1))
    got = ref_max_pool(x, k, s, d, pads, True)
    for oh in range(got.shape[2]):
        for ow in range(got.shape[3]):
            vals = [x[:, :, oh * s[0] + i * d[0] - pads[0][0], ow * s[1] + j * d[1] - pads[1][0]]
                    for i in range(k[0]) for j in range(k[1])
                    if 0 <= oh * s[0] + i * d[0] - pads[0][0] < 7 and 0 <= ow * s[1] + j * d[1] - pads[1][0] < 8]
            np.testing.assert_array_equal(got[:, :, oh, ow], np.max(vals, axis=0) if vals else -math.inf)
