"""The image request (docs/ARCHITECTURE.md §5.1): validation of ``images``/``prompts``/``metadata``
and safe image decoding (format allow-list; the work a decode may cost, JPEG scans and PNG
chunks counted from the bytes and pixel, aspect ratio and per-request pixel limits from the
headers, checked before any pixel is decoded), to the RGB image a viewer shows."""

from __future__ import annotations

import base64
import binascii
import functools
import io
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageCms, ImageOps

from common.batching import check_deadline, hold_work
from common.config import env_name
from common.errors import PayloadTooLarge, Unprocessable, describe_error, quote
from common.settings import CoreSettings

ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP")

# Our own limit (``max_pixels``) replaces PIL's global bomb guard, which warns at one size and
# raises at another; we want one clear 413 at the configured size.
Image.MAX_IMAGE_PIXELS = None

JPEG_START, PNG_SIGNATURE = b"\xff\xd8", b"\x89PNG\r\n\x1a\n"
# A JPEG scan starts at an SOS marker: these two bytes, which entropy-coded data never holds
# (a 0xFF there is followed by 0x00 or a restart marker), and libjpeg reads a marker only there.
JPEG_SCAN = b"\xff\xda"
# EXIF orientations that turn the image a quarter (``ImageOps.exif_transpose``): width and height swap.
_QUARTER_TURNS = {5, 6, 7, 8}
_SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


@dataclass(frozen=True)
class ImageRequest:
    """A validated image request: raw image bytes, prompts and the free-form metadata."""

    images: list[bytes]
    prompts: list[str]
    metadata: dict[str, Any]


def encoded_image(value: Any, name: str) -> bytes:
    """An image as sent: bytes, or base64 text in the JSON twin (422 otherwise)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):  # the JSON twin carries base64
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise Unprocessable(f"{name} is not valid base64") from None
    raise Unprocessable(f"{name} must be bytes (or base64 text in JSON), got {type(value).__name__}")


def check_metadata(payload: dict[str, Any]) -> dict[str, Any]:
    """The request's free-form ``metadata`` dict ({} when absent)."""
    metadata = payload.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise Unprocessable(f"'metadata' must be a dict (or absent), got {quote(metadata)}")
    return metadata


def check_prompts(prompts: Any, count: int, kind: str, core: CoreSettings) -> list[str]:
    """One prompt (a string within ``SCORER_MAX_PROMPT_CHARS``) per sample of ``kind`` (image, video)."""
    if not isinstance(prompts, (list, tuple)):
        raise Unprocessable(f"'prompts' must be a list of strings, one per {kind}")
    if len(prompts) != count:
        raise Unprocessable(f"{count} {kind}s but {len(prompts)} prompts; need one prompt per {kind}")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise Unprocessable(f"prompts[{index}] must be a string, got {type(prompt).__name__}")
        if len(prompt) > core.max_prompt_chars:
            raise PayloadTooLarge(
                f"prompts[{index}] has {len(prompt)} characters; the limit is {core.max_prompt_chars}"
            )
    return list(prompts)


def check_items(count: int, what: str, core: CoreSettings) -> None:
    """At most ``SCORER_MAX_ITEMS`` images to score in one request (413)."""
    if count > core.max_items:
        raise PayloadTooLarge(
            f"{count} {what} in one request; the limit is {core.max_items} ({env_name('', 'max_items')})"
        )


def parse_image_request(payload: dict[str, Any], core: CoreSettings) -> ImageRequest:
    """Check the shape and limits of an image request; raise a clear 413/422 otherwise."""
    images = payload.get("images")
    if not isinstance(images, (list, tuple)):
        raise Unprocessable("'images' must be a list of encoded images")
    metadata = check_metadata(payload)
    check_items(len(images), "images", core)
    prompts = check_prompts(payload.get("prompts"), len(images), "image", core)
    return ImageRequest(
        images=[encoded_image(value, name) for value, name in zip(images, image_names(len(images)))],
        prompts=prompts,
        metadata=metadata,
    )


def image_names(count: int) -> list[str]:
    """How errors name the images of an image request: ``images[i]``."""
    return [f"images[{index}]" for index in range(count)]


