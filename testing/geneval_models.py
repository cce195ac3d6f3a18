"""A random Mask2Former of GenEval's architecture (Swin backbone, multi-scale deformable pixel
decoder, masked-attention decoder, COCO's 80 classes) at tiny widths, saved with
``save_pretrained`` as a converted or downloaded detector is laid out: the service loads it by
its own path; and scenes for it of any size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, SwinConfig

# Swin-S's layout (depths 2-2-18-2, heads 3-6-12-24, window 7, 224 pretraining) at tiny widths; the
# head's widths are multiples of 32, its GroupNorm's groups.
TINY_SWIN: dict[str, Any] = {
    "embed_dim": 12,
    "depths": [1, 1, 2, 1],
    "num_heads": [1, 1, 2, 2],
    "window_size": 7,
    "image_size": 224,
    "drop_path_rate": 0.0,
    "out_features": ["stage1", "stage2", "stage3", "stage4"],
}
TINY_HEAD: dict[str, Any] = {
    "num_labels": 80,
    "num_queries": 20,
    "hidden_dim": 32,
    "mask_feature_size": 32,
    "feature_size": 32,
    "encoder_feedforward_dim": 64,
    "dim_feedforward": 64,
    "encoder_layers": 1,
    "decoder_layers": 2,
    "num_attention_heads": 2,
}


# How far the random heads are pushed so that detections pass GenEval's thresholds and differ
# (random weights alone give every class about 1/81 and every mask the whole image): class
# logits scaled, a few classes (dog, cat, cup) raised, mask embeddings scaled.
CLASS_SCALE = 30.0
MASK_SCALE = 6.0
BOOSTS = {16: 6.0, 15: 5.0, 41: 5.0}


# GenEval's detector at its real size (mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco): Swin-S,
# 100 queries, 256 wide, 6 encoder and 9 decoder layers (transformers counts the first
# prediction as a tenth).
SWIN_S: dict[str, Any] = {**TINY_SWIN, "embed_dim": 96, "depths": [2, 2, 18, 2], "num_heads": [3, 6, 12, 24]}
SWIN_S_HEAD: dict[str, Any] = {"num_labels": 80, "num_queries": 100, "decoder_layers": 10, "encoder_layers": 6}


def tiny_config() -> Mask2FormerConfig:
    return Mask2FormerConfig(backbone_config=SwinConfig(**TINY_SWIN), **TINY_HEAD)


def swin_s_config() -> Mask2FormerConfig:
    return Mask2FormerConfig(backbone_config=SwinConfig(**SWIN_S), **SWIN_S_HEAD)


def save_random_mask2former(directory: Path, seed: int = 0, confident: bool = True, size: str = "tiny") -> Path:
    """The random detector (``size``: "tiny" or "swin-s"), saved; ``confident``: its heads
    pushed (``CLASS_SCALE``)."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = Mask2FormerForUniversalSegmentation(tiny_config() if size == "tiny" else swin_s_config()).eval()
    if confident:
        with torch.no_grad():
            # Queries that disagree on class and mask: the heads' weights scaled up.
            model.class_predictor.weight.mul_(CLASS_SCALE)
            for name, parameter in model.named_parameters():
                if "mask_embedder" in name and name.endswith("weight"):
                    parameter.mul_(MASK_SCALE)
            # Pixel embeddings centred per image channel: masks that cover part of the image.
            model.model.pixel_level_module.decoder.mask_projection.bias.zero_()
            for label, boost in BOOSTS.items():
                model.class_predictor.bias[label] += boost
    model.save_pretrained(directory)
    return directory


def geneval_service_settings(directory: Path) -> dict[str, str]:
    """The GenEval service's settings for a tiny random detector and CLIP written under
    ``directory``, at the tests' input scale (mmdet's 1333 x 800 costs a CPU seconds an image)."""
    from testing.clip_models import save_random_clip_model

    return {
        "SCORER_GENEVAL_DETECTOR": str(save_random_mask2former(directory / "detector")),
        "SCORER_GENEVAL_CLIP": str(save_random_clip_model(directory / "clip")),
        "SCORER_GENEVAL_MIN_SIZE": "96",
        "SCORER_GENEVAL_MAX_SIZE": "128",
    }


def ellipses(width: int, height: int, seed: int) -> Image.Image:
    """Five coloured ellipses, a twelfth to a third of each side, on a coloured ground: at any
    size, shapes that the tiny detector's masks follow."""
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(0, 255, 3)))
    draw = ImageDraw.Draw(image)
    for _ in range(5):
        w, h = int(rng.integers(width // 12, width // 3)), int(rng.integers(height // 12, height // 3))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        draw.ellipse([x, y, x + w, y + h], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return image
