"""The engine client against a real HTTP server on loopback: the concurrency cap, retries with
backoff inside the deadline, and what is not retried."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from common.limits.errors import PayloadTooLarge
from services.judge.engine import MAX_ANSWER_BYTES, EngineClient, EngineFault, EngineUnavailable
from testing.clock import wait_until
from testing.engine_standin import StandInEngine

pytestmark = pytest.mark.unit


@pytest.fixture
def engine() -> Iterator[StandInEngine]:
    served = StandInEngine()
    yield served
    served.close()


def client(
    url: str, concurrency: int = 4, retries: int = 3, sleeps: list[float] | None = None, max_queued: int = 64
) -> EngineClient:
    sleep = sleeps.append if sleeps is not None else time.sleep
    return EngineClient(url, "judge", concurrency, retries, 0.5, 4.0, sleep=sleep, max_queued=max_queued)


def test_at_most_concurrency_calls_are_in_flight(engine: StandInEngine) -> None:
    engine.release.clear()
    judge = client(engine.url, concurrency=2)
    answers: list[list[str]] = []
    asking = threading.Thread(
        target=lambda: answers.append(
            [reply.text for reply in judge.replies([{"model": "m"}] * 6, time.monotonic() + 60, "c")]
        )
    )
    asking.start()
    wait_until(lambda: engine.in_flight == 2, "two calls held by the engine")
    # Held there, two calls keep the others queued in the client: none can arrive.
    assert engine.calls == 2
    engine.release.set()
    asking.join(timeout=30)
    assert answers == [["The image matches.\nFinal Score: 4"] * 6]
    assert engine.most == 2 and engine.calls == 6


def test_busy_and_failing_answers_are_retried_with_doubling_backoff(engine: StandInEngine) -> None:
    engine.statuses = [429, 503, 500]
    sleeps: list[float] = []
    reply = client(engine.url, sleeps=sleeps).complete({"model": "m"}, time.monotonic() + 60)
    assert reply.text == "The image matches.\nFinal Score: 4" and (reply.prompt_tokens, reply.completion_tokens) == (
        7,
        3,
    )
    assert sleeps == [0.5, 1.0, 2.0] and engine.calls == 4


def test_retries_end_with_a_503_that_names_the_engine(engine: StandInEngine) -> None:
    engine.statuses = [503] * 10
    with pytest.raises(EngineUnavailable, match="engine answered 503"):
        client(engine.url, retries=2, sleeps=[]).complete({"model": "m"}, time.monotonic() + 60)
    assert engine.calls == 3


def test_a_client_error_is_not_retried(engine: StandInEngine) -> None:
    engine.statuses = [400]
    with pytest.raises(EngineFault, match="refused the call: it answered 400"):
        client(engine.url, sleeps=[]).complete({"model": "m"}, time.monotonic() + 60)
    assert engine.calls == 1


def test_no_retry_sleeps_past_the_deadline(engine: StandInEngine) -> None:
    engine.statuses = [503] * 10
    sleeps: list[float] = []
    # Pauses of 30, 60, 120 s (recorded, not slept) against 100 s: the calls' own time, under
    # 10 s even on a loaded machine, cannot move the third pause inside the deadline or the second out.
    judge = EngineClient(engine.url, "judge", 4, 10, 30.0, 240.0, sleep=sleeps.append)
    with pytest.raises(EngineUnavailable, match="no time left"):
        judge.complete({"model": "m"}, time.monotonic() + 100)
    assert sleeps == [30.0, 60.0]  # the next pause, 120 s, would end past the deadline


def test_an_unreachable_engine_is_retried_then_unavailable() -> None:
    sleeps: list[float] = []
    with pytest.raises(EngineUnavailable, match="could not be reached"):
        client("http://127.0.0.1:9", retries=2, sleeps=sleeps).complete({"model": "m"}, time.monotonic() + 60)
    assert sleeps == [0.5, 1.0]


@pytest.mark.parametrize(
    "body",
    [
        b"<html>oops</html>",
        b"[]",
        b'{"choices": []}',
        b'{"choices": [{"message": 1}]}',
        b"[" * 100_000,
        b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": -1}}',
        b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": Infinity}}',
        b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 1e400}}',
        b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 9007199254740992}}',
        b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": true}}',
        b'{"choices": [{"message": {"content": ["x"]}}]}',
    ],
)
def test_a_200_that_is_no_chat_completion_is_the_engines_failure_not_retried(
    engine: StandInEngine, body: bytes
) -> None:
    engine.body = body
    with pytest.raises(EngineFault, match="no chat completion"):
        client(engine.url, sleeps=[]).complete({"model": "m"}, time.monotonic() + 60)
    assert engine.calls == 1


def test_an_answer_over_the_cap_is_read_no_further_and_a_parse_failure(engine: StandInEngine) -> None:
    engine.body = b'{"choices": [{"message": {"content": "' + b"x" * (MAX_ANSWER_BYTES + 10) + b'"}}]}'
    reply = client(engine.url, sleeps=[]).complete({"model": "m"}, time.monotonic() + 60)
    assert reply.text == "" and "over 1048576 bytes" in (reply.problem or "")


def test_a_request_with_more_calls_than_the_queue_holds_is_413_and_none_is_sent(engine: StandInEngine) -> None:
    judge = client(engine.url, max_queued=4)
    with pytest.raises(PayloadTooLarge, match="5 engine calls"):
        judge.replies([{"model": "m"}] * 5, time.monotonic() + 60, "c")
    assert engine.calls == 0


def test_each_sender_keeps_its_connection_and_replaces_one_the_engine_closed(engine: StandInEngine) -> None:
    sleeps: list[float] = []
    judge = client(engine.url, concurrency=1, sleeps=sleeps)
    for _ in range(3):
        assert judge.replies([{"model": "m"}] * 2, time.monotonic() + 60, "c")[0].prompt_tokens == 7
    assert engine.connections == 1 and engine.calls == 6
    engine.keep_alive = False  # each connection closed after its answer, as an idle one is
    for _ in range(3):
        assert judge.replies([{"model": "m"}] * 2, time.monotonic() + 60, "c")[0].prompt_tokens == 7
    # The first call went on the kept connection; each of the five after found its connection
    # closed and made a new one: no call failed, none was retried with a pause.
    assert engine.connections == 1 + 5 and engine.calls == 12 and sleeps == []
