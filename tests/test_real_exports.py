"""Models of our own making, written as torch users write them and exported to ONNX by torch's own exporters
(TorchScript: `dynamo=False`, and dynamo: `torch.export`), with dynamic axes: each imports, compiles once and
equals onnxruntime on the same file at several sizes (`torch_models.py` has the models)."""

import numpy as np
import pytest

import dyntvm as dt
from dyntvm.codegen.build import stats

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
import torch_models  # noqa: E402  (tests/ is on sys.path)
from model_exports import export as _export  # noqa: E402

pytestmark = pytest.mark.slow


def _cnn():
    return torch_models.SmallCNN().eval(), (torch.randn(2, 3, 17, 23),), ["x"], {"x": {0: "B", 2: "H", 3: "W"}}


def _bert():
    return torch_models.Encoder().eval(), (torch.randint(1, 50, (2, 7)),), ["ids"], {"ids": {0: "B", 1: "T"}}


def _gru_step():
    return (torch_models.GRUStep().eval(), (torch.randint(0, 20, (3,)), torch.randn(3, 16)), ["tok", "h"],
            {"tok": {0: "B"}, "h": {0: "B"}})


def _inputs(name, rng, size):
    if name == "cnn":
        b, h, w = size
        return {"x": rng.standard_normal((b, 3, h, w)).astype(np.float32)}
    if name == "bert":
        b, t = size
        ids = rng.integers(1, 50, (b, t)).astype(np.int64)
        ids[:, t - t // 3:] = 0                         # padding at the end of each row: the mask matters
        return {"ids": ids}
    if name == "greedy":
        return {"h": rng.standard_normal((size, 16)).astype(np.float32)}
    return {"tok": rng.integers(0, 20, (size,)).astype(np.int64), "h": rng.standard_normal((size, 16)).astype(np.float32)}


SIZES = {"cnn": [(1, 1, 1), (2, 17, 23), (3, 8, 5), (1, 32, 31)], "bert": [(1, 1), (2, 7), (3, 12), (1, 30)],
         "gru_step": [1, 3, 8], "greedy": [1, 3, 8]}
MAKERS = {"cnn": _cnn, "bert": _bert, "gru_step": _gru_step}
CASES = [(m, e) for m in MAKERS for e in ("torchscript", "dynamo")] + [("greedy", "torchscript")]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


@pytest.mark.parametrize("name,exporter", CASES)
def test_exported_model_matches_onnxruntime(name, exporter, tmp_path, cache_dir):
    torch.manual_seed(0)
    path = str(tmp_path / f"{name}_{exporter}.onnx")
    if name == "greedy":    # a scripted loop with a data-dependent trip count (ONNX Loop); TorchScript only
        scripted = torch.jit.script(torch_models.GreedyDecoder().eval())
        _export(scripted, (torch.randn(3, 16),), path, ["h"], {"h": {0: "B"}}, dynamo=False)
    else:
        model, args, names, axes = MAKERS[name]()
        _export(model, args, path, names, axes, dynamo=exporter == "dynamo")
    graph = dt.from_onnx(path)
    before = stats.builds
    compiled = dt.compile(graph, cache_dir=cache_dir, use_cache=False)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for size in SIZES[name]:
        feeds = _inputs(name, rng, size)
        want = session.run(None, feeds)
        got = compiled(*feeds.values())       # in the model's input order
        got = got if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.shape == w.shape, (size, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{name} {exporter} at {size}")
    assert stats.builds - before == 1, "one build for every size"
