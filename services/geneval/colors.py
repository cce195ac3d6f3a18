"""GenEval's colour classifier: CLIP zero-shot over its 10 colours and 3 templates per class
(clip_benchmark's ``zero_shot_classifier``: each template's text embedding normalised, their
mean normalised again, made once per class at start-up), on the crops of ``crops.py``.

Imported by ``setup`` only (torch and transformers).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import CLIPModel, CLIPTokenizer

from common.models.hub import local_first
from services.clip.towers import image_features, normalised, text_features
from services.geneval.rules import CLASSNAMES, COLORS

# Texts per text-tower call at start-up.
TEXT_BATCH = 600
TEMPLATES = ("a photo of a {c} {classname}", "a photo of a {c}-colored {classname}", "a photo of a {c} object")


def prompts(classname: str) -> list[str]:
    """The 10 x 3 texts of a class, colour by colour."""
    return [template.format(c=color, classname=classname) for color in COLORS for template in TEMPLATES]


class ColorClassifier:
    """A transformers CLIP and each class's colour embeddings, on one device."""

    def __init__(self, source: str, device: str, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype
        clip = local_first(lambda offline: CLIPModel.from_pretrained(source, local_files_only=offline))
        self.clip = clip.to(device, dtype).eval()
        tokenizer = local_first(lambda offline: CLIPTokenizer.from_pretrained(source, local_files_only=offline))
        self.classes = self._class_embeddings(tokenizer)

    @torch.inference_mode()
    def _class_embeddings(self, tokenizer: CLIPTokenizer) -> torch.Tensor:
        """(80, 10, dim) unit vectors: per class and colour, the templates' mean direction."""
        texts = [text for classname in CLASSNAMES for text in prompts(classname)]
        tokens = tokenizer(texts, padding=True, return_tensors="pt")
        features = []
        for start in range(0, len(texts), TEXT_BATCH):
            ids = tokens["input_ids"][start : start + TEXT_BATCH].to(self.device)
            mask = tokens["attention_mask"][start : start + TEXT_BATCH].to(self.device)
            features.append(normalised(text_features(self.clip, ids, mask)))
        mean = torch.cat(features).view(len(CLASSNAMES), len(COLORS), len(TEMPLATES), -1).mean(dim=2)
        return mean / mean.norm(dim=-1, keepdim=True)

    @torch.inference_mode()
    def __call__(self, batch: Sequence[tuple[np.ndarray, int]]) -> list[int]:
        """Each (crop pixels, class index) -> the index of its colour."""
        pixels = torch.from_numpy(np.stack([pixels for pixels, _ in batch])).to(self.device, self.dtype)
        features = normalised(image_features(self.clip, pixels))
        classes = self.classes[torch.tensor([label for _, label in batch], device=self.device)]
        return torch.einsum("nd,ncd->nc", features, classes).argmax(dim=1).tolist()
