"""GenEval as a service: does a generated image show the objects, counts, colours and positions
its prompt asked for (djghosh13/geneval), scored as flow_grpo's reward server scores it.

Each image comes with its GenEval metadata (``metadata["geneval"]``, one dict per image). The
request threads convert the images; the detector (``detector.py``) runs the images of
concurrent requests in one batch; the request threads keep GenEval's detections (``rules.py``)
and cut the crops the colour clauses need (``crops.py``), which go through CLIP in one batched
call per request, shared with the other requests' crops (``colors.py``); then the rules. The
score is the reward server's partial score; the extras ``rewards`` (GenEval's correctness),
``strict_rewards``, ``tag`` and ``details`` (the kept detections and the reasons) travel beside it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from common.configuration.config import ConfigError
from common.configuration.settings import CoreSettings
from common.imaging.images import shown_size
from common.imaging.media import MediaRequest
from common.limits.budget import hold_work
from common.limits.deadlines import check_deadline
from common.limits.errors import Unprocessable
from common.models.loading import Refusal, load_model, require_weights, warm_up
from common.models.precision import torch_dtype
from common.pipeline.scorer import ImageScorer, Scored
from services.geneval.crops import CROP_BYTES, crop_pixels, masked_crop
from services.geneval.rules import (
    CLASSNAMES,
    COLORS,
    Detection,
    Task,
    TaskError,
    Thresholds,
    colors_needed,
    geneval_correct,
    kept_detections,
    parse_task,
    strict_score,
)
from services.geneval.settings import SECTION, missing, read_settings

if TYPE_CHECKING:
    from services.geneval.detector import Detections

log = logging.getLogger(__name__)

METADATA_KEY = "geneval"
ONLY_STRICT_KEY = "geneval_only_strict"
LABELS = {name: index for index, name in enumerate(CLASSNAMES)}
# An image's bytes a pixel: its RGB pixels (uint8) and their float32 copy the detector resizes.
PIXEL_BYTES = 3 + 3 * 4


@dataclass(frozen=True)
class GenEvalItem:
    """One image to judge: the image, its RGB pixels, its task."""

    image: Image.Image
    pixels: np.ndarray
    task: Task
    only_strict: bool


def only_strict(metadata: dict[str, Any]) -> bool:
    value = metadata.get(ONLY_STRICT_KEY, False)
    if not isinstance(value, bool):
        raise Unprocessable(f"metadata[{ONLY_STRICT_KEY!r}] must be true or false, got {type(value).__name__}")
    return value


def tasks(metadata: dict[str, Any], positions: Sequence[int]) -> list[Task]:
    """The GenEval tasks of the samples at ``positions`` in a request; 422 naming a bad one."""
    entries = metadata.get(METADATA_KEY)
    if not isinstance(entries, (list, tuple)):
        raise Unprocessable(
            f"metadata[{METADATA_KEY!r}] must be a list of GenEval metadata dicts (tag, include, exclude), one an image"
        )
    needed = max(positions, default=-1) + 1
    if len(entries) < needed:
        raise Unprocessable(f"metadata[{METADATA_KEY!r}] has {len(entries)} entries for {needed} images")
    try:
        return [parse_task(entries[i], f"metadata[{METADATA_KEY!r}][{i}]") for i in positions]
    except TaskError as exc:
        raise Unprocessable(str(exc)) from None


class GenEvalScorer(ImageScorer):
    name = "geneval"
    max_batch = 16
    max_wait_ms = 5.0

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = read_settings()
        s = self.settings
        self.thresholds = Thresholds(s.threshold, s.counting_threshold, s.max_objects, s.position_threshold)
        self.detect: Any = None
        self.classify: Any = None
        self.device = "cpu"

    def setup(self, device: str) -> None:
        require_weights(missing(self.settings, allow_download=True))
        from services.geneval.colors import ColorClassifier
        from services.geneval.detector import Detector

        s = self.settings
        dtype = torch_dtype(s.precision, device)
        options = (s.min_size, s.max_size, s.max_detections, s.channels == "bgr", s.own_size_pixels)
        refusal = Refusal((OSError, ValueError), f"SCORER_GENEVAL_DETECTOR={s.detector!r} is not a Mask2Former")
        detector = load_model(device, lambda: Detector(s.detector, device, dtype, *options), refusal)
        if detector.num_classes != len(CLASSNAMES):
            raise ConfigError(
                f"SCORER_GENEVAL_DETECTOR={s.detector!r} has {detector.num_classes} classes, not COCO's 80 in "
                "GenEval's order"
            )
        refusal = Refusal((OSError, ValueError), f"SCORER_GENEVAL_CLIP={s.clip!r} is not a CLIP")
        classifier = load_model(device, lambda: ColorClassifier(s.clip, device, dtype), refusal)
        self.device = device
        self.detect = self.batched_stage(detector, "detector")
        self.classify = self.batched_stage(classifier, "colors", s.color_batch)
        warm = {METADATA_KEY: [{"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}]}]}
        warm_up(lambda images, prompts: self.score_request(self.prepare_images(images, prompts, warm)), device, 1, 64)
        log.info("geneval: detector %s, clip %s, on %s in %s", s.detector, s.clip, device, dtype)

    def check_images(self, images: Sequence[Image.Image], request: MediaRequest) -> None:
        """Videos are refused (GenEval judges images); each sample needs its GenEval metadata
        (422 naming a bad entry). Held: each image's pixels and their float copy for the
        detector's resize, the masks its colour clauses may bring back (on the image's own
        pixels, or on the detector's input for an image over ``own_size_pixels``) and their crops."""
        from services.geneval.detector import scaled_size

        if request.frames is not None:
            raise Unprocessable("the geneval service judges images, not videos")
        only_strict(request.metadata)
        judged = tasks(request.metadata, request.sample_positions)
        s = self.settings
        nbytes = 0
        for image, task in zip(images, judged):
            width, height = shown_size(image)
            mask_pixels = width * height
            if mask_pixels > s.own_size_pixels:
                mask_pixels = math.prod(scaled_size(width, height, s.min_size, s.max_size))
            colored = sum(1 for clause in task.include if clause.color is not None)
            nbytes += width * height * PIXEL_BYTES + colored * s.max_objects * (mask_pixels + CROP_BYTES)
        hold_work(nbytes, "geneval inputs")

    def prepare_images(self, images: list[Image.Image], prompts: list[str], metadata: dict[str, Any]) -> list[Any]:
        judged = tasks(metadata, range(len(images)))
        if len(judged) != len(metadata[METADATA_KEY]):
            raise Unprocessable(
                f"metadata[{METADATA_KEY!r}] has {len(metadata[METADATA_KEY])} entries for {len(images)} images"
            )
        strict = only_strict(metadata)
        return [GenEvalItem(image, np.array(image.convert("RGB")), task, strict) for image, task in zip(images, judged)]

    def sample_metadata(self, metadata: dict[str, Any], positions: Sequence[int]) -> dict[str, Any]:
        """The GenEval entries of the samples at ``positions``, in order (a bad list is left as
        it is, for ``prepare_images`` to name)."""
        entries = metadata.get(METADATA_KEY)
        if not isinstance(entries, (list, tuple)) or len(entries) <= max(positions, default=-1):
            return metadata
        return {**metadata, METADATA_KEY: [entries[i] for i in positions]}

    def score_bounds(self) -> tuple[float, float]:
        """The partial score is the mean of terms of at most 1, the lowest a count clause's
        ``1 - |count - found| / count`` with ``count`` 1 and ``max_objects`` found."""
        return min(0.0, 2.0 - self.settings.max_objects), 1.0

    def score_request(self, items: Sequence[GenEvalItem]) -> list[Scored]:
        from services.geneval.detector import DetectorInput

        s = self.settings
        inputs = [
            DetectorInput(
                item.pixels,
                self.thresholds.confidence(item.task.tag),
                frozenset(LABELS[c.classname] for c in item.task.include if c.color is not None),
                s.max_objects,
            )
            for item in items
        ]
        found = self.detect(inputs)
        check_deadline("the colour crops")
        kept = [self._kept(item, detections) for item, detections in zip(items, found)]
        # Every crop of the request in one call: (image index, detection key) -> its colour.
        wanted: list[tuple[int, int]] = []
        crops: list[tuple[np.ndarray, int]] = []
        for index, (item, objects, detections) in enumerate(zip(items, kept, found)):
            # The masks' grid: the image's own pixels, or the resized image the detector saw.
            canvas = item.image if detections.canvas is None else Image.fromarray(detections.canvas)
            for classname, count in colors_needed(item.task, objects, item.only_strict).items():
                for detection in objects[classname][:count]:
                    mask, box = detections.masks[detection.key], detections.grid_boxes[detection.key]
                    crops.append((crop_pixels(masked_crop(canvas, mask, box)), LABELS[classname]))
                    wanted.append((index, detection.key))
        colors = dict(zip(wanted, (COLORS[i] for i in self.classify(crops))))
        check_deadline("the rules")
        return [self._judge(index, item, objects, colors) for index, (item, objects) in enumerate(zip(items, kept))]

    def _kept(self, item: GenEvalItem, detections: Detections) -> dict[str, list[Detection]]:
        by_class: dict[str, list[Detection]] = {}
        for key, (label, confidence, box) in enumerate(
            zip(detections.labels, detections.confidences, detections.boxes)
        ):
            by_class.setdefault(CLASSNAMES[int(label)], []).append(
                Detection(tuple(float(v) for v in box), float(confidence), key)  # type: ignore[arg-type]
            )
        return kept_detections(by_class, item.task.tag, self.thresholds)

    def _judge(
        self, index: int, item: GenEvalItem, objects: dict[str, list[Detection]], colors: dict[tuple[int, int], str]
    ) -> Scored:
        margin = self.thresholds.position

        def colors_of(classname: str, detections: Sequence[Detection]) -> list[str]:
            return [colors[index, d.key] for d in detections]

        strict = strict_score(item.task, objects, colors_of, margin, self.settings.strict_exclude)
        correct = None if item.only_strict else geneval_correct(item.task, objects, colors_of, margin)
        details = {
            "detections": [
                {
                    "class": classname,
                    "box": list(d.box),
                    "confidence": d.confidence,
                    **({"color": colors[index, d.key]} if (index, d.key) in colors else {}),
                }
                for classname, detections in objects.items()
                for d in detections
            ],
            "reason": "\n".join(correct.reasons) if correct is not None else None,
            "strict_reason": "\n".join(strict.reasons),
        }
        extras = {
            "rewards": 1.0 if correct is not None and correct.correct else 0.0,
            "strict_rewards": 1.0 if strict.correct else 0.0,
            "tag": item.task.tag,
            "details": details,
        }
        return Scored(strict.score, extras)

    def info(self) -> dict[str, Any]:
        s = self.settings
        return {
            "detector": s.detector,
            # A directory (a converted GenEval checkpoint, or a saved model) or a hub id.
            "detector_source": "directory" if Path(s.detector).expanduser().is_dir() else "hub",
            "clip": s.clip,
            "precision": s.precision if self.device.startswith("cuda") else "float32",
            "thresholds": {
                "threshold": s.threshold,
                "counting_threshold": s.counting_threshold,
                "max_objects": s.max_objects,
                "position_threshold": s.position_threshold,
            },
            "detector_input": {"min_size": s.min_size, "max_size": s.max_size, "max_detections": s.max_detections},
            "strict_exclude": s.strict_exclude,
            "channels": s.channels,
            "settings_section": SECTION,
        }
