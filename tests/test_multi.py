"""The ``multi`` service against the single services it combines: real gunicorn, RapidOCR and tiny
random CLIP-family models on their real loading paths (the PaddleOCR engine keeps its own
environment and is not among them: ``tests/test_multi_requests.py``).

One multi service serves OCR, PickScore and the aesthetic score; the single services run with
the same settings, so each reward's ``details`` is compared with what its own service answers.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from PIL import Image

from bench.load.run import _load
from bench.ocr.run import one_image_bodies
from common.sdk import verl_omni
from common.sdk.client import ScorerClient
from common.sdk.retry import RetryPolicy, ScorerRequestError
from testing.images import blank, encode, render_text
from testing.multi import multi_server, reward_settings
from testing.server import Server, gunicorn_server

REWARDS = ("ocr", "pickscore", "aesthetic")
WORDS = ["Open", "Bakery", "Garden", "Coffee", "Sale", "Hotel"]
# Recognizer work per image (SCORER_OCR_MAX_TEXT_WIDTH): a word passes, a long line fails while
# OCR scores, after every check on the request's bytes and headers has passed.
SETTINGS = {"SCORER_OCR_MAX_TEXT_WIDTH": "600", "SCORER_MAX_WAIT_MS": "20"}
LONG_LINE = "the quick brown fox jumps over the lazy dog again and again"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {**reward_settings(REWARDS, tmp_path_factory.mktemp("models")), **SETTINGS}


@pytest.fixture(scope="module")
def multi(models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with gunicorn_server("multi", models, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def singles(models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """Each reward's own service, with the same settings."""
    logs = tmp_path_factory.mktemp("single-logs")
    with (
        gunicorn_server("ocr", models, threads=32, log_dir=logs) as ocr,
        gunicorn_server("pickscore", models, threads=32, log_dir=logs) as pickscore,
        gunicorn_server("aesthetic", models, threads=32, log_dir=logs) as aesthetic,
    ):
        yield {"ocr": ocr, "pickscore": pickscore, "aesthetic": aesthetic}


def samples(count: int) -> tuple[list[bytes], list[str]]:
    """Rendered words (some matching their prompt, some not), a blank, noise."""
    rng = np.random.default_rng(11)
    images, prompts = [], []
    for i in range(count):
        word = WORDS[i % len(WORDS)]
        if i % 4 == 3:
            image = encode(Image.fromarray(rng.integers(0, 256, (200 + 8 * i, 240, 3), dtype=np.uint8)), "PNG")
        elif i % 4 == 2:
            image = blank(256)
        else:
            image = render_text(word if i % 2 == 0 else WORDS[(i + 1) % len(WORDS)], size=384)
        images.append(image)
        prompts.append(f'a shop sign that says "{word}"')
    return images, prompts


def post(url: str, payload: dict[str, Any] | bytes, query: str = "", fmt: str = "pickle") -> tuple[int, dict]:
    if fmt == "json":
        response = requests.post(f"{url}/{query}", json=payload, timeout=120)
        return response.status_code, response.json()
    body = payload if isinstance(payload, bytes) else pickle.dumps(payload)
    response = requests.post(f"{url}/{query}", data=body, timeout=120)
    return response.status_code, pickle.loads(response.content)


def alone(server: Server, payload: dict[str, Any]) -> list[float]:
    status, answer = post(server.url, payload)
    assert status == 200, answer
    return answer["scores"]


