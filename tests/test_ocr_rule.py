"""The OCR reward rule against hand-computed cases, branch by branch."""

from __future__ import annotations

import pytest

from common.limits.errors import Unprocessable
from common.models.ocr_rule import RuleOptions, check_targets, match_score, reward, targets

pytestmark = pytest.mark.unit

FLOW = RuleOptions()


def score(prompt: str, lines, options: RuleOptions = FLOW) -> float:
    return reward(check_targets(prompt, options, 0), lines, options)


def test_substring_scores_one() -> None:
    # "hello" is inside "xxhelloyy": dist 0.
    assert score('a sign "Hello"', [("xx", 0.9), ("HELLO yy", 0.8)]) == 1.0


def test_levenshtein_when_not_a_substring() -> None:
    # target "hello", recognized "hallo": one substitution -> 1 - 1/5.
    assert score('a sign "Hello"', [("Hallo", 0.9)]) == pytest.approx(0.8)


def test_distance_is_capped_at_target_length() -> None:
    # recognized "xyzxyzxyz" vs "hi": distance 9, capped at 2 -> 0.
    assert score('say "hi"', [("xyzxyzxyz", 0.9)]) == 0.0
    # "hx" vs "hi": distance 1, under the cap -> 0.5.
    assert score('say "hi"', [("hx", 0.9)]) == 0.5
    assert score('say "hi"', []) == 0.0


def test_spaces_and_case_are_ignored() -> None:
    # "Open Now" -> "opennow"; recognized "OPENNOW" -> "opennow".
    assert score('board "Open Now"', [("OPEN", 0.9), ("NOW", 0.9)]) == 1.0
    assert score('board "Open Now"', [("O P E N N O W", 0.9)]) == 1.0


def test_lines_with_zero_confidence_are_dropped() -> None:
    assert score('x "ab"', [("ab", 0.0)]) == 0.0
    assert score('x "ab"', [("ab", 0.01)]) == 1.0


def test_only_first_quoted_segment_by_default() -> None:
    assert targets('a "first" and "second"', FLOW) == ["first"]
    assert score('a "first" and "second"', [("first", 0.9)]) == 1.0


def test_all_segments_are_averaged_in_all_mode() -> None:
    options = RuleOptions(target="all")
    assert targets('a "first" and "second"', options) == ["first", "second"]
    # "first" found (1.0); "second" vs "first": distance 6 capped at 6 -> 0.0; mean 0.5.
    assert score('a "first" and "second"', [("first", 0.9)], options) == pytest.approx(0.5)


def test_prompt_without_quotes() -> None:
    assert targets("no quotes here", FLOW) == ["no quotes here"]
    assert score("no quotes", [("NOQUOTES", 0.9)]) == 1.0
    zero = RuleOptions(no_quotes="zero")
    assert targets("no quotes here", zero) is None
    assert score("no quotes", [("NOQUOTES", 0.9)], zero) == 0.0


def test_lone_quote_behaves_as_flow_grpo_split() -> None:
    assert targets('sign reads "Open late', FLOW) == ["Open late"]


@pytest.mark.parametrize("prompt", ['a sign "" here', 'a sign "   " here'])
def test_empty_target_is_a_clear_error_not_a_division_by_zero(prompt: str) -> None:
    with pytest.raises(Unprocessable, match=r"prompts\[3\].*empty"):
        check_targets(prompt, FLOW, 3)


def test_case_sensitive_option() -> None:
    assert match_score("Hello", [("hello", 0.9)], RuleOptions(case_sensitive=True)) == pytest.approx(0.8)


def test_punctuation_option() -> None:
    assert match_score("Sale!", [("Sale", 0.9)], FLOW) == pytest.approx(0.8)
    assert match_score("Sale!", [("Sale", 0.9)], RuleOptions(strip_punctuation=True)) == 1.0


def test_min_confidence_option() -> None:
    assert match_score("ab", [("ab", 0.4)], RuleOptions(min_confidence=0.5)) == 0.0


def test_confusion_folding() -> None:
    # "5ALE 1N" folds to "sale ln"; target "Sale In" folds to "saleln".
    assert match_score("Sale In", [("5ALE 1N", 0.9)], FLOW) < 1.0
    assert match_score("Sale In", [("5ALE 1N", 0.9)], RuleOptions(fold_confusions=True)) == 1.0


def test_ngram_candidates_pick_the_best_window() -> None:
    # Whole text "bigsummersalenow" vs "summersail": delete "big", keep "summersa", insert "i",
    # keep "l", delete "enow": distance 8, score 0.2. The two-word window "summersale": insert
    # "i", delete "e": distance 2 -> 0.8.
    lines = [("big summer sale now", 0.9)]
    assert match_score("summer sail", lines, FLOW) == pytest.approx(0.2)
    assert match_score("summer sail", lines, RuleOptions(ngram_candidates=True)) == pytest.approx(0.8)


def test_per_request_overrides() -> None:
    assert FLOW.override({"case_sensitive": True}).case_sensitive
    assert FLOW.override(None) is FLOW
    with pytest.raises(Unprocessable, match="unknown OCR option"):
        FLOW.override({"bogus": 1})
    with pytest.raises(Unprocessable, match="not a valid value"):
        FLOW.override({"target": "some"})
    with pytest.raises(Unprocessable, match="not a valid value"):
        FLOW.override({"case_sensitive": "yes"})
    with pytest.raises(Unprocessable, match="not a valid value"):
        FLOW.override({"min_confidence": float("nan")})
    with pytest.raises(Unprocessable):
        FLOW.override(["case_sensitive"])
