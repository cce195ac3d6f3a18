"""The OCR reward rule: how well the recognized text matches the text the prompt asked for,
and its options (``RuleOptions``); the OCR service's and the judge's ``vlm-ocr`` rule.

The default is flow_grpo's rule, exactly: target = the first ``"..."`` segment of the prompt;
recognized = the concatenated texts of lines with confidence > 0; spaces removed and both
lowercased; dist = 0 if the target is a substring of the recognized text, else their
Levenshtein distance, capped at len(target); score = 1 - dist / len(target).
Options (deepgen_rl's newer rule) change one step each; all off by default.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from common.configuration.config import setting
from common.limits.errors import Unprocessable, quote

QUOTED = re.compile(r'"([^"]*)"')
# Characters OCR confuses; folded on both sides when ``fold_confusions`` is on.
CONFUSIONS = str.maketrans({"0": "o", "1": "l", "i": "l", "j": "l", "5": "s", "v": "w"})
PUNCTUATION = str.maketrans("", "", string.punctuation)


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


# (text, confidence) of one recognized line.
Line = tuple[str, float]


def targets(prompt: str, options: RuleOptions) -> list[str] | None:
    """The text(s) the prompt asks to be rendered; None when it asks for nothing (score 0)."""
    segments = QUOTED.findall(prompt)
    if not segments:
        # A lone quote is a segment to flow_grpo (``prompt.split('"')[1]``).
        if prompt.count('"') == 1:
            segments = [prompt.split('"')[1]]
        elif options.no_quotes == "zero":
            return None
        else:
            segments = [prompt]
    return segments if options.target == "all" else segments[:1]


def _normalize(text: str, options: RuleOptions) -> str:
    text = text.replace(" ", "")
    if not options.case_sensitive:
        text = text.lower()
    if options.strip_punctuation:
        text = text.translate(PUNCTUATION)
    if options.fold_confusions:
        text = text.translate(CONFUSIONS)
    return text


def _distance(recognized: str, target: str, substring: bool) -> int:
    # Imported here: run.sh reads ``RuleOptions`` (the OCR service's settings) with the standard library alone.

    # Imported here: run.sh reads ``RuleOptions`` (the OCR service's settings) with the standard library alone.
    from rapidfuzz.distance import Levenshtein

    return 0 if substring and target in recognized else Levenshtein.distance(recognized, target)


def match_score(target: str, lines: Sequence[Line], options: RuleOptions, substring: bool = True) -> float:
    """Score one target against the recognized lines; ``target`` must not normalize to ''.
    ``substring=False``: the plain edit distance, as flow_grpo's video OCR rule measures a frame."""
    wanted = _normalize(target, options)
    kept = [text for text, confidence in lines if confidence > options.min_confidence]
    recognized = _normalize("".join(kept), options)
    dist = _distance(recognized, wanted, substring)
    if options.ngram_candidates and dist:
        words = " ".join(kept).split()
        size = max(1, len(target.split()))
        for start in range(max(1, len(words) - size + 1)):
            candidate = _normalize("".join(words[start : start + size]), options)
            dist = min(dist, _distance(candidate, wanted, substring))
    dist = min(dist, len(wanted))
    return 1.0 - dist / len(wanted)


def check_targets(prompt: str, options: RuleOptions, index: int) -> list[str] | None:
    """Targets of a prompt, with a clear per-sample error for an empty one (never a 1/0)."""
    wanted = targets(prompt, options)
    for text in wanted or ():
        if not _normalize(text, options):
            raise Unprocessable(
                f"prompts[{index}]: the quoted target text {quote(text)} is empty after normalization; "
                "there is nothing to match"
            )
    return wanted


def reward(wanted: list[str] | None, lines: Sequence[Line], options: RuleOptions, substring: bool = True) -> float:
    """The sample's score: 0 for no target, else the mean over its targets."""
    if wanted is None:
        return 0.0
    return sum(match_score(text, lines, options, substring) for text in wanted) / len(wanted)
