"""The GenEval detector's post-processing memory, measured in a fresh interpreter: a 1.2-Mpx
image's masks (post-processed at its own size: ``own_size_pixels`` raised over it) are
upsampled in bounded chunks. Integration tier: a subprocess that loads torch
and a detector, some 15 s on a loaded machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testing.geneval_models import save_random_mask2former

PEAK_MEMORY = """
import resource, sys
import numpy as np, torch
from services.geneval.detector import Detector, DetectorInput
torch.set_num_threads(1)
detector = Detector(sys.argv[1], "cpu", torch.float32, 96, 128, 100, bgr=False, own_size_pixels=2_000_000)
detector([DetectorInput(np.zeros((96, 128, 3), np.uint8), 0.0, frozenset({16}), 16)])
pixels = np.random.default_rng(0).integers(0, 255, (1000, 1200, 3), dtype=np.uint8)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
(found,) = detector([DetectorInput(pixels, 0.0, frozenset({16}), 16)])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024, len(found.labels), len(found.masks))
"""


def test_the_masks_are_upsampled_in_bounded_chunks(tmp_path: Path) -> None:
    """A 1.2-Mpx image's 100 detections: the post-processing's peak memory stays under one
    full-size float copy of their masks (480 MB), where upsampling them at once held several."""
    path = save_random_mask2former(tmp_path / "detector")
    done = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY, str(path)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    grown, detections, masks = map(int, done.stdout.split())
    assert detections == 100 and 0 < masks <= 16
    assert grown < 100 * 1000 * 1200 * 4 // 2, f"the post-processing grew the process by {grown / 2**20:.0f} MiB"
