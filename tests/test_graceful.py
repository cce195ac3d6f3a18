"""Graceful restarts: SIGHUP replaces the workers under load and SIGTERM stops the service, and
neither drops a request the service accepted; the grace period bounds how long a stop takes."""

from __future__ import annotations

import http.client
import math
import pickle
import signal
import socket
import threading
import time

import pytest
import requests

from testing.clock import wait_until
from testing.images import render_text
from testing.server import gunicorn_server
from testing.stream import RequestStream, cases
from testing.timing import within


def refused(url: str) -> bool:
    """Whether a connection to ``url``'s port is refused (its listener closed)."""
    host, port = url.rpartition("/")[2].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def post_in_background(url: str, bodies: list[bytes], outcomes: dict[int, object]) -> list[threading.Thread]:
    """Post each body on its own connection; return once every request has been sent whole."""
    host, port = url.removeprefix("http://").split(":")
    sent = threading.Barrier(len(bodies) + 1)

    def post(index: int, body: bytes) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            connection.request("POST", "/", body=body)
            sent.wait()
            response = connection.getresponse()
            outcomes[index] = (response.status, pickle.loads(response.read()).get("scores"))
        except OSError as exc:
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i, body)) for i, body in enumerate(bodies)]
    for thread in threads:
        thread.start()
    sent.wait(30)
    return threads


def test_sighup_replaces_the_worker_under_load_and_drops_nothing(tmp_path) -> None:
    with gunicorn_server("ocr", log_dir=tmp_path) as server:
        (old,) = server.worker_pids()
        with RequestStream(server.url, threads=4) as stream:
            stream.wait_answered_since(0, 8)
            server.process.send_signal(signal.SIGHUP)
            wait_until(
                lambda: server.worker_pids() not in ([], [old]) and old not in server.worker_pids(), "a new worker"
            )
            replaced = time.monotonic()
            stream.wait_answered_since(replaced, 8)
        assert old not in server.worker_pids()
        assert not stream.failures(), stream.failures()[:10]


@pytest.mark.timing
def test_sigterm_lets_in_flight_requests_finish_and_refuses_new_ones(tmp_path) -> None:
    batch = cases()[:6]  # three words asked for themselves, three for another word
    bodies = [case.body for case in batch]
    with gunicorn_server("ocr", {"SCORER_GRACEFUL_TIMEOUT": "60"}, log_dir=tmp_path) as server:
        bodies += work_for(server.url, 5)  # in flight after the listener closed, however fast the machine
        outcomes: dict[int, object] = {}
        threads = post_in_background(server.url, bodies, outcomes)
        server.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        wait_until(lambda: refused(server.url), "the listener closed")
        # Refused at once, not held until the exit: while the in-flight requests are still served.
        assert len(outcomes) < len(bodies), outcomes
        with pytest.raises(requests.ConnectionError):
            requests.post(server.url + "/", data=bodies[0], timeout=5)
        for thread in threads:
            thread.join(60)
        server.process.wait(60)
        took = time.monotonic() - stopped
    assert server.process.returncode == 0
    for index, case in enumerate(batch):
        status, scores = outcomes[index]
        assert status == 200, outcomes[index]
        assert (scores[0] >= 0.9) == case.matches, (index, scores)
    assert all(outcomes[index][0] == 200 for index in range(len(batch), len(bodies))), outcomes
    # The failure waits out the 60 s grace period.
    assert took < min(within(25.0), 55.0), "the master should exit once the in-flight requests are answered"


def distinct_images(word: str, count: int) -> bytes:
    """A request of ``count`` distinct images (each distinct image is read once)."""
    images = [render_text(f"{word} {n}", size=256) for n in range(count)]
    return pickle.dumps({"images": images, "prompts": [f'"{word}"'] * count})


def work_for(url: str, seconds: float) -> list[bytes]:
    """Requests of 32 distinct images (within the request limits) that keep the server busy
    ``seconds`` at the rate it shows now: the second of two 8-image requests (the first warms)."""
    for word in ("Warm", "Rate"):
        started = time.monotonic()
        assert requests.post(url + "/", data=distinct_images(word, 8), timeout=120).status_code == 200
        per_image_s = (time.monotonic() - started) / 8
    return [distinct_images(f"Busy{n}", 32) for n in range(math.ceil(seconds / per_image_s / 32))]


@pytest.mark.timing
def test_grace_period_bounds_a_stop(tmp_path) -> None:
    with gunicorn_server("ocr", {"SCORER_GRACEFUL_TIMEOUT": "2"}, log_dir=tmp_path) as server:
        slow = work_for(server.url, 5 * 2)  # still in flight when the grace period ends
        outcomes: dict[int, object] = {}
        threads = post_in_background(server.url, slow, outcomes)
        server.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        server.process.wait(30)
        took = time.monotonic() - stopped
        for thread in threads:
            thread.join(30)
    assert took < 2 + within(2.0), f"stop took {took:.1f}s with a 2 s grace period"
    cut_off = [isinstance(outcome, OSError) for outcome in outcomes.values()]
    assert cut_off == [True] * len(slow), outcomes  # cut off, not left hanging


@pytest.mark.timing
def test_an_idle_kept_alive_connection_does_not_hold_a_stop_for_the_grace_period(tmp_path) -> None:
    """A trainer's session keeps its connection open between calls: on SIGTERM the worker keeps
    such an idle connection a moment only (gunicorn's ``STOP_KEEPALIVE_LINGER``), not until its
    keep-alive (75 s) or the grace period (60 s here) runs out."""
    with gunicorn_server("ocr", {"SCORER_GRACEFUL_TIMEOUT": "60"}, log_dir=tmp_path) as server:
        session = requests.Session()
        assert session.get(server.url + "/health", timeout=10).status_code == 200  # kept alive, idle
        server.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        server.process.wait(90)
        took = time.monotonic() - stopped
        session.close()
    assert took < 2 + within(3.0), f"stop took {took:.1f}s with one idle kept-alive connection"
