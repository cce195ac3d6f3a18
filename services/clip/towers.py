"""The two towers of any transformers CLIP, whatever the transformers version; shared by the
aesthetic and the text-image reward models."""

from __future__ import annotations

from typing import Any

import torch
from transformers import CLIPModel


def _pooled(out: Any) -> torch.Tensor:
    """``get_*_features`` return a tensor before transformers 5, the output's ``pooler_output`` since."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def image_features(model: CLIPModel, pixels: torch.Tensor) -> torch.Tensor:
    return _pooled(model.get_image_features(pixel_values=pixels))


def text_features(model: CLIPModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return _pooled(model.get_text_features(input_ids=input_ids, attention_mask=attention_mask))


def normalised(features: torch.Tensor) -> torch.Tensor:
    """float32 unit vectors, whatever the towers' precision."""
    features = features.float()
    return features / features.norm(p=2, dim=-1, keepdim=True)
