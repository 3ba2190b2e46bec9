"""The small models of our own making (`torch_models.py`) as `ModelCase`s: a torchvision-style CNN, a BERT-style
encoder, a GRU decoder step (both exporters) and a scripted greedy decoder (an ONNX `Loop`; TorchScript only).

`test_real_exports.py` runs them; `benchmarks/bench_onnx_models.py` times them against onnxruntime with the
other `zoo_*.py` suites. Sizes include 1 for every dynamic dim."""
import numpy as np

import torch
import torch_models
from model_exports import ModelCase


def _cnn():
    return torch_models.SmallCNN().eval(), (torch.randn(2, 3, 17, 23),), ["x"], {"x": {0: "B", 2: "H", 3: "W"}}


def _cnn_inputs(rng, size):
    b, h, w = size
    return {"x": rng.standard_normal((b, 3, h, w)).astype(np.float32)}


def _bert():
    return torch_models.Encoder().eval(), (torch.randint(1, 50, (2, 7)),), ["ids"], {"ids": {0: "B", 1: "T"}}


def _bert_inputs(rng, size):
    b, t = size
    ids = rng.integers(1, 50, (b, t)).astype(np.int64)
    ids[:, t - t // 3:] = 0                         # padding at the end of each row: the mask matters
    return {"ids": ids}


def _gru_step():
    return (torch_models.GRUStep().eval(), (torch.randint(0, 20, (3,)), torch.randn(3, 16)), ["tok", "h"],
            {"tok": {0: "B"}, "h": {0: "B"}})


def _gru_step_inputs(rng, size):
    return {"tok": rng.integers(0, 20, (size,)).astype(np.int64), "h": rng.standard_normal((size, 16)).astype(np.float32)}


def _greedy():
    """A scripted loop with a data-dependent trip count (ONNX `Loop`)."""
    return torch.jit.script(torch_models.GreedyDecoder().eval()), (torch.randn(3, 16),), ["h"], {"h": {0: "B"}}


def _greedy_inputs(rng, size):
    return {"h": rng.standard_normal((size, 16)).astype(np.float32)}


CASES = [
    ModelCase("small_cnn", _cnn, _cnn_inputs, [(1, 1, 1), (2, 17, 23), (3, 8, 5), (1, 32, 31)]),
    ModelCase("small_bert", _bert, _bert_inputs, [(1, 1), (2, 7), (3, 12), (1, 30)]),
    ModelCase("gru_step", _gru_step, _gru_step_inputs, [1, 3, 8]),
    ModelCase("greedy_loop", _greedy, _greedy_inputs, [1, 3, 8], exporters=("torchscript",)),   # torch.jit.script
]