def decoded(url: str, service: str = "multi") -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    match = re.search(rf'^scorer_images_decoded_total{{service="{service}"}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def weighted(details: dict[str, list[float]], weights: dict[str, float], index: int) -> float:
    return math.fsum(weights[name] * details[name][index] for name in weights)


def test_details_are_each_rewards_own_scores_and_scores_their_weighted_sum(
    multi: Server, singles: dict[str, Server]
) -> None:
    images, prompts = samples(12)
    payload = {"images": images, "prompts": prompts}
    weights = {"ocr": 0.7, "pickscore": 0.3, "aesthetic": -0.05}
    status, answer = post(multi.url, payload, "?ocr=0.7&pickscore=0.3&aesthetic=-0.05")
    assert status == 200, answer
    assert set(answer) == {"scores", "outputs", "details", "dropped"}
    assert answer["dropped"] == [] and answer["outputs"] == answer["scores"]
    for name, server in singles.items():
        assert answer["details"][name] == pytest.approx(alone(server, payload), abs=1e-6), name
    assert len(set(answer["details"]["ocr"])) > 1  # words read and not: the comparison means something
    for index, score in enumerate(answer["scores"]):
        assert score == pytest.approx(weighted(answer["details"], weights, index), abs=1e-12)


def test_without_a_query_every_reward_has_weight_one_and_json_answers_the_same(multi: Server) -> None:
    images, prompts = samples(4)
    status, answer = post(multi.url, {"images": images, "prompts": prompts})
    assert status == 200, answer
    assert list(answer["details"]) == list(REWARDS)
    ones = dict.fromkeys(REWARDS, 1.0)
    assert answer["scores"] == pytest.approx([weighted(answer["details"], ones, i) for i in range(4)], abs=1e-12)
    as_json = {"images": [base64.b64encode(image).decode() for image in images], "prompts": prompts}
    status, twin = post(multi.url, as_json, "score", fmt="json")
    assert status == 200, twin
    assert twin["scores"] == pytest.approx(answer["scores"])
    assert {name: pytest.approx(scores) for name, scores in answer["details"].items()} == twin["details"]


def test_each_image_is_decoded_once_whatever_the_number_of_rewards(multi: Server) -> None:
    images, prompts = samples(6)
    before = decoded(multi.url)
    status, answer = post(multi.url, {"images": images, "prompts": prompts}, "?ocr=1&pickscore=1&aesthetic=1")
    assert status == 200, answer
    assert decoded(multi.url) - before == 6
    # One image referenced three times in the pickle (its memo): decoded once, scored three times.
    before = decoded(multi.url)
    status, answer = post(multi.url, {"images": [images[0]] * 3, "prompts": prompts[:3]})
    assert status == 200, answer
    assert decoded(multi.url) - before == 1
    assert answer["details"]["aesthetic"][0] == answer["details"]["aesthetic"][2]


def test_url_wins_over_metadata_and_metadata_marks_optional(multi: Server) -> None:
    images, prompts = samples(2)
    metadata = {"rewards": {"ocr": 1.0}}
    status, answer = post(multi.url, {"images": images, "prompts": prompts, "metadata": metadata}, "?pickscore=2")
    assert status == 200, answer
    assert list(answer["details"]) == ["pickscore"]
    assert answer["scores"] == pytest.approx([2 * s for s in answer["details"]["pickscore"]])
    metadata = {"rewards": {"ocr": 0.5, "aesthetic": {"weight": 0.25, "optional": True}}}
    status, answer = post(multi.url, {"images": images, "prompts": prompts, "metadata": metadata})
    assert status == 200, answer
    assert list(answer["details"]) == ["ocr", "aesthetic"]
    expected = [weighted(answer["details"], {"ocr": 0.5, "aesthetic": 0.25}, i) for i in range(2)]
    assert answer["scores"] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("query", "metadata", "message"),
    [
        ("?ocr=1&hpsv2=1", {}, "names 'hpsv2', not a reward of this service; it serves ocr, pickscore, aesthetic"),
        ("?ocr=1&ocr=2", {}, "gives 'ocr' twice"),
        ("?ocr=heavy", {}, "is not a number"),
        ("?ocr=nan", {}, "is not a number"),
        ("?ocr=", {}, "is not a number"),
        ("", {"rewards": {"clipscore": 1}}, "it serves ocr, pickscore, aesthetic"),
        ("", {"rewards": {"ocr": True}}, "must be a finite number"),
        ("", {"rewards": {"ocr": {"weight": 1, "optional": "yes"}}}, "must be true or false"),
        ("", {"rewards": {}}, "must be a non-empty dict"),
        ("", {"rewards": ["ocr"]}, "must be a non-empty dict"),
    ],
)
def test_bad_rewards_are_a_422_that_says_why(multi: Server, query: str, metadata: dict, message: str) -> None:
    images, prompts = samples(1)
    status, answer = post(multi.url, {"images": images, "prompts": prompts, "metadata": metadata}, query)
    assert status == 422, answer
    assert message in answer["error"]


