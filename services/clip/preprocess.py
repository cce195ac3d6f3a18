"""Image and text preprocessing of the CLIP scorers, NumPy and PIL only: it runs on the request
threads, where a torch kernel's parallel region would compete with the inference thread's.

Two image recipes, as the reference scorers apply them:

- the checkpoint's own image processor (transformers' PIL path: resize the uint8 image with
  the processor's filter, centre-crop, rescale, normalise), PickScore's and the aesthetic's;
- ``FloatTransform``: torchvision's ``Resize`` / ``CenterCrop`` / ``Normalize`` on a float
  tensor in [0, 1], as flow_grpo's CLIP scorer and HPSv2's ``preprocess_val`` run them. PIL
  resamples float ("F") images with the same antialiased kernels as torch's ``interpolate``
  (``antialias=True``), so the result equals torchvision's to about 3e-5 per pixel.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

RESAMPLING = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def input_bytes(processor: Any) -> int:
    """The most memory one image's model input takes while a request holds it, whatever the
    image's size: its (3, crop) float32 array, twice (the processor's per-image arrays beside
    the batch it stacks them into)."""
    crop = processor.crop_size
    return 2 * 3 * int(crop["height"]) * int(crop["width"]) * 4


def resized_size(width: int, height: int, shortest_edge: int) -> tuple[int, int]:
    """(width, height) after resizing the shortest edge to ``shortest_edge`` (the longer edge
    truncated, as torchvision and transformers both do)."""
    if width <= height:
        return shortest_edge, int(shortest_edge * height / width)
    return int(shortest_edge * width / height), shortest_edge


@dataclass(frozen=True)
class FloatTransform:
    """torchvision's ``Resize(shortest_edge)``, ``CenterCrop(crop)``, ``Normalize(mean, std)`` on
    the image as floats in [0, 1]; returns a (3, crop height, crop width) float32 array."""

    shortest_edge: int
    crop: tuple[int, int]  # height, width
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resample: Image.Resampling

    @classmethod
    def from_processor(cls, processor: Any, resample: str) -> FloatTransform:
        """Sizes and statistics from a CLIP image processor's configuration."""
        crop = processor.crop_size
        transform = cls(
            shortest_edge=int(processor.size["shortest_edge"]),
            crop=(int(crop["height"]), int(crop["width"])),
            mean=tuple(processor.image_mean),
            std=tuple(processor.image_std),
            resample=RESAMPLING[resample],
        )
        if max(transform.crop) > transform.shortest_edge:
            raise ValueError(f"crop {transform.crop} is larger than the resized image's shortest edge")
        return transform

    def __call__(self, image: Image.Image) -> np.ndarray:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / np.float32(255)
        size = resized_size(image.width, image.height, self.shortest_edge)
        channels = [np.asarray(Image.fromarray(pixels[..., c]).resize(size, self.resample)) for c in range(3)]
        resized = np.stack(channels)
        crop_height, crop_width = self.crop
        top = round((size[1] - crop_height) / 2.0)  # torchvision's centre, not transformers' floor
        left = round((size[0] - crop_width) / 2.0)
        cropped = resized[:, top : top + crop_height, left : left + crop_width]
        mean = np.asarray(self.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(self.std, dtype=np.float32)[:, None, None]
        return np.ascontiguousarray((cropped - mean) / std, dtype=np.float32)


def open_clip_text(text: str) -> str:
    """open_clip's tokenizer clean-up before BPE (``ftfy.fix_text``, HTML entities unescaped
    twice, whitespace collapsed, lower case): curly quotes, entities and full-width letters
    then give the tokens HPSv2 was trained on."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).lower()
