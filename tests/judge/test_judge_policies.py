"""What a reply that does not parse scores under each ``parse_failure_score``, pointwise and in
pairwise groups, with the engine's replies given (the engine itself: test_judge_server.py)."""

from __future__ import annotations

import base64
import dataclasses
import io
import math
from typing import Any

import pytest
from PIL import Image

from common.configuration.config import ConfigError
from common.configuration.settings import CoreSettings
from common.imaging.media import parse_media_request
from common.limits.errors import PayloadTooLarge, Unprocessable
from services.judge import prompts
from services.judge.engine import Reply
from services.judge.scorer import JudgeItem, JudgeScorer

pytestmark = pytest.mark.unit

BETTER = {1: "<answer>Image 1 is better</answer>", 2: "<answer>Image 2 is better</answer>"}


class Replies:
    """An engine whose replies are chosen by the request's image URLs (``reply(urls)``)."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.bodies: list[dict[str, Any]] = []  # every call's, in order

    def replies(self, bodies: list[dict[str, Any]], expires: float, client: str) -> list[Reply]:
        self.bodies += bodies
        return [Reply(self.reply(self.urls(body)), 1, 1) for body in bodies]

    @staticmethod
    def urls(body: dict[str, Any]) -> list[str]:
        return [part["image_url"]["url"] for part in body["messages"][-1]["content"] if "image_url" in part]


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
    return [JudgeItem((url,), prompt, None, False) for url in urls]


POINTWISE = {"a": "Final Score: 5", "b": "Final Score: 3", "c": "no score here"}


@pytest.mark.parametrize(("policy", "failed"), [("nan", math.nan), ("zero", 0.0), ("mean", 0.8)])
def test_pointwise_failure_scores_by_the_setting(monkeypatch: pytest.MonkeyPatch, policy: str, failed: float) -> None:
    judge = scorer(monkeypatch, "unifiedreward-v1", policy, lambda urls: POINTWISE[urls[0]])
    results = judge.score_request(items(["a", "b", "c"]))
    assert [r.score for r in results[:2]] == [1.0, 0.6]
    assert results[2].extras["error_types"] == "parse_failure"
    assert results[2].score == failed or (math.isnan(failed) and math.isnan(results[2].score))


def test_flow_grpos_names_of_the_judges_it_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi request may name a judge as flow_grpo's ``multi_score`` does: its ``unifiedreward``
    is UnifiedReward v1, never the 2.0 judge of that name here."""
    names = {judge: scorer(monkeypatch, judge, "nan", None).aliases() for judge in ("qwenvl", "unifiedreward-v1")}
    assert names == {"qwenvl": ("qwenvl",), "unifiedreward-v1": ("unifiedreward",)}
    assert scorer(monkeypatch, "unifiedreward", "nan", None).aliases() == ()


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


def png(shade: int = 255) -> bytes:
    image = io.BytesIO()
    Image.new("RGB", (32, 32), (shade, shade, shade)).save(image, "PNG")
    return image.getvalue()


def request(prompts: list[str]) -> dict[str, Any]:
    return {"images": [png()] * len(prompts), "prompts": prompts}


def test_a_pairwise_request_is_bounded_before_any_call(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = scorer(monkeypatch, "unifiedreward-think", "nan", None, max_comparisons="10")
    assert len(judge.prepare_samples(request(["p"] * 5)).items) == 5  # 10 pairs
    with pytest.raises(PayloadTooLarge, match="11 comparisons"):
        judge.prepare_samples(request(["p"] * 5 + ["q"] * 2))
    with pytest.raises(Unprocessable, match="no other sample"):
        judge.prepare_samples(request(["p", "p", "q"]))


def test_pairwise_videos_are_compared_whole_on_eight_uniformly_spaced_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pref-GRPO's video comparison: 8 frames of each video (np.linspace over its frames), the
    first video's then the second's, before the video prompt; ``Video 1 is better`` read."""
    judge = scorer(
        monkeypatch, "unifiedreward-think", "nan", lambda urls: "<think>x</think><answer>Video 1 is better</answer>"
    )
    # Three videos of one prompt: 12 frames (every second chosen: 0, 2, ..., 22), 3 frames, 1 frame.
    videos = [[png(i) for i in range(24)], [png(100 + i) for i in range(3)], [png(200)]]
    payload = {"videos": videos, "prompts": ["p"] * 3, "metadata": {"frame_interval": 2}}
    samples = judge.prepare_samples(payload)
    assert len(samples.items) == 3 and all(item.video for item in samples.items)
    # 12 chosen frames -> linspace(0, 11, 8) -> 0, 1, 3, 4, 6, 7, 9, 11: frames 0, 2, 6, 8, 12, 14, 18, 22.
    shown = [sorted(_shades(item.urls)) for item in samples.items]
    assert shown == [[0, 2, 6, 8, 12, 14, 18, 22], [100, 102], [200]], shown
    results = samples.results(judge.score_request(samples.items))
    assert [r.score for r in results] == [1.0, 0.5, 0.0]
    first = judge.engine.bodies[0]["messages"][0]["content"]
    assert len(first) == 8 + 2 + 1 and first[-1]["text"].startswith(
        "You are an objective and precise evaluator for video"
    )
    assert "「p」" in first[-1]["text"]


def test_an_image_answer_to_a_video_comparison_does_not_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = scorer(monkeypatch, "unifiedreward-think", "nan", lambda urls: BETTER[1])
    samples = judge.prepare_samples({"videos": [[png(1)], [png(2)]], "prompts": ["p", "p"]})
    results = samples.results(judge.score_request(samples.items))
    assert all(math.isnan(r.score) and r.extras["error_types"] == "parse_failure" for r in results)


def test_pairwise_videos_outside_the_judges_own_service_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi service checks and prepares a reward's frames itself (one item each), which
    would compare a video's frames with each other: it gets a 422 instead."""
    judge = scorer(monkeypatch, "unifiedreward-think", "nan", None)
    payload = {"videos": [[png(1)], [png(2)]], "prompts": ["p", "p"]}
    request = parse_media_request(payload, judge.core, judge.video_rules)
    with pytest.raises(Unprocessable, match="served alone"):
        judge.check_images([], request)
    assert len(judge.prepare_samples(payload).items) == 2  # its own service: one item per video


def _shades(urls: tuple[str, ...]) -> list[int]:
    """The grey level of each frame a data URL carries."""
    return [Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).getpixel((0, 0))[0] for url in urls]


