"""The RapidOCR engine in-process, on the real PP-OCRv4 models: a line's text never depends on
which other lines (other users' images) it was batched with."""

from __future__ import annotations

import numpy as np
import pytest

from services.ocr.engines import RapidOCREngine
from testing.images import decoded, ocr_prompts, quoted, render_text


@pytest.fixture(scope="module")
def engine() -> RapidOCREngine:
    return RapidOCREngine("cpu", text_score=0.5, det_batch=8, rec_batch=64, threads=None)


def test_results_do_not_depend_on_the_batch(engine: RapidOCREngine) -> None:
    # Texts of different lengths: line crops of different widths share recognizer calls.
    texts = [quoted(prompt) for prompt in ocr_prompts(12)] + ["AI", "Is", "Time Is Precious", "AI Training Zone"]
    prepared = [engine.prepare(decoded(render_text(text))) for text in texts]
    alone = [engine.read([item])[0] for item in prepared]
    together = engine.read(prepared)
    assert together == alone
    assert engine.read(prepared[::-1]) == alone[::-1]
    assert all(lines for lines in alone)


@pytest.mark.unit
def test_recognition_width_depends_on_the_crop_alone(engine: RapidOCREngine) -> None:
    short, long = np.zeros((40, 100, 3), np.uint8), np.zeros((40, 1000, 3), np.uint8)
    assert engine.recognition_input(short).shape == (3, 48, 320)
    assert engine.recognition_input(long).shape == (3, 48, 1216)  # ceil(48 * 25) = 1200 -> 1216


@pytest.mark.unit
@pytest.mark.parametrize(
    "size",
    [(512, 512), (16, 16), (200, 1), (1, 200), (2001, 10), (2000, 251), (2000, 300), (3000, 2000), (31, 1500)]
    + [(w, h) for w in (1, 29, 30, 97, 736, 1999, 2001, 2047) for h in (3, 30, 257, 640, 2500)],
)
def test_input_size_from_the_header_is_the_size_prepare_makes(engine: RapidOCREngine, size: tuple[int, int]) -> None:
    """The scorer bounds the engine's work by ``input_size`` before any resize: it must be exact.
    RapidOCR's own resizing steps, as ``prepare`` runs them (without the normalisation after)."""
    expected = engine.input_size(*size)
    try:
        resized, _, _ = engine.engine.preprocess(np.zeros((size[1], size[0], 3), np.uint8))
        resized, _ = engine.engine.maybe_add_letterbox(resized, {})
        resized = engine._det_pre.resize(resized)
    except Exception as exc:  # RapidOCR's ResizeImgError for an image it cannot resize
        assert expected is None, exc
        return
    assert expected == (None if resized is None else resized.shape[1::-1])
