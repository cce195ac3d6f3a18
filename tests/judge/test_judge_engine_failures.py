"""The judge service under gunicorn against an engine that misbehaves (testing/engine_standin.py,
a real HTTP server): one that sends slowly or sends too much, answers malformed completions,
is flooded by one client's calls, or goes down and comes back."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from testing.clock import wait_until
from testing.engine_standin import StandInEngine, answer, completion, judge_server, memo_flood, post
from testing.images import blank
from testing.server import answered, flow_grpo_call
from testing.timing import within


@pytest.fixture
def standin() -> Iterator[StandInEngine]:
    engine = StandInEngine()
    yield engine
    engine.close()


@pytest.mark.timing
@pytest.mark.parametrize("slow_head", [False, True], ids=["slow-body", "slow-head"])
def test_an_engine_sending_slowly_is_cut_off_at_the_requests_deadline(
    standin: StandInEngine, tmp_path: Path, slow_head: bool
) -> None:
    """A byte a second: each socket read is quick, the call is not; the request's deadline bounds
    the whole call, and the judge hangs up then (its thread and engine slot are free again)."""
    standin.bytes_per_s, standin.slow_head = 1.0, slow_head
    with judge_server(standin, tmp_path, REQUEST_TIMEOUT_S="4") as server:
        started = time.monotonic()
        response = post(server, [blank(64)])
        took = time.monotonic() - started
        assert response.status_code == 500 and "engine" in answer(response)["error"], response.content
        assert took <= 4 + within(1.0), took
        wait_until(lambda: standin.answers[0].ended > 0, "the engine's sending ended")
        # The engine notices at its next byte or the one after.
        assert standin.answers[0].hung_up and standin.answers[0].ended - started <= 4 + 2 + within(1.0)


def test_a_huge_reply_is_that_samples_parse_failure_and_is_not_read_whole(
    standin: StandInEngine, tmp_path: Path
) -> None:
    """A 60 MB completion: the judge reads up to its reply cap, then hangs up."""
    standin.body = completion("Final Score: 4 " + "x" * 60_000_000)
    with judge_server(standin, tmp_path) as server:
        response = post(server, [blank(64)])
        assert response.status_code == 200, response.content
        result = answer(response)
        assert result["error_types"] == ["parse_failure"] and result["scores"][0] != result["scores"][0], result
        assert "bytes" in result["error"][0], result
        wait_until(lambda: standin.answers[0].ended > 0, "the engine's sending ended")
        # What the kernel's socket buffers took before the judge hung up, far from all of it.
        assert standin.answers[0].hung_up and standin.answers[0].sent < 30_000_000, standin.answers[0]


def with_usage(usage: bytes) -> bytes:
    """A completion whose usage is written as given (JSON's dumps writes no ``1e400``)."""
    return completion("Final Score: 4")[: -len(b"}")].rsplit(b'"usage"', 1)[0] + b'"usage": ' + usage + b"}"


MALFORMED = {
    "negative usage": completion("Final Score: 4", {"prompt_tokens": -5, "completion_tokens": 3}),
    "infinite usage": with_usage(b'{"prompt_tokens": Infinity}'),
    "1e400 usage": with_usage(b'{"completion_tokens": 1e400}'),
    "fractional usage": completion("Final Score: 4", {"prompt_tokens": 1.5}),
    "string usage": completion("Final Score: 4", {"prompt_tokens": "7"}),
    "usage a list": completion("Final Score: 4", [1, 2]),
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "content a number": completion(5),
    "choices a dict": b'{"choices": {"0": 1}}',
    "no json": b"<html>oops</html>",
}


def test_a_malformed_completion_is_a_503_naming_the_engine(standin: StandInEngine, tmp_path: Path) -> None:
    """A fault a retry would meet again: a 503 on a pickle body too, where flow_grpo's client
    would retry a 500 a thousand times; it stops at once, on the one answer."""
    with judge_server(standin, tmp_path) as server:
        for name, body in MALFORMED.items():
            standin.body = body
            response = post(server, [blank(64)])
            assert response.status_code == 503, (name, response.status_code, response.content[:300])
            assert "engine" in answer(response)["error"], (name, response.content)
        calls = standin.calls
        request = pickle.dumps({"images": [blank(64)], "prompts": ["a cat"]})
        with pytest.raises(KeyError, match="outputs"):  # unifiedreward_score_remote's read
            flow_grpo_call(server.url, request, "outputs")
        assert standin.calls == calls + 1 and answered(server.url, 500) == 0
        standin.body = completion("Final Score: 4")
        assert answer(post(server, [blank(64)]))["scores"] == [0.8]  # the worker is unharmed


@pytest.mark.timing
def test_one_clients_flood_of_calls_does_not_hold_back_another_clients_request(
    standin: StandInEngine, tmp_path: Path
) -> None:
    """Three 4.3 kB requests of 1,024 calls each from one client, 16 calls at once of 50 ms:
    ~10 s of engine time, inside their deadline on a quiet machine. Another client's one-image request gets the next
    turn, not the place behind 3,072 calls."""
    standin.delay_s = 0.05
    settings = {"concurrency": "16", "REQUEST_TIMEOUT_S": "60", "TRUSTED_PROXIES": "127.0.0.1"}
    with judge_server(standin, tmp_path, **settings) as server:
        flood = memo_flood()
        assert len(pickle.dumps({"images": flood, "prompts": ["a cat"] * 1024})) < 4400
        statuses: list[int] = []
        attackers = [
            threading.Thread(target=lambda: statuses.append(post(server, flood, client="10.0.0.1").status_code))
            for _ in range(3)
        ]
        for thread in attackers:
            thread.start()
        wait_until(lambda: standin.calls >= 64, "the flood's calls reach the engine")
        started = time.monotonic()
        response = post(server, [blank(64)], client="10.0.0.2")
        took = time.monotonic() - started
        assert response.status_code == 200 and answer(response)["scores"] == [0.8], response.content
        assert took <= within(1.0), took
        assert standin.calls < 3 * 1024 - 16 * 4  # still flooded when it was answered
        for thread in attackers:
            thread.join(timeout=120)
        # Each scored, or refused by its estimated wait on a machine slow enough to need it.
        assert len(statuses) == 3 and set(statuses) <= {200, 500}, statuses


@pytest.mark.timing
def test_calls_that_would_wait_past_the_deadline_are_refused_at_once(standin: StandInEngine, tmp_path: Path) -> None:
    """1,024 calls of 100 ms, 4 at once: ~26 s against a 10 s deadline, known from the time of
    the calls before; refused at once (on a pickle body, the 500 flow_grpo retries), before any of
    its calls is sent, not at the deadline."""
    standin.delay_s = 0.1
    with judge_server(standin, tmp_path, concurrency="4", REQUEST_TIMEOUT_S="10") as server:
        assert answer(post(server, [blank(64)] * 8))["scores"] == [0.8] * 8  # the call time known
        calls, started = standin.calls, time.monotonic()
        response = post(server, memo_flood())
        assert response.status_code == 500 and "deadline" in answer(response)["error"], response.content
        assert time.monotonic() - started <= within(1.0) and standin.calls == calls


@pytest.mark.timing
def test_ready_follows_the_engine_down_and_back_with_occasional_probes(standin: StandInEngine, tmp_path: Path) -> None:
    with judge_server(standin, tmp_path, ready_probe_s="1") as server:
        # Polled a hundred times, the engine sees a probe a second at most.
        probes, started = standin.probes, time.monotonic()
        for _ in range(100):
            assert requests.get(server.url + "/ready", timeout=10).status_code == 200
        assert standin.probes - probes <= time.monotonic() - started + 1, standin.probes - probes
        standin.down()
        wait_until(
            lambda: requests.get(server.url + "/ready", timeout=10).status_code == 503, "not ready", pause_s=0.05
        )
        reason = requests.get(server.url + "/ready", timeout=10).json()["reason"]
        assert "engine" in reason, reason
        standin.up()
        wait_until(lambda: requests.get(server.url + "/ready", timeout=10).status_code == 200, "ready", pause_s=0.05)
        # A call that could not reach the engine says so at once, and one answered that it is back.
        standin.down()
        assert post(server, [blank(64)]).status_code == 500
        assert requests.get(server.url + "/ready", timeout=10).status_code == 503
        standin.up()
        assert answer(post(server, [blank(64)]))["scores"] == [0.8]
        assert requests.get(server.url + "/ready", timeout=10).status_code == 200
