"""The clients' one retry policy (common/sdk/retry.py): what is retried, what is final, what a
balancer answers, and that every client (sync, async, the VeRL-Omni drop-in, the load bench)
sends each retry the first attempt's bytes, at the URL it was given."""

from __future__ import annotations

import asyncio
import io
import pickle
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import numpy as np
import pytest
from PIL import Image

from bench.load.run import _load
from common.sdk import verl_omni
from common.sdk.client import AsyncScorerClient, ScorerClient, settle
from common.sdk.retry import Answer, GaveUp, Retryable, RetryPolicy, ScorerRequestError, call_before
from testing.images import render_text
from testing.nginx import nginx
from testing.server import Server, free_port
from testing.timing import within

OURS = "application/octet-stream"


@pytest.mark.unit
def test_the_policy_retries_408_429_and_5xx_and_settles_the_rest() -> None:
    policy = RetryPolicy(retries=2, backoff=0.5)
    assert [status for status in range(400, 600) if policy.retryable(status)] == [408, 429, *range(500, 600)]
    assert policy.retried("ClientConnectionError") and policy.retried("503") and not policy.retried("422")
    assert [policy.delay(n) for n in range(3)] == [0.5, 1.0, 2.0]
    assert settle(Answer(200, pickle.dumps({"scores": [1.0]}), OURS, 1)) == {"scores": [1.0]}
    with pytest.raises(ScorerRequestError, match=r"HTTP 503: busy \(after 3 attempts\)"):
        settle(Answer(503, pickle.dumps({"error": "busy"}), OURS, 3))
    with pytest.raises(ScorerRequestError, match=r"HTTP 422: bad$"):
        settle(Answer(422, b'{"error": "bad"}', "application/json", 1))
    with pytest.raises(ValueError, match="non-negative"):
        RetryPolicy(retries=-1)


class Clock:
    """A clock that moves only when the caller sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(outcomes: list[str]):
    """An attempt that fails with ``outcomes`` in turn, then answers how many seconds it had."""

    def attempt(remaining: float) -> float:
        if outcomes:
            outcome = outcomes.pop(0)
            raise Retryable(outcome, f"failed with {outcome}")
        return remaining

    return attempt


@pytest.mark.unit
def test_a_deadline_bound_caller_retries_by_the_policy_with_capped_backoff() -> None:
    clock = Clock()
    policy = RetryPolicy(retries=5, backoff=0.5, backoff_max=1.5)
    observed: list[str] = []
    left = call_before(
        failing(["503", "ConnectionError", "429", "500"]),
        policy,
        100.0,
        clock.sleep,
        lambda: clock.now,
        observed.append,
    )
    assert clock.sleeps == [0.5, 1.0, 1.5, 1.5] and left == 100.0 - 4.5 and observed == ["retried"] * 4


@pytest.mark.unit
@pytest.mark.parametrize(
    ("outcomes", "expires", "reason", "sleeps"),
    [
        (["422"], 100.0, "final", []),  # not retried
        (["503"] * 3, 100.0, "final", [0.5, 1.0]),  # the retries ran out
        (["503"] * 9, 1.2, "deadline", [0.5]),  # the next pause (1 s) would end past the deadline
    ],
)
def test_a_deadline_bound_caller_gives_up(
    outcomes: list[str], expires: float, reason: str, sleeps: list[float]
) -> None:
    clock = Clock()
    with pytest.raises(GaveUp) as gave_up:
        call_before(failing(outcomes), RetryPolicy(retries=2, backoff=0.5), expires, clock.sleep, lambda: clock.now)
    assert gave_up.value.reason == reason and clock.sleeps == sleeps


@pytest.mark.unit
def test_a_proxy_page_is_judged_by_its_status_not_unpickled() -> None:
    page = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    assert all(RetryPolicy.retryable(status) for status in (502, 503, 504))
    with pytest.raises(ScorerRequestError, match=r"HTTP 502: <html>.*Bad Gateway"):
        settle(Answer(502, page, "text/html", 2))
    with pytest.raises(ScorerRequestError, match="HTTP 413"):
        settle(Answer(413, page, OURS, 1))  # a proxy's page in the wrong type


class Recorder(ThreadingHTTPServer):
    """A real HTTP server that records each request's path and body and answers the statuses
    of ``script`` in turn (the last one from then on), an error body or one score."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.seen: list[tuple[str, bytes]] = []
        super().__init__(("127.0.0.1", 0), RecordingHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class RecordingHandler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status = self.server.script[min(len(self.server.seen), len(self.server.script) - 1)]
        self.server.seen.append((self.path, body))
        answer = pickle.dumps({"scores": [0.95], "outputs": [0.95]} if status == 200 else {"error": f"{status}"})
        self.send_response(status)
        self.send_header("Content-Type", OURS)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder(request: pytest.FixtureRequest) -> Iterator[Recorder]:
    server = Recorder(request.param)
    # shutdown() waits out serve_forever's poll interval: 0.5 s a test at its default.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def sync_client(url: str) -> None:
    ScorerClient(url + "/score", backoff=0.01).scores([b"image"], ["p"])


def async_client(url: str) -> None:
    async def score() -> None:
        async with AsyncScorerClient(url + "/score", backoff=0.01) as client:
            await client.score([b"image"], ["p"])

    asyncio.run(score())


def drop_in(url: str) -> None:
    async def score() -> None:
        try:
            image = np.zeros((16, 16, 3), np.uint8)
            await verl_omni.compute_score(image, "p", url + "/score", retry_backoff=0.01, weights={"ocr": 1})
        finally:
            await verl_omni.compute_score._session.close()

    asyncio.run(score())


def load_bench(url: str) -> None:
    result = asyncio.run(_load(url + "/score", [b"a body"], 1, RetryPolicy(backoff=0.01)))
    assert result["answered_200"] == 1, result


@pytest.mark.unit
@pytest.mark.parametrize("recorder", [[503, 429, 200]], indirect=True)
@pytest.mark.parametrize("client", [sync_client, async_client, drop_in, load_bench])
def test_every_client_resends_the_first_requests_bytes(recorder: Recorder, client: Any) -> None:
    client(recorder.url)
    paths, bodies = zip(*recorder.seen)
    assert len(bodies) == 3 and set(bodies) == {bodies[0]}, [body[:60] for body in bodies]
    assert set(paths) == {"/score?ocr=1.0" if client is drop_in else "/score"}


@pytest.mark.unit
@pytest.mark.parametrize("recorder", [[500, 422]], indirect=True)
def test_a_final_status_is_not_retried_and_says_so(recorder: Recorder) -> None:
    with pytest.raises(ScorerRequestError, match="HTTP 422: 422 \\(after 2 attempts\\)"):
        sync_client(recorder.url)
    assert len(recorder.seen) == 2


def test_every_documented_url_form_scores_on_a_running_service(ocr_server: Server) -> None:
    """``/``, ``/score`` and the bare node, through both clients and the drop-in."""
    image = render_text("Open", size=256)
    frame = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))

    async def both(url: str) -> tuple[list[float], dict[str, float]]:
        async with AsyncScorerClient(url) as client:
            scores = await client.score_each([image], ['"Open"'])
        try:
            result = await verl_omni.compute_score(frame, '"Open"', url)
        finally:
            await verl_omni.compute_score._session.close()
        return scores, result

    for url in (ocr_server.url, ocr_server.url + "/", ocr_server.url + "/score"):
        assert ScorerClient(url).scores([image], ['"Open"']) == [1.0], url
        assert asyncio.run(both(url)) == ([1.0], {"score": 1.0}), url


