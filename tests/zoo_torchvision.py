"""torchvision models of the real-model suite (tests/test_models_torchvision.py): random weights, small images.

Classifiers take a batch [B, 3, H, W] with B, H, W dynamic; detectors take one image [3, H, W] (the list of
images torchvision's detectors want, of length 1) with H, W dynamic and return boxes, labels, scores (and masks).
BatchNorm statistics are calibrated on random batches so activations are not all near zero, and detectors keep
every box (score threshold 0) so the comparison sees real boxes, not empty outputs."""
from __future__ import annotations

import itertools

import numpy as np

import torch

from model_exports import ModelCase
from torchvision_cpu import load as _torchvision


def _calibrated(model, batches):
    """`model` in eval mode after BatchNorm running statistics were taken from `batches` random inputs."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None                                     # a plain average over the batches
    model.train()
    with torch.no_grad():
        for x in batches:
            model(x)
    return model.eval()


def _classifier(builder):
    def make():
        tv = _torchvision()
        torch.manual_seed(0)
        model = getattr(tv.models, builder)(weights=None, num_classes=10)
        model = _calibrated(model, [torch.randn(4, 3, 64, 64) for _ in range(3)])
        return model, (torch.randn(2, 3, 64, 64),), ["x"], {"x": {0: "B", 2: "H", 3: "W"}}
    make.__qualname__ = f"classifier_{builder}"
    return make


def _images(rng, size):
    b, h, w = size
    return {"x": rng.standard_normal((b, 3, h, w)).astype(np.float32)}


class _Detector(torch.nn.Module):
    """A torchvision detector on one image tensor [3, H, W], returning its first (only) result as a tuple."""
    def __init__(self, model, keys):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, image):
        result = self.model([image])
        if isinstance(result, tuple):                              # scripting returns (losses, detections)
            result = result[1]
        return tuple(result[0][k] for k in self.keys)


_SMALL = dict(min_size=96, max_size=128, box_score_thresh=0.05, box_detections_per_img=20,
              rpn_pre_nms_top_n_test=60, rpn_post_nms_top_n_test=30)


# the last layers of each detector's heads and the spread of their outputs wanted on calibration images: with
# random weights the logits and box deltas are so large that every score is 1.0 and every box the whole image
_HEAD_SPREAD = {
    "head.classification_head.cls_logits": 1.5, "head.regression_head.bbox_reg": 0.2,            # RetinaNet
    "rpn.head.cls_logits": 1.5, "rpn.head.bbox_pred": 0.2,                                       # the R-CNNs
    "roi_heads.box_predictor.cls_score": 1.5, "roi_heads.box_predictor.bbox_pred": 0.2,
    "roi_heads.mask_predictor.mask_fcn_logits": 1.5,
}


def _tamed(model, images):
    """`model` with each head layer of `_HEAD_SPREAD` it has rescaled so that its output's standard deviation
    around the mean, measured on `images`, is the listed spread (weights only: the bias keeps its prior)."""
    layers = dict(model.named_modules())
    for name, spread in _HEAD_SPREAD.items():
        layer = layers.get(name)
        if layer is None:
            continue
        seen = []
        hook = layer.register_forward_hook(lambda m, i, out: seen.append(out.detach().flatten()))
        with torch.no_grad():
            for image in images:
                model([image])
        hook.remove()
        if seen:
            std = float(torch.cat(seen).std())
            if std > 0:
                with torch.no_grad():
                    layer.weight.mul_(spread / std)
    return model


def _detector(builder, keys, **kwargs):
    def make():
        tv = _torchvision()
        torch.manual_seed(0)
        model = getattr(tv.models.detection, builder)(weights=None, weights_backbone=None, **kwargs)
        backbone = model.backbone
        _calibrated(backbone, [torch.rand(2, 3, 96, 128) for _ in range(3)])
        model.eval()
        _tamed(model, [torch.rand(3, 96, 128) for _ in range(2)])
        return (_Detector(model, keys).eval(), (torch.rand(3, 96, 112),), ["image"],
                {"image": {1: "H", 2: "W"}})
    make.__qualname__ = f"detector_{builder}"
    return make


class _MaskDetector(_Detector):
    """Mask R-CNN as `_Detector`, its outputs followed by the mask head's probabilities before pasting, taken with
    a hook on `roi_heads` (whose result the model's transform then pastes into the image)."""
    def forward(self, image):
        raw = []
        hook = self.model.roi_heads.register_forward_hook(lambda m, i, out: raw.append(out[0][0]["masks"]))
        try:
            detections = super().forward(image)
        finally:
            hook.remove()
        return detections + (raw[0],)


def _mask_detector(**kwargs):
    make_detector = _detector("maskrcnn_resnet50_fpn", _BOXES + ("masks",), **kwargs)

    def make():
        detector, args, names, axes = make_detector()
        return _MaskDetector(detector.model, detector.keys).eval(), args, names, axes
    make.__qualname__ = "detector_maskrcnn_resnet50_fpn"
    return make


def _mask_pastes(raw, boxes, image_hw) -> list:
    """Every [1, H, W] mask that torchvision's `paste_masks_in_image` may paste of one detection's raw mask `raw`
    [1, M, M], given `boxes`, the float boxes dyntvm and onnxruntime found for it: the paste pads the mask by one
    pixel, scales the box by (M + 2) / M and truncates its corners to integers, so a corner within float error of
    an integer (46.000015 from onnxruntime, 45.99998 from a float rounding elsewhere) moves the whole pasted mask
    by a pixel. Both truncations are legitimate; this lists the pastes of every corner truncation that either box,
    expanded within 4 float32 ulps, gives (one paste where the box is far from such a tie)."""
    _torchvision()
    from torchvision.models.detection.roi_heads import expand_boxes, expand_masks, paste_mask_in_image
    padded, scale = expand_masks(torch.from_numpy(np.asarray(raw, np.float32))[None], padding=1)
    corners = [set(), set(), set(), set()]
    for box in boxes:
        expanded = expand_boxes(torch.from_numpy(np.asarray(box, np.float32))[None], scale)[0].numpy()
        for k, c in enumerate(expanded):
            for nudged in (c - 4 * np.spacing(c), c + 4 * np.spacing(c)):
                corners[k].add(int(np.trunc(nudged)))          # the export's float -> int64 Cast truncates
    h, w = image_hw
    return [paste_mask_in_image(padded[0, 0], torch.tensor(corner), h, w).numpy()[None]
            for corner in itertools.product(*(sorted(c) for c in corners))]


def _image(rng, size):
    h, w = size
    return {"image": rng.random((3, h, w), dtype=np.float32)}


_BOXES = ("boxes", "labels", "scores")
_CLASSIFIER_SIZES = [(1, 64, 64), (2, 96, 80), (1, 33, 47)]
_DETECTOR_SIZES = [(96, 112), (80, 128), (128, 96)]

# compile times are minutes per (model, exporter) on 2 cores: the suite holds one exporter of most models
CASES: list[ModelCase] = [
    ModelCase("resnet18", _classifier("resnet18"), _images, _CLASSIFIER_SIZES, atol=1e-3, rtol=1e-3),
    ModelCase("mobilenet_v3_small", _classifier("mobilenet_v3_small"), _images, _CLASSIFIER_SIZES, atol=1e-3,
              rtol=1e-3, exporters=("torchscript",)),
    ModelCase("regnet_y_400mf", _classifier("regnet_y_400mf"), _images, _CLASSIFIER_SIZES, atol=1e-3, rtol=1e-3,
              exporters=("torchscript",)),
    # its scores differ from onnxruntime's by up to 5e-4 and its boxes by up to 0.03 px (of 112), more than the
    # other detectors (< 2e-5): not explained yet (docs/onnx.md)
    ModelCase("fasterrcnn_mobilenet_v3_large_320_fpn",
              _detector("fasterrcnn_mobilenet_v3_large_320_fpn", _BOXES, **_SMALL), _image, _DETECTOR_SIZES,
              atol=2e-3, rtol=1e-3, exporters=("torchscript",), detections=True, score_atol=2e-3),
    # its own transform resizes every image to 320 x 320 and keeps 300 detections of 90 classes (score threshold
    # 0.001): with random weights many scores are near ties, so detections are compared as a set
    ModelCase("ssdlite320_mobilenet_v3_large", _detector("ssdlite320_mobilenet_v3_large", _BOXES), _image,
              _DETECTOR_SIZES, atol=1e-3, rtol=1e-3, exporters=("torchscript",), detections=True),
    ModelCase("retinanet_resnet50_fpn",
              _detector("retinanet_resnet50_fpn", _BOXES, min_size=96, max_size=128, score_thresh=0.05,
                        detections_per_img=20, topk_candidates=60), _image, _DETECTOR_SIZES, atol=1e-3, rtol=1e-3,
              exporters=("torchscript",), detections=True),
    # boxes, labels, scores, a [n, 1, H, W] mask per detection pasted into the image and the mask head's
    # [n, 1, 28, 28] probabilities it was pasted from (`_MaskDetector`); pasted masks compared as `_mask_pastes` says
    ModelCase("maskrcnn_resnet50_fpn", _mask_detector(**_SMALL), _image, _DETECTOR_SIZES + [(61, 97)], atol=1e-3,
              rtol=1e-3, exporters=("torchscript",), detections=True, mask_pastes=_mask_pastes),
]

# torchvision detectors not in the suite: {builder: why} (the dynamo exporter's failures are in docs/onnx.md)
NOT_IN_SUITE: dict[str, str] = {}
