"""GenEval in-process on tiny random models: this service's design against the reward server's
restated, on the same models, images and metadata.

- ``original``: one request at a time (the reward server's Flask app), the detector on the
  request's images together (mmdet's ``inference_detector`` on a list), then per image and colour
  clause a ``DataLoader(batch_size=16, num_workers=4)`` over its crops and a CLIP call per batch;
- ``ours``: the requests at once on the service's scorer (``score_request``: the detector
  batched across requests, every crop of a request in one CLIP call, shared across requests).

    .venv/bin/python -m bench.geneval.bench --requests 4 --images 8 --rounds 2
    python -m bench.geneval.bench --size real --device cuda --precision float16 --image-size 512 \
        --requests 4 --images 32 --rounds 2 --out geneval.json      # on a GPU node

``--size real``: GenEval's Swin-S Mask2Former and a ViT-L/14 CLIP, random, at mmdet's scale.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from common.configuration.settings import CoreSettings
from services.geneval.colors import ColorClassifier
from services.geneval.crops import crop_pixels, masked_crop
from services.geneval.detector import Detector, DetectorInput
from services.geneval.rules import colors_needed
from services.geneval.scorer import LABELS, GenEvalScorer
from testing.clip_models import save_random_clip_model
from testing.geneval_models import save_random_mask2former

METADATA = {
    "tag": "color_attr",
    "include": [{"class": "dog", "count": 1, "color": "red"}, {"class": "cat", "count": 1, "color": "blue"}],
}


def scene(seed: int, size: tuple[int, int]) -> Image.Image:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", size, (20, 20, 20))
    draw = ImageDraw.Draw(image)
    for _ in range(5):
        x, y = int(rng.integers(0, size[0] - 16)), int(rng.integers(0, size[1] - 12))
        draw.rectangle([x, y, x + 16, y + 12], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return image


class Crops(torch.utils.data.Dataset):
    """The reward server's ``ImageCrops``: one image's crops, made by the loader's workers."""

    def __init__(self, image: Image.Image, objects: list[tuple[np.ndarray, Any]]) -> None:
        self.image, self.objects = image, objects

    def __len__(self) -> int:
        return len(self.objects)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        mask, box = self.objects[index]
        return torch.from_numpy(crop_pixels(masked_crop(self.image, mask, box))), 0


def original(
    scorer: GenEvalScorer, detector: Detector, classifier: ColorClassifier, requests: list, device: str
) -> None:
    for items in requests:
        found = detector([DetectorInput(i.pixels, 0.3, frozenset({16, 15}), 16) for i in items])
        for item, detections in zip(items, found):
            objects = scorer._kept(item, detections)
            for classname, count in colors_needed(item.task, objects, False).items():
                chosen = [(detections.masks[d.key], d.box) for d in objects[classname][:count]]
                loader = torch.utils.data.DataLoader(Crops(item.image, chosen), batch_size=16, num_workers=4)
                for pixels, _ in loader:
                    classifier([(p.numpy(), LABELS[classname]) for p in pixels])
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def ours(scorer: GenEvalScorer, requests: list) -> None:
    with ThreadPoolExecutor(len(requests)) as pool:
        list(pool.map(scorer.score_request, requests))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("float16", "bfloat16", "float32"), default="float32")
    parser.add_argument("--image-size", type=int, default=128, help="the images' width (height: 3/4 of it)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here too")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    directory = Path(tempfile.mkdtemp())
    real = args.size == "real"
    started = time.perf_counter()
    with torch.device(args.device):  # random weights made where they run: a GPU makes them in a second
        detector_dir = save_random_mask2former(directory / "detector", size="swin-s" if real else "tiny")
        clip_dir = save_random_clip_model(directory / "clip", size="l14" if real else "tiny")
    os.environ.update(
        SCORER_GENEVAL_DETECTOR=str(detector_dir),
        SCORER_GENEVAL_CLIP=str(clip_dir),
        SCORER_GENEVAL_MIN_SIZE="800" if real else "96",
        SCORER_GENEVAL_MAX_SIZE="1333" if real else "128",
        SCORER_GENEVAL_PRECISION=args.precision,
    )
    scorer = GenEvalScorer(CoreSettings(service="geneval", max_batch=args.images * args.requests))
    scorer.setup(args.device)
    s = scorer.settings
    dtype = getattr(torch, args.precision) if args.device.startswith("cuda") else torch.float32
    detector = Detector(s.detector, args.device, dtype, s.min_size, s.max_size, s.max_detections, False)
    classifier = ColorClassifier(s.clip, args.device, dtype)
    shutil.rmtree(directory)  # loaded: the real size's random weights are 2 GB on disk
    size = (args.image_size, args.image_size * 3 // 4)
    requests = [
        scorer.prepare_images(
            [scene(r * 100 + i, size) for i in range(args.images)],
            [""] * args.images,
            {"geneval": [METADATA] * args.images},
        )
        for r in range(args.requests)
    ]
    # Each design's models see the input shapes once before they are timed.
    original(scorer, detector, classifier, requests[:1], args.device)
    ours(scorer, requests[:1])
    setup_s = time.perf_counter() - started
    total = args.requests * args.images
    rates: dict[str, list[float]] = {"original": [], "ours": []}
    for _ in range(args.rounds):
        for name, run in (
            ("original", lambda: original(scorer, detector, classifier, requests, args.device)),
            ("ours", lambda: ours(scorer, requests)),
        ):
            start = time.perf_counter()
            run()
            rates[name].append(total / (time.perf_counter() - start))
    result = {name: statistics.median(values) for name, values in rates.items()}
    result["ours / original"] = result["ours"] / result["original"]
    report = {
        "images_per_s": result,
        "rounds": rates,
        "setup_s": setup_s,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
