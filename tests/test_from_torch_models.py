"""Real models through `dt.from_torch` (random weights; the builders of the ONNX real-model suite,
tests/zoo_torchvision.py and tests/zoo_hf.py): each imported, compiled once and compared with torch eager at 3
sizes of its dynamic dims. A model that cannot run is listed in CANNOT with the exact reason, and its test
expects that failure (so a fixed model shows up); none is skipped silently."""
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dyntvm as dt  # noqa: E402
from torch.export import Dim  # noqa: E402

from helpers import assert_same  # noqa: E402
import torchvision_cpu  # noqa: E402

torchvision_cpu.load()           # before transformers, which imports torchvision
import zoo_hf  # noqa: E402
import zoo_torchvision  # noqa: E402


def _classifier(builder):
    def build():
        model, args, _, _ = zoo_torchvision._classifier(builder)()
        # torch.export specialises on a pooled size of 1 (its guards `1 + (H - 1) // 32 != 1`): H, W >= 33
        return model, args, {"x": {0: Dim("B", max=64), 2: Dim("H", min=33, max=1024),
                                   3: Dim("W", min=33, max=1024)}}
    return build


def _text_model(make):
    def build():
        model, args, _, _ = make()
        batch, seq = Dim("batch", max=64), Dim("seq", max=64)         # seq <= max_position_embeddings
        return model, args, {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    return build


IMAGE_SIZES, TEXT_SIZES = [(1, 64, 64), (2, 96, 80), (1, 33, 47)], [(1, 1), (2, 7), (3, 12)]   # B x H x W, B x S


def _images(rng, size):
    return list(zoo_torchvision._images(rng, size).values())


def _text(rng, size):
    return list(zoo_hf._text_inputs(rng, size).values())        # ids and a mask with padded rows


def _detector(builder):
    """The detector as the ONNX real-model suite builds it (its own small sizes and thresholds)."""
    make = next(case for case in zoo_torchvision.CASES if case.name == builder).make

    def build():
        model, args, _, axes = make()
        return model, args, axes
    return build


def _image(rng, size):
    return list(zoo_torchvision._image(rng, size).values())


#: name -> (builder, sizes, inputs(rng, size) -> list of arrays)
MODELS = {
    "resnet18": (_classifier("resnet18"), IMAGE_SIZES, _images),
    "mobilenet_v3_small": (_classifier("mobilenet_v3_small"), IMAGE_SIZES, _images),
    "bert": (_text_model(zoo_hf.make_bert), TEXT_SIZES, _text),
    "distilbert": (_text_model(zoo_hf.make_distilbert), TEXT_SIZES, _text),
    "gpt2": (_text_model(zoo_hf.make_gpt2), TEXT_SIZES, _text),
    "t5": (_text_model(zoo_hf.make_t5), TEXT_SIZES, _text),              # encoder-decoder, decoder fed the ids
    "fasterrcnn_mobilenet_v3_large_320_fpn": (_detector("fasterrcnn_mobilenet_v3_large_320_fpn"),
                                              zoo_torchvision._DETECTOR_SIZES, _image),
    "ssdlite320_mobilenet_v3_large": (_detector("ssdlite320_mobilenet_v3_large"), zoo_torchvision._DETECTOR_SIZES,
                                      _image),
    "retinanet_resnet50_fpn": (_detector("retinanet_resnet50_fpn"), zoo_torchvision._DETECTOR_SIZES, _image),
}
#: name -> the exact reason (a substring of the error) a model cannot go through from_torch yet
CANNOT: dict = {
    # torchvision's batched_nms branches on `boxes.numel() == 0`, a Python `if` on an unbacked size
    "fasterrcnn_mobilenet_v3_large_320_fpn": re.escape(
        "torch.export refused the program (GuardOnDataDependentSymNode): Could not guard on data-dependent "
        "expression Eq(4*u1, 0)"),
    # batched_nms picks its algorithm by `boxes.numel() > 4000`, a Python `if` on a sum of unbacked sizes
    "ssdlite320_mobilenet_v3_large": re.escape(
        "torch.export refused the program (GuardOnDataDependentSymNode): Could not guard on data-dependent "
        "expression 4*Min(300, u0)"),
    # as fasterrcnn: batched_nms's `boxes.numel() == 0` (torchvision/ops/boxes.py, _batched_nms_coordinate_trick)
    "retinanet_resnet50_fpn": re.escape(
        "torch.export refused the program (GuardOnDataDependentSymNode): Could not guard on data-dependent "
        "expression"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_through_from_torch_equals_torch_eager(name):
    build, sizes, inputs = MODELS[name]
    module, args, dynamic_shapes = build()
    if name in CANNOT:
        with pytest.raises(dt.DyntvmError, match=CANNOT[name]):
            dt.compile(dt.from_torch(module, args, dynamic_shapes=dynamic_shapes))
        return
    model = dt.compile(dt.from_torch(module, args, dynamic_shapes=dynamic_shapes))     # once, for every size
    rng = np.random.default_rng(0)
    for size in sizes:
        arrays = inputs(rng, size)
        with torch.no_grad():
            want = module(*[torch.from_numpy(a) for a in arrays]).numpy()
        got = model(*arrays)
        assert got.shape == want.shape, (name, size)
        assert_same([got], [want], rtol=1e-4, atol=1e-4)
