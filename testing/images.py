"""Test images: text rendered with Pillow's built-in font (no system fonts needed)."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from common.configuration.settings import CoreSettings
from common.imaging.images import load_images, open_images

# flow_grpo's OCR test prompts (tests/data/README.md: origin and licence).
OCR_PROMPTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "flow_grpo_ocr_test_prompts.txt"


def encode(image: Image.Image, fmt: str = "JPEG", **params: object) -> bytes:
    """``image`` as a file of format ``fmt`` (JPEG at PIL's default quality, 75, unless ``params`` say)."""
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def decoded(data: bytes, core: CoreSettings | None = None) -> Image.Image:
    """The RGB image a scorer is handed for ``data``: the services' own path (``open_images``,
    then ``load_images``) at ``core``'s limits (the defaults unless given)."""
    (image,) = load_images(open_images([data], core or CoreSettings()))
    return image


def render_text(text: str, size: int = 512, fmt: str = "JPEG") -> bytes:
    """``text`` in black on white, as large as fits on one line (JPEG quality 75, PIL's default)."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font_size = 64
    while font_size > 12:
        font = ImageFont.load_default(size=font_size)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        if right - left <= size - 40:
            break
        font_size -= 4
    draw.text(((size - (right - left)) // 2, (size - (bottom - top)) // 2), text, fill="black", font=font)
    return encode(image, fmt)


def blank(size: int = 512, fmt: str = "JPEG") -> bytes:
    return encode(Image.new("RGB", (size, size), (200, 180, 160)), fmt)


def ocr_prompts(count: int | None = None) -> list[str]:
    """Real prompts of flow_grpo's OCR test set."""
    prompts = [line.strip() for line in OCR_PROMPTS.read_text().splitlines() if line.strip()]
    return prompts[:count] if count else prompts


def quoted(prompt: str) -> str:
    return prompt.split('"')[1]


def scan_bomb(size: int, repeats: int) -> bytes:
    """A progressive JPEG whose last refinement scan is repeated: libjpeg decodes each in turn
    over the whole image (2048x2048 and 2,000 scans: 57 KB, 15 s to decode)."""
    data = encode(Image.new("RGB", (size, size), "white"), "JPEG", progressive=True, quality=90)
    last, end = data.rfind(b"\xff\xda"), data.rfind(b"\xff\xd9")
    return data[:end] + data[last:end] * repeats + data[end:]


def png_chunk(kind: bytes, payload: bytes = b"") -> bytes:
    """A PNG chunk: length, type, payload, CRC."""
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def empty_chunks_png(count: int) -> bytes:
    """A valid 8x8 PNG with ``count`` empty ancillary chunks before its pixels."""
    data = encode(Image.new("L", (8, 8), 255), "PNG")
    header_end = 8 + 25  # signature, IHDR
    return data[:header_end] + png_chunk(b"teXt") * count + data[header_end:]


def sample_images(count: int) -> list[bytes]:
    """Varied images: noise and gradients, odd sizes (the centre crop's rounding), three formats."""
    rng = np.random.default_rng(3)
    images = []
    for i in range(count):
        width, height = 150 + 41 * (i % 6), 180 + 29 * (i % 5)
        noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
        pixels = (noise * (i % 3) / 3 + ramp * (1 - (i % 3) / 3)).astype(np.uint8)
        images.append(encode(Image.fromarray(pixels), ("JPEG", "PNG", "WEBP")[i % 3]))
    return images
