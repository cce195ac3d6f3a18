"""Settings of the OCR service (``SCORER_OCR_*``): the engine, its limits, and the matching
options a request may override. Standard library only, as ``run.sh`` reads them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from common.configuration.config import setting
from common.models.ocr_rule import RuleOptions


@dataclass(frozen=True)
class OcrSettings(RuleOptions):
    """``SCORER_OCR_*``: the engine, and the server-wide matching options."""

    engine: Literal["auto", "rapidocr", "torch", "paddleocr"] = setting(
        "auto", "`auto` (`torch` on a GPU, `rapidocr` on the CPU), `rapidocr`, `torch` or `paddleocr`"
    )
    torch_dtype: Literal["float32", "float16", "bfloat16"] = setting(
        "float32", "the torch engine's precision on CUDA: `float32`, `float16`, `bfloat16` (CPU: float32 only)"
    )
    # RapidOCR's and PaddleOCR's 0.5.
    text_score: float = setting(0.5, "the engine's own drop threshold for text lines")
    # bench/ocr measured a batched detector call slower per image than single ones on a CPU.
    det_batch: int | None = setting(
        None,
        "images per detection call, gathered across requests (batched detection measured slower on CPU)",
        shown_default="16 on GPU, 1 on CPU",
    )
    rec_batch: int = setting(64, "text lines per recognition call, gathered across requests")
    onnx_threads: int | None = setting(
        None,
        "intra-op threads of the ONNX sessions (of torch, for the torch engine on the CPU)",
        shown_default="ONNX Runtime's default; torch engine on the CPU: 1",
    )
    # Every image within SCORER_MAX_PIXELS and SCORER_MAX_ASPECT_RATIO stays under it: RapidOCR's
    # largest such input, of an 8:1 image, is 5888x736 = 4.3 Mpx.
    max_input_pixels: int = setting(
        6_000_000,
        "pixels of the detector's input after the engine's own resizing, computed from the header before any "
        "pixel work (413)",
    )
    # A render of a flow_grpo OCR prompt (all 1,017) is one line of at most 768; a 64 KB PNG of 46
    # lines of small text was 128,000 (30 s of recognizer work on a loaded 2-core CPU).
    max_text_width: int = setting(
        65_536,
        "recognizer work per image: its detected lines' widths as the recognizer reads them (48 px high), summed, "
        "checked before recognition (413)",
    )
    # Each is matched against every run of recognized words with ``ngram_candidates``: 2,730 of
    # them cost 2.9 s per sample.
    max_targets: int = setting(16, 'quoted targets per prompt with `target="all"` (413)')
    paddle_det_dir: str | None = setting(
        None, "a local PaddleOCR detection model (a directory, or an `.onnx` file), for offline nodes"
    )
    paddle_rec_dir: str | None = setting(None, "a local PaddleOCR recognition model, for offline nodes")
    paddle_cls_dir: str | None = setting(None, "a local PaddleOCR text direction model, for offline nodes")
    paddle_rec_dict: str | None = setting(None, "a local PaddleOCR character dictionary, for offline nodes")

    def rule(self) -> RuleOptions:
        return RuleOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RuleOptions)})
