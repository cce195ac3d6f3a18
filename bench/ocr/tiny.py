"""What a tiny image costs a worker (issue 26): requests of a few hundred bytes whose images the
OCR engine enlarges to its detector size (a 50x1 PNG is read at 2944x736), against the OCR
service and the multi service (OCR, PickScore and the aesthetic score on tiny models), each
with its default settings. For each case: the answer's status, how long the worker was held
(the request's wall time), and the worker's resident memory (``/proc/<pid>/status``, not the
client's) before, right after the answer, and 5 s later, idle.

- ``repeated``: a 527-byte body, one 50x1 PNG referenced 100 times (the pickle's memo);
- ``distinct``: 20 distinct 50x1 PNGs (1.6 KB);
- ``multi``: three ``repeated`` bodies at once to the multi service, OCR alone (``/?ocr=1``).

    .venv/bin/python -m bench.ocr.tiny [--cases repeated,distinct,multi]
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from testing.multi import multi_server  # noqa: E402
from testing.server import Server, gunicorn_server  # noqa: E402

PROMPT = 'a sign that says "Open"'


def thin_png(seed: int = 0) -> bytes:
    """A 50x1 PNG (about 70 bytes); ``seed`` makes distinct ones."""
    image = Image.new("RGB", (50, 1), (seed % 256, (seed * 7) % 256, 255))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def repeated_body() -> bytes:
    png = thin_png()
    return pickle.dumps({"images": [png] * 100, "prompts": [PROMPT] * 100})


def distinct_body() -> bytes:
    return pickle.dumps({"images": [thin_png(seed) for seed in range(20)], "prompts": [PROMPT] * 20})


def rss_mb(pid: int) -> float:
    """The process's resident memory, in MB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


def worker_pid(server: Server) -> int:
    return requests.get(server.url + "/health", timeout=10).json()["pid"]


def measure(server: Server, bodies: list[bytes], path: str = "/") -> dict[str, Any]:
    """Send ``bodies`` at once to ``path``; the statuses, the wall time and the worker's memory."""
    pid = worker_pid(server)
    before = rss_mb(pid)

    def send(body: bytes) -> int:
        return requests.post(server.url + path, data=body, timeout=300).status_code

    started = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as pool:
        statuses = list(pool.map(send, bodies))
    held = time.perf_counter() - started
    after = rss_mb(pid)
    time.sleep(5)
    return {
        "body_bytes": [len(body) for body in bodies],
        "statuses": statuses,
        "held_s": round(held, 2),
        "rss_before_mb": before,
        "rss_after_mb": after,
        "rss_idle_5s_mb": rss_mb(pid),
        "same_worker": worker_pid(server) == pid,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ocr.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="repeated,distinct,multi")
    args = parser.parse_args()
    cases = args.cases.split(",")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch)
        if {"repeated", "distinct"} & set(cases):
            with gunicorn_server("ocr", {"SCORER_DEVICE": "cpu"}, log_dir=logs) as server:
                if "repeated" in cases:
                    results["repeated"] = measure(server, [repeated_body()])
                if "distinct" in cases:
                    results["distinct"] = measure(server, [distinct_body()])
        if "multi" in cases:
            with multi_server(["ocr", "pickscore", "aesthetic"], logs / "models", log_dir=logs) as server:
                results["multi"] = measure(server, [repeated_body()] * 3, "/?ocr=1")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
