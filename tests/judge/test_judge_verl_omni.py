"""The judges against VeRL-Omni's own modules, ``verl_omni/utils/reward_score/unified_reward.py``
and ``genrm_ocr.py``, read from a VeRL-Omni checkout that ``SCORER_TEST_VERL_OMNI`` names
(VeRL-Omni is not on PyPI, so CI has none: these tests skip there). The same prompts and
sampling; the same score on every generated reply their rules define; and where their rules
score a reply they cannot read (no axes, one missing, out of range), a parse failure here.

Only the rules' constants and functions are taken from the files (by their syntax tree), so
the modules' transport imports (aiohttp, torch, openai, transformers) are not needed.
"""

from __future__ import annotations

import math
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from common.models.ocr_rule import RuleOptions, check_targets, reward
from services.judge import prompts
from services.judge.prompts import ParseFailure
from testing import fetched

VERL_OMNI = os.environ.get("SCORER_TEST_VERL_OMNI")
pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not VERL_OMNI, reason="SCORER_TEST_VERL_OMNI names no VeRL-Omni checkout"),
]
REPLIES = 3000


def load(module: str, functions: set[str]) -> dict[str, Any]:
    """The module-level constants and the named functions of VeRL-Omni's reward_score/<module>.py."""
    path = Path(VERL_OMNI or "") / "verl_omni" / "utils" / "reward_score" / f"{module}.py"
    return fetched.load(path, functions, {"re": re, "os": os})


@pytest.fixture(scope="module")
def unified() -> dict[str, Any]:
    return load(
        "unified_reward",
        {"_build_unified_reward_prompt", "_parse_unified_reward_scores", "_aggregate_unified_reward_scores"},
    )


@pytest.fixture(scope="module")
def ocr() -> dict[str, Any]:
    return load("genrm_ocr", {"_levenshtein_score"})


def test_the_requests_are_verl_omnis(unified: dict[str, Any], ocr: dict[str, Any]) -> None:
    for caption in ["a cat", 'a sign saying "OPEN"', "[brackets] {braces} 「quotes」", ""]:
        assert prompts.unified_reward_prompt(caption) == unified["_build_unified_reward_prompt"](caption)
    assert prompts.UNIFIED_REWARD_SAMPLING.body() == unified["DEFAULT_UNIFIED_REWARD_SAMPLING_PARAMS"]
    assert ocr["DEFAULT_GRM_PROMPT"] == prompts.VLM_OCR_PROMPT
    assert prompts.VLM_OCR_SAMPLING.body() == ocr["DEFAULT_SAMPLING_PARAMS"]


def axis_value(rng: random.Random) -> str:
    """An axis value as the judges write them: a whole score, or a decimal (2.4036)."""
    if rng.random() < 0.5:
        return str(rng.randint(1, 5))
    return f"{rng.uniform(1, 5):.{rng.randint(1, 4)}f}"


def published_reply(rng: random.Random) -> str:
    """A reply in the format the 2.0 prompt asks for, with the variants the pattern allows:
    reasoning around it, another order, case, the scale or not, spacing."""
    lines = []
    for axis in rng.sample(["Alignment", "Coherence", "Style"], 3):
        name = rng.choice([axis, axis.lower(), axis.upper()])
        scale = rng.choice([" (1-5)", "", "(1-5)"])
        lines.append(f"{name} Score{scale}{rng.choice([':', ': ', ' : '])}{axis_value(rng)}")
    before = rng.choice(["", "The image shows the caption's subject.\n", "Evaluation:\n\n"])
    after = rng.choice(["", "\n", "\nOverall, a good image."])
    return before + "\n".join(lines) + after


def test_published_replies_score_as_verl_omni_scores_them(unified: dict[str, Any]) -> None:
    rng = random.Random(30)
    for _ in range(REPLIES):
        reply = published_reply(rng)
        theirs = unified["_parse_unified_reward_scores"](reply)
        normalized, _ = unified["_aggregate_unified_reward_scores"](theirs)
        axes = prompts.parse_unified_reward(reply)
        assert axes == theirs, reply
        assert prompts.unified_reward_score(axes) == pytest.approx(normalized, abs=1e-12), reply


