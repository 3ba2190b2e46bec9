"""`model_exports.match_detections` on Mask R-CNN style outputs (boxes, labels, scores, pasted masks, raw masks):
a box whose expanded corner sits within float error of an integer pastes its mask a pixel apart in either of two
legitimate ways (the Mask R-CNN mismatch of docs/onnx.md, "Real models"); that is accepted, a wrong mask is not.
The pasted masks here are made by torchvision's own eager `paste_masks_in_image`."""
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("torchvision") is None:   # not imported here: tests/torchvision_cpu.py does that
    pytest.skip("torchvision is not installed", allow_module_level=True)

from model_exports import match_detections  # noqa: E402  (tests/ is on sys.path)
from zoo_torchvision import _mask_pastes, _torchvision  # noqa: E402

H, W = 128, 96
# onnxruntime's box of the detection that failed at 128 x 96: its right corner expands to 46.000015 (-> 46); the
# same box 2.5e-5 px narrower, within float error of it, expands to 45.99999 (-> 45)
ORT_BOX = [7.658306, 62.83192, 44.677887, 87.86322]
TIED_BOX = [7.658306, 62.83192, 44.677862, 87.86322]


def _detections(box, raw):
    """(boxes, labels, scores, masks pasted by torchvision, raw masks) of one detection."""
    _torchvision()
    from torchvision.models.detection.roi_heads import paste_masks_in_image
    boxes = np.array([box], np.float32)
    pasted = paste_masks_in_image(torch.from_numpy(raw[None]), torch.from_numpy(boxes), (H, W), padding=1).numpy()
    return [boxes, np.array([3]), np.array([0.5], np.float32), pasted, raw[None]]


@pytest.fixture
def raw():
    return np.random.default_rng(0).random((1, 28, 28), dtype=np.float32)


def test_a_mask_pasted_a_pixel_apart_by_a_rounding_tie_matches(raw):
    want, got = _detections(ORT_BOX, raw), _detections(TIED_BOX, raw)
    moved = np.abs(got[3] - want[3]) > 1e-3
    assert moved.sum() > 500, "the two boxes must paste visibly different masks, or this tests nothing"
    assert len(_mask_pastes(raw, [ORT_BOX, TIED_BOX], (H, W))) == 2
    assert match_detections(got, want, 1e-3, "tie", mask_pastes=_mask_pastes) == 0.0
    with pytest.raises(AssertionError, match="mask off by up to"):       # without the pastes: a mismatch
        match_detections(got[:4], want[:4], 1e-3, "tie")


def test_a_wrong_mask_still_fails(raw):
    want = _detections(ORT_BOX, raw)
    wrong_paste = _detections(ORT_BOX, raw)
    wrong_paste[3] = _detections([7.658306, 62.83192, 42.6, 87.86322], raw)[3]    # pasted 2 px narrower
    wrong_raw = _detections(TIED_BOX, raw)
    wrong_raw[4] = wrong_raw[4] + np.float32(0.01)                                   # the mask head is off
    far = [7.658306, 62.83192, 44.9, 87.86322]        # its right corner expands to 46.23: no tie
    untied = _detections(far, raw)
    untied[3] = _detections(TIED_BOX, raw)[3]
    for got, expect, target in [(wrong_paste, "mask off by up to", want), (wrong_raw, "raw mask off by up to", want),
                                (untied, "mask off by up to", _detections(far, raw))]:
        with pytest.raises(AssertionError, match=expect):
            match_detections(got, target, 1e-3, "wrong", mask_pastes=_mask_pastes)
    assert len(_mask_pastes(raw, [far, far], (H, W))) == 1
