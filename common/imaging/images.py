"""The decode policy (docs/ARCHITECTURE.md §5.1): an image's bytes to the RGB image a viewer
shows. The format allow-list and the work a decode may cost are checked first (JPEG scans and
PNG chunks from the bytes, ``common.imaging.image_bytes``; pixels, aspect ratio and the request's pixels
from the headers), then the pixels are decoded, each distinct image once."""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
from PIL import Image, ImageCms

from common.configuration.config import env_name
from common.configuration.settings import CoreSettings
from common.imaging.image_bytes import check_png_chunks, check_scans, exif_orientation, shown_png_chunks
from common.imaging.image_request import image_names
from common.limits.budget import hold_work
from common.limits.deadlines import check_deadline
from common.limits.errors import PayloadTooLarge, Unprocessable, describe_error

T = TypeVar("T")

ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP")

# Our own limit (``max_pixels``) replaces PIL's global bomb guard, which warns at one size and
# raises at another; we want one clear 413 at the configured size.
Image.MAX_IMAGE_PIXELS = None

# EXIF orientations 2-8 and how each turns the image (1: as stored); 5-8 turn it a quarter,
# swapping width and height.
_TURNS = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_QUARTER_TURNS = {5, 6, 7, 8}
_SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


def open_image(data: bytes, name: str = "images[0]") -> Image.Image:
    """The image with its header read and no pixels decoded yet; 422 unless JPEG, PNG or WebP.
    ``name`` says in errors which image it is (``images[2]``, a video's frame ``videos[0][8]``).
    A PNG is read without the chunks a viewer does not use (``shown_png_chunks``)."""
    try:
        return Image.open(io.BytesIO(shown_png_chunks(data)), formats=ALLOWED_FORMATS)
    except Exception as exc:  # PIL raises many types for corrupt data
        raise Unprocessable(f"{name} could not be decoded as JPEG, PNG or WebP: {describe_error(exc)}") from None


def check_image_sizes(images: Sequence[Image.Image], core: CoreSettings, names: Sequence[str] | None = None) -> None:
    """The limits on decoding work, from the headers alone: pixels per image (413), the aspect
    ratio (422) and the pixels of the whole request (413), where an image the pickle memo
    references several times counts each time, as it is decoded each time (a video's chosen
    frames are its images here). Then the decoded images, and the metadata each distinct image
    keeps, are held against the worker's work bytes."""
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
    distinct = {id(image): image for image in images}.values()
    hold_work(
        sum(decoded_bytes(image) for image in images) + sum(metadata_bytes(image) for image in distinct),
        "decoded images",
    )


def decoded_bytes(image: Image.Image) -> int:
    """The most memory the decode of ``image`` (header read) holds: Pillow keeps 4 bytes a pixel,
    and the decoded image and its RGB copy stay until the request's images are all decoded, with
    one image's intermediate steps (turned, composited) at a time; 8 more for an APNG whose
    hidden default image is decoded before its first frame (canvas and previous frame), 16 more
    for a 16-bit RGB PNG with a transparent colour (its low bytes decoded again, the 16-bit
    samples compared: ``_decoded``)."""
    width, height = image.size
    extra = 8 if _hides_default_image(image) else 16 if _keyed_rgb16(image) else 0
    return width * height * (12 + extra)


def metadata_bytes(image: Image.Image) -> int:
    """The bytes of metadata Pillow keeps from reading an image's header until the request ends:
    its ICC profile (a PNG's iCCP inflated, up to 1 MB from ~1 KB), EXIF, XMP, a JPEG's APP
    segments (counted twice where ``info`` holds them too)."""
    kept = [value for value in image.info.values() if isinstance(value, (bytes, str))]
    kept += [segment for _, segment in getattr(image, "applist", [])]
    return sum(map(len, kept))


def shown_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) as a viewer shows the image: swapped by an EXIF quarter turn."""
    width, height = image.size
    return (height, width) if exif_orientation(image.info.get("exif")) in _QUARTER_TURNS else (width, height)


def load_image(image: Image.Image, name: str = "images[0]") -> Image.Image:
    """Decode an opened image's pixels to the RGB image a viewer shows (``as_shown``); 422 for
    corrupt data."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return as_shown(_decoded(image))
    except Exception as exc:  # PIL raises many types for corrupt data
        raise Unprocessable(f"{name} could not be decoded as JPEG, PNG or WebP: {describe_error(exc)}") from None


