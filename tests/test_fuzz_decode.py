"""Structure-aware fuzzing of JSON bodies and image headers and scans.

JSON: documents of any shape, whose strings hold quotes, backslashes, brackets, commas and
colons, written with any separators; the value count (``check_json``) must be exact (values
plus empty containers) so that no document over the cap passes and none within it is refused;
any bytes cut from or spliced into them are a clear error or a dict within the cap.
Images: JPEG segments and PNG chunks repeated, dropped, reordered, resized, cut or spliced
(scans repeated by the thousand, chunks emptied by the thousand, header sizes, bit depths and
colour types changed, EXIF orientations, ICC profiles, transparency); each decodes to the RGB
image of its shown size or is a clear 413/422, within its limits' time.

In-process properties run a few hundred cases in the suite, and a slice goes to the running
OCR service (``testing/fuzz.py``'s ``check``). SCORER_FUZZ_EXAMPLES sets every property's
count for a long run:
    SCORER_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/test_fuzz_decode.py
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import time
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, ImageCms

from common.configuration.settings import CoreSettings
from common.imaging.images import open_image, shown_size
from common.limits.errors import BadRequest, PayloadTooLarge, Unprocessable
from common.sdk.wire import JsonCap, check_json, decode_body
from testing.fuzz import check, fuzz
from testing.images import decoded
from testing.timing import within

# Small limits, so that the fuzzer reaches them: pixels, scans, chunks.
CORE = CoreSettings(max_pixels=1024 * 1024, max_request_pixels=4 * 1024 * 1024, max_jpeg_scans=40, max_png_chunks=2_000)
# A case that takes longer than this in-process (one decode at the limits above) is a finding.
CASE_WITHIN_S = within(3.0)

# --- JSON ----------------------------------------------------------------------------------

TRICKY = st.text(alphabet=st.sampled_from('"\\[]{},: abc\u00e9\u4e2d\U0001f600\n\t/u0'), max_size=12)
SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | TRICKY
JSON_VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(TRICKY, inner, max_size=6), max_leaves=60
)


def values_and_empties(value: Any) -> tuple[int, int]:
    """Values ``json.loads`` builds of ``value`` (dict keys included), and its empty containers."""
    if isinstance(value, dict):
        counts = [values_and_empties(item) for item in value.values()]
        return 1 + len(value) + sum(v for v, _ in counts), (not value) + sum(e for _, e in counts)
    if isinstance(value, list):
        counts = [values_and_empties(item) for item in value]
        return 1 + sum(v for v, _ in counts), (not value) + sum(e for _, e in counts)
    return 1, 0


def dumped(value: Any, style: int) -> bytes:
    separators = [(",", ":"), (", ", ": "), (" ,\n", " :\t")][style % 3]
    return json.dumps(value, separators=separators, ensure_ascii=style % 2 == 0).encode("utf-8")


@fuzz(100)
@given(value=JSON_VALUES, style=st.integers(0, 5))
def test_the_json_value_count_is_exact(value: Any, style: int) -> None:
    """Values plus empty containers, whatever the strings hold: one more than the cap is refused."""
    body = dumped(value, style)
    count, empties = values_and_empties(value)
    check_json(body, JsonCap(count + empties, "X"))
    with pytest.raises(PayloadTooLarge):
        check_json(body, JsonCap(count + empties - 1, "X"))


@fuzz(100)
@given(
    value=JSON_VALUES,
    style=st.integers(0, 5),
    cuts=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 8), st.binary(max_size=6)), max_size=4),
    cap=st.integers(1, 80),
)
def test_json_spliced_or_cut_is_a_clear_error_or_a_dict_within_the_cap(value, style, cuts, cap) -> None:
    body = bytearray(dumped({"v": value}, style))
    for position, length, insert in cuts:
        position %= len(body) + 1
        body[position : position + length] = insert
    try:
        payload = decode_body(bytes(body), "json", JsonCap(cap, "X"))
    except (BadRequest, PayloadTooLarge):
        return
    assert isinstance(payload, dict) and values_and_empties(payload)[0] <= cap


# --- Images --------------------------------------------------------------------------------


def saved(image: Image.Image, fmt: str, **params: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def base_image(mode: str, size: tuple[int, int]) -> Image.Image:
    image = Image.linear_gradient("L").resize(size)
    return image if mode == "L" else image.convert(mode)


EXIF = {orientation: Image.Exif() for orientation in range(1, 9)}
for orientation, exif in EXIF.items():
    exif[0x0112] = orientation
SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


@st.composite
def jpegs(draw) -> bytes:
    mode = draw(st.sampled_from(["RGB", "L", "CMYK"]))
    size = (draw(st.integers(1, 300)), draw(st.integers(1, 300)))
    params: dict[str, Any] = {"quality": draw(st.integers(1, 95)), "progressive": draw(st.booleans())}
    if draw(st.booleans()):
        params["exif"] = EXIF[draw(st.integers(1, 8))]
    if draw(st.booleans()) and mode == "RGB":
        params["icc_profile"] = SRGB
    return saved(base_image(mode, size), "JPEG", **params)


def jpeg_segments(data: bytes) -> list[bytes]:
    """SOI, each marker segment (a scan with its entropy-coded data), EOI."""
    segments, position = [data[:2]], 2
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker == 0xD9:
            break
        (length,) = struct.unpack_from(">H", data, position + 2)
        end = position + 2 + length
        if marker == 0xDA:  # entropy-coded data runs to the next marker other than RSTn
            while (end := data.find(b"\xff", end)) != -1 and data[end + 1] in (0x00, *range(0xD0, 0xD8)):
                end += 2
            end = len(data) - 2 if end == -1 else end
        segments.append(data[position:end])
        position = end
    return [*segments, data[position:]]


@st.composite
def mutated_jpegs(draw) -> bytes:
    segments = jpeg_segments(draw(jpegs()))
    for _ in range(draw(st.integers(0, 3))):
        index = draw(st.integers(1, max(1, len(segments) - 2)))
        kind = draw(st.sampled_from(["repeat", "drop", "swap", "size", "length", "splice"]))
        segment = segments[index]
        if kind == "repeat":  # a scan (or any segment) again, up to thousands of times
            segments[index : index + 1] = [segment] * draw(st.sampled_from([2, 10, 39, 41, 200, 3000]))
        elif kind == "drop":
            del segments[index]
        elif kind == "swap":
            other = draw(st.integers(1, max(1, len(segments) - 2)))
            segments[index], segments[other] = segments[other], segments[index]
        elif kind == "size" and segment[1:2] in (b"\xc0", b"\xc2") and len(segment) >= 9:
            height, width = draw(st.integers(0, 4000)), draw(st.integers(0, 4000))
            segments[index] = segment[:5] + struct.pack(">HH", height, width) + segment[9:]
        elif kind == "length" and len(segment) >= 4:
            segments[index] = segment[:2] + struct.pack(">H", draw(st.integers(0, 65535))) + segment[4:]
        elif kind == "splice":
            position = draw(st.integers(0, len(segment)))
            segments[index] = segment[:position] + draw(st.binary(max_size=16)) + segment[position:]
    return b"".join(segments)


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    chunks, position = [], 8
    while position + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, position)
        chunks.append((kind, data[position + 8 : position + 8 + length]))
        position += 12 + length
    return chunks


@st.composite
def pngs(draw) -> tuple[bytes, Image.Image]:
    """A PNG and the image it must decode to (its chunks legitimately re-cut or emptied)."""
    mode = draw(st.sampled_from(["1", "L", "LA", "P", "RGB", "RGBA", "I;16"]))
    width = draw(st.integers(1, 200))
    size = (width, draw(st.integers(-(-width // 50), min(200, 50 * width))))  # within the aspect ratio
    image = base_image("L" if mode == "I;16" else mode, size)
    if mode == "I;16":
        image = image.point(lambda v: v * 257, "I").convert("I;16")
    params: dict[str, Any] = {"interlace": draw(st.booleans())} if mode != "I;16" else {}
    if draw(st.booleans()):
        params["exif"] = EXIF[draw(st.integers(1, 8))]
    return saved(image, "PNG", **params), image


@st.composite
def mutated_pngs(draw) -> tuple[bytes, bool]:
    """A mutated PNG, and whether it still holds the same pixels (only chunks re-cut or added)."""
    data, _ = draw(pngs())
    chunks = png_chunks(data)
    same = True
    for _ in range(draw(st.integers(0, 3)) if len(chunks) > 1 else 0):
        index = draw(st.integers(1, len(chunks) - 1))
        kind = draw(st.sampled_from(["recut", "empties", "header", "drop", "splice", "repeat"]))
        name, payload = chunks[index]
        if kind == "recut" and name == b"IDAT":  # the same stream in chunks of a few bytes
            step = draw(st.integers(1, 64))
            chunks[index : index + 1] = [(b"IDAT", payload[i : i + step]) for i in range(0, len(payload), step)] or [
                (b"IDAT", b"")
            ]
        elif kind == "empties":  # empty ancillary chunks by the thousand
            same = same and not chunks[index - 1][0] == name == b"IDAT"  # the IDATs must follow one another
            chunks[index:index] = [(b"tEXt", b"")] * draw(st.sampled_from([1, 100, 1999, 2001, 20_000]))
        elif kind == "header" and chunks[0][0] == b"IHDR":
            width, height = draw(st.integers(0, 5000)), draw(st.integers(0, 5000))
            depth, colour = draw(st.sampled_from([1, 2, 4, 8, 16, 3])), draw(st.sampled_from([0, 2, 3, 4, 6, 1]))
            chunks[0] = (b"IHDR", struct.pack(">IIBB", width, height, depth, colour) + chunks[0][1][10:])
            same = False
        elif kind == "drop" and len(chunks) > 2:
            del chunks[index]
            same = False
        elif kind == "splice":
            position = draw(st.integers(0, len(payload)))
            chunks[index] = (name, payload[:position] + draw(st.binary(max_size=8)) + payload[position:])
            same = False
        elif kind == "repeat" and name != b"IDAT":
            chunks[index : index + 1] = [(name, payload)] * draw(st.integers(2, 50))
    out = b"\x89PNG\r\n\x1a\n" + b"".join(png_chunk(name, payload) for name, payload in chunks)
    if draw(st.integers(0, 9)) == 0:
        out, same = out[: draw(st.integers(0, len(out)))], False
    return out, same


def decode_one(data: bytes) -> Image.Image | None:
    """The decoded image, or None for a clear 413/422; any other exception is a finding."""
    started = time.process_time()
    try:
        image = decoded(data, CORE)
    except (PayloadTooLarge, Unprocessable):
        return None
    finally:
        assert time.process_time() - started < CASE_WITHIN_S, f"{time.process_time() - started:.1f}s: {data[:64]!r}"
    assert image.mode == "RGB"
    assert image.size == shown_size(open_image(data)), "decoded at another size than shown"
    return image


@pytest.mark.timing
@fuzz(60)
@given(data=mutated_jpegs())
def test_jpeg_segments_and_scans_decode_as_shown_or_are_refused(data: bytes) -> None:
    image = decode_one(data)
    if image is not None:
        assert data.count(b"\xff\xda") <= CORE.max_jpeg_scans


@pytest.mark.timing
@fuzz(60)
@given(case=mutated_pngs())
def test_png_chunks_decode_as_shown_or_are_refused(case: tuple[bytes, bool]) -> None:
    data, same = case
    image = decode_one(data)
    if same and len(png_chunks(data)) <= CORE.max_png_chunks:
        assert image is not None, "a valid PNG (chunks re-cut or added) was refused"


@pytest.mark.timing
@fuzz(40)
@given(case=pngs())
def test_recut_chunks_never_change_the_pixels(case: tuple[bytes, Image.Image]) -> None:
    data, _ = case
    chunks = png_chunks(data)
    stream = b"".join(payload for name, payload in chunks if name == b"IDAT")
    others = [(name, payload) for name, payload in chunks if name not in (b"IDAT", b"IEND")]
    recut = [(b"IDAT", stream[i : i + 7]) for i in range(0, len(stream), 7)]
    again = b"\x89PNG\r\n\x1a\n" + b"".join(png_chunk(n, p) for n, p in [*others, *recut, (b"IEND", b"")])
    if len(png_chunks(again)) <= CORE.max_png_chunks:
        assert decode_one(again).tobytes() == decode_one(data).tobytes()


# --- A slice against the running service ---------------------------------------------------


@pytest.mark.timing
@fuzz(12)
@given(images=st.lists(mutated_jpegs() | mutated_pngs().map(lambda case: case[0]), min_size=1, max_size=3))
def test_mutated_images_against_the_service(fuzzed, images: list[bytes]) -> None:
    check(fuzzed, pickle.dumps({"images": images, "prompts": ['"a"'] * len(images)}))


@pytest.mark.timing
@fuzz(12)
@given(value=JSON_VALUES, style=st.integers(0, 5), cut=st.integers(0, 10**6))
def test_json_documents_against_the_service(fuzzed, value: Any, style: int, cut: int) -> None:
    body = dumped({"images": [], "prompts": [], "metadata": {"x": value}}, style)
    check(fuzzed, body[: cut % (len(body) + 1)] if cut % 3 == 0 else body, "application/json")
