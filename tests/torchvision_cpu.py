"""`import torchvision` on a CPU machine, with the wheel of the package index here.

torchvision 0.28.0 on this index is a CUDA build: its `_C.so` does not load without CUDA, so `torchvision::nms` is
never defined and `import torchvision` fails (its fake-tensor registrations name the op). `load()` defines the ops
the detectors use (`nms`, `roi_align`, and `qnms`, which the import names) with CPU implementations of the real
semantics before importing torchvision, then tells torchvision its ops are there, so that models call
`torch.ops.torchvision.*` as with a working build and both ONNX exporters map them to NonMaxSuppression / RoiAlign.
A torchvision whose own ops load is used as it is."""
from __future__ import annotations

import functools
import glob
import importlib
import importlib.util
import os

import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": ("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                  "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"),
}


def _nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS as torchvision's CPU kernel: by score, highest first; drop boxes with IoU > threshold."""
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    order = scores.argsort(descending=True, stable=True)
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        suppressed |= inter / (areas[i] + areas - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.long)


def _roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    roi_align = importlib.import_module("torchvision.ops.roi_align")   # the module: torchvision.ops.roi_align is the function
    # torchvision's own pure-torch version of the kernel, without the torch.compile it wraps it in (compiling
    # inside the TorchScript exporter's trace is refused, and would be slow)
    plain = roi_align._roi_align.__wrapped__
    return plain(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)


def _roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


def _has_ops() -> bool:
    """torchvision's `extension._has_ops` once `load` defined the ops (a def: torchvision scripts code that calls it)."""
    return True


def _own_library_loads() -> bool:
    """Whether torchvision's own `_C` library loads here (a CUDA build on a GPU host, a CPU build): then its ops
    are its own, and defining them too would abort the process when `import torchvision` registers them again."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    for folder in spec.submodule_search_locations:
        for lib in glob.glob(os.path.join(folder, "_C*.so")):
            try:
                torch.ops.load_library(lib)
                return True
            except (OSError, RuntimeError):
                pass
    return False


@functools.cache
def load():
    """torchvision, imported; defines its CPU ops first when its own library does not load."""
    if not hasattr(torch.ops.torchvision, "nms") and not _own_library_loads():
        lib = torch.library.Library("torchvision", "DEF")   # noqa: TOR901  (kept alive by the cache)
        for schema in _SCHEMAS.values():
            lib.define(schema)
        lib.impl("nms", _nms, "CPU")
        lib.impl("qnms", _nms, "CPU")
        lib.impl("roi_align", _roi_align, "CPU")
        torch.library.register_fake("torchvision::roi_align", _roi_align_fake, lib=lib)
        load.library = lib
    import torchvision
    extension = importlib.import_module("torchvision.extension")
    if not extension._has_ops():
        # its ops are the ones above now: without this, roi_align traces through its Python fallback (no RoiAlign)
        extension._has_ops = importlib.import_module("torchvision.ops.roi_align")._has_ops = _has_ops
    return torchvision
