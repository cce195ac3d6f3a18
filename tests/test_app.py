"""The core's request path, in process: ``create_app`` with a fake scorer and Flask's test client.

These cover what every scorer gets from ``common`` (wire formats, limits, readiness, errors,
batching across requests, metrics) in milliseconds; the real-gunicorn tests cover the same
path end to end for the shipped scorers.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from common.configuration.config import from_env
from common.configuration.settings import CoreSettings
from common.limits.errors import PayloadTooLarge, ScorerError, Unprocessable
from common.pipeline.runtime import ScorerRuntime
from common.pipeline.scorer import Result, Scored, Scorer
from common.server.app import create_app
from common.server.protocols import WireProtocol
from testing.clock import wait_until

pytestmark = pytest.mark.unit


class LengthScorer(Scorer):
    """Scores each prompt by its length and keeps every batch it was given."""

    name = "length"
    max_batch = 8
    max_wait_ms = 1.0

    def __init__(self, core: CoreSettings, loaded: threading.Event | None = None, fail: str = "") -> None:
        super().__init__(core)
        self.loaded = loaded
        self.fail = fail
        self.batches: list[list[str]] = []

    def setup(self, device: str) -> None:
        if self.loaded is not None:
            self.loaded.wait()
        if self.fail:
            raise RuntimeError(self.fail)

    def prepare(self, payload: dict[str, Any]) -> list[str]:
        prompts = payload.get("prompts")
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise Unprocessable("'prompts' must be a list of strings")
        return prompts

    def score(self, batch: Sequence[str]) -> list[Scored]:
        self.batches.append(list(batch))
        return [Scored(float(len(prompt)), {"echo": prompt}) for prompt in batch]


class RequestScorer(LengthScorer):
    """The same rule, scored on the request thread (``score_request``)."""

    name = "length-request"
    score = Scorer.score  # type: ignore[assignment]

    def score_request(self, items: Sequence[str]) -> list[float]:
        self.batches.append(list(items))
        return [float(len(prompt)) for prompt in items]


class AltScorer(LengthScorer):
    """The same rule, served with ``AltProtocol`` too."""

    name = "length-alt"


class AltProtocol(WireProtocol):
    """A JSON-only protocol on ``/alt`` whose clients see 413 as 422."""

    name = "alt"
    routes = ("/alt",)

    def parse(self, body: bytes, content_type: str | None) -> dict[str, Any]:
        return {"prompts": json.loads(body)["texts"]}

    def answer(self, results: Sequence[Result]) -> dict[str, Any]:
        return {"rewards": [r.score if isinstance(r, Scored) else r for r in results]}

    def encode(self, answer: dict[str, Any], content_type: str | None) -> tuple[bytes, str]:
        return json.dumps(answer).encode(), "application/json"

    def status(self, error: ScorerError, content_type: str | None) -> int:
        return 422 if isinstance(error, PayloadTooLarge) else error.status


def client_of(scorer: Scorer, protocols: Sequence[type[WireProtocol]] = ()) -> FlaskClient:
    app: Flask = create_app(scorer, protocols)
    return app.test_client()


def wait_until_ready(client: FlaskClient) -> None:
    """Until ``/ready`` says the model is loaded: its setup thread runs when the machine lets it."""
    wait_until(lambda: client.get("/ready").status_code == 200, "the model loaded", pause_s=0.01)


def post_pickle(client: FlaskClient, payload: Any, path: str = "/", **kwargs: Any) -> tuple[int, Any]:
    response = client.post(path, data=pickle.dumps(payload), content_type="application/octet-stream", **kwargs)
    return response.status_code, pickle.loads(response.data)


def test_pickle_and_json_give_the_same_answer() -> None:
    client = client_of(LengthScorer(CoreSettings()))
    status, answer = post_pickle(client, {"prompts": ["ab", "abcd"]})
    assert status == 200
    assert answer == {"scores": [2.0, 4.0], "outputs": [2.0, 4.0], "echo": ["ab", "abcd"]}
    response = client.post("/score", json={"prompts": ["ab", "abcd"]})
    assert response.status_code == 200 and response.get_json() == answer


def test_a_pickle_naming_a_function_is_400_and_nothing_runs(tmp_path) -> None:
    target = tmp_path / "pwned"

    class Touch:
        def __reduce__(self):
            return (os.system, (f"touch {target}",))

    status, answer = post_pickle(client_of(LengthScorer(CoreSettings())), {"prompts": [Touch()]})
    assert status == 400 and "is refused" in answer["error"]
    assert not target.exists()


def test_bad_content_is_422_in_the_request_format() -> None:
    client = client_of(LengthScorer(CoreSettings()))
    response = client.post("/", json={"prompts": [1]})
    assert response.status_code == 422
    assert response.get_json() == {"error": "'prompts' must be a list of strings"}


def test_a_body_over_the_limit_is_413_before_it_is_read() -> None:
    client = client_of(LengthScorer(CoreSettings(max_body_bytes=64)))
    status, answer = post_pickle(client, {"prompts": ["x" * 100]})
    assert status == 413 and "limit is 64" in answer["error"]


def test_a_bearer_token_is_checked_before_anything_else() -> None:
    client = client_of(LengthScorer(CoreSettings(auth_token="s3cret")))
    assert post_pickle(client, {"prompts": ["a"]})[0] == 401
    assert post_pickle(client, {"prompts": ["a"]}, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert post_pickle(client, {"prompts": ["a"]}, headers={"Authorization": "bearer s3cret"})[0] == 200
    assert client.get("/health").status_code == 200  # GETs need no token


def test_a_request_waits_for_the_model_then_gets_the_status_its_client_retries() -> None:
    """A pickle body's is flow_grpo's 500 (it retries no other), JSON's 503."""
    loaded = threading.Event()
    client = client_of(LengthScorer(CoreSettings(ready_wait_s=0.05), loaded=loaded))
    try:
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 503
        status, answer = post_pickle(client, {"prompts": ["a"]})
        assert status == 500 and "loading" in answer["error"]
        response = client.post("/", json={"prompts": ["a"]})
        assert response.status_code == 503 and "loading" in response.get_json()["error"]
    finally:
        loaded.set()


