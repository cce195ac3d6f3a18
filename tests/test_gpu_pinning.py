"""One worker per visible GPU, each pinned, and a replacement worker gets the dead one's GPU.

No GPU here: the pinning logic runs all the same from ``CUDA_VISIBLE_DEVICES``; the workers then
fail to get ONNX Runtime's CUDA provider, which must show as a clear reason on /ready.
"""

from __future__ import annotations

import os
import signal
import time

import requests

from tests.server import gunicorn_server


def gpus_seen(url: str, tries: int = 60) -> dict[int, str]:
    """pid -> pinned GPU, from /info answers spread over the workers by the kernel."""
    seen: dict[int, str] = {}
    for _ in range(tries):
        info = requests.get(url + "/info", timeout=10, headers={"Connection": "close"}).json()
        seen[info["pid"]] = info["gpu"]
    return seen


def test_workers_are_pinned_one_per_gpu_and_replacements_reuse_it(tmp_path) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "3,5", "SCORER_WORKERS": ""}
    with gunicorn_server("ocr", env, require_ready=False, log_dir=tmp_path) as server:
        deadline = time.monotonic() + 30
        while len(server.worker_pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = server.worker_pids()
        assert len(pids) == 2  # one per visible GPU, without SCORER_WORKERS
        seen = gpus_seen(server.url)
        assert sorted(seen.values()) == ["3", "5"] and set(seen) == set(pids)
        ready = requests.get(server.url + "/ready", timeout=10).json()
        assert ready["ready"] is False and "CUDA provider" in ready["reason"]

        victim = next(pid for pid, gpu in seen.items() if gpu == "5")
        os.kill(victim, signal.SIGKILL)
        while (
            set(server.worker_pids()) == set(pids) or len(server.worker_pids()) < 2
        ) and time.monotonic() < deadline + 30:
            time.sleep(0.2)
        after = gpus_seen(server.url)
        assert victim not in after
        assert sorted(after.values()) == ["3", "5"]