def test_an_optional_reward_refusing_a_samples_input_drops_that_sample_alone(multi: Server) -> None:
    """OCR refuses a prompt whose quoted target is empty (422); PickScore scores it. Optional,
    OCR drops out of that sample's sum alone; required, the request fails."""
    images, prompts = samples(3)
    prompts[1] = 'a shop sign that says ""'
    payload = {"images": images, "prompts": prompts}
    status, answer = post(multi.url, payload, "?ocr=0.5!optional&pickscore=0.5")
    assert status == 200, answer
    assert answer["dropped"] == [1]
    assert math.isnan(answer["details"]["ocr"][1]) and not math.isnan(answer["details"]["ocr"][0])
    assert answer["scores"][1] == pytest.approx(0.5 * answer["details"]["pickscore"][1])
    assert answer["scores"][0] == pytest.approx(weighted(answer["details"], {"ocr": 0.5, "pickscore": 0.5}, 0))
    status, answer = post(multi.url, payload, "?ocr=0.5&pickscore=0.5")
    assert status == 422 and "prompts[1]" in answer["error"], answer
    # JSON carries the NaN as JavaScript does (Python's json reads it).
    response = requests.post(
        f"{multi.url}/?ocr=0.5!optional&pickscore=0.5",
        json={"images": [base64.b64encode(i).decode() for i in images], "prompts": prompts},
        timeout=120,
    )
    assert response.status_code == 200 and math.isnan(response.json()["details"]["ocr"][1])


def test_an_optional_reward_failing_while_it_scores_drops_it_from_the_request(multi: Server) -> None:
    """A long line of text passes every check on the bytes and headers, then OCR's recognizer
    work (SCORER_OCR_MAX_TEXT_WIDTH) fails the OCR call: optional, OCR drops out of every
    sample of the request; required, the request is a 413 as OCR's own service answers."""
    images = [render_text(LONG_LINE, size=512), render_text("Open", size=384)]
    prompts = [f'"{LONG_LINE}"', 'a sign "Open"']
    payload = {"images": images, "prompts": prompts}
    status, answer = post(multi.url, payload, "?ocr=1!optional&aesthetic=0.5")
    assert status == 200, answer
    assert answer["dropped"] == [0, 1]
    assert all(math.isnan(score) for score in answer["details"]["ocr"])
    assert answer["scores"] == pytest.approx([0.5 * s for s in answer["details"]["aesthetic"]])
    status, answer = post(multi.url, payload, "?ocr=1&aesthetic=0.5")
    assert status == 413 and "SCORER_OCR_MAX_TEXT_WIDTH" in answer["error"], answer
    # The second image alone: OCR reads it.
    status, answer = post(multi.url, {"images": images[1:], "prompts": prompts[1:]}, "?ocr=1!optional&aesthetic=0.5")
    assert status == 200 and answer["dropped"] == [] and answer["details"]["ocr"] == [1.0], answer


def test_a_sample_no_reward_could_score_gets_no_sum_alone(multi: Server) -> None:
    """Sample 1 is refused by its only reward: its sum is NaN, never 0, and listed in ``dropped``;
    sample 0 keeps its score (the request was a 422, losing it)."""
    images, prompts = samples(2)
    prompts[1] = 'a shop sign that says ""'
    status, answer = post(multi.url, {"images": images, "prompts": prompts}, "?ocr=1!optional")
    assert status == 200 and answer["dropped"] == [1], answer
    assert answer["scores"][0] == answer["details"]["ocr"][0] and math.isnan(answer["scores"][1])


