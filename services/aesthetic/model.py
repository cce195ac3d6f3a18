"""The model: CLIP image features, L2-normalised, through the LAION MLP head.

Kept apart from ``scorer.py`` and imported by ``setup`` only: torch and transformers take
seconds to import, and a worker should answer ``/health`` while they load.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn
from transformers import AutoImageProcessor, CLIPModel

from common.imaging.images import once_per_image
from common.models.hub import local_first
from common.models.precision import torch_dtype
from services.clip.preprocess import input_bytes
from services.clip.towers import image_features, normalised


class AestheticHead(nn.Module):
    """The LAION MLP: same layers and state-dict keys (``layers.0/2/4/6/7``) as the release."""

    def __init__(self, dim: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(dim, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.layers(embeddings)


class AestheticModel:
    """CLIP, its image processor and the head on one device; raw scores in micro-batches."""

    def __init__(self, clip: str, head: str, device: str, precision: str, micro_batch: int) -> None:
        """Load everything; ``OSError`` when CLIP can't be found, ``HeadError`` for the head."""
        self.device = device
        self.dtype = torch_dtype(precision, device)
        self.micro_batch = micro_batch
        self.clip, self.processor = self._load_clip(clip)
        self.head = self._load_head(head, self.clip.config.projection_dim)
        size = getattr(self.processor, "size", None) or {}
        # CLIP resizes the shortest edge to this, then centre-crops.
        self.shortest_edge: int | None = size.get("shortest_edge")
        self.input_bytes = input_bytes(self.processor)

    def _load_clip(self, source: str) -> tuple[CLIPModel, Any]:
        return local_first(lambda offline: self._from_pretrained(source, local_files_only=offline))

    def _from_pretrained(self, source: str, local_files_only: bool) -> tuple[CLIPModel, Any]:
        clip = CLIPModel.from_pretrained(source, dtype=self.dtype, local_files_only=local_files_only)
        processor = AutoImageProcessor.from_pretrained(source, local_files_only=local_files_only)
        return clip.to(self.device).eval(), processor

    def _load_head(self, path: str, dim: int) -> AestheticHead:
        head = AestheticHead(dim)
        try:
            head.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        except (OSError, RuntimeError, pickle.UnpicklingError, EOFError, TypeError, AttributeError, ValueError) as exc:
            # unreadable, not a state dict, refused by the weights-only unpickler, wrong keys or shapes
            raise HeadError(f"{type(exc).__name__}: {exc}") from None
        return head.to(self.device).eval()

    def preprocess(self, images: list[Image.Image]) -> list[torch.Tensor]:
        """CLIP's own resize, centre crop and normalise; one float32 tensor per image, made once
        per distinct image.

        NumPy only (``from_numpy`` copies nothing): no torch kernel runs on the request
        threads, whose parallel regions would compete with the inference thread's on a CPU.
        """
        return once_per_image(images, self._pixels)

    def _pixels(self, images: list[Image.Image]) -> list[torch.Tensor]:
        pixels = self.processor(images=images, return_tensors="np")["pixel_values"]
        return [torch.from_numpy(array) for array in pixels]

    @torch.inference_mode()
    def raw_scores(self, batch: Sequence[torch.Tensor]) -> list[float]:
        """The head's output per image, ``micro_batch`` images per forward pass."""
        scores: list[float] = []
        for start in range(0, len(batch), self.micro_batch):
            pixels = torch.stack(list(batch[start : start + self.micro_batch])).to(self.device).to(self.dtype)
            # The head runs in float32 on the normalised embedding, whatever CLIP's precision.
            embeddings = normalised(image_features(self.clip, pixels))
            scores.extend(self.head(embeddings).squeeze(-1).tolist())
        return scores


class HeadError(ValueError):
    """The head file is not a LAION aesthetic head for this CLIP."""
