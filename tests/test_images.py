"""Image decoding (common/imaging/images.py): the work a decode may cost is counted from the bytes
before it starts, and every image reads as a viewer shows it, whatever its mode."""

from __future__ import annotations

import base64
import io
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image, ImageCms

from common.configuration.settings import CoreSettings
from common.imaging.images import (
    as_shown,
    load_images,
    metadata_bytes,
    open_image,
    open_images,
    shown_size,
)
from common.imaging.media import MEAN, parse_media_request
from common.limits.errors import PayloadTooLarge
from testing.images import decoded, empty_chunks_png, encode, png_chunk, scan_bomb
from testing.timing import within

CORE = CoreSettings()


def saved(image: Image.Image, fmt: str = "PNG", **params) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def decoded_pixels(data: bytes) -> np.ndarray:
    image = decoded(data, CORE)
    assert image.mode == "RGB"
    return np.asarray(image).astype(int)


def test_a_jpeg_of_many_scans_is_refused_from_its_bytes() -> None:
    bomb = scan_bomb(256, 150)
    with pytest.raises(PayloadTooLarge, match=r"JPEG of 160 scans; the limit is 100 \(SCORER_MAX_JPEG_SCANS\)"):
        open_images([bomb], CORE)
    progressive = saved(Image.new("RGB", (256, 256), "white"), "JPEG", progressive=True)
    assert progressive.count(b"\xff\xda") == 10  # a real progressive JPEG: well within
    decoded_pixels(progressive)


@pytest.mark.timing
def test_png_chunks_are_counted_across_the_request_each_reference_counting() -> None:
    """Counted before Pillow opens them: ``Image.open`` reads a PNG's chunks up to its pixels."""
    png = empty_chunks_png(30_000)
    assert decoded_pixels(png).min() == 255  # one image of 30,000 chunks: read
    started = time.process_time()
    with pytest.raises(PayloadTooLarge, match=r"over 100000 chunks .* \(SCORER_MAX_PNG_CHUNKS\)"):
        open_images([empty_chunks_png(1_000_000)], CORE)
    assert time.process_time() - started < within(1.0)  # Image.open: 3.2 s
    with pytest.raises(PayloadTooLarge, match="SCORER_MAX_PNG_CHUNKS"):
        open_images([png] * 4, CORE)  # one image referenced 4 times: 120,000 chunks to read
    # chunks are walked by their declared lengths: bytes inside a chunk are not chunks
    big = saved(Image.fromarray(np.random.default_rng(0).integers(0, 255, (512, 512, 3), dtype=np.uint8)))
    load_images(open_images([big] * 64, CORE))


def test_16_bit_greyscale_is_scaled_not_clipped() -> None:
    """A 16-bit PNG went through Pillow's convert("RGB"), which clips at 255: all white."""
    ramp = np.linspace(0, 65535, 256 * 64).reshape(64, 256).astype(np.uint16)
    pixels = decoded_pixels(saved(Image.fromarray(ramp)))
    expected = np.rint(ramp / 257.0)
    assert np.abs(pixels[..., 0] - expected).max() <= 1
    assert (pixels[..., 0] == pixels[..., 2]).all() and pixels.min() == 0 and pixels.max() == 255


def test_exif_orientation_is_applied_and_sizes_are_as_shown() -> None:
    upright = Image.new("RGB", (300, 100), "white")
    upright.paste((0, 0, 0), (0, 0, 50, 50))  # black square top left as shown
    stored = upright.rotate(90, expand=True)  # a phone's sensor rows: turned a quarter
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to show"
    data = saved(stored, "JPEG", exif=exif, quality=95)
    assert shown_size(open_image(data)) == (300, 100) and open_image(data).size == (100, 300)
    pixels = decoded_pixels(data)
    assert pixels.shape == (100, 300, 3)
    assert pixels[10, 10].max() < 40 and pixels[90, 290].min() > 215