def _image(url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def test_qwenvl_sends_flow_grpos_chat_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    """flow_grpo's qwenvl.py: one user message, the image (qwen_vl_utils' smart size, bicubic)
    then the task, no caption, no system message; 2,048 new tokens, the rest the model's own."""
    judge = scorer(monkeypatch, "qwenvl", "nan", lambda urls: "<Thought>fine</Thought>\n<Score>4</Score>")
    noise = Image.frombytes("RGB", (512, 384), bytes(range(256)) * (512 * 384 * 3 // 256))
    samples = judge.prepare_samples({"images": [_png(noise), png()], "prompts": ["a cat", "a dog"]})
    results = samples.results(judge.score_request(samples.items))
    assert [(r.score, r.extras["rating"]) for r in results] == [(0.8, 4.0), (0.8, 4.0)]
    first, second = judge.engine.bodies
    assert set(first) == {"model", "messages", "max_tokens"} and first["max_tokens"] == 2048
    (message,) = first["messages"]
    image, task = message["content"]
    assert message["role"] == "user" and task == {"type": "text", "text": prompts.QWENVL_TASK}
    sent = _image(image["image_url"]["url"])
    # 512x384 rounds to 504x392 (multiples of 28); the 32x32 image is brought up to 56x56 (4 tokens).
    assert sent.size == (504, 392) and _image(second["messages"][0]["content"][0]["image_url"]["url"]).size == (56, 56)
    assert sent.tobytes() == noise.resize((504, 392), Image.Resampling.BICUBIC).tobytes()
    assert "a cat" not in str(first) and "a dog" not in str(second)


@pytest.mark.parametrize(("policy", "failed"), [("nan", math.nan), ("zero", 0.0), ("mean", 1.0)])
def test_qwenvl_refuses_scores_outside_1_to_5(monkeypatch: pytest.MonkeyPatch, policy: str, failed: float) -> None:
    """flow_grpo scores ``<Score>9</Score>`` 1.8 and a reply without a score 0: parse failures here."""
    replies = {"a": "<Score>5</Score>", "b": "<Score>9</Score>", "c": "<Score>0</Score>", "d": "<Score>3.5</Score>"}
    judge = scorer(monkeypatch, "qwenvl", policy, lambda urls: replies[urls[0]])
    results = judge.score_request(items(["a", "b", "c", "d"]))
    assert results[0].score == 1.0
    for result in results[1:]:
        assert result.extras["error_types"] == "parse_failure", result
        assert result.score == failed or (math.isnan(failed) and math.isnan(result.score))


def test_qwenvl_refuses_an_image_qwen2_vl_cannot_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the core's own bound (50 by default), Qwen2-VL's: a 422, not the engine's 400 (a 503)."""
    judge = scorer(monkeypatch, "qwenvl", "nan", None)
    judge.core = dataclasses.replace(judge.core, max_aspect_ratio=1000.0)
    with pytest.raises(Unprocessable, match=r"images\[0\] is 402x2: Qwen2\.5-VL takes no aspect ratio over 200"):
        judge.prepare_samples({"images": [_png(Image.new("RGB", (402, 2)))], "prompts": ["p"]})


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()
