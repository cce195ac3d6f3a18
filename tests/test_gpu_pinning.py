"""One worker per visible GPU, each pinned, and a replacement worker gets the dead one's GPU.

No GPU here: the pinning logic runs all the same from ``CUDA_VISIBLE_DEVICES``; the workers then
find no CUDA GPU for the OCR engine (torch, the default on a GPU), which must show as a clear
reason on /ready.
"""

from __future__ import annotations

import os
import signal
import time

import requests

from testing.clock import wait_until
from testing.server import Server, gunicorn_server


def gpus_seen(server: Server, timeout: float = 60.0) -> dict[int, str]:
    """pid -> pinned GPU of every live worker, asking /info until each has answered (the
    kernel spreads new connections over the workers; a new worker answers once booted)."""
    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = requests.get(server.url + "/info", timeout=10, headers={"Connection": "close"}).json()
        seen[info["pid"]] = info["gpu"]
        live = set(server.worker_pids())
        if len(live) == 2 and live <= set(seen):
            return {pid: gpu for pid, gpu in seen.items() if pid in live}
    raise AssertionError(f"not every worker answered: seen {seen}, live {server.worker_pids()}")


def test_workers_are_pinned_one_per_gpu_and_replacements_reuse_it(tmp_path) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "3,5", "SCORER_WORKERS": ""}
    with gunicorn_server("ocr", env, require_ready=False, log_dir=tmp_path) as server:
        wait_until(lambda: len(server.worker_pids()) >= 2, "two workers")
        pids = server.worker_pids()
        assert len(pids) == 2  # one per visible GPU, without SCORER_WORKERS
        seen = gpus_seen(server)
        assert sorted(seen.values()) == ["3", "5"] and set(seen) == set(pids)
        ready = server.settled_ready(tries=100, pause=0.3).json()  # setup runs in the background
        assert ready["ready"] is False and "sees no CUDA GPU" in ready["reason"]

        victim = next(pid for pid, gpu in seen.items() if gpu == "5")
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: set(server.worker_pids()) != set(pids) and len(server.worker_pids()) == 2, "a replacement")
        after = gpus_seen(server)
        assert victim not in after
        assert sorted(after.values()) == ["3", "5"]