def hostile_reply(rng: random.Random) -> str:
    """A reply VeRL-Omni's rule still scores though it does not answer the prompt."""
    axes = ["Alignment", "Coherence", "Style"]
    kind = rng.randrange(5)
    if kind == 0:  # no axis: VeRL-Omni takes the first three numbers, or scores 0
        return rng.choice(["", "I cannot judge this image.", f"{rng.randint(0, 99)} {rng.randint(0, 99)} 7 and 2"])
    if kind == 1:  # an axis missing: the mean of the others
        return "\n".join(f"{axis} Score (1-5): {axis_value(rng)}" for axis in rng.sample(axes, rng.randint(1, 2)))
    if kind == 2:  # a value off the 1-5 scale: clipped after averaging
        values = [axis_value(rng) for _ in axes]
        values[rng.randrange(3)] = rng.choice(["0", "6", "10", "-3", "1e9", "0.5", "5.01"])
        return "\n".join(f"{axis} Score (1-5): {value}" for axis, value in zip(axes, values))
    if kind == 3:  # two different values for an axis: the last one
        first, second = rng.sample(["1", "2", "3", "4", "5"], 2)
        rest = "\n".join(f"{axis} Score (1-5): {axis_value(rng)}" for axis in axes[1:])
        return f"Alignment Score (1-5): {first}\n{rest}\nAlignment Score (1-5): {second}"
    # a reply looping until max_tokens, its axes at the end
    return "ha " * (prompts.MAX_REPLY_CHARS // 3 + 1) + "\n".join(f"{axis} Score: 3" for axis in axes)


def test_hostile_replies_are_parse_failures_where_verl_omni_scores_them(unified: dict[str, Any]) -> None:
    rng = random.Random(31)
    for _ in range(REPLIES):
        reply = hostile_reply(rng)
        theirs, _ = unified["_aggregate_unified_reward_scores"](unified["_parse_unified_reward_scores"](reply))
        assert math.isfinite(theirs) and 0.0 <= theirs <= 1.0, reply
        with pytest.raises(ParseFailure):
            prompts.parse_unified_reward(reply)


ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.,!?-'&"


def transcription(rng: random.Random, text: str) -> str:
    """What a VLM might transcribe of ``text``: exact, recased, re-spaced or broken into lines,
    with typos, dropped or hallucinated characters, or nothing."""
    kind = rng.randrange(6)
    if kind == 0:
        return text
    if kind == 1:
        return rng.choice([text.upper(), text.lower(), text.swapcase()])
    if kind == 2:
        return "".join(ch + rng.choice(["", "", " ", "\n"]) for ch in text.replace(" ", rng.choice([" ", "\n", ""])))
    if kind == 3:
        chars = list(text)
        for _ in range(rng.randint(1, max(1, len(chars) // 2))):
            at = rng.randrange(len(chars) + 1)
            edit = rng.randrange(3)
            if edit == 0 and at < len(chars):
                del chars[at]
            elif edit == 1 and at < len(chars):
                chars[at] = rng.choice(ALPHABET)
            else:
                chars.insert(at, rng.choice(ALPHABET))
        return "".join(chars)
    if kind == 4:
        noise = "".join(rng.choice(ALPHABET + " ") for _ in range(rng.randint(1, 60)))
        return rng.choice([noise + text, text + "\n" + noise, noise])
    return ""


def test_vlm_ocr_scores_transcriptions_as_verl_omni_scores_them(ocr: dict[str, Any]) -> None:
    rng = random.Random(32)
    options = RuleOptions()
    for _ in range(REPLIES):
        words = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(1, 4))]
        text = " ".join(words)
        reply = transcription(rng, text)
        wanted = check_targets(f'A poster that says "{text}"', options, 0)
        ours = reward(wanted, prompts.transcription_lines(reply), options)
        assert ours == pytest.approx(ocr["_levenshtein_score"](reply, text), abs=1e-12), (text, reply)
