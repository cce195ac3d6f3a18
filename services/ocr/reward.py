"""The OCR reward rule: how well the recognized text matches the text the prompt asked for.

The default is flow_grpo's rule, exactly: target = the first ``"..."`` segment of the prompt;
recognized = the concatenated texts of lines with confidence > 0; spaces removed and both
lowercased; dist = 0 if the target is a substring of the recognized text, else their
Levenshtein distance, capped at len(target); score = 1 - dist / len(target).
Options (deepgen_rl's newer rule) change one step each; all off by default.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from rapidfuzz.distance import Levenshtein

from common.errors import Unprocessable, quote
from services.ocr.settings import RuleOptions

QUOTED = re.compile(r'"([^"]*)"')
# Characters OCR confuses; folded on both sides when ``fold_confusions`` is on.
CONFUSIONS = str.maketrans({"0": "o", "1": "l", "i": "l", "j": "l", "5": "s", "v": "w"})
PUNCTUATION = str.maketrans("", "", string.punctuation)

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
