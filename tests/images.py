"""Test images: text rendered with Pillow's built-in font (no system fonts needed)."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

# flow_grpo's OCR test prompts (tests/data/README.md: origin and licence).
OCR_PROMPTS = Path(__file__).resolve().parent / "data" / "flow_grpo_ocr_test_prompts.txt"


def encode(image: Image.Image, fmt: str = "JPEG") -> bytes:
    """``image`` as a file of format ``fmt`` (JPEG at PIL's default quality, 75)."""
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


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
