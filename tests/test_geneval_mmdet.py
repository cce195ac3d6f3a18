"""The detector against mmdet 2.x's own Mask2Former on the same tiny random weights: mmdet builds
GenEval's config at tiny widths and saves its checkpoint (testing/mmdet_reference.py, in the
reference environment), services/geneval/convert.py converts that checkpoint, and both detect
on the same images: labels, boxes, scores and masks of all 100 detections.

``SCORER_TEST_MMDET_PYTHON``: the reference environment's interpreter (``bash run.sh
reference-mmdet`` builds ``.venv-mmdet``, slowly: mmcv-full compiles from source; ``bash run.sh
test`` names it when it exists). Without it these tests skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from services.geneval.detector import Detector, DetectorInput
from testing import geneval_reference as reference

ROOT = Path(__file__).resolve().parents[1]
MMDET_PYTHON = os.environ.get("SCORER_TEST_MMDET_PYTHON")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not MMDET_PYTHON, reason="SCORER_TEST_MMDET_PYTHON names no mmdet 2.x environment (bash run.sh reference-mmdet)"
    ),
]

# (width, height): at the tiny test scale (128 x 96) already, then resized down, up, and long.
SIZES = [(128, 96), (256, 192), (80, 60), (300, 100)]


def scene(width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (width, height), (30, 30, 30))
    draw = ImageDraw.Draw(image)
    for _ in range(5):
        w, h = int(rng.integers(8, width // 3)), int(rng.integers(6, height // 3))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        draw.ellipse([x, y, x + w, y + h], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return np.array(image)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[np.ndarray], Any, Detector]:
    directory = tmp_path_factory.mktemp("mmdet")
    images = [scene(w, h, seed) for seed, (w, h) in enumerate(SIZES)]
    paths = []
    for index, pixels in enumerate(images):
        paths.append(str(directory / f"{index}.npy"))
        np.save(paths[-1], pixels)
    for command in (
        [MMDET_PYTHON, "testing/mmdet_reference.py", str(directory), *paths],
        [sys.executable, "-m", "services.geneval.convert", str(directory / "checkpoint.pth"), str(directory / "ours")],
    ):
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    detector = Detector(str(directory / "ours"), "cpu", torch.float32, 96, 128, 100, bgr=False)
    return images, np.load(directory / "detections.npz"), detector


def ordered(labels: np.ndarray, scores: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Rows by class, then score, highest first, then box."""
    return np.lexsort((*boxes.T[::-1], -scores, labels))


def compare(found: Any, theirs: dict[str, np.ndarray]) -> dict[str, float]:
    """Our detections against mmdet's, row by row in the same order: how far apart."""
    masks = np.stack([found.masks[row] for row in range(len(found.labels))])
    mine = ordered(found.labels, found.confidences, found.boxes)
    other = ordered(theirs["labels"], theirs["scores"], theirs["boxes"])
    assert len(mine) == len(other) == 100
    # Random weights that still tell classes and masks apart.
    assert len(set(found.labels.tolist())) > 5 and 0.05 < masks.mean() < 0.95
    return {
        "labels": float(np.mean(found.labels[mine] != theirs["labels"][other])),
        "scores": float(np.abs(found.confidences[mine] - theirs["scores"][other]).max()),
        "boxes": float(np.abs(found.boxes[mine] - theirs["boxes"][other]).max()),
        "masks": float(np.mean(masks[mine] != theirs["masks"][other])),
    }


def mmdets(mmdet: Any, index: int) -> dict[str, np.ndarray]:
    return {key: mmdet[f"{index}_{key}"] for key in ("labels", "boxes", "scores", "masks")}


@pytest.mark.parametrize("index", range(len(SIZES)))
def test_the_network_and_post_processing_are_mmdets(both: tuple[list[np.ndarray], Any, Detector], index: int) -> None:
    """On mmdet's own input (cv2's resize, restated in testing/geneval_reference.py), the same
    detections to float rounding: labels and boxes equal, a mask pixel apart at most in 10^5."""
    images, mmdet, detector = both
    pixels = images[index]
    padded, shape = reference.mmdet_test_input(pixels, (128, 96))
    with torch.no_grad():
        out = detector.model(pixel_values=torch.from_numpy(padded)[None])
    found = detector._instances(
        out.class_queries_logits[0],
        out.masks_queries_logits[0:1],
        shape,
        padded.shape[1:],
        DetectorInput(pixels, -1.0, frozenset(range(80)), 100),
    )
    apart = compare(found, mmdets(mmdet, index))
    assert apart["labels"] == 0 and apart["boxes"] == 0 and apart["scores"] < 5e-5 and apart["masks"] < 1e-5, apart


@pytest.mark.parametrize("index", range(len(SIZES)))
def test_detections_are_mmdets(both: tuple[list[np.ndarray], Any, Detector], index: int) -> None:
    """End to end, the detector's own resize (torch's bilinear, a level off cv2's on some
    pixels): the same detections where no resize happens, within 0.01 and 1 % of the mask
    pixels where one does."""
    images, mmdet, detector = both
    (found,) = detector([DetectorInput(images[index], -1.0, frozenset(range(80)), 100)])
    apart = compare(found, mmdets(mmdet, index))
    if images[index].shape[:2] == (96, 128):
        assert apart == {**apart, "labels": 0, "boxes": 0, "masks": 0} and apart["scores"] < 5e-5, apart
    else:
        assert apart["labels"] == 0 and apart["boxes"] <= 1 and apart["scores"] < 0.01 and apart["masks"] < 0.01, apart