def test_a_deadline_passed_is_overload_a_pickle_body_gets_as_500() -> None:
    client = client_of(LengthScorer(CoreSettings(request_timeout_s=1e-6)))
    wait_until_ready(client)
    status, answer = post_pickle(client, {"prompts": ["a"]})
    assert status == 500 and "deadline passed" in answer["error"]
    response = client.post("/", json={"prompts": ["a"]})
    assert response.status_code == 503 and "deadline passed" in response.get_json()["error"]


class FaultyScorer(LengthScorer):
    """A model that raises on every batch: a fault a retry would meet again."""

    name = "faulty"

    def score(self, batch: Sequence[str]) -> list[Scored]:
        raise FloatingPointError("the model produced NaN")


def test_a_fault_is_a_503_on_a_pickle_body_and_a_500_in_json() -> None:
    """flow_grpo would retry a 500 a thousand times: a fault that would repeat is a 503 there."""
    client = client_of(FaultyScorer(CoreSettings()))
    wait_until_ready(client)
    status, answer = post_pickle(client, {"prompts": ["a"]})
    assert status == 503 and answer == {"error": "internal error: FloatingPointError: the model produced NaN"}
    response = client.post("/", json={"prompts": ["a"]})
    assert response.status_code == 500 and "the model produced NaN" in response.get_json()["error"]
    assert post_pickle(client, {"prompts": [1]})[0] == 422  # bad input stays a 4xx


def test_a_request_arriving_while_loading_is_answered_once_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading is held until the request waits for it: the request takes the waiting path."""
    loaded, waiting = threading.Event(), threading.Event()
    wait_ready = ScorerRuntime.wait_ready

    def arrives(runtime: ScorerRuntime) -> None:
        waiting.set()
        wait_ready(runtime)

    monkeypatch.setattr(ScorerRuntime, "wait_ready", arrives)
    client = client_of(LengthScorer(CoreSettings(ready_wait_s=600), loaded=loaded))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post_pickle, client, {"prompts": ["abc"]})
        assert waiting.wait(60)
        assert not pending.done() and client.get("/ready").status_code == 503  # still loading
        loaded.set()
        assert pending.result(timeout=60) == (200, {"scores": [3.0], "outputs": [3.0], "echo": ["abc"]})


def test_a_failed_setup_shows_its_reason_on_ready_and_on_requests() -> None:
    """A 503 in both formats: a pickle body's 500 would be retried a thousand times."""
    client = client_of(LengthScorer(CoreSettings(), fail="weights not found: set SCORER_X"))
    status, answer = post_pickle(client, {"prompts": ["a"]})
    assert status == 503 and "weights not found: set SCORER_X" in answer["error"]
    assert client.post("/", json={"prompts": ["a"]}).status_code == 503
    ready = client.get("/ready")
    assert ready.status_code == 503 and "weights not found" in ready.get_json()["reason"]