def test_the_shown_size_is_read_without_decoding() -> None:
    """Pillow's ``getexif`` of a PNG decodes it whole to look for an eXIf chunk after the pixels."""
    exif = Image.Exif()
    exif[0x0112] = 8
    for params in ({}, {"exif": exif}):
        for fmt in ("PNG", "JPEG", "WEBP"):
            image = open_image(saved(Image.new("RGB", (40, 20)), fmt, **params))
            assert shown_size(image) == ((20, 40) if params else (40, 20)), (fmt, params)
            assert image.tile or fmt == "WEBP", "decoded"  # (a WebP's tile is empty before and after)
            assert decoded_pixels(saved(Image.new("RGB", (40, 20)), fmt, **params)).shape[:2] == shown_size(image)[::-1]


@pytest.mark.parametrize(
    "mode, fill, expected",
    [
        ("RGBA", (255, 0, 0, 0), (255, 255, 255)),  # fully transparent: white, not black or red
        ("RGBA", (0, 0, 0, 128), (127, 127, 127)),  # half black over white
        ("LA", (0, 0), (255, 255, 255)),
        ("P", None, (255, 255, 255)),  # a palette whose colour 0 is transparent (tRNS)
        ("1", 0, (0, 0, 0)),
        ("I;16", 65535, (255, 255, 255)),
    ],
)
def test_modes_convert_as_a_viewer_shows_them(mode: str, fill, expected) -> None:
    if mode == "P":
        image = Image.new("P", (16, 16), 0)
        image.putpalette([0, 0, 0] * 256)
        data = saved(image, transparency=0)
    else:
        data = saved(Image.new(mode, (16, 16), fill))
    pixels = decoded_pixels(data)
    assert np.abs(pixels - np.array(expected)).max() <= 1, (mode, pixels[0, 0])


def test_webp_with_alpha_is_composited_over_white() -> None:
    data = saved(Image.new("RGBA", (16, 16), (0, 0, 255, 0)), "WEBP", lossless=True)
    assert decoded_pixels(data).min() >= 254


def swapped_primaries_profile() -> bytes:
    """lcms's sRGB profile with its red and blue primaries swapped: an RGB profile whose red is
    stored in the blue channel (a stand-in for a camera's wide-gamut profile)."""
    profile = bytearray(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    (count,) = struct.unpack_from(">I", profile, 128)
    entries = {bytes(profile[132 + 12 * i : 136 + 12 * i]): 132 + 12 * i for i in range(count)}
    red, blue = entries[b"rXYZ"] + 4, entries[b"bXYZ"] + 4  # each tag's offset and size
    profile[red : red + 8], profile[blue : blue + 8] = profile[blue : blue + 8], profile[red : red + 8]
    return bytes(profile)


def test_embedded_icc_profiles_are_converted_to_srgb() -> None:
    image = Image.new("RGB", (16, 16), (200, 30, 30))
    for fmt in ("PNG", "JPEG", "WEBP"):
        data = saved(image, fmt, icc_profile=swapped_primaries_profile(), quality=95)
        shown = decoded_pixels(data)[0, 0]
        assert shown[2] > 150 and shown[0] < 80, (fmt, shown)  # its red numbers are blue in its profile
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    assert np.abs(decoded_pixels(saved(image, "PNG", icc_profile=srgb)) - (200, 30, 30)).max() <= 1
    broken = decoded_pixels(saved(image, "PNG", icc_profile=b"not a profile" * 10))
    assert (broken == (200, 30, 30)).all()  # a profile lcms cannot read: taken as sRGB, as viewers do


def test_cmyk_jpeg_with_its_profile_reads_as_its_colours() -> None:
    cmyk = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # pure red ink mix
    data = encode(cmyk, "JPEG")
    red = decoded_pixels(data)[0, 0]
    assert red[0] > 200 and red[1] < 60 and red[2] < 60, red


def test_as_shown_keeps_plain_rgb_as_is() -> None:
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (8, 8, 3), dtype=np.uint8))
    assert np.array_equal(np.asarray(as_shown(image)), np.asarray(image))


