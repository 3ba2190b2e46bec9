"""Window ops' output dims as plain vars (`converters/window_dims.py`, issue 24) next to the code that sizes a tensor
by ANOTHER map's size: an FPN's top-down path (torchvision's detectors) resizes a coarse map to the finer map's
``Shape -> Slice -> Concat`` size and adds it to the finer map. The Resize's ``arange`` is then sized by a window
var that none of its inputs carries; fused, FuseTIR failed ("All shape inputs are expected to be single tirx var",
`fusion_guard.sized_by_cast_vars`). Built as ONNX by hand (no torch), compiled once, compared with numpy at several
sizes per symbolic dim (1 included, odd sizes)."""
import numpy as np
import pytest

import dyntvm as dt

onnx = pytest.importorskip("onnx")
pytest.importorskip("tvm")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_conv_schedules import ref_conv  # noqa: E402

RNG = np.random.default_rng(24)
C = 6


def _w(o, c, k):
    return (RNG.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype("float32")


W1, B1 = _w(C, 3, 3), RNG.standard_normal(C).astype("float32")
W2, B2 = _w(C, C, 3), RNG.standard_normal(C).astype("float32")
WL, BL = _w(C, C, 1), RNG.standard_normal(C).astype("float32")


def _fpn_model(pool: bool):
    """a = relu(conv3x3/2(x)); b = relu(conv3x3/2(a)) (or maxpool 3x3/2 of a); up = Resize(b, sizes = [N, C] of b
    + [H, W] of a, nearest, asymmetric, floor); out = conv1x1(a) + up."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["a"]),
        (n("MaxPool", ["a"], ["b"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]) if pool else
         n("Conv", ["a", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1])),
        *([] if pool else [n("Relu", ["c2"], ["b"])]),
        n("Shape", ["b"], ["sb"]), n("Slice", ["sb", "zero", "two"], ["nc"]),
        n("Shape", ["a"], ["sa"]), n("Slice", ["sa", "two", "four"], ["hw"]),
        n("Concat", ["nc", "hw"], ["sizes"], axis=0),
        n("Resize", ["b", "", "", "sizes"], ["up"], mode="nearest", coordinate_transformation_mode="asymmetric",
          nearest_mode="floor"),
        n("Conv", ["a", "wl", "bl"], ["lat"]),
        n("Add", ["lat", "up"], ["y"]),
    ]
    consts = {"w1": W1, "b1": B1, "w2": W2, "b2": B2, "wl": WL, "bl": BL, "zero": np.array([0], np.int64),
              "two": np.array([2], np.int64), "four": np.array([4], np.int64)}
    g = helper.make_graph(nodes, "fpn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _maxpool(x):
    """3x3 windows, stride 2, padding 1 (padding never wins: -inf)."""
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
    ho, wo = (x.shape[2] - 1) // 2 + 1, (x.shape[3] - 1) // 2 + 1
    out = np.full(x.shape[:2] + (ho, wo), -np.inf)
    for i in range(3):
        for j in range(3):
            out = np.maximum(out, xp[:, :, i:i + 2 * ho:2, j:j + 2 * wo:2])
    return out


def _reference(x, pool: bool):
    p1, p0 = [(1, 1), (1, 1)], [(0, 0), (0, 0)]
    a = np.maximum(ref_conv(x, W1, (2, 2), (1, 1), p1, 1) + B1.reshape(1, C, 1, 1), 0)
    b = _maxpool(a) if pool else np.maximum(ref_conv(a, W2, (2, 2), (1, 1), p1, 1) + B2.reshape(1, C, 1, 1), 0)
    # nearest, asymmetric, floor: source index floor(i / (out / in)) (ONNX's arithmetic), clamped to the axis
    rows, cols = (np.minimum(np.floor(np.arange(o) / (np.float64(o) / n)).astype(np.int64), n - 1)
                  for o, n in ((a.shape[2], b.shape[2]), (a.shape[3], b.shape[3])))
    up = b[:, :, rows][:, :, :, cols]
    return ref_conv(a, WL, (1, 1), (1, 1), p0, 1) + BL.reshape(1, C, 1, 1) + up


SIZES = [(1, 3, 1, 1), (2, 3, 17, 9), (1, 3, 32, 32), (1, 3, 5, 64), (3, 3, 23, 2)]


@pytest.mark.parametrize("pool", [False, True], ids=["conv", "maxpool"])
def test_resize_to_a_window_outputs_size_matches_numpy(pool):
    """Compiled once with symbolic N, H, W; at each size == numpy (the build failed in FuseTIR before)."""
    m = dt.compile(dt.from_onnx(_fpn_model(pool)), use_cache=False)
    for shape in SIZES:
        x = RNG.standard_normal(shape).astype("float32")
        got, want = np.asarray(m(x)), _reference(x, pool)
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))


def test_kernel_sized_by_a_known_value_match_cast_stays_out_of_fusion():
    """The same FuseTIR failure without the window converters: ``m`` bound by a match_cast of a value whose size
    Relax knows (``(n - 1) // 2 + 1``), then an arange of m (no input carries m) fused with a multiply.
    `fusion_guard.sized_by_cast_vars` finds the arange; the module builds (it failed in FuseTIR) and runs."""
    import tvm
    from tvm import relax, te, tirx

    from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu
    from dyntvm.codegen.fusion_guard import sized_by_cast_vars

    def module():
        n, m = tirx.Var("n", "int64"), tirx.Var("m", "int64")
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType([n], "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit_te(lambda a: te.compute([tirx.floordiv(n - 1, 2) + 1], lambda i: a[i * 2], name="every"),
                               x, primfunc_name_hint="every_2nd")
                z = bb.match_cast(y, relax.TensorType([m], "float32"))
                r = bb.emit_te(lambda: te.compute([m], lambda i: i.astype("float32"), name="ar"),
                               primfunc_name_hint="arange_m")
                r2 = bb.emit_te(lambda a: te.compute([m], lambda i: a[i] * 2.0, name="twice"), r)
                out = bb.emit_output(relax.Tuple([z, r2]))
            bb.emit_func_output(out)
        return bb.get()

    assert {g.name_hint for g in sized_by_cast_vars(module()["main"])} == {"arange_m"}
    vm = relax.VirtualMachine(build_cpu(module()), tvm.cpu())
    for size in (1, 7, 8):
        x = RNG.standard_normal(size).astype("float32")
        z, r = vm["main"](tvm.runtime.tensor(x))
        np.testing.assert_array_equal(z.numpy(), x[::2])
        np.testing.assert_array_equal(r.numpy(), 2.0 * np.arange(len(x[::2]), dtype="float32"))


WG = (np.random.default_rng(3).standard_normal((2, 2, 3, 3)) * 0.3).astype("float32")


def _gate(x):
    """max_pool 2x2/2 (size H // 2) gated by the global mean of a 3x3/2 conv (size (H + 1) // 2): two window
    sizes in one region, and the fused chain {max_pool, relu, multiply} spans the conv's sizes."""
    from dyntvm import F
    p = F.max_pool(x, 2, 2)
    c = F.conv(x, WG, stride=2, padding=1)
    return F.relu(p) * F.sigmoid(F.mean(c, axis=(2, 3), keepdims=True))


def _gate_reference(x):
    n, ch, h, w = x.shape
    p = x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, ch, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    c = ref_conv(x, WG, (2, 2), (1, 1), [(1, 1), (1, 1)], 1)
    g = 1 / (1 + np.exp(-c.mean(axis=(2, 3), keepdims=True)))
    return np.maximum(p, 0) * g


def test_two_window_sizes_in_one_fused_chain_match_numpy():
    """Review 37: the sizes' bindings define vars only types use; FuseOps re-sorted the dataflow block by data edges
    and put them after the kernels they size (Relax's VMShapeLower: "... has not been computed"). They are moved
    in front of the dataflow block (`window_dims.hoist_window_sizes`)."""
    m = dt.compile(_gate, dt.TensorSpec(("N", 2, "H", "W")))
    rng = np.random.default_rng(0)
    for shape in [(1, 2, 2, 2), (1, 2, 4, 6), (2, 2, 5, 7), (3, 2, 9, 4)]:
        x = rng.standard_normal(shape).astype("float32")
        np.testing.assert_allclose(m(x), _gate_reference(x), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(m(x), _gate(x), rtol=1e-5, atol=1e-6)
