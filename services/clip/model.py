"""CLIP on a device: the towers' features, and the text-image reward of a batch.

Imported by ``setup`` only: torch and transformers take seconds to import, and a worker should
answer ``/health`` while they load.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

from common.imaging.images import once_per_image
from common.models.hub import local_first
from common.models.precision import torch_dtype
from services.clip.open_clip_checkpoint import load_open_clip_checkpoint, read_config
from services.clip.preprocess import FloatTransform, input_bytes, open_clip_text
from services.clip.towers import image_features, normalised, text_features


@dataclass(frozen=True)
class Recipe:
    """How a reward reads its checkpoint and turns a pair into a score."""

    # "pretrained": a transformers CLIPModel; "open_clip": an open_clip checkpoint file.
    checkpoint: str
    # None: the image processor's own PIL path; "bilinear"/"bicubic": torchvision on floats.
    float_resize: str | None
    # Clean prompts as open_clip's tokenizer does before BPE.
    open_clip_text: bool
    # Multiply the cosine by the model's ``logit_scale.exp()`` (CLIP's logits).
    logit_scale: bool


class Pair(NamedTuple):
    """One sample ready for the towers: preprocessed pixels and its prompt's token ids."""

    pixels: torch.Tensor
    tokens: tuple[int, ...]


class ClipRewardModel:
    """A CLIP, its tokenizer and image preprocessing on one device; rewards in micro-batches."""

    def __init__(
        self,
        recipe: Recipe,
        model: str,
        processor: str,
        device: str,
        precision: str,
        micro_batch: int,
        divisor: float,
    ) -> None:
        """Load everything; ``OSError`` when weights or processor files can't be found,
        ``CheckpointError`` for an open_clip file that does not fit."""
        self.recipe = recipe
        self.device = device
        self.dtype = torch_dtype(precision, device)
        self.micro_batch = micro_batch
        clip = self._load_model(model)
        self.clip = clip.to(self.device, self.dtype).eval()
        self.tokenizer = local_first(lambda offline: CLIPTokenizer.from_pretrained(processor, local_files_only=offline))
        self.image_processor = local_first(
            lambda offline: CLIPImageProcessorPil.from_pretrained(processor, local_files_only=offline)
        )
        self.float_transform = (
            FloatTransform.from_processor(self.image_processor, recipe.float_resize) if recipe.float_resize else None
        )
        self.shortest_edge: int = int(self.image_processor.size["shortest_edge"])
        self.input_bytes = input_bytes(self.image_processor)
        self.context_length: int = clip.config.text_config.max_position_embeddings
        scale = clip.logit_scale.detach().float().exp().item() if recipe.logit_scale else 1.0
        self.factor = scale / divisor
        # transformers' fast tokenizer re-applies its truncation settings on each call, which the
        # Rust side refuses ("Already borrowed") when two threads do it at once.
        self._tokenizing = threading.Lock()

    def _load_model(self, source: str) -> CLIPModel:
        if self.recipe.checkpoint == "open_clip":
            path = Path(source).expanduser()
            return load_open_clip_checkpoint(path, read_config(path.parent))
        return local_first(lambda offline: CLIPModel.from_pretrained(source, local_files_only=offline))

    def preprocess(self, images: list[Image.Image]) -> list[torch.Tensor]:
        """One float32 (3, H, W) tensor per image, made once per distinct image."""
        return once_per_image(images, self._pixels)

    def _pixels(self, images: list[Image.Image]) -> list[torch.Tensor]:
        """Each image's tensor, NumPy only (``from_numpy`` copies nothing)."""
        if self.float_transform is not None:
            return [torch.from_numpy(self.float_transform(image)) for image in images]
        pixels = self.image_processor(images=images, return_tensors="np")["pixel_values"]
        return [torch.from_numpy(array) for array in pixels]

    def tokenize(self, prompts: list[str]) -> list[tuple[int, ...]]:
        """Token ids per prompt, truncated to the text tower's context as the references do."""
        if self.recipe.open_clip_text:
            prompts = [open_clip_text(prompt) for prompt in prompts]
        with self._tokenizing:
            ids = self.tokenizer(prompts, truncation=True, max_length=self.context_length)["input_ids"]
        return [tuple(row) for row in ids]

    @torch.inference_mode()
    def _text_embeddings(self, texts: list[tuple[int, ...]]) -> torch.Tensor:
        """Normalised embeddings of distinct token sequences, padded per micro-batch."""
        out = []
        for start in range(0, len(texts), self.micro_batch):
            chunk = texts[start : start + self.micro_batch]
            width = max(len(ids) for ids in chunk)
            input_ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for row, ids in enumerate(chunk):
                input_ids[row, : len(ids)] = ids
                mask[row, : len(ids)] = 1
            features = text_features(
                self.clip, torch.from_numpy(input_ids).to(self.device), torch.from_numpy(mask).to(self.device)
            )
            out.append(normalised(features))
        return torch.cat(out)

    @torch.inference_mode()
    def scores(self, batch: Sequence[Pair]) -> list[float]:
        """cos(image, text) x factor per pair. A prompt shared by many pairs (a GRPO group) is
        encoded once per batch."""
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(pair.tokens, len(distinct)) for pair in batch]
        texts = self._text_embeddings(list(distinct))
        scores: list[float] = []
        for start in range(0, len(batch), self.micro_batch):
            chunk = batch[start : start + self.micro_batch]
            pixels = torch.stack([pair.pixels for pair in chunk]).to(self.device, self.dtype)
            images = normalised(image_features(self.clip, pixels))
            matching = texts[rows[start : start + len(chunk)]]
            scores.extend(((images * matching).sum(dim=-1) * self.factor).tolist())
        return scores