def test_an_image_referenced_several_times_is_opened_and_decoded_once() -> None:
    """The pickle memo gives one bytes (or text) object for every reference: one open, one
    decode, one base64 decode; the size limits still count every reference."""
    data = saved(Image.new("RGB", (64, 64), "white"))
    opened = open_images([data] * 3, CORE)
    assert len({id(image) for image in opened}) == 1
    assert len({id(image) for image in load_images(open_images([data] * 3, CORE))}) == 1
    text = base64.b64encode(data).decode()
    request = parse_media_request({"images": [text] * 3, "prompts": ["a"] * 3}, CORE, {MEAN.name: MEAN})
    assert len({id(image) for image in request.images}) == 1
    with pytest.raises(PayloadTooLarge, match="SCORER_MAX_REQUEST_PIXELS"):
        open_images([data] * 3, CoreSettings(max_request_pixels=3 * 64 * 64 - 1))


def test_png_text_and_private_chunks_are_not_read() -> None:
    """A 1 KB zTXt inflates to 1 MB in ``Image.open`` and a private chunk is copied there: both
    dropped before Pillow reads the image, which still decodes; an ICC profile stays."""
    deflated = zlib.compress(b"\0" * (2**20 - 16), 9)
    image = saved(
        Image.new("L", (8, 8), 0), icc_profile=ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    )
    at = image.index(b"IDAT") - 4
    bomb = image[:at] + png_chunk(b"zTXt", b"k\0\0" + deflated) + png_chunk(b"prIv", b"\0" * 1000) + image[at:]
    opened = open_image(bomb)
    assert "k" not in opened.info and not opened.private_chunks and opened.info["icc_profile"]
    assert decoded_pixels(bomb).max() == 0


@pytest.mark.timing
def test_the_orientation_is_the_exif_tag_alone() -> None:
    """Read among IFD0's entries without parsing them (65,000 tags: Pillow's parse took 0.15 s),
    from the EXIF block only: an eXIf after the pixels is dropped (the header has not seen it)."""
    tags, blob = 65_000, b"\0" * 16
    data_at = 8 + 2 + 12 * tags + 4
    ifd = b"".join(struct.pack("<HHII", 300 + i, 7, len(blob), data_at) for i in range(tags - 1))
    ifd += struct.pack("<HHIHH", 0x0112, 3, 1, 6, 0)
    exif = b"II*\0" + struct.pack("<IH", 8, tags) + ifd + b"\0\0\0\0" + blob
    image = saved(Image.new("RGB", (64, 32), "white"))
    at, end = image.index(b"IDAT") - 4, image.index(b"IEND") - 4
    before = image[:at] + png_chunk(b"eXIf", exif) + image[at:]
    started = time.process_time()
    assert shown_size(open_image(before)) == (32, 64)
    assert time.process_time() - started < within(0.05)
    assert decoded_pixels(before).shape[:2] == (64, 32)
    after = image[:end] + png_chunk(b"eXIf", exif) + image[end:]
    assert shown_size(open_image(after)) == (64, 32) and decoded_pixels(after).shape[:2] == (32, 64)


def test_an_inflated_icc_profile_counts_as_work() -> None:
    """A 1.1 KB PNG whose iCCP inflates to 1 MB (Pillow's cap per chunk), kept until the request
    ends: counted in the work bytes, once per distinct image."""
    image = saved(Image.new("RGB", (8, 8)))
    at = image.index(b"IDAT") - 4
    bomb = image[:at] + png_chunk(b"iCCP", b"p\0\0" + zlib.compress(b"\0" * (2**20 - 100), 9)) + image[at:]
    assert len(bomb) < 1200 and metadata_bytes(open_image(bomb)) >= 2**20 - 100
