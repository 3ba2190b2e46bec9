"""conv / max_pool / avg_pool (ir/ops_nn.py): eager, the reference interpreter and compiled code against a
plain loop-per-output-position numpy reference written here (not the vectorized kernels of
runtime/kernels_nn.py), over 1, 2 and 3 spatial axes, with a symbolic batch and symbolic spatial sizes
(batch 0 and 1, spatial sizes giving a single output position), groups (depthwise too), strides, dilations,
asymmetric padding, bias, ceil_mode, count_include_pad, NaN, float16 / float64 / integer dtypes; bad
arguments and too-small inputs raise dyntvm errors naming the op."""
from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

S = dt.TensorSpec
RNG = np.random.default_rng(0)


# ------------------------------------------------------------------------- the loop references
def _out_size(n, k, s, d, lo, hi, ceil_mode):
    span = d * (k - 1) + 1
    if not ceil_mode:
        return (n + lo + hi - span) // s + 1
    o = math.ceil((n + lo + hi - span) / s) + 1
    return o - 1 if (o - 1) * s >= n + lo else o        # the last window must start before n + lo


def _taps(o, kernel, strides, dilations, pads):
    """Input coordinates of the taps of output position `o` (a tuple per tap)."""
    return itertools.product(*[[oi * s - lo + j * d for j in range(k)]
                               for oi, k, s, d, (lo, _) in zip(o, kernel, strides, dilations, pads)])


def ref_conv(x, w, b, strides, pads, dilations, groups):
    n, c = x.shape[:2]
    o_ch, cg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    out = [_out_size(sz, k, s, d, lo, hi, False)
           for sz, k, s, d, (lo, hi) in zip(x.shape[2:], kernel, strides, dilations, pads)]
    y = np.zeros((n, o_ch, *out), np.float64)
    per = o_ch // groups
    for o in itertools.product(*map(range, out)):
        for t, tap in zip(itertools.product(*map(range, kernel)), _taps(o, kernel, strides, dilations, pads)):
            if all(0 <= p < sz for p, sz in zip(tap, x.shape[2:])):
                v = x[(slice(None), slice(None)) + tap].astype(np.float64)            # [n, c]
                for g in range(groups):
                    y[(slice(None), slice(g * per, (g + 1) * per)) + o] += \
                        v[:, g * cg:(g + 1) * cg] @ w[(slice(g * per, (g + 1) * per), slice(None)) + t].T
    if b is not None:
        y += b.reshape((-1,) + (1,) * len(out))
    return y.astype(x.dtype)


def ref_pool(x, kind, kernel, strides, pads, dilations, ceil_mode=False, count_include_pad=False):
    spatial = x.shape[2:]
    out = [_out_size(sz, k, s, d, lo, hi, ceil_mode)
           for sz, k, s, d, (lo, hi) in zip(spatial, kernel, strides, dilations, pads)]
    y = np.zeros(x.shape[:2] + tuple(out), x.dtype)
    for o in itertools.product(*map(range, out)):
        taps = list(_taps(o, kernel, strides, dilations, pads))
        inside = [t for t in taps if all(0 <= p < sz for p, sz in zip(t, spatial))]
        vals = np.stack([x[(slice(None), slice(None)) + t] for t in inside], -1) if inside else None
        if kind == "max":
            low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
            y[(...,) + o] = low if vals is None else vals.max(-1)
            continue
        counted = len(inside) if not count_include_pad else sum(
            all(-lo <= p < sz + hi for p, sz, (lo, hi) in zip(t, spatial, pads)) for t in taps)
        total = 0 if vals is None else vals.astype(np.float64).sum(-1)
        with np.errstate(all="ignore"):
            y[(...,) + o] = np.divide(total, counted)
    return y


def _close(got, want, tol):
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)


def _check_all(fn, specs, inputs_list, refs, tol=1e-5):
    """eager, the reference interpreter and the compiled model each equal `refs(*inputs)`."""
    graph = dt.trace(fn, *specs)
    model = dt.compile(fn, *specs)
    for inputs in inputs_list:
        want = refs(*inputs)
        for got in (fn(*inputs), dt.run_reference(graph, *inputs), model(*inputs)):
            for g, w in zip(got, want):
                _close(g, w, tol)
    return graph


