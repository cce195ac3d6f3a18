"""The HTTP layer under gunicorn: several services on one host, slow and idle clients."""

from __future__ import annotations

import contextlib
import json
import pickle
import resource
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from testing.clock import wait_until
from testing.ocr import read_until_closed, score_request
from testing.server import gunicorn_server
from testing.timing import within

# The three services as ``bash run.sh`` starts them on one node (aesthetic without weights and
# code without a sandbox still serve /health).
NODE_SERVICES = {
    "ocr": {},
    "aesthetic": {"SCORER_AESTHETIC_CLIP": "/nonexistent", "SCORER_DEVICE": "cpu"},
    "code": {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan"},
}


def control_sockets(home: Path) -> list[Path]:
    return sorted(path for path in home.rglob("*") if path.is_socket())


def test_the_services_of_one_node_do_not_share_a_control_socket(tmp_path, monkeypatch) -> None:
    """gunicorn 27 gives every master on a host the same control socket under ~/.gunicorn: the
    last one started takes it over and the first one stopped removes it for everyone."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(gunicorn_server(name, env, require_ready=False, log_dir=tmp_path))
            for name, env in NODE_SERVICES.items()
        }
        for server in servers.values():
            assert requests.get(server.url + "/health", timeout=10).status_code == 200
        shared = control_sockets(home)
        # Either none, or one of its own per master (then it must survive the others stopping).
        assert len(shared) in (0, len(servers)), f"control sockets {shared} for {len(servers)} masters"
        servers["ocr"].stop()
        assert len(control_sockets(home)) in (0, len(servers) - 1)
        for name in ("aesthetic", "code"):
            assert requests.get(servers[name].url + "/health", timeout=10).status_code == 200
            assert "Control server error" not in servers[name].logs()


@pytest.fixture
def many_sockets() -> Iterator[None]:
    """Room for a thousand client sockets in this process (the soft limit is often 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def raw_request(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_until_closed(sock)


SLOW_CLIENTS = {
    "idle": b"",
    "partial head": b"POST / HTTP/1.1\r\nHost: scorer\r\nContent-Type: application/octet-stream\r\n",
    "short body": b"POST / HTTP/1.1\r\nHost: scorer\r\nContent-Length: 100000\r\n\r\n" + b"\x80\x05" * 10,
    "short chunked body": b"POST / HTTP/1.1\r\nHost: scorer\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + b"x" * 10,
}


@pytest.mark.timing
def test_a_thousand_slow_clients_do_not_stop_the_others(tmp_path, many_sockets) -> None:
    """Each holds a connection with nothing, part of a head or part of a body: the others are
    served meanwhile, and each slow one gets 408 at its deadline and is closed."""
    hold = within(8.0)  # the slow clients' deadline: the others are served before it
    env = {"SCORER_HEAD_TIMEOUT_S": str(hold), "SCORER_BODY_TIMEOUT_S": str(hold)}
    with gunicorn_server("ocr", env, log_dir=tmp_path) as server:
        kinds = list(SLOW_CLIENTS)
        slow = []
        opened = time.monotonic()
        for n in range(1000):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            sock.sendall(SLOW_CLIENTS[kinds[n % len(kinds)]])
            slow.append(sock)
        wait_until(lambda: server.sockets() > 1000, "the worker holding the slow clients", pause_s=0.05)

        started = time.monotonic()
        # The client waits past the bounds below: they, not its timeout, say what was slow.
        assert requests.get(server.url + "/health", timeout=60).status_code == 200
        health_s = time.monotonic() - started
        started = time.monotonic()
        response = requests.post(server.url + "/", data=score_request(), timeout=60)
        score_s = time.monotonic() - started
        assert response.status_code == 200 and pickle.loads(response.content)["scores"][0] >= 0.9
        assert time.monotonic() - opened < hold, "the slow clients were not held the whole time"
        assert health_s < within(2.0) and score_s < within(6.0), (health_s, score_s)

        answers = Counter()
        for sock in slow:
            answer = read_until_closed(sock)  # the server closes it: recv returns b""
            answers[answer.split(b"\r\n", 1)[0]] += 1
            sock.close()
        assert answers == {b"HTTP/1.1 408 Request Timeout": 1000}, answers
        assert time.monotonic() - opened < hold + within(6.0)


def test_a_timed_out_request_is_told_in_its_own_format(tmp_path) -> None:
    with gunicorn_server(
        "ocr", {"SCORER_HEAD_TIMEOUT_S": "1", "SCORER_BODY_TIMEOUT_S": "1"}, log_dir=tmp_path
    ) as server:
        head = b"POST / HTTP/1.1\r\nHost: scorer\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{"
        status, _, body = raw_request(server.port, head).partition(b"\r\n")
        assert status == b"HTTP/1.1 408 Request Timeout"
        assert "body did not arrive within 1s" in json.loads(body.split(b"\r\n\r\n", 1)[1])["error"]
        assert requests.get(server.url + "/health", timeout=5).status_code == 200


def chunked(body: bytes, size: int = 1000) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def test_chunked_bodies_are_scored_and_bad_chunk_sizes_are_400(tmp_path) -> None:
    with gunicorn_server("ocr", log_dir=tmp_path) as server:
        head = b"POST / HTTP/1.1\r\nHost: scorer\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        answer = raw_request(server.port, head + chunked(score_request()))
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert pickle.loads(answer.split(b"\r\n\r\n", 1)[1])["scores"][0] >= 0.9
        for bad in (b"zz\r\nhello\r\n0\r\n\r\n", b"-5\r\nhello\r\n0\r\n\r\n", b"5\r\nhello!!0\r\n\r\n"):
            answer = raw_request(server.port, head + bad)
            assert answer.startswith(b"HTTP/1.1 400 "), (bad, answer[:200])
        assert requests.get(server.url + "/health", timeout=5).status_code == 200


def test_a_client_that_waits_for_100_continue_gets_it(tmp_path) -> None:
    with gunicorn_server("ocr", log_dir=tmp_path) as server:
        body = score_request()
        head = b"POST / HTTP/1.1\r\nHost: scorer\r\nExpect: 100-continue\r\nConnection: close\r\n"
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
            sock.sendall(body)
            answer = read_until_closed(sock)
        assert b"HTTP/1.1 200 " in answer
