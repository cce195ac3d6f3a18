"""The engine client against a real HTTP server on loopback: the concurrency cap, retries with
backoff inside the deadline, and what is not retried."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from services.judge.engine import EngineClient, EngineUnavailable
from testing.clock import wait_until

pytestmark = pytest.mark.unit

COMPLETION = {
    "choices": [{"message": {"content": "Final Score: 4"}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3},
}


class Engine:
    """A chat-completions endpoint answering ``statuses`` in turn (200 after), each call held
    until ``release`` is set; it counts the calls it holds at once."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.body = json.dumps(COMPLETION).encode()
        self.release = threading.Event()
        self.release.set()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.calls = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with engine.lock:
                    engine.calls += 1
                    engine.in_flight += 1
                    engine.most = max(engine.most, engine.in_flight)
                    status = engine.statuses.pop(0) if engine.statuses else 200
                engine.release.wait(30)
                body = engine.body if status == 200 else b'{"error": "busy"}'
                with engine.lock:
                    engine.in_flight -= 1
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # shutdown() waits out serve_forever's poll interval: 0.5 s a test at its default.
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()


@pytest.fixture
def engine() -> Iterator[Engine]:
    served = Engine()
    yield served
    served.release.set()
    served.server.shutdown()


def client(url: str, concurrency: int = 4, retries: int = 3, sleeps: list[float] | None = None) -> EngineClient:
    return EngineClient(
        url, "judge", concurrency, retries, 0.5, 4.0, sleep=(sleeps.append if sleeps is not None else time.sleep)
    )


def test_at_most_concurrency_calls_are_in_flight(engine: Engine) -> None:
    engine.release.clear()
    judge = client(engine.url, concurrency=2)
    futures = [judge.submit({"model": "m"}, time.monotonic() + 60) for _ in range(6)]
    wait_until(lambda: engine.in_flight == 2, "two calls held by the engine")
    # Held there, two calls keep the others queued in the client: none started, none can arrive.
    assert [future.running() for future in futures] == [True, True, False, False, False, False]
    assert engine.in_flight == 2
    engine.release.set()
    assert [future.result(timeout=30).text for future in futures] == ["Final Score: 4"] * 6
    assert engine.most == 2 and engine.calls == 6


def test_busy_and_failing_answers_are_retried_with_doubling_backoff(engine: Engine) -> None:
    engine.statuses = [429, 503, 500]
    sleeps: list[float] = []
    reply = client(engine.url, sleeps=sleeps).complete({"model": "m"}, time.monotonic() + 60)
    assert reply.text == "Final Score: 4" and (reply.prompt_tokens, reply.completion_tokens) == (7, 3)
    assert sleeps == [0.5, 1.0, 2.0] and engine.calls == 4


def test_retries_end_with_a_503_that_names_the_engine(engine: Engine) -> None:
    engine.statuses = [503] * 10
    with pytest.raises(EngineUnavailable, match="engine answered 503"):
        client(engine.url, retries=2, sleeps=[]).complete({"model": "m"}, time.monotonic() + 60)
    assert engine.calls == 3


def test_a_client_error_is_not_retried(engine: Engine) -> None:
    engine.statuses = [400]
    with pytest.raises(EngineUnavailable, match="400"):
        client(engine.url, sleeps=[]).complete({"model": "m"}, time.monotonic() + 60)
    assert engine.calls == 1


def test_no_retry_sleeps_past_the_deadline(engine: Engine) -> None:
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


@pytest.mark.parametrize("body", [b"<html>oops</html>", b"[]", b'{"choices": []}', b'{"choices": [{"message": 1}]}'])
def test_a_200_that_is_no_chat_completion_is_the_engines_failure_not_retried(engine: Engine, body: bytes) -> None:
    engine.body = body
    with pytest.raises(EngineUnavailable, match="no chat completion"):
        client(engine.url, sleeps=[]).complete({"model": "m"}, time.monotonic() + 60)
    assert engine.calls == 1
