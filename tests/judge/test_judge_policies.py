"""What a reply that does not parse scores under each ``parse_failure_score``, pointwise and in
pairwise groups, with the engine's replies given (the engine itself: test_judge_server.py)."""

from __future__ import annotations

import io
import math
from concurrent.futures import Future
from typing import Any

import pytest
from PIL import Image

from common.config import ConfigError
from common.errors import PayloadTooLarge, Unprocessable
from common.settings import CoreSettings
from services.judge.engine import Reply
from services.judge.scorer import JudgeItem, JudgeScorer

pytestmark = pytest.mark.unit

BETTER = {1: "<answer>Image 1 is better</answer>", 2: "<answer>Image 2 is better</answer>"}


class Replies:
    """An engine whose replies are chosen by the request's image URLs (``reply(urls)``)."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply

    def submit(self, body: dict[str, Any], expires: float) -> Future[Reply]:
        urls = [part["image_url"]["url"] for part in body["messages"][-1]["content"] if "image_url" in part]
        future: Future[Reply] = Future()
        future.set_result(Reply(self.reply(urls), 1, 1))
        return future


def scorer(monkeypatch: pytest.MonkeyPatch, judge: str, policy: str, reply: Any, **settings: str) -> JudgeScorer:
    monkeypatch.setenv("SCORER_JUDGE_JUDGE", judge)
    monkeypatch.setenv("SCORER_JUDGE_ENGINE", "http://127.0.0.1:1")
    monkeypatch.setenv("SCORER_JUDGE_MODEL", "m")
    monkeypatch.setenv("SCORER_JUDGE_PARSE_FAILURE_SCORE", policy)
    for key, value in settings.items():
        monkeypatch.setenv(f"SCORER_JUDGE_{key.upper()}", value)
    built = JudgeScorer(CoreSettings(service="judge"))
    built.engine = Replies(reply)
    return built


def items(urls: list[str], prompt: str = "p") -> list[JudgeItem]:
    return [JudgeItem(url, prompt, None, False) for url in urls]


POINTWISE = {"a": "Final Score: 5", "b": "Final Score: 3", "c": "no score here"}


@pytest.mark.parametrize(("policy", "failed"), [("nan", math.nan), ("zero", 0.0), ("mean", 0.8)])
def test_pointwise_failure_scores_by_the_setting(monkeypatch: pytest.MonkeyPatch, policy: str, failed: float) -> None:
    judge = scorer(monkeypatch, "unifiedreward-v1", policy, lambda urls: POINTWISE[urls[0]])
    results = judge.score_request(items(["a", "b", "c"]))
    assert [r.score for r in results[:2]] == [1.0, 0.6]
    assert results[2].extras["error_types"] == "parse_failure"
    assert results[2].score == failed or (math.isnan(failed) and math.isnan(results[2].score))


def test_tie_is_for_the_pairwise_judge_only(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="pairwise"):
        scorer(monkeypatch, "unifiedreward", "tie", None)


def pairwise_reply(urls: list[str]) -> str:
    """a beats everyone, b's comparison with c does not parse."""
    if "a" in urls:
        return BETTER[urls.index("a") + 1]
    return "I cannot decide"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("nan", [1.0, math.nan, math.nan]),
        ("zero", [1.0, 0.0, 0.0]),  # the failed comparison a loss for both
        ("tie", [1.0, 0.25, 0.25]),  # half a win each
        ("mean", [1.0, 0.0, 0.0]),  # left out: b and c each lost their one counted comparison
    ],
)
def test_pairwise_failure_scores_by_the_setting(
    monkeypatch: pytest.MonkeyPatch, policy: str, expected: list[float]
) -> None:
    judge = scorer(monkeypatch, "unifiedreward-think", policy, pairwise_reply)
    results = judge.score_request(items(["a", "b", "c"]))
    scores = [r.score for r in results]
    assert all(s == e or (math.isnan(s) and math.isnan(e)) for s, e in zip(scores, expected)), scores
    assert "error_types" not in results[0].extras
    assert results[1].extras["error_types"] == "parse_failure" and results[1].extras["failed_comparisons"] == 1


def test_pairwise_both_orders_cancel_a_position_bias(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = scorer(monkeypatch, "unifiedreward-think", "nan", lambda urls: BETTER[1], both_orders="1")
    results = judge.score_request(items(["a", "b"]) + items(["c", "d", "e"], "q"))
    assert [r.score for r in results] == [0.5] * 5
    assert [r.extras["comparisons"] for r in results] == [2, 2, 4, 4, 4]


def request(prompts: list[str]) -> dict[str, Any]:
    image = io.BytesIO()
    Image.new("RGB", (32, 32), "white").save(image, "PNG")
    return {"images": [image.getvalue()] * len(prompts), "prompts": prompts}


def test_a_pairwise_request_is_bounded_before_any_call(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = scorer(monkeypatch, "unifiedreward-think", "nan", None, max_comparisons="10")
    assert len(judge.prepare_samples(request(["p"] * 5)).items) == 5  # 10 pairs
    with pytest.raises(PayloadTooLarge, match="11 comparisons"):
        judge.prepare_samples(request(["p"] * 5 + ["q"] * 2))
    with pytest.raises(Unprocessable, match="no other sample"):
        judge.prepare_samples(request(["p", "p", "q"]))
