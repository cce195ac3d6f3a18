"""Attacks on the decode bounds of issue 16, against the running OCR service, as an attacker with
no token: each test asserts what SHOULD happen (bounded memory, the same worker, the right 4xx,
the score of the image as a viewer shows it). Written to fail on the code they were found on
(attack-pass branch); figures in each docstring are from a loaded 2-core machine.
"""

from __future__ import annotations

import base64
import io
import os
import pickle
import struct
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from common.sdk.client import ScorerClient
from testing.images import render_text
from testing.ocr import OCR_LIMITS, bounded, memory_kb, peak_memory_reset, timed_post
from testing.server import Server, cpu_seconds, gunicorn_server

GOOD = render_text("Hello")  # JPEG, 512x512, scores 1.0


@pytest.fixture
def fresh_ocr(tmp_path) -> Iterator[Server]:
    """A new worker with the suite's OCR limits (32 items, 8 MB bodies) for each memory test, so
    that heap freed by an earlier request (reused without raising the peak) does not hide one."""
    with gunicorn_server("ocr", OCR_LIMITS, threads=128, log_dir=tmp_path) as server:
        yield server


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def raw_png(pixels: np.ndarray, depth: int, colour_type: int, extra: list[bytes] | tuple = ()) -> bytes:
    """A PNG written byte by byte (Pillow cannot write 16-bit RGB): ``extra`` chunks before IDAT."""
    height, width = pixels.shape[:2]
    rows = pixels.astype(">u2" if depth == 16 else "u1").reshape(height, -1)
    raw = b"".join(b"\0" + row.tobytes() for row in rows)
    header = struct.pack(">IIBBBBB", width, height, depth, colour_type, 0, 0, 0)
    return (
        PngImagePlugin._MAGIC
        + chunk(b"IHDR", header)
        + b"".join(extra)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def ink() -> np.ndarray:
    """GOOD's ink mask: True where the text is."""
    return np.asarray(Image.open(io.BytesIO(GOOD)).convert("L")) < 128


def png(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG", **options)
    return out.getvalue()


def gray_icc(curve: list[int]) -> bytes:
    """A minimal ICC v2 grey monitor profile whose tone curve (kTRC) is ``curve``."""

    def xyz(*values: float) -> bytes:
        return b"XYZ \0\0\0\0" + b"".join(struct.pack(">i", round(v * 65536)) for v in values)

    text = b"grey test\0"
    desc = b"desc\0\0\0\0" + struct.pack(">I", len(text)) + text + b"\0" * 81
    trc = b"curv\0\0\0\0" + struct.pack(">I", len(curve)) + b"".join(struct.pack(">H", v) for v in curve)
    tags = [(b"desc", desc), (b"wtpt", xyz(0.9642, 1.0, 0.8249)), (b"kTRC", trc)]
    offset, table, data = 128 + 4 + 12 * len(tags), b"", b""
    for signature, body in tags:
        body += b"\0" * (-len(body) % 4)
        table += signature + struct.pack(">II", offset + len(data), len(body))
        data += body
    header = struct.pack(">I", offset + len(data)) + b"lcms" + bytes([2, 0x10, 0, 0]) + b"mntrGRAYXYZ "
    header += b"\0" * 12 + b"acsp" + b"\0" * 24 + struct.pack(">iii", 63190, 65536, 54061)
    return header.ljust(128, b"\0") + struct.pack(">I", len(tags)) + table + data


# Levels up to 250 show black, 251-255 white: ink at 250 on paper at 255 is crisp black on
# white to a colour-managed viewer, and all but invisible without the profile.
DARKENING_PROFILE = gray_icc([0 if level <= 250 else 65535 for level in range(256)])


# --- memory ------------------------------------------------------------------------------

# A PNG whose header says 4096x4096, over the suite's SCORER_MAX_PIXELS: a request that ends with it
# is refused (413) once its images are opened, before the OCR model runs. Scoring 32 plain 64x64
# images costs the fresh worker ~1 GB of peak (the detector reads each at 736x736, 8 a call), which
# would hide what opening the images costs; this measures that alone.
OVERSIZED = (
    PngImagePlugin._MAGIC
    + chunk(b"IHDR", struct.pack(">IIBBBBB", 4096, 4096, 8, 2, 0, 0, 0))
    + chunk(b"IDAT", zlib.compress(b""))
    + chunk(b"IEND", b"")
)


def refused_once_opened(image: bytes, references: int) -> bytes:
    """A pickle body referring to ``image`` ``references`` times through the memo, then OVERSIZED."""
    images = [image] * references + [OVERSIZED]
    return pickle.dumps({"images": images, "prompts": ['"a"'] * len(images)})


def test_png_text_chunks_of_images_referenced_through_the_memo_are_bounded(fresh_ocr) -> None:
    """A 67 KB 64x64 PNG with 63 zTXt chunks, each 1 KB inflating to 1 MB: Pillow inflates them
    in ``Image.open`` (its own cap is 64 MB per image), and every image of the request is opened
    before any limit is checked, an image referenced through the pickle memo once per
    reference; the chunks (66 per image) are counted after. Measured: x8 +560 MB, x32 +2.2 GB
    peak (RSS 0.46 -> 2.7 GB), 8.7 s CPU, and a 200 with scores; x1024 (the default
    SCORER_MAX_ITEMS) would be 64 GB. Here x16: +2.07 GB peak. Distinct images in one request
    (the JSON twin, no memo) cost the same: 66 KB of body per 64 MB. Measured up to the 413 for
    OVERSIZED, without the model's own memory; the image alone is scored."""
    deflated = zlib.compress(b"\0" * (2**20 - 16), 9)
    text = [chunk(b"zTXt", f"k{i}".encode() + b"\0\0" + deflated) for i in range(63)]
    small = png(Image.new("RGB", (64, 64), "white"))
    at = small.index(b"IDAT") - 4
    bomb = small[:at] + b"".join(text) + small[at:]
    body = refused_once_opened(bomb, 15)
    assert len(body) < 70_000
    status, answer, _, _ = bounded(fresh_ocr, lambda: timed_post(fresh_ocr.url, body), max_growth_mb=200)
    assert status == 413 and "(SCORER_MAX_PIXELS)" in answer["error"], answer
    assert len(ScorerClient(fresh_ocr.url).scores([bomb], ['"a"'])) == 1


def test_base64_text_referenced_through_the_memo_is_not_decoded_once_per_reference(fresh_ocr) -> None:
    """``images`` as base64 text (the JSON twin's form) inside a pickle: one string sent once,
    referenced through the memo, is base64-decoded once per reference before any image is
    opened. Default limits: a 2.8 MB body x1024 took +2 GB peak and 5.8 s of CPU (20 s wall)
    before its 422; a 256 MB body would ask for 190 GB. Here 5.6 MB x32: +147 MB."""
    text = base64.b64encode(os.urandom(4 * 2**20)).decode()
    body = pickle.dumps({"images": [text] * 32, "prompts": ['"a"'] * 32})
    assert len(body) < 6 * 2**20
    status, answer, _, _ = bounded(fresh_ocr, lambda: timed_post(fresh_ocr.url, body), max_growth_mb=60)
    assert status in (413, 422), answer


def metadata_bomb(fmt: str, size: int) -> bytes:
    """A white 64x64 image carrying ``size`` bytes of metadata that Pillow copies out in
    ``Image.open``: a private PNG chunk (kept in ``private_chunks``), JPEG APP15 segments (kept
    in ``applist``), a WebP XMP chunk (``info["xmp"]``)."""
    white = Image.new("RGB", (64, 64), "white")
    if fmt == "PNG":
        small = png(white)
        at = small.index(b"IDAT") - 4
        return small[:at] + chunk(b"prIv", b"\0" * size) + small[at:]
    out = io.BytesIO()
    if fmt == "JPEG":
        white.save(out, "JPEG")
        segment = b"\xff\xef" + struct.pack(">H", 65535) + b"\0" * 65533
        return out.getvalue()[:2] + segment * (size // 65533) + out.getvalue()[2:]
    white.save(out, "WEBP", xmp=b"\0" * size)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_image_metadata_of_images_referenced_through_the_memo_is_bounded(fresh_ocr, fmt: str) -> None:
    """Pillow keeps the bytes of a PNG's private ancillary chunks, a JPEG's APP segments and a
    WebP's XMP, read in ``Image.open``, a copy per open, with no cap of its own, and every
    reference through the pickle memo is opened before any limit is checked. Default limits: a
    4.2 MB body (4 MB of private chunks on a 64x64 PNG) x256 took the worker from 0.36 to 3.5 GB
    (+3.2 GB peak), then ran to its 110 s deadline (503); x1024 and a 256 MB body ask for
    ~256 GB. Here 7 MB x32 (an 8 MB body): +1.55 GB (PNG), +1.43 GB (JPEG), +1.68 GB (WebP),
    ~1 GB of it the model's; measured up to the 413 for OVERSIZED (x31), the image alone scored."""
    bomb = metadata_bomb(fmt, 7 * 2**20)
    assert Image.open(io.BytesIO(bomb)).size == (64, 64)
    body = refused_once_opened(bomb, 31)
    assert len(body) < 8 * 2**20
    status, answer, _, _ = bounded(fresh_ocr, lambda: timed_post(fresh_ocr.url, body), max_growth_mb=60)
    assert status == 413 and "(SCORER_MAX_PIXELS)" in answer["error"], answer
    assert len(ScorerClient(fresh_ocr.url).scores([bomb], ['"a"'])) == 1


def test_empty_png_chunks_are_counted_before_pillow_reads_them(ocr_server) -> None:
    """``check_image_sizes`` counts the chunks after every image of the request was opened, and
    ``Image.open`` reads every chunk before IDAT: a 1.2 MB PNG of 100,000 empty chunks
    referenced 64 times through the memo cost 12.5 s of CPU (50 s wall, +730 MB peak) before
    the 413 for SCORER_MAX_PNG_CHUNKS; x1024 would be ~200 s of CPU. Here x32: the refusal
    should cost what reading the bytes does, not one open per reference (here: 6.2 s of CPU,
    +372 MB, for the 413)."""
    small = png(Image.new("RGB", (64, 64), "white"))
    at = small.index(b"IDAT") - 4
    empty = small[:at] + chunk(b"emPt", b"") * 100_000 + small[at:]
    body = pickle.dumps({"images": [empty] * 32, "prompts": ['"a"'] * 32})
    (pid,) = ocr_server.worker_pids()
    before, memory_before = cpu_seconds(pid), peak_memory_reset(pid)
    status, answer, _, _ = timed_post(ocr_server.url, body)
    spent, grown_mb = cpu_seconds(pid) - before, (memory_kb(pid, "VmHWM") - memory_before) / 1024
    assert status == 413 and "(SCORER_MAX_PNG_CHUNKS)" in answer["error"], answer
    assert ocr_server.worker_pids() == [pid]
    assert spent < 1.5 and grown_mb < 60, f"refused for its chunks after {spent:.1f} s of CPU, +{grown_mb:.0f} MB"


def test_exif_of_images_referenced_through_the_memo_is_parsed_within_a_bound(ocr_server) -> None:
    """An eXIf chunk is as large as the body allows (JPEG's APP1 stops at 64 KB) and Pillow parses
    every tag of IFD0 on ``getexif`` (its data capped at the file size, so the memory holds, but
    not the tag count): a 780 KB 64x64 PNG with 65,000 tags costs ~0.15 s of CPU per
    reference, each memo reference parsed again for its orientation. Default limits: x32 took
    5.0 s of CPU against 0.34 s for the same request without the chunk; x1024 ~160 s. Here
    x32: 13.1 s against 10.7 s."""
    small = png(Image.new("RGB", (64, 64), "white"))
    tags, blob = 65_000, b"\0" * 16
    data_at = 8 + 2 + 12 * tags + 4
    ifd = b"".join(struct.pack("<HHII", 300 + i, 7, len(blob), data_at) for i in range(tags))
    exif = b"II*\0" + struct.pack("<IH", 8, tags) + ifd + b"\0\0\0\0" + blob
    at = small.index(b"IDAT") - 4
    tagged = small[:at] + chunk(b"eXIf", exif) + small[at:]
    (pid,) = ocr_server.worker_pids()
    spent = {}
    for name, image in (("plain", small), ("tagged", tagged)):
        before = cpu_seconds(pid)
        status, answer, _, _ = timed_post(
            ocr_server.url, pickle.dumps({"images": [image] * 32, "prompts": ['"a"'] * 32})
        )
        spent[name] = cpu_seconds(pid) - before
        assert status in (200, 413, 422), answer
    assert ocr_server.worker_pids() == [pid]
    assert spent["tagged"] < spent["plain"] + 1.0, spent


# --- images read as a viewer shows them ----------------------------------------------------


XMP_MENTIONING_ORIENTATION = (
    '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
    '<rdf:Description xmlns:dc="http://purl.org/dc/elements/1.1/">'
    '<dc:description>set tiff:Orientation="3" in Lightroom</dc:description>'
    "</rdf:Description></rdf:RDF></x:xmpmeta>"
)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_xmp_text_that_mentions_an_orientation_does_not_turn_the_image(ocr_server, fmt: str) -> None:
    """Pillow's ``getexif`` takes an orientation from a regex over the XMP packet when EXIF has
    none, so a description that mentions ``tiff:Orientation="3"`` turned an upright "Hello"
    upside down: 0.4 in all three formats (browsers apply no XMP orientation, not even a real
    ``tiff:Orientation`` attribute, which scored 0.4 too)."""
    upright = Image.open(io.BytesIO(GOOD))
    out = io.BytesIO()
    if fmt == "PNG":
        info = PngImagePlugin.PngInfo()
        info.add_itxt("XML:com.adobe.xmp", XMP_MENTIONING_ORIENTATION)
        upright.save(out, fmt, pnginfo=info)
    else:
        upright.save(out, fmt, quality=95, xmp=XMP_MENTIONING_ORIENTATION.encode())
    assert ScorerClient(ocr_server.url).scores([out.getvalue()], ['"Hello"']) == [1.0]


def test_an_imagemagick_raw_exif_text_chunk_does_not_turn_a_png(ocr_server) -> None:
    """A tEXt chunk named "Raw profile type exif" (ImageMagick's convention, no viewer applies
    it) holding orientation 3: Pillow reads it as the EXIF, the upright "Hello" scored 0.4."""
    exif = Image.Exif()
    exif[0x0112] = 3
    data = exif.tobytes()
    info = PngImagePlugin.PngInfo()
    info.add_text("Raw profile type exif", f"\nexif\n{len(data)}\n{data.hex()}\n")
    image = png(Image.open(io.BytesIO(GOOD)), pnginfo=info)
    assert ScorerClient(ocr_server.url).scores([image], ['"Hello"']) == [1.0]


def test_a_16_bit_greyscale_png_keeps_its_transparent_background(ocr_server) -> None:
    """Black ink on a near-black (0x0800) background that tRNS marks transparent: a viewer shows
    black on white; ``as_shown`` scales 16-bit samples into a new image and drops the
    transparency: black on black, 0.0 (the same image at 8 bits scores 1.0)."""
    grey = np.where(ink(), 0, 0x0800).astype(np.uint16)
    image = raw_png(grey, 16, 0, [chunk(b"tRNS", struct.pack(">H", 0x0800))])
    assert Image.open(io.BytesIO(image)).mode == "I;16"
    assert ScorerClient(ocr_server.url).scores([image], ['"Hello"']) == [1.0]


def test_a_16_bit_rgb_transparent_colour_is_matched_at_16_bits(ocr_server) -> None:
    """Ink of 0x0001 (black) on white, tRNS colour 0x0000: no pixel is transparent. Pillow reads
    16-bit RGB as its high bytes, so the ink becomes 0 and matches the transparent colour: the
    text vanished into the white background, 0.0."""
    rgb = np.repeat(np.where(ink(), 1, 0xFFFF).astype(np.uint16)[..., None], 3, axis=2)
    image = raw_png(rgb, 16, 2, [chunk(b"tRNS", struct.pack(">HHH", 0, 0, 0))])
    assert ScorerClient(ocr_server.url).scores([image], ['"Hello"']) == [1.0]


@pytest.mark.parametrize("mode", ["LA", "I;16"])
def test_a_grey_icc_profile_is_applied_to_grey_with_alpha_and_16_bit_grey(ocr_server, mode: str) -> None:
    """Ink at level 250 on 255, with a grey profile that shows 250 as black: in mode L the
    profile is applied (1.0), but LA is converted to RGBA first, where a grey profile no longer
    fits and is dropped, and 16-bit grey is rebuilt without its info: 0.0 for both."""
    faint = Image.fromarray(np.where(ink(), 250, 255).astype(np.uint8), "L")
    if mode == "LA":
        image = Image.merge("LA", [faint, Image.new("L", faint.size, 255)])
    else:
        image = Image.fromarray(np.asarray(faint).astype(np.uint16) * 257)
    data = png(image, icc_profile=DARKENING_PROFILE)
    assert Image.open(io.BytesIO(data)).mode == mode
    client = ScorerClient(ocr_server.url)
    assert client.scores([png(faint, icc_profile=DARKENING_PROFILE)], ['"Hello"']) == [1.0]  # mode L: held
    assert client.scores([data], ['"Hello"']) == [1.0]


@pytest.mark.parametrize("shown, hidden, expected", [("Hello", "", 1.0), ("", "Hello", 0.0)])
def test_an_apng_is_read_as_its_animation_not_its_hidden_default_image(
    ocr_server, shown: str, hidden: str, expected: float
) -> None:
    """An APNG whose IDAT image is not part of the animation: every browser shows the animation
    and never that image; Pillow's frame 0 is that image. "Hello" animated over a blank default
    scored 0.0, and a blank animation over a hidden "Hello" scored 1.0."""

    def page(text: str) -> Image.Image:
        if not text:
            return Image.new("RGB", (512, 512), "white")
        return Image.open(io.BytesIO(render_text(text))).convert("RGB")

    out = io.BytesIO()
    page(hidden).save(out, "PNG", save_all=True, append_images=[page(shown)], default_image=True)
    assert ScorerClient(ocr_server.url).scores([out.getvalue()], ['"Hello"']) == [expected]


def test_a_png_gamma_chunk_is_applied(ocr_server) -> None:
    """A PNG's gAMA chunk says how its samples map to light, and browsers (Chromium, Firefox)
    apply it when there is no iCCP or sRGB chunk; Pillow keeps it in ``info["gamma"]`` and
    ``as_shown`` ignores it. Ink at level 250 on 255 with a file gamma of 0.01: shown as grey
    ~104 on white, read as 250 on 255: 0.0."""
    faint = Image.fromarray(np.where(ink(), 250, 255).astype(np.uint8), "L")
    data = png(faint)
    at = data.index(b"IDAT") - 4
    data = data[:at] + chunk(b"gAMA", struct.pack(">I", 1000)) + data[at:]
    assert Image.open(io.BytesIO(data)).info["gamma"] == 0.01
    assert ScorerClient(ocr_server.url).scores([data], ['"Hello"']) == [1.0]
