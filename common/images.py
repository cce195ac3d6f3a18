"""The image request (docs/ARCHITECTURE.md §5.1): validation of ``images``/``prompts``/``metadata`` and
safe image decoding (format allow-list, pixel limit checked before pixels are decoded)."""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass
from typing import Any

from PIL import Image

from common.errors import PayloadTooLarge, Unprocessable
from common.settings import CoreSettings

ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP")

# Our own limit (``max_pixels``) replaces PIL's global bomb guard, which warns at one size and
# raises at another; we want one clear 413 at the configured size.
Image.MAX_IMAGE_PIXELS = None


@dataclass(frozen=True)
class ImageRequest:
    """A validated image request: raw image bytes, prompts and the free-form metadata."""

    images: list[bytes]
    prompts: list[str]
    metadata: dict[str, Any]


def _image_bytes(value: Any, index: int) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):  # the JSON twin carries base64
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise Unprocessable(f"images[{index}] is not valid base64") from None
    raise Unprocessable(f"images[{index}] must be bytes (or base64 text in JSON), got {type(value).__name__}")


def parse_image_request(payload: dict[str, Any], core: CoreSettings) -> ImageRequest:
    """Check the shape and limits of an image request; raise a clear 413/422 otherwise."""
    images = payload.get("images")
    prompts = payload.get("prompts")
    metadata = payload.get("metadata") or {}
    if not isinstance(images, (list, tuple)):
        raise Unprocessable("'images' must be a list of encoded images")
    if not isinstance(prompts, (list, tuple)):
        raise Unprocessable("'prompts' must be a list of strings, one per image")
    if not isinstance(metadata, dict):
        raise Unprocessable("'metadata' must be a dict")
    if len(images) > core.max_items:
        raise PayloadTooLarge(f"{len(images)} images in one request; the limit is {core.max_items}")
    if len(prompts) != len(images):
        raise Unprocessable(f"{len(images)} images but {len(prompts)} prompts; need one prompt per image")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise Unprocessable(f"prompts[{index}] must be a string, got {type(prompt).__name__}")
        if len(prompt) > core.max_prompt_chars:
            raise PayloadTooLarge(
                f"prompts[{index}] has {len(prompt)} characters; the limit is {core.max_prompt_chars}"
            )
    return ImageRequest(
        images=[_image_bytes(value, i) for i, value in enumerate(images)],
        prompts=list(prompts),
        metadata=metadata,
    )


def decode_image(data: bytes, max_pixels: int, index: int = 0) -> Image.Image:
    """Decode JPEG/PNG/WebP bytes to an RGB image; the size is checked from the header first."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
            width, height = image.size
            if width * height > max_pixels:
                raise PayloadTooLarge(
                    f"images[{index}] is {width}x{height} = {width * height} pixels; the limit is {max_pixels}"
                )
            image.load()
            return image.convert("RGB")
    except PayloadTooLarge:
        raise
    except Exception as exc:  # PIL raises many types for corrupt data
        raise Unprocessable(
            f"images[{index}] could not be decoded as JPEG, PNG or WebP: {type(exc).__name__}: {exc}"
        ) from None
