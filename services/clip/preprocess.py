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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from common.configuration.config import env_name
from common.configuration.settings import CoreSettings
from common.imaging.images import shown_size
from common.limits.budget import hold_work
from common.limits.errors import PayloadTooLarge, Unprocessable

RESAMPLING = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def check_clip_inputs(
    images: Sequence[Image.Image],
    names: Sequence[str],
    shortest_edge: int | None,
    nbytes: int,
    what: str,
    core: CoreSettings,
) -> None:
    """A CLIP reward's bounds on a request's images, from their headers: CLIP resizes the shortest
    edge to ``shortest_edge`` (None: to a fixed size) before its centre crop, so a 1 x 300,000
    PNG would grow to billions of pixels (422 past ``SCORER_MAX_PIXELS``), and a 70-byte 1 x 50
    one to 2.5 Mpx, a 0.1 s resize: the resized pixels of the request, each reference counted,
    are bounded as its decoded pixels are (413 past ``SCORER_MAX_REQUEST_PIXELS``). The model
    inputs, ``nbytes`` a distinct image (``input_bytes``; its references share it,
    ``once_per_image``), are held against the work bytes first."""
    hold_work(len({id(image) for image in images}) * nbytes, what)
    if not shortest_edge:
        return
    total = 0
    for image, name in zip(images, names):
        shown = shown_size(image)
        width, height = resized_size(*shown, shortest_edge)
        if width * height > core.max_pixels:
            raise Unprocessable(
                f"{name} is {shown[0]}x{shown[1]}: resized to a shortest edge of {shortest_edge} it would have "
                f"{width * height} pixels, over the limit of {core.max_pixels}; the aspect ratio is too extreme"
            )
        total += width * height
        if total > core.max_request_pixels:
            raise PayloadTooLarge(
                f"the request's images resized to a shortest edge of {shortest_edge} ({name}: {shown[0]}x{shown[1]} "
                f"to {width}x{height}) have over {core.max_request_pixels} pixels together; the limit is "
                f"{core.max_request_pixels} ({env_name('', 'max_request_pixels')})"
            )


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
        return centre_crop_normalised(np.stack(channels), self.crop, self.mean, self.std)


def centre_crop_normalised(
    resized: np.ndarray, crop: tuple[int, int], mean: Sequence[float], std: Sequence[float]
) -> np.ndarray:
    """torchvision's ``CenterCrop(crop)`` (height, width) then ``Normalize(mean, std)`` of a
    (3, height, width) float32 array; a contiguous float32 array."""
    crop_height, crop_width = crop
    top = round((resized.shape[1] - crop_height) / 2.0)  # torchvision's centre, not transformers' floor
    left = round((resized.shape[2] - crop_width) / 2.0)
    cropped = resized[:, top : top + crop_height, left : left + crop_width]
    mean_array = np.asarray(mean, dtype=np.float32)[:, None, None]
    std_array = np.asarray(std, dtype=np.float32)[:, None, None]
    return np.ascontiguousarray((cropped - mean_array) / std_array, dtype=np.float32)


def open_clip_text(text: str) -> str:
    """open_clip's tokenizer clean-up before BPE (``ftfy.fix_text``, HTML entities unescaped
    twice, whitespace collapsed, lower case): curly quotes, entities and full-width letters
    then give the tokens HPSv2 was trained on."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).lower()