# ------------------------------------------------------------------------------------- conv
@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_conv_symbolic_batch_and_spatial(nsp):
    c = 4
    w1 = RNG.standard_normal((6, 2) + (3,) * nsp).astype("float32")            # 2 groups
    w2 = RNG.standard_normal((8, 1) + (2,) * nsp).astype("float32")            # depthwise, multiplier 2
    w3 = RNG.standard_normal((5, c) + (1,) * nsp).astype("float32")            # 1x1
    b1 = RNG.standard_normal(6).astype("float32")
    strides, dil = (2,) + (1,) * (nsp - 1), (1,) + (2,) * (nsp - 1)
    pads = ((1, 2),) + ((0, 1),) * (nsp - 1)

    def fn(x):
        return (F.conv(x, w1, b1, stride=strides, padding=pads, dilation=dil, groups=2),
                F.conv(x, w2, padding=1, groups=c), F.conv(x, w3, stride=2))

    def refs(x):
        return (ref_conv(x, w1, b1, strides, pads, dil, 2),
                ref_conv(x, w2, None, (1,) * nsp, ((1, 1),) * nsp, (1,) * nsp, c),
                ref_conv(x, w3, None, (2,) * nsp, ((0, 0),) * nsp, (1,) * nsp, 1))
    spec = S(("N", c) + ("H",) * nsp)
    # H = 4: one output position along the dilated axes (4 + 0 + 1 - 5 = 0)
    sizes = [(0, 5), (1, 4), (2, 5), (3, 8)] if nsp < 3 else [(0, 4), (1, 4), (2, 6)]
    g = _check_all(fn, [spec], [(RNG.standard_normal((n, c) + (h,) * nsp).astype("float32"),) for n, h in sizes], refs)
    assert "N" in str(g.outputs[0].type) and "H" in str(g.outputs[0].type)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_conv_dtypes(dtype):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(dtype)
    b = RNG.standard_normal(4).astype(dtype)

    def fn(x):
        return (F.conv(x, w, b, padding=1),)
    xs = [(RNG.standard_normal((n, 3, 5, 6)).astype(dtype),) for n in (1, 2)]
    _check_all(fn, [S(("N", 3, 5, 6), dtype)], xs, lambda x: (ref_conv(x, w, b, (1, 1), ((1, 1),) * 2, (1, 1), 1),),
               tol=2e-2 if dtype == "float16" else 1e-10)


# ------------------------------------------------------------------------------------- pools
@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_pools_symbolic_batch_and_spatial(nsp):
    k3, s2, p1 = (3,) * nsp, (2,) * nsp, ((1, 0),) + ((1, 1),) * (nsp - 1)
    d2 = (2,) * nsp

    def fn(x):
        return (F.max_pool(x, 3, 2, p1, ceil_mode=True),
                F.max_pool(x, 2, 1, 0, dilation=2),
                F.avg_pool(x, 3, 2, p1, ceil_mode=True, count_include_pad=False),
                F.avg_pool(x, 3, 2, p1, ceil_mode=True, count_include_pad=True),
                F.avg_pool(x, 2, 3, 1, dilation=2, count_include_pad=False))

    def refs(x):
        return (ref_pool(x, "max", k3, s2, p1, (1,) * nsp, True),
                ref_pool(x, "max", (2,) * nsp, (1,) * nsp, ((0, 0),) * nsp, d2),
                ref_pool(x, "avg", k3, s2, p1, (1,) * nsp, True, False),
                ref_pool(x, "avg", k3, s2, p1, (1,) * nsp, True, True),
                ref_pool(x, "avg", (2,) * nsp, (3,) * nsp, ((1, 1),) * nsp, d2, False, False))
    sizes = [(0, 4), (1, 3), (2, 5), (1, 6), (3, 9)] if nsp < 3 else [(0, 4), (1, 3), (2, 5), (1, 6)]
    inputs = []
    for n, h in sizes:
        x = RNG.standard_normal((n, 3) + (h,) * nsp).astype("float32")
        if x.size:
            x.reshape(-1)[::7] = np.nan                  # NaN propagates through max and mean
        inputs.append((x,))
    _check_all(fn, [S(("N", 3) + ("H",) * nsp)], inputs, refs)


def test_a_window_with_no_tap_inside_the_input():
    """Dilated windows can skip the input: max gives -inf, a mean over no counted tap NaN (0 / 0)."""
    x = np.arange(6, dtype="float32").reshape(1, 2, 3)

    def fn(x):
        return F.max_pool(x, 2, 1, 3, dilation=7), F.avg_pool(x, 2, 1, 3, dilation=7, count_include_pad=False)
    _check_all(fn, [S((1, 2, "W"))], [(x,)],
               lambda x: (ref_pool(x, "max", (2,), (1,), ((3, 3),), (7,)),
                          ref_pool(x, "avg", (2,), (1,), ((3, 3),), (7,))))
    assert np.isneginf(fn(x)[0]).any() and np.isnan(fn(x)[1]).any()


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "float16", "float64"])
def test_pool_dtypes(dtype):
    floats = np.dtype(dtype).kind == "f"
    x = RNG.standard_normal((2, 3, 7, 6)) * 50
    x = x.astype(dtype) if floats else np.clip(x, np.iinfo(dtype).min, np.iinfo(dtype).max).astype(dtype)

    def fn(x):
        out = [F.max_pool(x, (3, 2), (2, 1), ((1, 1), (0, 1)), ceil_mode=True)]
        return out + ([F.avg_pool(x, 3, 2, 1)] if floats else [])

    def refs(x):
        out = [ref_pool(x, "max", (3, 2), (2, 1), ((1, 1), (0, 1)), (1, 1), True)]
        return out + ([ref_pool(x, "avg", (3, 3), (2, 2), ((1, 1),) * 2, (1, 1), False, True)] if floats else [])
    _check_all(fn, [S(("N", 3, 7, 6), dtype)], [(x,), (x[:1],)], refs, tol=1e-2 if dtype == "float16" else 1e-6)