def test_connection_refused_is_retried_then_raised() -> None:
    client = ScorerClient(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01)
    with pytest.raises(aiohttp.ClientConnectionError):
        client.scores([b"x"], ["p"])


def test_both_clients_retry_the_balancers_502_when_the_node_is_down(tmp_path) -> None:
    down = f"127.0.0.1:{free_port()}"  # nothing listens there: nginx answers its HTML 502
    with nginx([down], tmp_path / "lb") as balancer:
        with pytest.raises(ScorerRequestError) as sync_error:
            ScorerClient(balancer.url, retries=2, backoff=0.01).scores([b"x"], ["p"])
        assert sync_error.value.status == 502 and "Bad Gateway" in sync_error.value.message

        async def score() -> None:
            async with AsyncScorerClient(balancer.url, retries=2, backoff=0.01) as client:
                await client.score_each([b"x"], ["p"])

        with pytest.raises(ScorerRequestError) as async_error:
            asyncio.run(score())
        assert async_error.value.status == 502
    statuses = [status for status, _, _ in balancer.attempts()]  # nginx stopped: its log written whole
    assert statuses == [502] * 6, statuses  # three attempts each


class DribblingHandler(BaseHTTPRequestHandler):
    """Answers one byte of its head every 0.1 s for ``DRIBBLE_S``: every read gets a byte well
    within any per-read timeout, so only a bound on the whole attempt ends the call early."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.attempts += 1  # type: ignore[attr-defined]
        head = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000
        end = time.monotonic() + DRIBBLE_S
        for byte in head:
            if time.monotonic() > end:
                break
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:  # the client gave up and closed: what the test wants
                return
            time.sleep(0.1)

    def log_message(self, *args: Any) -> None:
        pass


DRIBBLE_S = 30.0


@pytest.fixture
def dribbler() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), DribblingHandler)
    server.attempts = 0  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.timing
def test_a_slow_sending_server_cannot_stretch_a_call_past_its_attempts_timeouts(dribbler: ThreadingHTTPServer) -> None:
    """Two attempts of 1 s each (one retry): the call ends in about 2 s with a timeout, not
    after the 30 s the server dribbles its head for (a per-read timeout never fires)."""
    url = f"http://127.0.0.1:{dribbler.server_address[1]}/score"

    async def async_call() -> None:
        async with AsyncScorerClient(url, timeout=1.0, retries=1, backoff=0.01) as client:
            await client.score([b"x"], ["p"])

    def sync_call() -> None:
        with ScorerClient(url, timeout=1.0, retries=1, backoff=0.01) as client:
            client.score([b"x"], ["p"])

    for call in (sync_call, lambda: asyncio.run(async_call())):
        before = dribbler.attempts  # type: ignore[attr-defined]
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            call()
        assert time.monotonic() - started < min(within(4.0), DRIBBLE_S / 2)
        assert dribbler.attempts - before == 2  # type: ignore[attr-defined]