def test_videos_are_combined_per_reward_by_its_own_rule(multi: Server, singles: dict[str, Server]) -> None:
    frames = [render_text(word, size=256) for word in WORDS[:5]] + [blank(256)] * 3
    videos = [frames[:7], frames[2:]]
    prompts = ['"Open"', '"Garden"']
    for metadata in ({"frame_interval": 2}, {"video_rule": "video_ocr"}):
        payload = {"videos": videos, "prompts": prompts, "metadata": metadata}
        before = decoded(multi.url)
        status, answer = post(multi.url, payload)
        assert status == 200, answer
        interval = metadata.get("frame_interval", 4)
        # A frame sent twice (the videos share frames: the pickle's memo) is decoded once.
        chosen = {id(frame) for video in videos for frame in video[::interval]}
        assert decoded(multi.url) - before == len(chosen)
        for name, server in singles.items():
            # A reward without the named rule takes the mean of the same frames.
            own = metadata if name == "ocr" else {"frame_interval": interval}
            status, expected = post(server.url, {**payload, "metadata": own})
            assert status == 200, expected
            assert answer["details"][name] == pytest.approx(expected["scores"], abs=1e-6), (name, metadata)
            # Each reward's frames' scores, as its own service's frame_scores.
            per_video = answer["frame_details"][name]
            assert [len(f) for f in per_video] == [len(f) for f in expected["frame_scores"]], (name, metadata)
            for got, own_frames in zip(per_video, expected["frame_scores"]):
                assert got == pytest.approx(own_frames, abs=1e-6), (name, metadata)
    status, answer = post(multi.url, {"images": frames[:2], "prompts": prompts})
    assert status == 200 and "frame_details" not in answer, answer


def test_info_and_metrics_per_reward(multi: Server) -> None:
    info = requests.get(multi.url + "/info", timeout=10).json()
    assert info["service"] == "multi" and info["ready"] is True
    rewards = info["model"]["rewards"]
    assert set(rewards) == set(REWARDS)
    assert all(reward["ready"] and reward["setup_error"] is None for reward in rewards.values())
    assert rewards["pickscore"]["batching"]["max_batch"] == 64 and rewards["ocr"]["batching"]["stages"] is True
    assert rewards["pickscore"]["model"]["model"].endswith("pickscore")
    images, prompts = samples(2)
    assert post(multi.url, {"images": images, "prompts": prompts})[0] == 200
    text = requests.get(multi.url + "/metrics", timeout=10).text
    for name, stage in (("pickscore", "score"), ("aesthetic", "score"), ("ocr", "detect")):
        assert re.search(rf'^scorer_batch_size_count{{service="{name}",stage="{stage}"}} [1-9]', text, re.M), name
    for name in (*REWARDS, "multi"):
        assert f'scorer_ready{{service="{name}"}} 1.0' in text


def test_the_url_form_through_verl_omnis_client(multi: Server) -> None:
    """bench/load (one request per image, retried by the clients' policy) given a URL
    with the rewards in it: OCR alone reads every rendered word (1.0, none below 0.9); at half
    weight every score is 0.5 (all "wrong" for the bench's 0.9 bar)."""
    words = WORDS * 2
    bodies = one_image_bodies([render_text(word, size=256) for word in words], [f'"{w}"' for w in words])
    policy = RetryPolicy()
    full = asyncio.run(_load(f"{multi.url}/?ocr=1", bodies, 8, policy))
    assert full["answered_200"] == len(bodies) and full["wrong_scores"] == 0, full
    half = asyncio.run(_load(f"{multi.url}/?ocr=0.5", bodies, 8, policy))
    assert half["answered_200"] == len(bodies) and half["wrong_scores"] == len(bodies), half

    async def drop_in(**kwargs: Any) -> float:
        try:
            image = np.asarray(Image.open(io.BytesIO(render_text("Open", size=256))))
            result = await verl_omni.compute_score(solution_image=image, ground_truth='"Open"', **kwargs)
        finally:
            await verl_omni.compute_score._session.close()
        return result["score"]

    assert asyncio.run(drop_in(server_url=f"{multi.url}/?ocr=0.5")) == pytest.approx(0.5)
    assert asyncio.run(drop_in(server_url=multi.url, weights={"ocr": 0.25})) == pytest.approx(0.25)
    assert asyncio.run(drop_in(server_url=f"{multi.url}/score", weights={"ocr": 0.25})) == pytest.approx(0.25)


