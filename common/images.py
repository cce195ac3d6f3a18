"""The image request (docs/ARCHITECTURE.md §5.1): validation of ``images``/``prompts``/``metadata``
and safe image decoding (format allow-list; pixel, aspect ratio and per-request pixel limits
checked from the headers before any pixel is decoded)."""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from common.config import env_name
from common.errors import PayloadTooLarge, Unprocessable, describe_error, quote
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
    metadata = payload.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(images, (list, tuple)):
        raise Unprocessable("'images' must be a list of encoded images")
    if not isinstance(prompts, (list, tuple)):
        raise Unprocessable("'prompts' must be a list of strings, one per image")
    if not isinstance(metadata, dict):
        raise Unprocessable(f"'metadata' must be a dict (or absent), got {quote(metadata)}")
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


def open_image(data: bytes, index: int = 0) -> Image.Image:
    """The image with its header read and no pixels decoded yet; 422 unless JPEG, PNG or WebP."""
    try:
        return Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except Exception as exc:  # PIL raises many types for corrupt data
        raise Unprocessable(
            f"images[{index}] could not be decoded as JPEG, PNG or WebP: {describe_error(exc)}"
        ) from None


def check_image_sizes(images: Sequence[Image.Image], core: CoreSettings) -> None:
    """The limits on decoding work, from the headers alone: pixels per image (413), the aspect
    ratio (422) and the pixels of the whole request (413), where an image the pickle memo
    references several times counts each time, as it is decoded each time."""
    for index, image in enumerate(images):
        _check_pixels(image, core.max_pixels, index)
        width, height = image.size
        if max(width, height) > core.max_aspect_ratio * min(width, height):
            raise Unprocessable(
                f"images[{index}] is {width}x{height}, an aspect ratio over the limit of {core.max_aspect_ratio:g} "
                f"({env_name('', 'max_aspect_ratio')})"
            )
    total = sum(image.size[0] * image.size[1] for image in images)
    if total > core.max_request_pixels:
        raise PayloadTooLarge(
            f"the {len(images)} images of the request have {total} pixels together; the limit is "
            f"{core.max_request_pixels} ({env_name('', 'max_request_pixels')})"
        )


def load_image(image: Image.Image, index: int = 0) -> Image.Image:
    """Decode an opened image's pixels to RGB; 422 for corrupt data."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
            return image.convert("RGB")
    except Exception as exc:  # PIL raises many types for corrupt data
        raise Unprocessable(
            f"images[{index}] could not be decoded as JPEG, PNG or WebP: {describe_error(exc)}"
        ) from None


def decode_images(data: Sequence[bytes], core: CoreSettings) -> list[Image.Image]:
    """Decode a request's images to RGB once all their headers are within the limits."""
    images = [open_image(item, index) for index, item in enumerate(data)]
    check_image_sizes(images, core)
    return [load_image(image, index) for index, image in enumerate(images)]


def decode_image(data: bytes, max_pixels: int, index: int = 0) -> Image.Image:
    """Decode one image to RGB; the size is checked from the header first."""
    image = open_image(data, index)
    _check_pixels(image, max_pixels, index)
    return load_image(image, index)


def _check_pixels(image: Image.Image, max_pixels: int, index: int) -> None:
    width, height = image.size
    if width * height > max_pixels:
        raise PayloadTooLarge(
            f"images[{index}] is {width}x{height} = {width * height} pixels; the limit is {max_pixels} "
            f"({env_name('', 'max_pixels')})"
        )