def _decoded(image: Image.Image) -> Image.Image:
    """An opened image's pixels, decoded as a viewer reads them where Pillow differs: an APNG as
    the first frame of its animation (its default image, when the animation leaves it out, is
    shown by no browser and is Pillow's frame 0); a 16-bit RGB PNG's transparent colour (tRNS)
    matched at 16 bits (Pillow keeps the samples' high bytes and matches those)."""
    if _hides_default_image(image):
        image.seek(1)
        image.load()
        return image
    if _keyed_rgb16(image):
        low = Image.open(io.BytesIO(image.fp.getvalue()), formats=["PNG"])  # the samples' low bytes
        low.tile = [tile._replace(args="RGB;16L") for tile in low.tile]
        low.load()
        image.load()
        high = np.asarray(image)
        transparent = ((high.astype(np.uint16) << 8 | np.asarray(low)) == image.info["transparency"]).all(axis=2)
        keyed = Image.fromarray(np.dstack([high, np.where(transparent, 0, 255).astype(np.uint8)]), "RGBA")
        keyed.info = {key: value for key, value in image.info.items() if key != "transparency"}
        return keyed
    image.load()
    return image


def _hides_default_image(image: Image.Image) -> bool:
    """An APNG whose IDAT image is not part of its animation."""
    return image.format == "PNG" and bool(getattr(image, "default_image", False)) and image.n_frames > 1


def _keyed_rgb16(image: Image.Image) -> bool:
    """A 16-bit RGB PNG (one frame) with a transparent colour."""
    return (
        image.format == "PNG"
        and isinstance(image.info.get("transparency"), tuple)
        and getattr(image, "n_frames", 1) == 1
        and [tile.args for tile in image.tile] == ["RGB;16B"]
    )


def as_shown(image: Image.Image) -> Image.Image:
    """A decoded image as RGB the way a viewer shows it: turned by its EXIF orientation, 16-bit
    samples scaled (not clipped), palettes expanded, colours from its embedded ICC profile (CMYK
    and grey included) or else a PNG's gamma to sRGB, and transparency composited over white."""
    if (turn := _TURNS.get(exif_orientation(image.info.get("exif")))) is not None:
        image = image.transpose(turn)
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        image = _grey16_as_8(image)
    if image.mode in ("P", "PA", "La", "RGBa", "1") or "transparency" in image.info:
        has_alpha = "transparency" in image.info or image.mode in ("PA", "La", "RGBa")
        grey = image.mode in ("L", "La")  # kept grey: a grey ICC profile applies to grey only
        image = image.convert(("LA" if grey else "RGBA") if has_alpha else ("L" if grey else "RGB"))
    image = _to_srgb(image)
    if image.mode in ("LA", "RGBA"):
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image.convert("RGBA"))
    return image.convert("RGB")