# ------------------------------------------------------------------------------------- errors
def test_inputs_smaller_than_the_kernel_raise_everywhere():
    w = np.ones((2, 1, 3, 3), "float32")

    def fn(x):
        return F.conv(x, w), F.max_pool(x, 3, 1), F.avg_pool(x, 2, 2, dilation=3)
    x = np.ones((1, 1, 2, 9), "float32")
    with pytest.raises(dt.TraceError, match=r"conv: spatial axis 0 of float32\[1,1,2,9\].*smaller than the "
                                            r"dilated kernel \(3 positions\)"):
        fn(x)
    model = dt.compile(fn, S(("N", 1, "H", 9)))
    assert [o.shape for o in model(np.ones((2, 1, 4, 9), "float32"))] == [(2, 2, 2, 7), (2, 1, 2, 7), (2, 1, 1, 3)]
    for h, op in ((3, "avg_pool"), (2, "conv")):      # only the pool's input is too small; the conv's too
        with pytest.raises(dt.ExecutionError, match=rf"{op}: spatial axis 0 of size {h} padded by \(0, 0\) is "
                                                    "smaller than the dilated kernel"):
            model(np.ones((1, 1, h, 9), "float32"))


def test_bad_arguments_are_trace_errors_naming_the_op():
    x = np.ones((1, 4, 5, 5), "float32")
    w = np.ones((6, 2, 3, 3), "float32")
    for bad, msg in [(lambda: F.conv(x, w), r"conv: data float32\[1,4,5,5\] has 4 channels, but the weight .* takes 2"),
                     (lambda: F.conv(x, w, groups=3), "conv: 6 output channels .* do not split into 3 groups"),
                     (lambda: F.conv(x, w, groups=2, stride=0), r"conv: strides must be integers >= 1"),
                     (lambda: F.conv(x, w, groups=2, padding=-1), "conv: pads must be >= 0"),
                     (lambda: F.conv(x, w, groups=2, dilation=(1, 1, 1)), "conv: dilation needs one entry per "
                                                                          r"spatial axis \(2\)"),
                     (lambda: F.conv(x[0], w), r"conv: x must have axes N, C and 1 to 3 spatial axes"),
                     (lambda: F.conv(x.astype("int32"), w.astype("int32"), groups=2), "conv: float tensors only"),
                     (lambda: F.conv(x, w.astype("float64"), groups=2), "conv: data and weight dtypes differ"),
                     (lambda: F.conv(x, w, np.ones(5, "float32"), groups=2), r"conv: bias must be 1-d with one "
                                                                             r"float32 value per output channel \(6\)"),
                     (lambda: F.conv(x, w[:, :, :, :, None], groups=2), "conv: 2 spatial axes need a weight of rank 4"),
                     (lambda: F.max_pool(x, 2, stride=1.5), "max_pool: strides must be an integer"),
                     (lambda: F.max_pool(x > 0, 2), "max_pool: numeric tensors only, got bool"),
                     (lambda: F.avg_pool(x.astype("int8"), 2), "avg_pool: float tensors only"),
                     (lambda: F.avg_pool(x, 2, ceil_mode=1), "avg_pool: ceil_mode must be a bool"),
                     (lambda: F.avg_pool(x, (2, 2, 2)), r"avg_pool: kernel_size needs one entry per spatial axis")]:
        with pytest.raises(dt.TraceError, match=msg):
            bad()
    with pytest.raises(dt.TraceError, match="conv: the weight's shape must be static"):
        dt.trace(F.conv, S((1, 4, 5, 5)), S(("O", 4, 3, 3)))
    # a symbolic channel count is checked when it runs
    model = dt.compile(lambda x: F.conv(x, w, groups=2), S((1, "C", 5, 5)))
    assert model(x).shape == (1, 6, 3, 3)
    with pytest.raises(dt.ExecutionError, match="conv: the data has 3 channels, the weight .* takes 4"):
        model(np.ones((1, 3, 5, 5), "float32"))


@pytest.mark.skipif(not any(os.access(os.path.join(d, "nvcc"), os.X_OK) for d in
                            os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/cuda/bin"]),
                    reason="CUDA builds need nvcc")
def test_conv_and_pools_build_cuda_device_code(tmp_path):
    """dlight schedules the Relax conv and the pool TE computes (static and symbolic spatial sizes: the run-time
    size check takes its device form); running them needs a GPU (tests/test_cuda.py's execution tests)."""
    w = RNG.standard_normal((8, 2, 3, 3)).astype("float32")

    def fn(x):
        return (F.conv(x, w, stride=2, padding=1, groups=2), F.max_pool(x, 3, 2, 1, ceil_mode=True),
                F.avg_pool(x, 3, 2, 1, dilation=2, count_include_pad=False))
    for spec in [("N", 4, 16, 16), ("N", 4, "H", "W")]:
        model = dt.compile(fn, S(spec), target="cuda", cache_dir=str(tmp_path))
        assert model.target == "cuda"
