"""The ``qwenvl`` judge against flow_grpo's own Qwen-VL aesthetic judge, ``flow_grpo/qwenvl.py``:
the same task text, and the same score as its ``extract_scores`` on every reply it reads in range;
a reply it scores 0 (no ``<Score>`` tag of whole digits) or out of 1-5 (``<Score>9</Score>``: 1.8)
is a parse failure here. The file is read from a copy that ``SCORER_TEST_FLOW_GRPO_QWENVL`` names
(fetched by hand, not shipped); without it, its rule restated (``testing/flow_grpo_qwenvl.py``)
stands in, and the tests of the file itself skip as missing."""

from __future__ import annotations

import math
import os
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from services.judge import prompts
from services.judge.prompts import ParseFailure
from testing import fetched, flow_grpo_qwenvl

FLOW_GRPO_QWENVL = os.environ.get("SCORER_TEST_FLOW_GRPO_QWENVL")
pytestmark = pytest.mark.unit
needs_file = pytest.mark.skipif(
    not FLOW_GRPO_QWENVL,
    reason="missing: SCORER_TEST_FLOW_GRPO_QWENVL names no copy of flow_grpo's flow_grpo/qwenvl.py",
)
REPLIES = 3000
Rule = Callable[[list[str]], list[float]]


def file_rule() -> Rule:
    return fetched.load(Path(FLOW_GRPO_QWENVL or ""), {"extract_scores"}, {"re": re})["extract_scores"]


@pytest.fixture(params=["restated", pytest.param("flow_grpo", marks=needs_file)])
def extract_scores(request: pytest.FixtureRequest) -> Rule:
    return flow_grpo_qwenvl.extract_scores if request.param == "restated" else file_rule()


def thought(rng: random.Random) -> str:
    return rng.choice(["", "The image is sharp, well exposed, with a clear focal point.", "Blurry.\n\nDull colours."])


def published_reply(rng: random.Random) -> str:
    """A reply in the format the task asks for: the analysis in <Thought>, then the score, with
    what a model puts around it (text before and after, the same score again, leading zeros)."""
    score = rng.choice(["1", "2", "3", "4", "5", "05", "003"])
    reply = f"<Thought>\n{thought(rng)}\n</Thought>\n<Score>{score}</Score>"
    return rng.choice(["", "Analysis:\n"]) + reply + rng.choice(["", "\n", f"\nFinal: <Score>{int(score)}</Score>"])


def hostile_reply(rng: random.Random) -> tuple[str, str]:
    """(kind, reply): a reply flow_grpo scores though it gives no 1-5 score it could read."""
    kind = rng.choice(["unmatched", "out of range", "two scores", "huge"])
    if kind == "unmatched":  # flow_grpo: 0
        score = rng.choice(["X", "3.5", " 4 ", "four", "", "-2", "+3"])
        tag = rng.choice(["<Score>{}</Score>", "<score>{}</score>", "Score: {}", "<Score>{}"]).format(score)
        return kind, rng.choice([f"<Thought>{thought(rng)}</Thought>\n{tag}", tag, thought(rng)])
    if kind == "out of range":  # flow_grpo: the value over 5, whatever it is
        score = rng.choice(["0", "00", "6", "9", "10", "55", str(rng.randint(6, 10**30))])
        return kind, f"<Thought>\n{thought(rng)}\n</Thought>\n<Score>{score}</Score>"
    if kind == "two scores":  # flow_grpo: the first
        first, second = rng.sample(["1", "2", "3", "4", "5"], 2)
        return kind, f"<Score>{first}</Score> on reflection <Score>{second}</Score>"
    # looping until the length cap, its score at the end: flow_grpo reads it
    return kind, "ha " * (prompts.MAX_REPLY_CHARS // 3 + 1) + "<Score>4</Score>"


def test_published_replies_score_as_flow_grpo_scores_them(extract_scores: Rule) -> None:
    rng = random.Random(41)
    replies = [published_reply(rng) for _ in range(REPLIES)]
    for reply, theirs in zip(replies, extract_scores(replies)):
        assert prompts.parse_qwenvl(reply) / 5.0 == theirs, reply


def test_replies_flow_grpo_scores_0_or_out_of_range_are_parse_failures(extract_scores: Rule) -> None:
    rng = random.Random(42)
    kinds, replies = zip(*(hostile_reply(rng) for _ in range(REPLIES)))
    theirs: Counter[str] = Counter()
    for kind, reply, score in zip(kinds, replies, extract_scores(list(replies))):
        with pytest.raises(ParseFailure):
            prompts.parse_qwenvl(reply)
        if kind == "unmatched":
            assert score == 0, reply
        elif kind == "out of range":
            assert not 0.2 <= score <= 1.0 and math.isfinite(score), reply
        else:
            assert 0.2 <= score <= 1.0, reply  # the first of two, or the score after a loop
        theirs[kind] += 1
    assert set(theirs) == {"unmatched", "out of range", "two scores", "huge"}, theirs


@needs_file
def test_the_restated_rule_is_flow_grpos() -> None:
    rng = random.Random(43)
    replies = [published_reply(rng) for _ in range(500)] + [hostile_reply(rng)[1] for _ in range(500)]
    assert flow_grpo_qwenvl.extract_scores(replies) == file_rule()(replies)


@needs_file
def test_the_task_is_flow_grpos_word_for_word() -> None:
    published = fetched.attribute_text(Path(FLOW_GRPO_QWENVL or ""), "task")
    assert published == prompts.QWENVL_TASK