def _grey16_as_8(image: Image.Image) -> Image.Image:
    """16-bit greyscale (PNG) as 8-bit, its info (ICC profile, gamma) kept: 0..65535 to 0..255,
    rounded (Pillow's convert clips it at 255), and its transparent grey level (tRNS), matched
    at 16 bits, as alpha (LA)."""
    samples = np.clip(np.asarray(image), 0, 65535).astype(np.uint32)
    grey = Image.fromarray(((samples * 255 + 32767) // 65535).astype(np.uint8), "L")
    info = dict(image.info)
    key = info.pop("transparency", None)
    if isinstance(key, int):
        grey = Image.merge("LA", [grey, Image.fromarray(np.where(samples == key, 0, 255).astype(np.uint8), "L")])
    grey.info = info
    return grey


def _to_srgb(image: Image.Image) -> Image.Image:
    """Colours converted to sRGB (RGB, or RGBA keeping its alpha) by the image's ICC profile
    (RGB, CMYK or grey, alpha included); without one, by a PNG's gAMA unless it has an sRGB
    chunk, as browsers do; else, or when lcms cannot use the profile, taken as sRGB."""
    profile = image.info.get("icc_profile")
    if profile and image.mode in ("RGB", "RGBA", "CMYK", "L", "LA"):
        colour = image.getchannel("L") if image.mode == "LA" else image
        transform = _srgb_transform(bytes(profile), colour.mode, "RGBA" if colour.mode == "RGBA" else "RGB")
        if transform is None:
            return image
        shown = transform.apply(colour)
        if image.mode == "LA":
            shown.putalpha(image.getchannel("A"))
        return shown
    return image if profile or "srgb" in image.info else _with_png_gamma(image)


def _with_png_gamma(image: Image.Image) -> Image.Image:
    """Samples encoded with a PNG's file gamma (``info["gamma"]``) re-encoded for an sRGB display
    (gamma 2.2): level ** (1 / (gamma x 2.2)); alpha as it is."""
    gamma = image.info.get("gamma")
    if not isinstance(gamma, (int, float)) or gamma <= 0 or image.mode not in ("L", "LA", "RGB", "RGBA"):
        return image
    exponent = 1 / (gamma * 2.2)
    if abs(exponent - 1) < 0.01:  # 0.45455, the usual: sRGB already
        return image
    curve = [round(255 * (level / 255) ** exponent) for level in range(256)]
    return image.point([v for band in image.getbands() for v in (range(256) if band == "A" else curve)])


@functools.lru_cache(maxsize=16)
def _srgb_transform(profile: bytes, mode: str, output: str) -> ImageCms.ImageCmsTransform | None:
    """One transform per profile and mode (a request's images usually share one profile)."""
    try:
        source = ImageCms.ImageCmsProfile(io.BytesIO(profile))
        return ImageCms.buildTransform(source, _SRGB, mode, output)
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
        return None


def _distinct(pairs: Iterable[tuple[Any, str]]) -> Iterator[tuple[Any, str]]:
    """The (object, name) pairs whose object is not an earlier one's (the same object again: an
    image the pickle memo references several times), with the first one's name."""
    seen: set[int] = set()
    for item, name in pairs:
        if id(item) not in seen:
            seen.add(id(item))
            yield item, name


def once_each(items: Sequence[Any], names: Sequence[str], work: Callable[[Any, str], Any]) -> list[Any]:
    """``work`` done once per distinct object of ``items``, its result given to every reference."""
    done = {id(item): work(item, name) for item, name in _distinct(zip(items, names))}
    return [done[id(item)] for item in items]


def once_per_image(images: Sequence[Any], preprocess: Callable[[list[Any]], Sequence[T]]) -> list[T]:
    """The one way every image scorer does each distinct image once: ``preprocess`` (a batch ->
    one result each) of each distinct object, its result given to each of its references.
    ``load_images`` hands every reference of bytes the pickle memo repeats the same image, which
    must not cost a resize, a model input or a model pass per reference (the CLIP scorers'
    inputs, OCR's preparation and its reading of the prepared image)."""
    distinct = {id(image): image for image in images}
    done = dict(zip(distinct, preprocess(list(distinct.values()))))
    return [done[id(image)] for image in images]


def open_images(data: Sequence[bytes], core: CoreSettings, names: Sequence[str] | None = None) -> list[Image.Image]:
    """A request's images with their headers read, once their bytes are within the limits that
    Pillow's reading itself would break: scans per JPEG (413) and the chunks of the request's
    PNGs (413; Pillow reads a PNG's chunks up to its pixels in ``Image.open``); then checked
    against the limits of ``check_image_sizes``, no pixel decoded yet. Bytes the request refers
    to several times (the pickle memo) are checked and opened once, one image object shared by
    its references; the size limits count every reference, as each is scored."""
    names = image_names(len(data)) if names is None else names
    for item, name in _distinct(zip(data, names)):
        check_scans(item, core.max_jpeg_scans, name)
    check_png_chunks(data, core.max_png_chunks, names)
    images = once_each(data, names, open_image)
    check_image_sizes(images, core, names)
    return images


def load_images(images: Sequence[Image.Image], names: Sequence[str] | None = None) -> list[Image.Image]:
    """Decode opened images to RGB, the request's deadline checked between one image and the
    next; an image object given several times is decoded once, its RGB image shared."""
    names = image_names(len(images)) if names is None else names

    def load(image: Image.Image, name: str) -> Image.Image:
        check_deadline("decoding its images")
        return load_image(image, name)

    return once_each(images, names, load)


def _check_pixels(image: Image.Image, max_pixels: int, name: str) -> None:
    width, height = image.size
    if width * height > max_pixels:
        raise PayloadTooLarge(
            f"{name} is {width}x{height} = {width * height} pixels; the limit is {max_pixels} "
            f"({env_name('', 'max_pixels')})"
        )
