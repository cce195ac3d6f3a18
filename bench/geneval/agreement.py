"""How often GenEval's answer changes when an image's post-processing runs on the detector's
input instead of at the image's own size (issue 39): the service's scorer in-process on the tiny
random Mask2Former and CLIP (``testing/geneval_models.py``, ``testing/clip_models.py``) at their
test scale (128 x 96), twice on the same images and metadata: ``SCORER_GENEVAL_OWN_SIZE_PIXELS``
over the images' size (mmdet's post-processing, which the agreement tests compare with GenEval's
reference) and at 0 (every image on the detector's input). Counted per sample: a different
score, GenEval's correctness, strict correctness, the kept detections' classes, a judged colour
(of the same detections); and the largest box difference in the detector's input pixels.

    .venv/bin/python -m bench.geneval.agreement [--images 300] [--width 512 --height 384]

The tiny models' random weights make masks and colours of no meaning: the count is what this
change does to mmdet's arithmetic on such detections, not a real detector's accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common.configuration.settings import CoreSettings  # noqa: E402
from services.geneval.scorer import GenEvalScorer  # noqa: E402
from testing.clip_models import save_random_clip_model  # noqa: E402
from testing.geneval_models import ellipses, save_random_mask2former  # noqa: E402

# Every tag, colour and position clauses included, on the classes the tiny detector finds.
METADATAS: list[dict[str, Any]] = [
    {"tag": "single_object", "include": [{"class": "dog", "count": 1}]},
    {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]},
    {"tag": "counting", "include": [{"class": "dog", "count": 2}]},
    {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}]},
    {
        "tag": "position",
        "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
    },
    {
        "tag": "color_attr",
        "include": [{"class": "dog", "count": 1, "color": "blue"}, {"class": "cup", "count": 1, "color": "red"}],
    },
]


def answers(own_size_pixels: int, images: list[Image.Image], metadatas: list[dict[str, Any]]) -> list[Any]:
    os.environ["SCORER_GENEVAL_OWN_SIZE_PIXELS"] = str(own_size_pixels)
    scorer = GenEvalScorer(CoreSettings(service="geneval"))
    scorer.setup("cpu")
    return scorer.score_request(scorer.prepare_images(images, [""] * len(images), {"geneval": metadatas}))


def detections(scored: Any) -> list[dict[str, Any]]:
    """The kept detections, by class and then box."""
    return sorted(scored.extras["details"]["detections"], key=lambda d: (d["class"], d["box"]))


def classes(scored: Any) -> list[str]:
    return [d["class"] for d in detections(scored)]


def colours(scored: Any) -> list[str]:
    return [d.get("color", "") for d in detections(scored)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.geneval.agreement", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--height", type=int, default=384)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.update(
            SCORER_GENEVAL_DETECTOR=str(save_random_mask2former(Path(scratch) / "detector")),
            SCORER_GENEVAL_CLIP=str(save_random_clip_model(Path(scratch) / "clip")),
            SCORER_GENEVAL_MIN_SIZE="96",
            SCORER_GENEVAL_MAX_SIZE="128",
        )
        images = [ellipses(args.width, args.height, seed) for seed in range(args.images)]
        metadatas = [METADATAS[i % len(METADATAS)] for i in range(args.images)]
        own = answers(args.width * args.height, images, metadatas)
        grid = answers(0, images, metadatas)
    scale = max(args.width / 128, args.height / 96)
    counts = {
        "samples": len(images),
        "kept detections": sum(len(classes(a)) for a in own),
        "colours judged": sum(len([c for c in colours(a) if c]) for a in own),
    }
    for name, differs in (
        ("score", lambda a, b: a.score != b.score),
        ("correct", lambda a, b: a.extras["rewards"] != b.extras["rewards"]),
        ("strict", lambda a, b: a.extras["strict_rewards"] != b.extras["strict_rewards"]),
        ("kept classes", lambda a, b: classes(a) != classes(b)),
        ("colours", lambda a, b: classes(a) == classes(b) and colours(a) != colours(b)),
    ):
        counts[f"{name} differs"] = sum(bool(differs(a, b)) for a, b in zip(own, grid))
    # Each kept box's nearest box of its class on the other path (near-equal confidences may swap order).
    boxes = [
        min(max(abs(x - y) for x, y in zip(d["box"], e["box"])) for e in detections(b) if e["class"] == d["class"])
        / scale
        for a, b in zip(own, grid)
        if classes(a) == classes(b)
        for d in detections(a)
    ]
    counts["scores that differ (tag, own size, detector input)"] = [
        (a.extras["tag"], a.score, b.score) for a, b in zip(own, grid) if a.score != b.score
    ]
    counts["largest box difference (detector input pixels)"] = round(max(boxes, default=0.0), 3)
    print(json.dumps(counts, indent=2))


if __name__ == "__main__":
    main()