def open_image(data: bytes, name: str = "images[0]") -> Image.Image:
    """The image with its header read and no pixels decoded yet; 422 unless JPEG, PNG or WebP.
    ``name`` says in errors which image it is (``images[2]``, a video's frame ``videos[0][8]``)."""
    try:
        return Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except Exception as exc:  # PIL raises many types for corrupt data
        raise Unprocessable(f"{name} could not be decoded as JPEG, PNG or WebP: {describe_error(exc)}") from None


def check_image_sizes(images: Sequence[Image.Image], core: CoreSettings, names: Sequence[str] | None = None) -> None:
    """The limits on decoding work, from the headers alone: pixels per image (413), the aspect
    ratio (422) and the pixels of the whole request (413), where an image the pickle memo
    references several times counts each time, as it is decoded each time (a video's chosen
    frames are its images here). Then the decoded images are held against the worker's work bytes."""
    names = image_names(len(images)) if names is None else names
    for image, name in zip(images, names):
        _check_pixels(image, core.max_pixels, name)
        width, height = image.size
        if max(width, height) > core.max_aspect_ratio * min(width, height):
            raise Unprocessable(
                f"{name} is {width}x{height}, an aspect ratio over the limit of {core.max_aspect_ratio:g} "
                f"({env_name('', 'max_aspect_ratio')})"
            )
    total = sum(image.size[0] * image.size[1] for image in images)
    if total > core.max_request_pixels:
        raise PayloadTooLarge(
            f"the {len(images)} images (a video's chosen frames included) of the request have {total} pixels "
            f"together; the limit is {core.max_request_pixels} ({env_name('', 'max_request_pixels')})"
        )
    hold_work(sum(decoded_bytes(image) for image in images), "decoded images")


def decoded_bytes(image: Image.Image) -> int:
    """The most memory the decode of ``image`` (header read) holds: Pillow keeps 4 bytes a pixel,
    and the decoded image and its RGB copy stay until the request's images are all decoded, with
    one image's intermediate steps (turned, composited) at a time."""
    width, height = image.size
    return width * height * 12


def _check_scans(data: bytes, limit: int, name: str) -> None:
    """A progressive JPEG is decoded once per scan over the whole image: a 73 KB 4096x4096 JPEG
    repeating a 40-byte refinement scan took 11.6 s (libjpeg-turbo sets no limit)."""
    if data.startswith(JPEG_START) and (scans := data.count(JPEG_SCAN)) > limit:
        raise PayloadTooLarge(
            f"{name} is a JPEG of {scans} scans; the limit is {limit} ({env_name('', 'max_jpeg_scans')})"
        )


def _check_png_chunks(data: Sequence[bytes], limit: int, names: Sequence[str]) -> None:
    """Count the chunks of the request's PNGs, walking their lengths, up to ``limit``: Pillow
    spends microseconds on each, even an empty one (a PNG of 1 M empty chunks: 3.2 s to open)."""
    count = 0
    for item, name in zip(data, names):
        if not item.startswith(PNG_SIGNATURE):
            continue
        position = len(PNG_SIGNATURE)
        while position + 8 <= len(item):
            count += 1
            if count > limit:
                raise PayloadTooLarge(
                    f"the request's PNG images have over {limit} chunks together ({name} reaching it); "
                    f"the limit is {limit} ({env_name('', 'max_png_chunks')})"
                )
            length, kind = struct.unpack_from(">I4s", item, position)
            if kind == b"IEND":
                break
            position += 12 + length


def shown_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) as a viewer shows the image: swapped by an EXIF quarter turn."""
    width, height = image.size
    return (height, width) if _orientation(image) in _QUARTER_TURNS else (width, height)


def _orientation(image: Image.Image) -> int | None:
    """The EXIF orientation read with the header (``getexif`` of a PNG would decode it whole to
    look past its pixels: libpng-based viewers too read only an eXIf before them)."""
    try:
        exif = Image.Exif()
        exif.load(image.info.get("exif") or b"")
        return exif.get(ImageOps.ExifTags.Base.Orientation)
    except Exception:  # a viewer shows an image whose EXIF it cannot parse as stored
        return None


def load_image(image: Image.Image, name: str = "images[0]") -> Image.Image:
    """Decode an opened image's pixels to the RGB image a viewer shows (``as_shown``); 422 for
    corrupt data."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
            return as_shown(image)
    except Exception as exc:  # PIL raises many types for corrupt data
        raise Unprocessable(f"{name} could not be decoded as JPEG, PNG or WebP: {describe_error(exc)}") from None


