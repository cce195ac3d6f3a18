"""The RapidOCR engine in-process, on the real PP-OCRv4 models: a line's text never depends on
which other lines (other users' images) it was batched with."""

from __future__ import annotations

import numpy as np
import pytest

from common.images import decode_image
from services.ocr.engines import RapidOCREngine
from tests.images import ocr_prompts, quoted, render_text


@pytest.fixture(scope="module")
def engine() -> RapidOCREngine:
    return RapidOCREngine("cpu", text_score=0.5, det_batch=8, rec_batch=64, threads=None)


def test_results_do_not_depend_on_the_batch(engine: RapidOCREngine) -> None:
    # Texts of different lengths: line crops of different widths share recognizer calls.
    texts = [quoted(prompt) for prompt in ocr_prompts(12)] + ["AI", "Is", "Time Is Precious", "AI Training Zone"]
    prepared = [engine.prepare(decode_image(render_text(text), 1 << 24)) for text in texts]
    alone = [engine.read([item])[0] for item in prepared]
    together = engine.read(prepared)
    assert together == alone
    assert engine.read(prepared[::-1]) == alone[::-1]
    assert all(lines for lines in alone)


def test_recognition_width_depends_on_the_crop_alone(engine: RapidOCREngine) -> None:
    short, long = np.zeros((40, 100, 3), np.uint8), np.zeros((40, 1000, 3), np.uint8)
    assert engine.recognition_input(short).shape == (3, 48, 320)
    assert engine.recognition_input(long).shape == (3, 48, 1216)  # ceil(48 * 25) = 1200 -> 1216