def test_ready_says_a_set_up_scorers_problem_while_it_has_one() -> None:
    """A scorer whose model runs elsewhere says when that is down (``ready_problem``)."""
    scorer = LengthScorer(CoreSettings())
    problem: list[str] = []
    scorer.ready_problem = lambda: problem[0] if problem else None
    client = client_of(scorer)
    wait_until_ready(client)
    problem.append("the engine could not be reached")
    ready = client.get("/ready")
    assert ready.status_code == 503 and ready.get_json()["reason"] == "the engine could not be reached"
    problem.clear()
    assert client.get("/ready").status_code == 200


def test_concurrent_requests_share_one_batch() -> None:
    """Four requests at once are one batch: a full batch goes at once, and the window (a minute)
    outlasts any delay of a loaded machine between the four arrivals."""
    scorer = LengthScorer(CoreSettings(max_wait_ms=60_000, max_batch=4))
    client = client_of(scorer)
    assert post_pickle(client, {"prompts": ["w", "a", "r", "m"]})[0] == 200  # a full batch: at once
    scorer.batches.clear()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: post_pickle(client, {"prompts": [p]}), ["a", "bb", "ccc", "dddd"]))
    assert [a["scores"] for _, a in answers] == [[1.0], [2.0], [3.0], [4.0]]
    assert sorted(map(sorted, scorer.batches)) == [["a", "bb", "ccc", "dddd"]]


def test_a_request_scorer_scores_each_request_on_its_own() -> None:
    scorer = RequestScorer(CoreSettings())
    client = client_of(scorer)
    assert post_pickle(client, {"prompts": ["ab", "c"]}) == (200, {"scores": [2.0, 1.0], "outputs": [2.0, 1.0]})
    assert scorer.batches == [["ab", "c"]]
    info = client.get("/info").get_json()
    assert info["batching"]["stages"] is True and info["service"] == "length-request"


def test_a_scorer_implements_exactly_one_scoring_method() -> None:
    class Neither(LengthScorer):
        score = Scorer.score  # type: ignore[assignment]

    class Both(RequestScorer):
        score = LengthScorer.score

    for cls in (Neither, Both):
        with pytest.raises(TypeError, match="exactly one of score"):
            cls(CoreSettings())


def test_metrics_count_requests_and_items() -> None:
    client = client_of(LengthScorer(CoreSettings()))

    def items_scored() -> float:
        text = client.get("/metrics").get_data(as_text=True)
        line = next((row for row in text.splitlines() if row.startswith('scorer_items_total{service="length"}')), "")
        return float(line.split()[-1]) if line else 0.0

    before = items_scored()
    assert post_pickle(client, {"prompts": ["a", "b", "c"]})[0] == 200
    assert post_pickle(client, {"prompts": "not a list"})[0] == 422
    assert items_scored() == before + 3
    text = client.get("/metrics").get_data(as_text=True)
    assert 'scorer_requests_total{route="/",service="length",status="422"}' in text


class BusyPrepareScorer(LengthScorer):
    """Spends ``BUSY_CPU_S`` of its thread's CPU preparing each request."""

    name = "length-busy"

    def prepare(self, payload: dict[str, Any]) -> list[str]:
        started = time.thread_time()
        while time.thread_time() - started < BUSY_CPU_S:
            pass
        return super().prepare(payload)


BUSY_CPU_S = 0.02


