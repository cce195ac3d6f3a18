"""What the OCR service's tests share: the small limits of their server, its requests, and the
worker's memory read from /proc (peak reset, then grown by how much)."""

from __future__ import annotations

import pickle
import socket
import time
from collections.abc import Callable
from typing import TypeVar

import requests

from testing.images import render_text
from testing.server import Server

T = TypeVar("T")

OCR_LIMITS = {
    "SCORER_MAX_ITEMS": "32",
    "SCORER_MAX_PIXELS": str(2048 * 2048),
    "SCORER_MAX_REQUEST_PIXELS": str(4 * 2048 * 2048),
    # Under the default (6 Mpx), over the 736x736 the tests' 512x512 images are read at: an image
    # read at the limit takes a few seconds on a loaded 2-core CPU, which the fuzzer allows.
    "SCORER_OCR_MAX_INPUT_PIXELS": str(1_500_000),
    "SCORER_MAX_BODY_BYTES": str(8 * 1024 * 1024),
    "SCORER_MAX_PROMPT_CHARS": "2000",
    # Batched detection, as on a GPU (the CPU default is 1 image per call, measured faster there).
    "SCORER_OCR_DET_BATCH": "8",
}


def peak_memory_reset(pid: int) -> int:
    """Reset the process's peak resident memory to its current value (Linux); returns it in kB."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return memory_kb(pid, "VmHWM")


def memory_kb(pid: int, field: str) -> int:
    """A field of the process's /proc status (VmRSS, VmHWM) in kB."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":")))


def timed_post(url: str, body: bytes) -> tuple[int, dict, float, int]:
    """A pickled request's status, answer, seconds and answer length."""
    started = time.perf_counter()
    response = requests.post(url + "/", data=body, timeout=120)
    return response.status_code, pickle.loads(response.content), time.perf_counter() - started, len(response.content)


def bounded(server: Server, send: Callable[[], T], max_growth_mb: float = 60) -> T:
    """``send()``'s answer, asserting the worker's peak memory grew by under ``max_growth_mb``
    and that it is the same worker after, answering /health."""
    workers = server.worker_pids()
    before = peak_memory_reset(workers[0])
    answer = send()
    grown_mb = (memory_kb(workers[0], "VmHWM") - before) / 1024
    assert grown_mb < max_growth_mb, f"the worker's peak memory grew by {grown_mb:.0f} MB"
    assert server.worker_pids() == workers
    assert requests.get(server.url + "/health", timeout=5).status_code == 200
    return answer


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything ``sock`` receives until the server closes it."""
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def score_request() -> bytes:
    """A pickled OCR request of one 256x256 image, scored 1.0 by a reader of its text."""
    return pickle.dumps({"images": [render_text("Hello", size=256)], "prompts": ['a sign that says "Hello"']})
