"""The gateway against an attacker without a token, on real gunicorn without nginx (as ``bash
run.sh`` serves): requests of a few KB that once killed, stalled or bloated a worker. Each is
answered with its 4xx on its own connection by the same worker, in bounded CPU and memory."""

from __future__ import annotations

import contextlib
import pickle
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from testing.clock import wait_until
from testing.ocr import read_until_closed, score_request
from testing.server import Server, gunicorn_server
from testing.timing import within

TOKEN = "s3cret"
HEAD = b"POST / HTTP/1.1\r\nHost: scorer\r\n"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory) -> Iterator[Server]:
    """One OCR worker; long deadlines, so a request held until one passes is seen as held."""
    env = {"SCORER_HEAD_TIMEOUT_S": "30", "SCORER_BODY_TIMEOUT_S": "30"}
    with gunicorn_server("ocr", env, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def guarded(tmp_path_factory) -> Iterator[Server]:
    """The same with a bearer token set."""
    env = {"SCORER_HEAD_TIMEOUT_S": "30", "SCORER_BODY_TIMEOUT_S": "30", "SCORER_AUTH_TOKEN": TOKEN}
    with gunicorn_server("ocr", env, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


def health_pid(server: Server, timeout: float = 5.0) -> int:
    return requests.get(server.url + "/health", timeout=timeout).json()["pid"]


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def exchange(server: Server, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` and keep the connection open (no EOF from us): what the server answers
    until it closes the connection. A server that waits for more bytes times this out."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_until_closed(sock)


def worker_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def worker_peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_content_length_of_5000_digits_is_a_400_from_the_same_worker(gateway) -> None:
    """int() of more than 4,300 digits raises ValueError: it ended the worker's main loop."""
    pid = health_pid(gateway)
    for digits in (b"9" * 5000, b"0" * 5000 + b"5", b"1" * 19):
        answer = exchange(gateway, HEAD + b"Content-Length: " + digits + b"\r\n\r\n")
        assert status_of(answer) == 400 and b"Connection: close" in answer
    assert health_pid(gateway) == pid


# Framings gunicorn's parser accepts and the worker's scan did not frame: handed to a request
# thread that then waited on the socket for the body.
UNFRAMED = {
    "gzip, chunked": (HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello", 501),
    "identity, chunked": (HEAD + b"Transfer-Encoding: identity, chunked\r\n\r\n5\r\nhello", 501),
    "split coding fields": (HEAD + b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n", 400),
    "17-digit chunk size": (HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * 17 + b"\r\nhello", 413),
    "whitespace after a chunk size": (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5 \r\nhello", 400),
}


@pytest.mark.parametrize("name", list(UNFRAMED))
def test_what_the_scan_cannot_frame_is_refused_at_once(gateway, name: str) -> None:
    request, status = UNFRAMED[name]
    assert status_of(exchange(gateway, request)) == status


def test_two_hundred_unframed_requests_do_not_stall_the_worker(gateway) -> None:
    """130 such connections of ~80 bytes held every request thread: /health timed out and a
    real request went unanswered for 50 s."""
    pid = health_pid(gateway)
    held = []
    requests_bytes = [request for request, _ in UNFRAMED.values()]
    for n in range(200):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
        sock.sendall(requests_bytes[n % len(requests_bytes)])
        held.append(sock)
    try:
        assert health_pid(gateway, timeout=5) == pid
        response = requests.post(gateway.url + "/", data=score_request(), timeout=20)
        assert response.status_code == 200 and pickle.loads(response.content)["scores"][0] >= 0.9
        statuses = {status_of(read_until_closed(sock)) for sock in held}
        assert statuses == {400, 413, 501}
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_is_read_in_linear_time(gateway, chunked: bool) -> None:
    """The worker's CPU per body byte is about the same for a body 8 times larger (quadratic
    reading: 1 MB of one-byte chunks cost 26 s of CPU, a 255 MB body 38 s and 1.8 GB)."""
    pid = health_pid(gateway)
    per_byte, rss_before = [], worker_peak_rss(pid)
    for size in (8_000, 64_000) if chunked else (8 << 20, 64 << 20):
        body = b"1\r\nx\r\n" * size + b"0\r\n\r\n" if chunked else b"x" * size
        framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % size
        before = worker_cpu_s(pid)
        answer = exchange(gateway, HEAD + framing + b"Connection: close\r\n\r\n" + body, timeout=60)
        per_byte.append((worker_cpu_s(pid) - before + 0.02) / size)  # + a tick: the clock's grain
        assert status_of(answer) == 400  # not a pickle: the body was read whole and decoded
    assert per_byte[1] < 3 * per_byte[0], per_byte
    if not chunked:  # the body, its one copy for the thread, and the decoder's view: no more
        assert worker_peak_rss(pid) - rss_before < 4 * (64 << 20)
    assert health_pid(gateway) == pid


def test_a_wrong_token_is_answered_before_the_body_is_sent(guarded) -> None:
    """The 401 comes while the client has sent only the head (the worker once waited for the
    whole body, then held a thread 5 s draining it), and the connection is closed."""
    pid = health_pid(guarded)
    for framing in (b"Content-Length: 1000000\r\n", b"Transfer-Encoding: chunked\r\n"):
        for token in (b"", b"Authorization: Bearer wrong\r\n", b"Authorization: Bearer s3cret,x\r\n"):
            for expect in (b"", b"Expect: 100-continue\r\n"):
                answer = exchange(guarded, HEAD + framing + token + expect + b"\r\n" + b"x" * 1000, timeout=10)
                assert status_of(answer) == 401 and b"100 Continue" not in answer, answer[:300]
    # a GET with a body needs the token too; the probes do not
    assert status_of(exchange(guarded, b"GET /health HTTP/1.1\r\nContent-Length: 10\r\n\r\n")) == 401
    assert health_pid(guarded) == pid


def test_a_flood_of_wrong_tokens_with_large_bodies_costs_the_worker_little(guarded) -> None:
    """Each refused client keeps sending its 8 MB chunked body; the worker discards at most a
    little of each and holds none (it once buffered every whole body, then drained it)."""
    pid = health_pid(guarded)
    body = b"1000\r\n" + b"x" * 4096 + b"\r\n"
    request = HEAD + b"Transfer-Encoding: chunked\r\nAuthorization: Bearer wrong\r\n\r\n" + body * 2048
    answers = []

    def send() -> None:
        with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as sock:
            with contextlib.suppress(OSError):  # closed while sending: refused, as it should be
                sock.sendall(request)
            with contextlib.suppress(OSError):
                answers.append(read_until_closed(sock))

    rss_before, cpu_before = worker_peak_rss(pid), worker_cpu_s(pid)
    clients = [threading.Thread(target=send) for _ in range(16)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(30)
    assert worker_peak_rss(pid) - rss_before < 32 << 20  # 16 bodies of 8 MB: 128 MB held
    assert worker_cpu_s(pid) - cpu_before < 2.0
    assert all(status_of(answer) == 401 for answer in answers if answer)
    response = requests.post(
        guarded.url + "/", data=score_request(), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=20
    )
    assert response.status_code == 200
    assert health_pid(guarded) == pid


def test_pipelined_requests_are_answered_in_order(gateway) -> None:
    body = score_request()
    one = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    health = b"GET /health HTTP/1.1\r\nHost: scorer\r\n\r\n"
    answer = exchange(gateway, one + health + one + health + b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 5
    first, second = answer.index(b"scores"), answer.index(b'"pid"')
    assert first < second and answer.index(b"scores", second) > second


@pytest.fixture
def files_for_ten_thousand() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 10_500:
        pytest.skip(f"the hard file limit ({hard}) leaves no room for 10,000 client sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 12_000) if hard != resource.RLIM_INFINITY else 12_000, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.timing
def test_ten_thousand_idle_connections_do_not_slow_a_real_request(tmp_path, files_for_ten_thousand) -> None:
    """Past 4,096 connections the worker stopped accepting: a real request waited in the backlog
    until idle ones timed out (7-10 s; here their deadline is 30 s)."""
    env = {"SCORER_HEAD_TIMEOUT_S": "30"}
    with gunicorn_server("ocr", env, log_dir=tmp_path) as server:
        pid = health_pid(server)
        idle = []
        try:
            for n in range(10_000):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
                if n % 2:
                    sock.sendall(b"POST / HTTP/1.1\r\n")
                idle.append(sock)
            wait_until(lambda: server.sockets() > 10_000, "the worker holding the idle connections", pause_s=0.05)
            started = time.monotonic()
            assert health_pid(server, timeout=60) == pid
            response = requests.post(server.url + "/", data=score_request(), timeout=30)
            elapsed = time.monotonic() - started
            assert response.status_code == 200 and pickle.loads(response.content)["scores"][0] >= 0.9
            assert elapsed < min(within(6.0), 25), elapsed  # a real request on 2 busy cores, not a 30 s wait
        finally:
            for sock in idle:
                sock.close()
