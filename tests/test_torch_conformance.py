"""`from_torch` against torch's core ATen op set (`torch.Tag.core`): which ops have a converter, the count the docs
give never falls, and a sample of converted ops equals torch eager (each converter run in dyntvm's eager mode on
numpy arrays: no compile)."""
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dyntvm.frontend import torch_export  # noqa: E402,F401  (registers every converter)
from dyntvm.frontend.torch_ops import CONVERTERS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: the figures README.md and docs/torch.md give; raise them when converters are added, never lower them
DOCUMENTED_CONVERTED, DOCUMENTED_CORE = 142, 193


def core_aten_ops() -> list[str]:
    """Every overload of torch's core ATen op set, as `str(op)` ("aten.add.Tensor": the converters' keys). The
    dispatcher's list of every registered op, not `dir(torch.ops.aten)`, which holds only the packets touched."""
    ops = set()
    for qualname in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualname.partition("::")
        if ns != "aten":
            continue
        name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        if torch.Tag.core in op.tags:
            ops.add(str(op))
    return sorted(ops)


def test_converted_core_aten_count_never_falls():
    core = core_aten_ops()
    converted = [op for op in core if op in CONVERTERS]
    missing = [op for op in core if op not in CONVERTERS]
    assert len(converted) >= DOCUMENTED_CONVERTED, f"converters lost for core ATen ops; missing now: {missing}"
    assert len(core) >= DOCUMENTED_CORE, f"torch's core ATen op set shrank to {len(core)}: update the docs"


def test_docs_give_the_counts():
    figure = f"{DOCUMENTED_CONVERTED} of the {DOCUMENTED_CORE}"
    for doc in ("README.md", "docs/torch.md"):
        assert figure in (ROOT / doc).read_text(), f"{doc} should say {figure!r} core ATen ops are converted"
    listed = set(re.findall(r"`(aten\.[\w.]+)`", (ROOT / "docs/torch.md").read_text()))
    missing = {op for op in core_aten_ops() if op not in CONVERTERS}
    assert missing <= listed, f"docs/torch.md does not list these unconverted ops: {sorted(missing - listed)}"


rng = np.random.default_rng(0)
f32 = lambda *s, lo=-2.0, hi=2.0: rng.uniform(lo, hi, s).astype(np.float32)  # noqa: E731

#: op -> argument lists (numpy arrays and Python values); torch eager gets the same as tensors
SAMPLES = {
    "aten.add.Tensor": [f32(3, 4), f32(4)], "aten.sub.Tensor": [f32(3, 4), f32(3, 1)],
    "aten.mul.Tensor": [f32(2, 3), f32(2, 3)], "aten.div.Tensor": [f32(5), f32(5, lo=0.5)],
    "aten.maximum.default": [f32(4), f32(4)], "aten.pow.Tensor_Scalar": [f32(6, lo=0.1), 3],
    "aten.exp.default": [f32(7)], "aten.tanh.default": [f32(7)], "aten.sigmoid.default": [f32(7)],
    "aten.sinh.default": [f32(7)], "aten.cosh.default": [f32(7)], "aten.asinh.default": [f32(7, lo=-9, hi=9)],
    "aten.acosh.default": [f32(7, lo=1.1, hi=9)], "aten.atanh.default": [f32(7, lo=-0.9, hi=0.9)],
    "aten.log2.default": [f32(7, lo=0.1, hi=9)], "aten.log10.default": [f32(7, lo=0.1, hi=9)],
    "aten.trunc.default": [f32(9, lo=-5, hi=5)], "aten.elu.default": [f32(9)],
    "aten.isinf.default": [np.array([1.0, np.inf, -np.inf, np.nan], np.float32)],
    "aten.logical_xor.default": [np.array([1, 0, 1, 0], bool), np.array([1, 1, 0, 0], bool)],
    "aten.sum.dim_IntList": [f32(3, 4, 5), [1, 2], True], "aten.amax.default": [f32(3, 4), [0]],
    "aten._softmax.default": [f32(3, 5), -1, False], "aten._log_softmax.default": [f32(3, 5), 1, False],
    "aten.permute.default": [f32(2, 3, 4), [2, 0, 1]], "aten.cat.default": [[f32(2, 3), f32(1, 3)], 0],
    "aten.slice.Tensor": [f32(6, 3), 0, 1, 100, 2], "aten.select.int": [f32(4, 3), 1, -1],
    "aten.index_select.default": [f32(5, 3), 0, np.array([4, 0, 0], np.int64)],
    "aten.repeat.default": [f32(2, 3), [2, 1, 2]], "aten.flip.default": [f32(3, 4), [0, 1]],
    "aten.constant_pad_nd.default": [f32(2, 3), [1, 2], 0.5], "aten.where.self": [f32(4) > 0, f32(4), f32(4)],
    "aten.mm.default": [f32(3, 4), f32(4, 2)], "aten.bmm.default": [f32(2, 3, 4), f32(2, 4, 5)],
    "aten.cumsum.default": [f32(3, 4), 1], "aten.clamp.default": [f32(8), -0.5, 0.5],
    "aten._native_batch_norm_legit_no_training.default": [f32(2, 3, 4, 4), f32(3), f32(3), f32(3),
                                                          f32(3, lo=0.5), 0.1, 1e-5],
    "aten._adaptive_avg_pool2d.default": [f32(2, 3, 5, 4), [1, 1]],
    "aten.gather.default": [f32(3, 4), 1, np.array([[0, 3], [1, 1], [2, 0]], np.int64)],
}


def _torch(v):
    if isinstance(v, np.ndarray):
        return torch.from_numpy(v.copy())
    return [_torch(x) for x in v] if isinstance(v, list) and v and isinstance(v[0], np.ndarray) else v


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("op", sorted(SAMPLES))
def test_converted_op_equals_torch_eager(op):
    args = SAMPLES[op]
    assert op in CONVERTERS, f"{op}: no converter"
    _, name, overload = op.split(".")
    want = _first(getattr(getattr(torch.ops.aten, name), overload)(*[_torch(a) for a in args])).numpy()
    got = np.asarray(_first(CONVERTERS[op](*args)))
    assert got.shape == want.shape, (op, got.shape, want.shape)
    np.testing.assert_allclose(got.astype(want.dtype) if want.dtype == bool else got, want, rtol=1e-5, atol=1e-6,
                               err_msg=op)
