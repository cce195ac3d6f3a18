"""Settings of the GenEval service and the files it needs, judged from the disk.

Standard library only: ``run.sh`` calls ``preflight`` with the system python3 before any
virtual environment exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.configuration.config import at_least, env_name, from_env, setting, within
from common.models.hub import missing_weights, offline_problem, weights_setting
from common.models.precision import Precision

SECTION = "geneval"
# 1024 x 1024: the images trainers generate are post-processed at their own size, as mmdet does.
OWN_SIZE_PIXELS = 1024 * 1024


@dataclass(frozen=True)
class GenEvalSettings:
    """``SCORER_GENEVAL_<FIELD>``; ``run.sh geneval --detector`` / ``--clip`` set the first two."""

    # GenEval's own mmdet checkpoint is converted by ``python -m services.geneval.convert``.
    detector: str = weights_setting(
        "facebook/mask2former-swin-small-coco-instance",
        "a transformers Mask2FormerForUniversalSegmentation with COCO's 80 classes: a directory or a hub id",
    )
    # ViT-L/14 with OpenAI's weights, as GenEval's open_clip ViT-L-14 "openai".
    clip: str = weights_setting(
        "openai/clip-vit-large-patch14", "the colour classifier, a transformers CLIP: a directory or a hub id"
    )
    # The models' precision on GPU; the CPU runs float32. Post-processing is float32 everywhere.
    precision: Precision = setting("float16", "`float16`, `bfloat16` or `float32` on GPU (the CPU runs float32)")
    # GenEval's evaluator options: a detection counts above ``threshold`` (``counting_threshold``
    # for the counting tag), at most ``max_objects`` per class; the position rule's margin.
    threshold: float = setting(0.3, "a detection counts above this", check=within(0, 1))
    counting_threshold: float = setting(0.9, "a detection counts above this for the `counting` tag", check=within(0, 1))
    max_objects: int = setting(16, "detections kept per class", check=at_least(1))
    position_threshold: float = setting(0.1, "the position rule's margin", check=within(0, 1))
    # mmdet's test pipeline for the detector: the image resized to fit min_size x max_size (its
    # img_scale (1333, 800), aspect kept), ``max_detections`` of queries x classes kept.
    min_size: int = setting(800, "mmdet's test scale: the image's shorter side at most", check=at_least(1))
    max_size: int = setting(1333, "mmdet's test scale: the image's longer side at most", check=at_least(1))
    max_detections: int = setting(100, "queries x classes kept before the thresholds", check=at_least(1))
    # Fixes of the reward server's quirks, off by default: the strict correctness reads the
    # exclude clauses; ``bgr``: the detector sees the image's channels swapped, as the reward
    # server's (it hands mmdet RGB arrays, which mmdet takes for BGR).
    strict_exclude: bool = setting(False, "the strict rule reads the exclude clauses")
    channels: Literal["rgb", "bgr"] = setting(
        "rgb", "`bgr`: the detector sees the channels swapped, as the reward server's did"
    )
    # Colour crops per CLIP call.
    color_batch: int = setting(64, "colour crops per CLIP call", check=at_least(1))
    # The post-processing's cost bound: 100 masks upsampled to a 4096 x 4096 image's size are
    # 1.7 G logits; past this size they stay on the detector's input (1333 x 800 at most).
    own_size_pixels: int = setting(
        OWN_SIZE_PIXELS,
        "an image of up to this many pixels has its masks upsampled to its own size, as mmdet does; a larger "
        "one's scores, boxes and colour crops come from its masks at the detector's input size",
        check=at_least(0),
    )


def read_settings() -> GenEvalSettings:
    """The settings from the environment; ``ConfigError`` for a bad one."""
    return from_env(GenEvalSettings, SECTION)


def missing(settings: GenEvalSettings, allow_download: bool) -> str | None:
    """Why the detector or the CLIP can't be loaded, judged from the disk and the hub cache."""
    setting = env_name(SECTION, "detector")
    hint = (
        f"Set {setting} (run.sh geneval --detector) to a directory holding a transformers Mask2Former "
        "(GenEval's mmdet checkpoint converted: python -m services.geneval.convert CHECKPOINT DIR), or to a hub id "
        "such as facebook/mask2former-swin-small-coco-instance."
    )
    problem = missing_weights(settings.detector, setting, hint, allow_download)
    if problem:
        return problem
    setting = env_name(SECTION, "clip")
    hint = f"Set {setting} (run.sh geneval --clip) to a transformers CLIP directory or hub id."
    return missing_weights(settings.clip, setting, hint, allow_download)


def preflight(service: str = SECTION) -> str | None:
    """Why the service cannot start on this node without a download; None when it can."""
    return offline_problem(read_settings, missing)
