"""The judges' reply rules on the published example replies and on hostile ones."""

from __future__ import annotations

import pytest

from services.judge import prompts
from services.judge.prompts import ParseFailure

pytestmark = pytest.mark.unit

# The reply format UnifiedReward 2.0's prompt asks for, filled in.
POINTWISE = "Alignment Score (1-5): 4\nCoherence Score (1-5): 3.5\nStyle Score (1-5): 5\n"
# The example answer UnifiedReward-Think's prompt shows, shortened.
THINK = (
    "<think>\n1. Semantic consistency: \n    Image 1 (9/10) - ...; \n    Image 2 (7/10) - ...\n"
    "Total score:\nImage 1: 9+8+8=25\nImage 2: 7+8+5=20\n</think>\n<answer>Image 1 is better</answer>"
)


def test_unified_reward_reads_the_three_axes_and_maps_their_mean_to_0_1() -> None:
    axes = prompts.parse_unified_reward("Some reasoning first.\n" + POINTWISE)
    assert axes == {"alignment": 4.0, "coherence": 3.5, "style": 5.0}
    assert prompts.unified_reward_score(axes) == pytest.approx((12.5 / 3 - 1) / 4)
    assert prompts.unified_reward_score({"alignment": 1, "coherence": 1, "style": 1}) == 0.0
    assert prompts.unified_reward_score({"alignment": 5, "coherence": 5, "style": 5}) == 1.0


def test_unified_reward_takes_the_published_patterns_variants() -> None:
    reply = "alignment score: 2\nCOHERENCE SCORE (1-5) : 3\nStyle  Score:4"
    assert prompts.parse_unified_reward(reply) == {"alignment": 2.0, "coherence": 3.0, "style": 4.0}
    # The same value given twice is one answer.
    assert prompts.parse_unified_reward(POINTWISE + "Alignment Score: 4")["alignment"] == 4.0


@pytest.mark.parametrize(
    "reply",
    [
        "",  # nothing
        "The image is lovely. 3 4 5",  # bare numbers: VeRL-Omni reads them as the three axes
        "Alignment Score (1-5): 4\nCoherence Score (1-5): 3",  # an axis missing
        "Alignment Score (1-5): 40\nCoherence Score (1-5): 3\nStyle Score (1-5): 5",  # out of range
        "Alignment Score (1-5): 0\nCoherence Score (1-5): 3\nStyle Score (1-5): 5",
        "Alignment Score (1-5): -1e9\nCoherence Score (1-5): 3\nStyle Score (1-5): 5",
        "Alignment Score (1-5): 1e999\nCoherence Score (1-5): 3\nStyle Score (1-5): 5",  # inf
        POINTWISE + "Alignment Score (1-5): 1",  # two different answers
        POINTWISE + " " * prompts.MAX_REPLY_CHARS,  # huge
    ],
)
def test_unified_reward_calls_an_unreadable_reply_a_failure(reply: str) -> None:
    with pytest.raises(ParseFailure):
        prompts.parse_unified_reward(reply)


def test_v1_reads_the_final_score() -> None:
    assert prompts.parse_unified_reward_v1("The image matches.\nFinal Score: 4") == 4.0
    assert prompts.parse_unified_reward_v1("Final Score:3.5") == 3.5
    assert prompts.parse_unified_reward_v1("Final Score: 5 ... Final Score: 5.0") == 5.0


@pytest.mark.parametrize(
    "reply",
    ["", "Score: 4", "Final Score: 10", "Final Score: 0", "Final Score: 2\nFinal Score: 5", "final score: 4"],
)
def test_v1_calls_an_unreadable_reply_a_failure(reply: str) -> None:
    # flow_grpo reads "Final Score: 10" as 1 and the rest as 0.
    with pytest.raises(ParseFailure):
        prompts.parse_unified_reward_v1(reply)


def test_think_reads_the_answer_after_the_reasoning() -> None:
    assert prompts.parse_think(THINK) == 1
    assert prompts.parse_think(THINK.replace("Image 1 is better</answer>", " Image 2 is better \n</answer>")) == 2
    # An answer quoted inside the reasoning does not count; the one after it does.
    quoted = THINK.replace("<think>\n", "<think>\nThe format is <answer>Image 2 is better</answer>.\n")
    assert prompts.parse_think(quoted) == 1


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "<think>Image 1 is clearly better</think>",  # no answer tag
        THINK.replace("Image 1 is better</answer>", "Image 1 is better</answer><answer>Image 2 is better</answer>"),
        THINK.replace("Image 1 is better", "Both are equally good"),
        THINK.replace("Image 1 is better", "Image 3 is better"),
        THINK.replace("Image 1 is better", "Image 1 is better, and Image 2 is better"),
        THINK + "x" * prompts.MAX_REPLY_CHARS,
    ],
)
def test_think_calls_an_unreadable_reply_a_failure(reply: str) -> None:
    with pytest.raises(ParseFailure):
        prompts.parse_think(reply)


def test_transcription_lines_drop_line_breaks_as_the_rule_joins_them() -> None:
    assert prompts.transcription_lines("HELLO\nWORLD\r\n") == [("HELLO", 1.0), ("WORLD", 1.0)]
    with pytest.raises(ParseFailure):
        prompts.transcription_lines("A" * (prompts.MAX_REPLY_CHARS + 1))


def test_the_prompts_are_the_published_ones_with_the_caption_in_place() -> None:
    assert prompts.unified_reward_prompt("a cat").endswith("Text Caption: [a cat]")
    assert "Style Score (1-5): Z" in prompts.unified_reward_prompt("a cat")
    assert prompts.unified_reward_v1_prompt("a cat").startswith("<image>\nYou are given a text caption")
    think = prompts.think_prompt("a {cat}")
    assert "「a {cat}」" in think and "<answer>Image 1 is better</answer>" in think
    video = prompts.think_video_prompt("a {cat}")
    assert "「a {cat}」" in video and "The first half of the frames belong to Video 1" in video


def test_think_reads_a_video_comparisons_answer() -> None:
    video = THINK.replace("Image 1 is better", "Video 2 is better")
    assert prompts.parse_think(video, "Video") == 2
    with pytest.raises(ParseFailure, match="Video 1 is better"):
        prompts.parse_think(THINK, "Video")  # an image's answer to a video comparison


def test_qwenvl_reads_the_score_tag() -> None:
    reply = "<Thought>\nSharp, rich colours.\n</Thought>\n<Score>4</Score>"
    assert prompts.parse_qwenvl(reply) == 4.0
    assert prompts.parse_qwenvl("<Score>05</Score> ... <Score>5</Score>") == 5.0  # the same score twice


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "<Score>X</Score>",  # the task's own template, echoed
        "<Score>3.5</Score>",  # flow_grpo's pattern takes whole numbers only: 0 there
        "<score>4</score>",
        "<Score>0</Score>",
        "<Score>9</Score>",  # flow_grpo: 1.8
        "<Score>2</Score><Score>4</Score>",  # flow_grpo: the first
        "<Score>4</Score>" + " " * prompts.MAX_REPLY_CHARS,
    ],
)
def test_qwenvl_calls_a_reply_without_a_1_to_5_score_a_failure(reply: str) -> None:
    with pytest.raises(ParseFailure):
        prompts.parse_qwenvl(reply)
