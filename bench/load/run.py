"""One OCR node under training load: many one-image requests at high concurrency, then the same
with a worker SIGKILLed every few seconds. Reports answered count, errors by status (or by
connection failure), p50/p99 latency, and any wrong score.

    .venv/bin/python -m bench.load.run [--requests 2000] [--concurrency 256] [--workers 2]
        [--kill-every 5] [--image-size 256]

The client does not retry: the figures show what a trainer's client sees before its own
retries. Every image shows the word its prompt asks for, so every 200 must score >= 0.9.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import percentile  # noqa: E402
from bench.ocr.run import one_image_bodies  # noqa: E402
from common.client import parse_answer  # noqa: E402
from tests.images import render_text  # noqa: E402
from tests.server import Server, gunicorn_server  # noqa: E402

WORDS = ["Open", "Bakery", "Garden", "Coffee", "Sale", "Hotel", "Museum", "Pizza"]


async def _load(url: str, bodies: list[bytes], concurrency: int) -> dict[str, Any]:
    """Send every body, ``concurrency`` in flight; count outcomes instead of raising."""
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    wrong = 0
    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=180)) as session:

        async def one(body: bytes) -> None:
            nonlocal wrong
            async with limit:
                started = time.perf_counter()
                try:
                    async with session.post(url + "/", data=body) as response:
                        content = await response.read()
                        outcome = str(response.status)
                        if response.status == 200:
                            score = parse_answer(content, response.headers.get("Content-Type", ""))["scores"][0]
                            wrong += score < 0.9
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    outcome = type(exc).__name__
                outcomes[outcome] += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(one(body) for body in bodies))
        wall = time.perf_counter() - started
    return {
        "requests": len(bodies),
        "answered_200": outcomes.get("200", 0),
        "errors": {key: count for key, count in sorted(outcomes.items()) if key != "200"},
        "wrong_scores": wrong,
        "wall_s": round(wall, 1),
        "per_s": round(len(bodies) / wall, 2),
        "p50_s": round(percentile(latencies, 50), 2),
        "p99_s": round(percentile(latencies, 99), 2),
    }


def kill_workers(server: Server, every: float, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL one random worker of ``server`` every ``every`` seconds until ``stop``."""
    while not stop.wait(every):
        pids = server.worker_pids()
        if pids:
            victim = random.choice(pids)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers of the node")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between worker kills")
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load.json")
    args = parser.parse_args()

    images = [render_text(word, size=args.image_size) for word in WORDS]
    picks = [i % len(WORDS) for i in range(args.requests)]
    bodies = one_image_bodies([images[i] for i in picks], [f'a sign that says "{WORDS[i]}"' for i in picks])
    results: dict[str, Any] = {"settings": vars(args) | {"out": str(args.out)}}
    with gunicorn_server("ocr", workers=args.workers) as server:
        print(f"steady: {args.requests} requests at concurrency {args.concurrency}", flush=True)
        results["steady"] = asyncio.run(_load(server.url, bodies, args.concurrency))
        print(json.dumps(results["steady"]), flush=True)

        print(f"chaos: the same with a worker SIGKILLed every {args.kill_every:g}s", flush=True)
        stop, killed = threading.Event(), []
        killer = threading.Thread(target=kill_workers, args=(server, args.kill_every, stop, killed))
        killer.start()
        try:
            results["chaos"] = asyncio.run(_load(server.url, bodies, args.concurrency))
        finally:
            stop.set()
            killer.join()
        results["chaos"]["workers_killed"] = len(killed)
        print(json.dumps(results["chaos"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
