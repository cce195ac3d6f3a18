"""The judge service under gunicorn against a real OpenAI-compatible engine (transformers serve)
with tiny Qwen2-VL models: steered ones answer a chosen reply, a random one gibberish."""

from __future__ import annotations

import base64
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from common.sdk.client import ScorerClient
from testing.images import blank, render_text
from testing.judge_engine import engine, save_judge_model
from testing.server import ROOT, free_port, gunicorn_server

ENGINE_PYTHON = os.environ.get("SCORER_TEST_ENGINE_PYTHON")
pytestmark = pytest.mark.skipif(not ENGINE_PYTHON, reason="engine environment not built (run via 'bash run.sh test')")

REPLIES = {
    "pointwise": "Reasoning.\nAlignment Score (1-5): 4\nCoherence Score (1-5): 3\nStyle Score (1-5): 5",
    "v1": "The image matches.\nFinal Score: 4",
    "think": "<think>\nTotal score:\nImage 1: 9+8=17\nImage 2: 7+8=15\n</think>\n<answer>Image 1 is better</answer>",
    "ocr": "HELLO\nWORLD",
    "think-video": "<think>\nVideo 1: 9+8=17\nVideo 2: 7+8=15\n</think>\n<answer>Video 1 is better</answer>",
    "qwenvl": "<Thought>\nSharp, good exposure.\n</Thought>\n<Score>4</Score>",
    "qwenvl-9": "<Thought>\nExceptional.\n</Thought>\n<Score>9</Score>",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("judge-models")
    built = {name: save_judge_model(root / name, reply) for name, reply in REPLIES.items()}
    built["random"] = save_judge_model(root / "random")
    return built


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with engine(ENGINE_PYTHON, tmp_path_factory.mktemp("engine") / "engine.log") as url:
        yield url


def b64(image: bytes) -> str:
    return base64.b64encode(image).decode()


def judge(engine_url: str, model: Path, judge_name: str, tmp_path: Path, **settings: str):
    env = {
        "SCORER_JUDGE_JUDGE": judge_name,
        "SCORER_JUDGE_ENGINE": engine_url,
        "SCORER_JUDGE_MODEL": str(model),
        "SCORER_JUDGE_PARSE_FAILURE_SCORE": "nan",
        **{f"SCORER_JUDGE_{key.upper()}": value for key, value in settings.items()},
    }
    return gunicorn_server("judge", env, threads=16, log_dir=tmp_path)


def test_pointwise_scores_the_engines_reply_by_the_published_rule(
    engine_url: str, models: dict[str, Path], tmp_path: Path
) -> None:
    with judge(engine_url, models["pointwise"], "unifiedreward", tmp_path) as server:
        answer = ScorerClient(server.url).score([blank(64), blank(96)], ["a cat", "a dog"], {"judge": {"reply": True}})
        assert answer["scores"] == [0.75, 0.75], answer
        assert answer["alignment"] == [4.0, 4.0] and answer["style"] == [5.0, 5.0], answer
        assert answer["reply"] == [REPLIES["pointwise"]] * 2, answer
        metrics = requests.get(server.url + "/metrics", timeout=10).text
        # One token of reply and <|im_end|> per call.
        assert 'scorer_judge_tokens_total{kind="completion",service="judge"} 4.0' in metrics, metrics
        assert 'scorer_judge_calls_total{outcome="ok",service="judge"} 2.0' in metrics
        # A video: its chosen frames judged as images (frame_interval), their scores' mean.
        frames = [b64(blank(64 + 8 * i)) for i in range(5)]
        video = {"videos": [frames], "prompts": ["a cat"], "metadata": {"frame_interval": 2}}
        answer = requests.post(server.url + "/", json=video, timeout=120).json()
        assert answer["scores"] == [0.75] and answer["frame_scores"] == [[0.75] * 3], answer


def test_v1_scores_the_final_score_over_5(engine_url: str, models: dict[str, Path], tmp_path: Path) -> None:
    with judge(engine_url, models["v1"], "unifiedreward-v1", tmp_path) as server:
        assert ScorerClient(server.url).scores([blank(64)], ["a cat"]) == [0.8]


def test_qwenvl_scores_the_score_tag_over_5_and_refuses_one_out_of_range(
    engine_url: str, models: dict[str, Path], tmp_path: Path
) -> None:
    """flow_grpo's Qwen-VL judge through the engine's chat template and image processor; its
    ``<Score>9</Score>`` (1.8 in flow_grpo) a parse failure."""
    images, captions = [blank(512), blank(30)], ["a cat", ""]
    with judge(engine_url, models["qwenvl"], "qwenvl", tmp_path) as server:
        answer = ScorerClient(server.url).score(images, captions, {"judge": {"reply": True}})
        assert answer["scores"] == [0.8, 0.8] and answer["rating"] == [4.0, 4.0], answer
        assert answer["reply"] == [REPLIES["qwenvl"]] * 2, answer
    with judge(engine_url, models["qwenvl-9"], "qwenvl", tmp_path) as server:
        answer = ScorerClient(server.url).score(images, captions)
        assert all(math.isnan(score) for score in answer["scores"]), answer
        assert answer["error_types"] == ["parse_failure"] * 2, answer


def test_a_reply_that_does_not_parse_is_nan_with_its_error_never_0(
    engine_url: str, models: dict[str, Path], tmp_path: Path
) -> None:
    with judge(engine_url, models["random"], "unifiedreward", tmp_path) as server:
        answer = ScorerClient(server.url).score([blank(64)] * 3, ["a cat"] * 3, {"judge": {"reply": True}})
        assert all(math.isnan(score) for score in answer["scores"]), answer
        assert answer["error_types"] == ["parse_failure"] * 3, answer
        assert all(reply for reply in answer["reply"]), answer  # the gibberish, for the trainer's logs


def test_pairwise_scores_each_sample_by_its_wins_in_its_prompts_group(
    engine_url: str, models: dict[str, Path], tmp_path: Path
) -> None:
    """The steered judge always prefers the first image shown."""
    images = [blank(64 + 8 * i) for i in range(5)]
    prompts = ["a cat", "a cat", "a cat", "a dog", "a dog"]
    with judge(engine_url, models["think"], "unifiedreward-think", tmp_path) as server:
        answer = ScorerClient(server.url).score(images, prompts)
        assert answer["scores"] == [1.0, 0.5, 0.0, 1.0, 0.0], answer
        assert answer["comparisons"] == [2, 2, 2, 1, 1], answer
        alone = requests.post(server.url + "/", json={"images": [b64(images[0])], "prompts": ["a cat"]}, timeout=30)
        assert alone.status_code == 422 and "no other sample" in alone.text, alone.text
    with judge(engine_url, models["think"], "unifiedreward-think", tmp_path, both_orders="1") as server:
        # Both orders: the position bias cancels.
        assert ScorerClient(server.url).scores(images, prompts) == [0.5] * 5


def test_pairwise_videos_are_compared_on_their_frames(engine_url: str, models: dict[str, Path], tmp_path: Path) -> None:
    """Pref-GRPO's video comparison through the engine's real chat template: both videos' frames
    (8 of each at most) in one call; the steered judge always prefers the first video."""
    videos = [[b64(blank(48 + 8 * i + j)) for j in range(10)] for i in range(3)]
    body = {"videos": videos, "prompts": ["a cat running"] * 3, "metadata": {"judge": {"reply": True}}}
    with judge(engine_url, models["think-video"], "unifiedreward-think", tmp_path) as server:
        answer = requests.post(server.url + "/", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        assert answer.json()["scores"] == [1.0, 0.5, 0.0], answer.text
        metrics = requests.get(server.url + "/metrics", timeout=10).text
        assert 'scorer_judge_calls_total{outcome="ok",service="judge"} 3.0' in metrics, metrics


def test_vlm_ocr_reads_the_transcription_with_the_ocr_rule(
    engine_url: str, models: dict[str, Path], tmp_path: Path
) -> None:
    with judge(engine_url, models["ocr"], "vlm-ocr", tmp_path) as server:
        scores = ScorerClient(server.url).scores(
            [render_text("hello world", 128)] * 2, ['a sign that says "Hello World"', 'a sign that says "hello"']
        )
        assert scores == [1.0, 1.0]  # the target found in the transcription, line break and case aside
        # "helloworld" read for "hellothere": 5 edits of 10 characters.
        assert ScorerClient(server.url).scores([blank(64)], ['a sign that says "Hello there"']) == [0.5]


def test_an_engine_down_is_retried_within_the_deadline_then_a_503(models: dict[str, Path], tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "engine.log"
    with contextlib.ExitStack() as stack:
        with engine(ENGINE_PYTHON, log, port) as url:
            once = stack.enter_context(judge(url, models["v1"], "unifiedreward-v1", tmp_path, retries="1"))
            patient = stack.enter_context(
                judge(url, models["v1"], "unifiedreward-v1", tmp_path, retries="60", backoff_max_s="1")
            )
            assert ScorerClient(patient.url).scores([blank(64)], ["a cat"]) == [0.8]
        # The engine is down: retried, then a 503 that says so (the trainer's client retries it).
        body = {"images": [b64(blank(64))], "prompts": ["a cat"]}
        response = requests.post(once.url + "/", json=body, timeout=120)
        assert response.status_code == 503 and "engine" in response.text, response.text
        # Restarted while a request waits: its retries, inside its deadline, reach it.
        outcome: dict[str, object] = {}
        client = ScorerClient(patient.url, retries=0)
        waiting = threading.Thread(target=lambda: outcome.update(scores=client.scores([blank(64)], ["a cat"])))
        waiting.start()
        with engine(ENGINE_PYTHON, log, port):
            waiting.join(timeout=120)
        assert outcome.get("scores") == [0.8], outcome


def test_multi_serves_the_judge_beside_ocr(engine_url: str, models: dict[str, Path], tmp_path: Path) -> None:
    env = {
        "SCORER_MULTI_REWARDS": "ocr,judge",
        "SCORER_DEVICE": "cpu",
        "SCORER_JUDGE_JUDGE": "unifiedreward-v1",
        "SCORER_JUDGE_ENGINE": engine_url,
        "SCORER_JUDGE_MODEL": str(models["v1"]),
        "SCORER_JUDGE_PARSE_FAILURE_SCORE": "nan",
    }
    with gunicorn_server("multi", env, threads=16, log_dir=tmp_path) as server:
        answer = ScorerClient(server.url).score([render_text("hello", 256)], ['a sign that says "hello"'])
        assert answer["details"]["judge"] == [0.8], answer
        assert answer["scores"] == [pytest.approx(answer["details"]["ocr"][0] + 0.8)], answer


def test_serve_runs_the_engine_as_a_child_and_stops_it_with_the_service(
    models: dict[str, Path], tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "SCORER_PORT": str(port),
        "SCORER_JUDGE_JUDGE": "unifiedreward-v1",
        "SCORER_JUDGE_SERVE": str(models["v1"]),
        "SCORER_JUDGE_SERVE_COMMAND": f"{ENGINE_PYTHON} -m transformers.cli.transformers serve --host 127.0.0.1 "
        "--port {port} --device cpu --model-timeout 600",
        "SCORER_JUDGE_PARSE_FAILURE_SCORE": "nan",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = (tmp_path / "serve.log").open("wb")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "services.judge.serve"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 240
        while time.monotonic() < end and supervisor.poll() is None:
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/ready", timeout=2).ok:
                    break
            time.sleep(1)
        assert ScorerClient(url).scores([blank(64)], ["a cat"]) == [0.8], (tmp_path / "serve.log").read_text()
        children = [
            int(pid) for pid in Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children").read_text().split()
        ]
        assert len(children) == 2, children  # the engine and gunicorn
    finally:
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=90) == 0, (tmp_path / "serve.log").read_text()
    for pid in children:  # gone with it
        assert not Path(f"/proc/{pid}").exists(), pid
