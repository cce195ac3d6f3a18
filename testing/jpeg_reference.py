"""An independent re-statement of flow_grpo's JPEG rewards (yifan123/flow_grpo
``flow_grpo/rewards.py``: ``jpeg_incompressibility`` and ``jpeg_compressibility``), written from
their description: an image's uint8 HWC RGB pixels -> ``Image.fromarray`` -> saved to a
``BytesIO`` as JPEG at quality 95 -> its size in bytes / 1000 (kB), and ``-kB / 500``. Imports
nothing from the service it checks.

A float NCHW tensor in [0, 1], as flow_grpo's trainer passes it, becomes those pixels by
``(x * 255).round().clamp(0, 255)`` as uint8, channels last (``pixels_of``, in NumPy).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def jpeg_kb(pixels: np.ndarray) -> float:
    """``pixels`` (H x W x 3, uint8) saved as flow_grpo saves them, in kB."""
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3, (pixels.dtype, pixels.shape)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    return buffer.tell() / 1000


def incompressibility(pixels: np.ndarray) -> float:
    return jpeg_kb(pixels)


def compressibility(pixels: np.ndarray) -> float:
    return -jpeg_kb(pixels) / 500


def pixels_of(images: np.ndarray) -> np.ndarray:
    """flow_grpo's conversion of a float batch (N x C x H x W, in [0, 1]) to uint8 N x H x W x C."""
    return np.clip(np.round(images * 255), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
