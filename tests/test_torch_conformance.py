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
    # the review of this stop: bitwise ops of bools, hardtanh's default bounds, unique rows, any / all of none
    "aten.bitwise_and.Tensor": [np.array([1, 0, 1, 0], bool), np.array([1, 1, 0, 0], bool)],
    "aten.bitwise_or.Tensor": [np.array([1, 0, 1, 0], bool), np.array([1, 1, 0, 0], bool)],
    "aten.bitwise_xor.Tensor": [np.array([1, 0, 1, 0], bool), np.array([1, 1, 0, 0], bool)],
    "aten.bitwise_not.default": [np.array([1, 0], bool)],
    "aten.hardtanh.default": [f32(9, lo=-3, hi=3)],
    "aten.unique_dim.default": [np.array([[1, 2], [0, 5], [1, 2], [0, 5], [3, 3]], np.int64), 0, True, True, True],
    "aten._unique2.default": [np.array([3, 1, 3, 2, 1], np.int64), True, True, True],
    "aten.any.dim": [np.zeros((3, 0), np.float32), 1], "aten.all.dim": [np.zeros((3, 0), np.float32), 1],
    "aten.any.default": [np.zeros((0,), np.float32)], "aten.all.default": [np.zeros((0,), np.float32)],
}
#: the review's integer / bool forms, under keys of their own (op name + "#" + form)
SAMPLES.update({"aten.cumsum.default#bool": [np.array([[1, 0, 1], [0, 1, 1]], bool), 1],
                "aten.cumsum.default#int32": [np.array([2 ** 30, 2 ** 30, 5], np.int32), 0]})


def _torch(v):
    if isinstance(v, np.ndarray):
        return torch.from_numpy(v.copy())
    return [_torch(x) for x in v] if isinstance(v, list) and v and isinstance(v[0], np.ndarray) else v


def _all_outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("op", sorted(SAMPLES))
def test_converted_op_equals_torch_eager(op):
    """Every output, its dtype and shape and values, equal torch eager's."""
    args = SAMPLES[op]
    op = op.split("#")[0]
    assert op in CONVERTERS, f"{op}: no converter"
    _, name, overload = op.split(".")
    wants = [w.numpy() for w in _all_outputs(getattr(getattr(torch.ops.aten, name), overload)(*[_torch(a) for a in args]))]
    gots = _all_outputs(CONVERTERS[op](*args))
    assert len(gots) == len(wants), (op, len(gots), len(wants))
    for k, (got, want) in enumerate(zip(gots, wants)):
        if got is None:         # an output the converter does not make: only where torch's is empty (unused)
            assert want.size == 0, (op, k, "no output where torch has", want)
            continue
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (op, k, got.dtype, got.shape, want.dtype, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{op} output {k}")


@pytest.mark.parametrize("op", ["aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor",
                                "aten.bitwise_not.default"])
def test_bitwise_ops_of_integers_are_refused_by_name(op):
    """dyntvm has no bitwise ops on integers: refused, never computed as the logical op (6 & 3 is 2, not True)."""
    from dyntvm.frontend.torch_ops import TorchImportError
    ints = [np.array([6, 5], np.int64)] * (1 if op.endswith("not.default") else 2)
    with pytest.raises(TorchImportError, match=op.split(".")[1]):
        CONVERTERS[op](*ints)
