"""A small real OpenAI-compatible engine for the judge's failure tests: a threaded HTTP server on
loopback whose chat completions a test shapes while it runs: a chosen reply or raw body, answered
after a pause, sent slowly, huge, with chosen statuses first, held until released; it can go down
and come back on its port. It counts what it was asked and what it managed to send."""

from __future__ import annotations

import contextlib
import json
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from testing.images import blank
from testing.server import Server, free_port, gunicorn_server

PICKLE = {"Content-Type": "application/x-pickle"}


def completion(content: Any, usage: Any = None) -> bytes:
    """A chat completion's body answering ``content`` (``usage`` as given, else small counts)."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3} if usage is None else usage
    return json.dumps({"choices": [{"message": {"content": content}}], "usage": usage}).encode()


class _QuietServer(ThreadingHTTPServer):
    """Its threads end with the process; a client hanging up is no error to print."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass


@dataclass
class Sent:
    """One chat completion as the engine answered it: bytes it sent, and whether the client
    hung up before it was all sent, and when its sending ended (``time.monotonic()``)."""

    sent: int = 0
    hung_up: bool = False
    ended: float = 0.0


class StandInEngine:
    """Chat completions at ``/v1/chat/completions``, ``/v1/models`` and ``/health``.

    Each completion answers ``statuses`` in turn (200 after), ``body`` (a completion of ``reply``
    unless set; of ``reply_for(text)`` when that is given, ``text`` the text parts of the call's
    last message joined), after ``delay_s``, held until ``release`` is set, at ``bytes_per_s`` when set
    (its head too when ``slow_head``), on connections kept alive unless ``keep_alive`` is False."""

    def __init__(
        self, reply: str = "The image matches.\nFinal Score: 4", reply_for: Callable[[str], str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.body = completion(reply)
        self.reply_for = reply_for
        self.statuses: list[int] = []
        self.delay_s = 0.0
        self.bytes_per_s: float | None = None
        self.slow_head = False
        # False: the engine closes each connection after its answer, as one closes an idle one.
        self.keep_alive = True
        self.connections = 0
        self.release = threading.Event()
        self.release.set()
        self.lock = threading.Lock()
        self.calls = 0
        self.probes = 0
        self.in_flight = 0
        self.most = 0
        self.answers: list[Sent] = []
        self.server: ThreadingHTTPServer | None = None
        self.up()

    def up(self) -> None:
        """Listen (again) on the engine's port."""
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with engine.lock:
                    engine.connections += 1

            def do_GET(self) -> None:
                with engine.lock:
                    engine.probes += 1
                if self.path not in ("/health", "/v1/models"):
                    self.send_error(404)
                    return
                body = json.dumps({"data": [{"id": "stand-in"}]}).encode()
                self._head(200, len(body))
                self.wfile.write(body)

            def do_POST(self) -> None:
                call = self.rfile.read(int(self.headers["Content-Length"]))
                with engine.lock:
                    engine.calls += 1
                    engine.in_flight += 1
                    engine.most = max(engine.most, engine.in_flight)
                    status = engine.statuses.pop(0) if engine.statuses else 200
                    record = Sent()
                    engine.answers.append(record)
                try:
                    time.sleep(engine.delay_s)
                    engine.release.wait(60)
                    body = engine.answer_to(call) if status == 200 else b'{"error": "busy"}'
                    engine.send(self, status, body, record)
                finally:
                    record.ended = time.monotonic()
                    with engine.lock:
                        engine.in_flight -= 1

            def _head(self, status: int, length: int) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(length))
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = _QuietServer(("127.0.0.1", self.port), Handler)
        # shutdown() waits out serve_forever's poll interval: 0.5 s at its default.
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()

    def answer_to(self, call: bytes) -> bytes:
        if self.reply_for is None:
            return self.body
        content = json.loads(call)["messages"][-1]["content"]
        return completion(self.reply_for("\n".join(part["text"] for part in content if part.get("type") == "text")))

    def send(self, handler: BaseHTTPRequestHandler, status: int, body: bytes, record: Sent) -> None:
        """The answer's head and body, at ``bytes_per_s`` when set; a client that hangs up ends it."""
        head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        slow = self.bytes_per_s is not None
        try:
            if not (slow and self.slow_head):
                handler.wfile.write(head)
            if not slow:
                self._write(handler, body, record, len(body))
            for index in range(len(head) if slow and self.slow_head else 0):
                handler.wfile.write(head[index : index + 1])
                handler.wfile.flush()
                time.sleep(1 / self.bytes_per_s)
            for index in range(len(body) if slow else 0):
                self._write(handler, body[index : index + 1], record, 1)
                time.sleep(1 / self.bytes_per_s)
        except OSError:
            record.hung_up = True
        handler.close_connection = record.hung_up or slow or not self.keep_alive

    @staticmethod
    def _write(handler: BaseHTTPRequestHandler, data: bytes, record: Sent, size: int) -> None:
        view = memoryview(data)
        for start in range(0, size, 1 << 16):
            handler.wfile.write(view[start : start + (1 << 16)])
            handler.wfile.flush()
            record.sent += len(view[start : start + (1 << 16)])

    def down(self) -> None:
        """Stop listening: new connections are refused until ``up``."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def close(self) -> None:
        self.release.set()
        self.down()


def judge_server(engine: StandInEngine, log_dir: Path, **settings: str) -> contextlib.AbstractContextManager[Server]:
    """The v1 judge (``Final Score: 4`` scores 0.8, no retries) in front of ``engine``;
    ``settings`` are the judge's own (``SCORER_JUDGE_*``) or, upper-case, the core's (``SCORER_*``)."""
    env = {
        "SCORER_JUDGE_JUDGE": "unifiedreward-v1",
        "SCORER_JUDGE_ENGINE": engine.url,
        "SCORER_JUDGE_MODEL": "stand-in",
        "SCORER_JUDGE_PARSE_FAILURE_SCORE": "nan",
        "SCORER_JUDGE_RETRIES": "0",
    }
    for key, value in settings.items():
        env[f"SCORER_{key}" if key.isupper() else f"SCORER_JUDGE_{key.upper()}"] = value
    return gunicorn_server("judge", env, threads=16, log_dir=log_dir)


def post(server: Server, images: list[bytes], client: str | None = None, timeout: float = 60) -> requests.Response:
    """A pickle request of ``images`` (an object sent once: the pickle memo refers back to it),
    from ``client`` (forwarded, for a server that trusts loopback as its proxy)."""
    body = pickle.dumps({"images": images, "prompts": ["a cat"] * len(images)})
    headers = {**PICKLE, **({"X-Forwarded-For": client} if client else {})}
    return requests.post(server.url + "/", data=body, headers=headers, timeout=timeout)


def answer(response: requests.Response) -> dict[str, Any]:
    return pickle.loads(response.content)


def memo_flood() -> list[bytes]:
    """One 64x64 PNG referenced 1,024 times: about 4.3 kB of pickle, 1,024 engine calls."""
    return [blank(64, "PNG")] * 1024
