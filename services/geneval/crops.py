"""GenEval's colour crops, on the request threads (NumPy and PIL only): each detection's box cut
from the image with everything outside its mask painted grey (``#999``), then open_clip's
``ViT-L-14`` preprocessing: the shortest edge resized to 224 (bicubic, on the uint8 image, as
torchvision does for PIL), the centre 224 x 224, OpenAI's statistics."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from services.clip.preprocess import resized_size

BACKGROUND = (0x99, 0x99, 0x99)
CROP = 224
OPENAI_MEAN = np.asarray((0.48145466, 0.4578275, 0.40821073), dtype=np.float32)[:, None, None]
OPENAI_STD = np.asarray((0.26862954, 0.26130258, 0.27577711), dtype=np.float32)[:, None, None]
# A crop whose resize would exceed this many times the 224 x 224 it keeps (a thin sliver) is
# resized over its centre only (PIL's ``box``), not whole: its cost stays bounded.
MAX_RESIZE_FACTOR = 4
# The bytes of one crop's model input.
CROP_BYTES = 3 * CROP * CROP * 4


def masked_crop(image: Image.Image, mask: np.ndarray, box: Sequence[float]) -> Image.Image:
    """The image inside ``mask`` on grey, cut to ``box`` (PIL rounds its corners)."""
    grey = Image.new("RGB", image.size, BACKGROUND)
    return Image.composite(image, grey, Image.fromarray(mask)).crop(tuple(box))


def crop_pixels(crop: Image.Image) -> np.ndarray:
    """A crop as CLIP's (3, 224, 224) float32 input."""
    width, height = crop.size
    new_width, new_height = resized_size(width, height, CROP)
    top = round((new_height - CROP) / 2.0)
    left = round((new_width - CROP) / 2.0)
    if new_width * new_height <= MAX_RESIZE_FACTOR * CROP * CROP:
        resized = crop.resize((new_width, new_height), Image.Resampling.BICUBIC)
        shown = resized.crop((left, top, left + CROP, top + CROP))
    else:
        sx, sy = width / new_width, height / new_height
        region = (left * sx, top * sy, (left + CROP) * sx, (top + CROP) * sy)
        shown = crop.resize((CROP, CROP), Image.Resampling.BICUBIC, box=region)
    pixels = np.asarray(shown, dtype=np.float32).transpose(2, 0, 1) / np.float32(255)
    return np.ascontiguousarray((pixels - OPENAI_MEAN) / OPENAI_STD)
