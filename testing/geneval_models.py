"""A random Mask2Former of GenEval's architecture (Swin backbone, multi-scale deformable pixel
decoder, masked-attention decoder, COCO's 80 classes) at tiny widths, saved with
``save_pretrained`` as a converted or downloaded detector is laid out: the service loads it by
its own path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
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


def tiny_config() -> Mask2FormerConfig:
    return Mask2FormerConfig(backbone_config=SwinConfig(**TINY_SWIN), **TINY_HEAD)


def save_random_mask2former(directory: Path, seed: int = 0, confident: bool = True) -> Path:
    """The random detector, saved. ``confident``: its class logits biased so that detections
    pass GenEval's thresholds (random weights alone give every class about 1/81)."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = Mask2FormerForUniversalSegmentation(tiny_config()).eval()
    if confident:
        with torch.no_grad():
            head = model.class_predictor
            head.weight.mul_(0.05)
            head.bias.zero_()
            # Queries favour a few classes strongly: dogs, cats and cups come back above 0.9.
            for label, boost in ((16, 12.0), (15, 11.0), (41, 10.0)):
                head.bias[label] = boost
    model.save_pretrained(directory)
    return directory