def test_python_client_asks_for_rewards(multi: Server, singles: dict[str, Server]) -> None:
    """The client's weights and optional rewards reach the service: its scores are the weighted
    sum of what each reward's own service answers, and an optional reward that refuses a sample
    drops out of it where a required one fails the request."""
    images, prompts = samples(2)
    payload = {"images": images, "prompts": prompts}
    own = {name: alone(singles[name], payload) for name in ("ocr", "pickscore")}
    client = ScorerClient(multi.url, weights={"ocr": 0.7, "pickscore": 0.3}, optional=["pickscore"])
    answer = client.score(images, prompts)
    assert list(answer["details"]) == ["ocr", "pickscore"] and answer["dropped"] == []
    for name, scores in own.items():
        assert answer["details"][name] == pytest.approx(scores, abs=1e-6), name
    expected = [0.7 * ocr + 0.3 * pickscore for ocr, pickscore in zip(own["ocr"], own["pickscore"])]
    assert answer["scores"] == pytest.approx(expected, abs=1e-6)
    as_json = ScorerClient(multi.url, fmt="json", weights={"aesthetic": 1.0}).score(images, prompts)
    assert list(as_json["details"]) == ["aesthetic"]
    assert as_json["scores"] == pytest.approx(alone(singles["aesthetic"], payload), abs=1e-6)
    on_score = ScorerClient(f"{multi.url}/score", weights={"ocr": 0.7, "pickscore": 0.3}).score(images, prompts)
    assert on_score["scores"] == answer["scores"]
    # OCR refuses a prompt whose quoted target is empty (422).
    refused = [prompts[0], 'a shop sign that says ""']
    dropping = ScorerClient(multi.url, weights={"ocr": 0.5, "pickscore": 0.5}, optional=["ocr"]).score(images, refused)
    assert dropping["dropped"] == [1] and math.isnan(dropping["details"]["ocr"][1]), dropping
    assert dropping["scores"][1] == pytest.approx(0.5 * dropping["details"]["pickscore"][1])
    with pytest.raises(ScorerRequestError) as required:
        ScorerClient(multi.url, weights={"ocr": 0.5, "pickscore": 0.5}).score(images, refused)
    assert required.value.status == 422 and "prompts[1]" in required.value.message


def test_a_reward_that_cannot_load_keeps_the_service_not_ready(tmp_path: Path) -> None:
    env = {"SCORER_PICKSCORE_MODEL": str(tmp_path / "no-model"), "SCORER_READY_WAIT_S": "5"}
    with multi_server(["ocr", "pickscore"], tmp_path, env, require_ready=False, log_dir=tmp_path) as server:
        ready = server.settled_ready(300, 0.5)
        assert ready.status_code == 503
        assert "pickscore: " in ready.json()["reason"] and "SCORER_PICKSCORE_MODEL" in ready.json()["reason"]
        info = requests.get(server.url + "/info", timeout=10).json()["model"]["rewards"]
        assert info["ocr"]["ready"] is True and info["pickscore"]["ready"] is False
        images, prompts = samples(1)
        status, answer = post(server.url, {"images": images, "prompts": prompts}, "?ocr=1")
        assert status == 503 and "SCORER_PICKSCORE_MODEL" in answer["error"]