def stage_counts(client: FlaskClient, service: str) -> dict[tuple[str, str], float]:
    """``(metric sample, stage) -> value`` of the stage metrics on ``/metrics``."""
    text = client.get("/metrics").get_data(as_text=True)
    return {
        (sample.name, sample.labels["stage"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("service") == service
        and sample.name in ("scorer_stage_seconds_count", "scorer_stage_cpu_seconds_total")
    }


def test_metrics_show_where_a_requests_time_goes_stage_by_stage() -> None:
    client = client_of(BusyPrepareScorer(CoreSettings()))
    wait_until_ready(client)
    before = stage_counts(client, "length-busy")
    assert post_pickle(client, {"prompts": ["a", "b"]})[0] == 200
    answered = stage_counts(client, "length-busy")
    assert post_pickle(client, {"prompts": "not a list"})[0] == 422
    refused = stage_counts(client, "length-busy")

    def counted(after: dict, since: dict, stage: str) -> float:
        key = ("scorer_stage_seconds_count", stage)
        return after.get(key, 0.0) - since.get(key, 0.0)

    stages = ("parse", "ready", "decode_wait", "decode", "score", "answer")
    assert {stage: counted(answered, before, stage) for stage in stages} == dict.fromkeys(stages, 1.0)
    # A request refused while its items were prepared spent time up to there, and none after.
    assert {stage: counted(refused, answered, stage) for stage in stages} == {
        **dict.fromkeys(stages[:4], 1.0),
        **dict.fromkeys(stages[4:], 0.0),
    }
    decode_cpu = answered[("scorer_stage_cpu_seconds_total", "decode")] - before.get(
        ("scorer_stage_cpu_seconds_total", "decode"), 0.0
    )
    assert decode_cpu >= BUSY_CPU_S


def test_info_describes_the_scorer_and_masks_the_token() -> None:
    info = client_of(LengthScorer(CoreSettings(auth_token="s3cret"))).get("/info").get_json()
    assert info["scorer"] == "LengthScorer" and info["batching"]["max_batch"] == 8
    assert info["settings"]["auth_token"] == "***"
    assert "s3cret" not in json.dumps(info)


def test_every_protocol_takes_the_same_path() -> None:
    """Body limit, readiness before validation, item metrics, error encoding: the same on a
    scorer's own protocol as on the core's."""
    loaded = threading.Event()
    client = client_of(AltScorer(CoreSettings(max_body_bytes=64, ready_wait_s=0.05), loaded=loaded), [AltProtocol])
    try:
        not_ready = client.post("/alt", data=json.dumps({"texts": [1]}))  # invalid, but the model is not loaded
        assert not_ready.status_code == 503 and "loading" in not_ready.get_json()["error"]
    finally:
        loaded.set()
    wait_until_ready(client)  # its 0.05 s wait for the model is for the request above
    ok = client.post("/alt", data=json.dumps({"texts": ["ab", "c"]}))
    assert ok.status_code == 200 and ok.get_json() == {"rewards": [2.0, 1.0]}
    too_large = client.post("/alt", data=json.dumps({"texts": ["x" * 100]}))
    assert too_large.status_code == 422 and "limit is 64" in too_large.get_json()["error"]
    invalid = client.post("/alt", data=json.dumps({"texts": [1]}))
    assert invalid.status_code == 422 and invalid.is_json
    assert post_pickle(client, {"prompts": ["x" * 100]})[0] == 413  # the core protocol keeps its 413
    text = client.get("/metrics").get_data(as_text=True)
    assert 'scorer_items_total{service="length-alt"} 2.0' in text
    assert 'scorer_requests_total{route="/alt",service="length-alt",status="422"} 2.0' in text


def test_a_deprecated_setting_is_warned_of_in_the_log_and_on_info(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SCORER_MAX_QUEUE_BYTES", "5000")
    with caplog.at_level("WARNING", logger="common.server.serving"):
        info = client_of(LengthScorer(from_env(CoreSettings))).get("/info").get_json()
    assert info["settings"]["max_work_bytes"] == 5000
    [message] = info["deprecated_settings"]
    assert message.startswith("SCORER_MAX_QUEUE_BYTES is deprecated") and "SCORER_MAX_WORK_BYTES" in message
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [message]


def test_info_lists_no_deprecated_setting_when_none_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCORER_MAX_QUEUE_BYTES", raising=False)
    info = client_of(LengthScorer(CoreSettings())).get("/info").get_json()
    assert info["deprecated_settings"] == [] and info["service_settings"] == {}  # no registry entry: no own settings