def as_shown(image: Image.Image) -> Image.Image:
    """A decoded image as RGB the way a viewer shows it: turned by its EXIF orientation, 16-bit
    samples scaled (not clipped), palettes expanded, colours from its embedded ICC profile (CMYK
    included) to sRGB, and transparency composited over white."""
    if _orientation(image) not in (None, 1):
        image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit greyscale (PNG): 0..65535 to 0..255, rounded; Pillow's convert clips it at 255.
        samples = np.clip(np.asarray(image), 0, 65535).astype(np.uint32)
        image = Image.fromarray(((samples * 255 + 32767) // 65535).astype(np.uint8), "L")
    if image.mode in ("P", "PA", "LA", "La", "RGBa", "1") or "transparency" in image.info:
        has_alpha = "transparency" in image.info or image.mode in ("PA", "LA", "La", "RGBa")
        image = image.convert("RGBA" if has_alpha else "RGB")
    image = _to_srgb(image)
    if image.mode == "RGBA":
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image)
    return image.convert("RGB")


def _to_srgb(image: Image.Image) -> Image.Image:
    """Colours by the image's ICC profile converted to sRGB (RGB, or RGBA keeping its alpha); an
    image without one, or whose profile lcms cannot use, is taken as sRGB, as viewers do."""
    profile = image.info.get("icc_profile")
    if not profile or image.mode not in ("RGB", "RGBA", "CMYK", "L"):
        return image
    output = "RGBA" if image.mode == "RGBA" else "RGB"
    transform = _srgb_transform(bytes(profile), image.mode, output)
    return image if transform is None else transform.apply(image)


@functools.lru_cache(maxsize=16)
def _srgb_transform(profile: bytes, mode: str, output: str) -> ImageCms.ImageCmsTransform | None:
    """One transform per profile and mode (a request's images usually share one profile)."""
    try:
        source = ImageCms.ImageCmsProfile(io.BytesIO(profile))
        return ImageCms.buildTransform(source, _SRGB, mode, output)
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
        return None


def open_images(data: Sequence[bytes], core: CoreSettings, names: Sequence[str] | None = None) -> list[Image.Image]:
    """A request's images with their headers read, once their bytes are within the limits that
    Pillow's reading itself would break: scans per JPEG (413) and the chunks of the request's
    PNGs (413; Pillow reads a PNG's chunks up to its pixels in ``Image.open``); then checked
    against the limits of ``check_image_sizes``, no pixel decoded yet."""
    names = image_names(len(data)) if names is None else names
    for item, name in zip(data, names):
        _check_scans(item, core.max_jpeg_scans, name)
    _check_png_chunks(data, core.max_png_chunks, names)
    images = [open_image(item, name) for item, name in zip(data, names)]
    check_image_sizes(images, core, names)
    return images


def load_images(images: Sequence[Image.Image], names: Sequence[str] | None = None) -> list[Image.Image]:
    """Decode opened images to RGB, the request's deadline checked between one image and the next."""
    names = image_names(len(images)) if names is None else names
    decoded = []
    for image, name in zip(images, names):
        check_deadline("decoding its images")
        decoded.append(load_image(image, name))
    return decoded


def decode_images(data: Sequence[bytes], core: CoreSettings, names: Sequence[str] | None = None) -> list[Image.Image]:
    """Decode a request's images to RGB once all their headers are within the limits."""
    return load_images(open_images(data, core, names), names)


def decode_image(data: bytes, max_pixels: int, name: str = "images[0]") -> Image.Image:
    """Decode one image to RGB; the size is checked from the header first."""
    image = open_image(data, name)
    _check_pixels(image, max_pixels, name)
    return load_image(image, name)


def _check_pixels(image: Image.Image, max_pixels: int, name: str) -> None:
    width, height = image.size
    if width * height > max_pixels:
        raise PayloadTooLarge(
            f"{name} is {width}x{height} = {width * height} pixels; the limit is {max_pixels} "
            f"({env_name('', 'max_pixels')})"
        )
