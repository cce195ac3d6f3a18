"""The detector against mmdet 2.x's test pipeline and instance post-processing restated
(``testing/geneval_reference.py``: cv2's resize as mmcv calls it, the head's upsampling, top-k
over queries x classes, mask-weighted scores, boxes from masks) on a tiny random Mask2Former
loaded as real weights are; then the colour crops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from services.geneval import detector as detector_module
from services.geneval.crops import BACKGROUND, crop_pixels, masked_crop
from services.geneval.detector import Detector, DetectorInput, mask_boxes, scaled_size
from testing import geneval_reference as reference
from testing.geneval_models import ellipses, save_random_mask2former

# Integration tier: importing transformers' model stack (torch._dynamo, sympy) costs the quick
# loop about 8 s of CPU on its own.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> Detector:
    path = save_random_mask2former(tmp_path_factory.mktemp("geneval") / "detector")
    return Detector(str(path), "cpu", torch.float32, 96, 128, 100, bgr=False)


def scene(width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (width, height), (20, 20, 20))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x, y = int(rng.integers(0, width - 10)), int(rng.integers(0, height - 10))
        draw.rectangle([x, y, x + 12, y + 9], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return np.array(image)


@pytest.mark.parametrize("chunk", [detector_module.MASK_CHUNK, 3 * 128 * 96])
def test_detections_match_mmdets_pipeline(detector: Detector, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image at the test scale already (no resize): the same detections, to float rounding,
    whether the masks are upsampled at once or three queries at a time."""
    monkeypatch.setattr(detector_module, "MASK_CHUNK", chunk)
    pixels = scene(128, 96, 5)
    (found,) = detector([DetectorInput(pixels, 0.0, frozenset(), 16)])
    padded, img_shape = reference.mmdet_test_input(pixels, (128, 96))
    with torch.no_grad():
        out = detector.model(pixel_values=torch.from_numpy(padded)[None])
    rows = reference.mmdet_instances(
        out.class_queries_logits[0], out.masks_queries_logits[0], img_shape, pixels.shape[:2], 100
    )
    expected = sorted(rows, key=lambda r: (r[0], -r[5]))
    got = sorted(
        ((int(label), *map(float, b), float(c)) for label, b, c in zip(found.labels, found.boxes, found.confidences)),
        key=lambda r: (r[0], -r[5]),
    )
    assert len(got) == len(expected) == 100
    assert [r[:5] for r in got] == [r[:5] for r in expected]
    np.testing.assert_allclose([r[5] for r in got], [r[5] for r in expected], atol=1e-6)
    # The images have detections of several classes and masks that are not the whole image.
    assert len({r[0] for r in got}) > 5


@pytest.mark.parametrize(("width", "height", "swap"), [(70, 90, False), (300, 200, True)])
def test_the_input_is_mmdets_to_a_level(detector: Detector, width: int, height: int, swap: bool) -> None:
    """Resized (cv2's fixed-point bilinear in mmcv, torch's here: a level apart on some pixels),
    padded with grey to a multiple of 32, normalised, the channels swapped as the reward
    server's RGB arrays are."""
    pixels = scene(width, height, width)
    detector.bgr = swap
    try:
        ours, shape, _ = detector._input(pixels)
    finally:
        detector.bgr = False
    expected, img_shape = reference.mmdet_test_input(pixels, (128, 96), swap)
    assert shape == img_shape and ours.shape == expected.shape and expected.shape[1:] != img_shape
    difference = np.abs(ours.numpy() - expected)
    assert difference.max() <= 1.01 / 57.12
    assert np.mean(difference > 1e-4) < 0.02


def test_a_large_image_is_post_processed_on_the_detectors_input(
    detector: Detector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over ``own_size_pixels`` the masks stay on the detector's input (128 x 96, a quarter of
    these images' sides): against mmdet's post-processing at the images' own size, the same
    detections in the same order, confidences within 0.01, boxes within a detector pixel (4 of
    the image's); of these 20 images' 2,000 detections, 1 crossed GenEval's 0.3 when measured
    (a few may, on other arithmetic); the kept masks and the canvas they lie on are the
    detector's input."""
    monkeypatch.setattr(detector, "own_size_pixels", 0)
    flips = 0
    for seed in range(20):
        pixels = np.array(ellipses(512, 384, seed))
        (found,) = detector([DetectorInput(pixels, -1.0, frozenset({16}), 4)])
        normalised, shape, _ = detector._input(pixels)
        with torch.no_grad():
            out = detector.model(pixel_values=normalised[None])
        rows = reference.mmdet_instances(
            out.class_queries_logits[0], out.masks_queries_logits[0], shape, pixels.shape[:2], 100
        )
        confidences = np.array([row[5] for row in rows], dtype=np.float32)
        assert found.labels.tolist() == [row[0] for row in rows]
        np.testing.assert_allclose(found.confidences, confidences, atol=0.01)
        assert np.abs(found.boxes - np.array([row[1:5] for row in rows])).max() <= 4
        flips += int(np.sum((confidences > np.float32(0.3)) != (found.confidences > np.float32(0.3))))
        assert found.canvas is not None and found.canvas.shape == (96, 128, 3)
        assert 0 < len(found.masks) <= 4
        for row, mask in found.masks.items():
            ys, xs = np.nonzero(mask)
            assert mask.shape == (96, 128)
            assert found.grid_boxes[row].tolist() == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
    assert flips <= 4


def test_mask_boxes_are_the_masks_extent_plus_one() -> None:
    masks = torch.zeros((3, 6, 8), dtype=torch.bool)
    masks[0, 1:3, 2:5] = True
    masks[1, 5, 7] = True
    boxes = mask_boxes(masks).tolist()
    assert boxes == [[2.0, 1.0, 5.0, 3.0], [7.0, 5.0, 8.0, 6.0], [0.0, 0.0, 0.0, 0.0]]


def test_scaled_size_is_mmcvs_rescale() -> None:
    assert scaled_size(512, 512, 800, 1333) == (800, 800)
    assert scaled_size(1024, 512, 800, 1333) == (1333, 667)
    assert scaled_size(640, 427, 800, 1333) == (1199, 800)


def test_the_mask_and_threshold_limits(detector: Detector) -> None:
    pixels = scene(80, 64, 1)
    (everything,) = detector([DetectorInput(pixels, 0.0, frozenset(), 16)])
    label = int(np.bincount(everything.labels).argmax())
    (found,) = detector([DetectorInput(pixels, 0.3, frozenset({label}), 2)])
    assert np.all(found.confidences > np.float32(0.3))
    assert len(found.masks) == min(2, int(np.sum(found.labels == label)))
    for row, mask in found.masks.items():
        assert found.labels[row] == label and mask.shape == (64, 80) and mask.dtype == bool
        x1, y1, x2, y2 = found.boxes[row]
        ys, xs = np.nonzero(mask)
        assert (x1, y1, x2, y2) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)


def test_a_crop_keeps_the_mask_on_grey() -> None:
    image = Image.new("RGB", (40, 30), (250, 0, 0))
    mask = np.zeros((30, 40), dtype=bool)
    mask[5:15, 10:20] = True
    crop = masked_crop(image, mask, (5, 5, 25, 20))
    assert crop.size == (20, 15)
    assert crop.getpixel((0, 0)) == BACKGROUND and crop.getpixel((10, 5)) == (250, 0, 0)
    assert crop_pixels(crop).shape == (3, 224, 224)
    # A sliver resizes over its centre only, to the same input shape.
    assert crop_pixels(Image.new("RGB", (400, 1), (0, 0, 250))).shape == (3, 224, 224)
