"""Settings of the OCR service (``SCORER_OCR_*``): the engine, its limits, and the matching
options a request may override. Standard library only, as ``run.sh`` reads them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from common.config import setting
from common.errors import Unprocessable, quote


@dataclass(frozen=True)
class RuleOptions:
    """Matching options; each is a server setting (``SCORER_OCR_<FIELD>``) and a per-request
    override in ``metadata["ocr"]``."""

    # "all" is deepgen_rl's newer mode.
    target: Literal["first", "all"] = setting(
        "first", "`first` quoted segment (flow_grpo), or `all` segments each scored and averaged"
    )
    no_quotes: Literal["whole_prompt", "zero"] = setting(
        "whole_prompt", "a prompt without quotes: match the whole prompt, or `zero`"
    )
    case_sensitive: bool = setting(False, "keep case when comparing")
    strip_punctuation: bool = setting(False, "drop ASCII punctuation on both sides")
    # flow_grpo: > 0.
    min_confidence: float = setting(0.0, "ignore lines at or below this confidence")
    ngram_candidates: bool = setting(
        False, "also compare against every run of as many recognized words as the target has; keep the best"
    )
    fold_confusions: bool = setting(False, "fold 0→o, 1/i/j→l, 5→s, v→w on both sides")

    def override(self, overrides: Any) -> RuleOptions:
        """These options with a request's ``metadata["ocr"]`` applied; 422 for a bad key/value."""
        if overrides is None:
            return self
        if not isinstance(overrides, dict):
            raise Unprocessable("metadata['ocr'] must be a dict of matching options")
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = [quote(key) for key in overrides if key not in fields]  # keys of any type, quoted bounded
        if unknown:
            shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
            raise Unprocessable(f"unknown OCR option(s) {shown}; known: {', '.join(sorted(fields))}")
        for key, value in overrides.items():
            if not _valid(getattr(self, key), key, value):
                raise Unprocessable(f"metadata['ocr'][{key!r}] = {quote(value)} is not a valid value")
        return dataclasses.replace(self, **overrides)


_CHOICES = {"target": ("first", "all"), "no_quotes": ("whole_prompt", "zero")}


def _valid(current: Any, key: str, value: Any) -> bool:
    """Whether ``value`` may replace the option ``key`` (now ``current``): a bool for a bool; a
    finite number for a float (an int too large for a float is not one); one of the choices."""
    if isinstance(current, bool):
        return isinstance(value, bool)
    if isinstance(current, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        try:
            return math.isfinite(float(value))
        except OverflowError:  # an int of over 1024 bits
            return False
    return isinstance(value, str) and value in _CHOICES[key]


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
