"""One OCR node under training load: many one-image requests at high concurrency, then the same
with a worker SIGKILLed every few seconds. Reports answered count, errors by status (or by
connection failure), p50/p99 latency, and any wrong score.

    .venv/bin/python -m bench.load.run [--requests 2000] [--concurrency 256] [--workers 2]
        [--kill-every 5] [--image-size 256]

The client retries a failed attempt like flow_grpo's does (``--retries``, 0 for none); each
phase reports the first attempts' outcomes (what a client without retries sees) and the final ones.
Every image shows the word its prompt asks for, so every 200 must score >= 0.9.
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


async def _load(url: str, bodies: list[bytes], concurrency: int, retries: int = 0) -> dict[str, Any]:
    """Send every body, ``concurrency`` in flight; count outcomes instead of raising.

    With ``retries``, a request whose attempt failed (connection lost, 5xx) is sent again after
    a doubling backoff (0.5 s, capped at 8 s), as flow_grpo's and VeRL-Omni's clients do; the
    first attempt's outcome and the final one are both counted.
    """
    first: Counter[str] = Counter()
    final: Counter[str] = Counter()
    latencies: list[float] = []
    attempts_made: Counter[int] = Counter()
    wrong = 0
    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=180)) as session:

        async def attempt(body: bytes) -> str:
            nonlocal wrong
            try:
                async with session.post(url + "/", data=body) as response:
                    content = await response.read()
                    if response.status == 200:
                        score = parse_answer(content, response.headers.get("Content-Type", ""))["scores"][0]
                        wrong += score < 0.9
                    return str(response.status)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return type(exc).__name__

        async def one(body: bytes) -> None:
            async with limit:
                started = time.perf_counter()
                for number in range(retries + 1):
                    outcome = await attempt(body)
                    if number == 0:
                        first[outcome] += 1
                    if outcome == "200" or (outcome.isdigit() and int(outcome) < 500) or number == retries:
                        break
                    await asyncio.sleep(min(8.0, 0.5 * 2**number))
                final[outcome] += 1
                attempts_made[number + 1] += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(one(body) for body in bodies))
        wall = time.perf_counter() - started
    result = {
        "requests": len(bodies),
        "answered_200": final.get("200", 0),
        "errors": {key: count for key, count in sorted(final.items()) if key != "200"},
        "wrong_scores": wrong,
        "wall_s": round(wall, 1),
        "per_s": round(len(bodies) / wall, 2),
        "p50_s": round(percentile(latencies, 50), 2),
        "p99_s": round(percentile(latencies, 99), 2),
    }
    if retries:
        result["first_attempt"] = dict(sorted(first.items()))
        result["attempts"] = dict(sorted(attempts_made.items()))
    return result


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
    parser.add_argument("--retries", type=int, default=20, help="client retries of a failed attempt (0: none)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load.json")
    args = parser.parse_args()

    images = [render_text(word, size=args.image_size) for word in WORDS]
    picks = [i % len(WORDS) for i in range(args.requests)]
    bodies = one_image_bodies([images[i] for i in picks], [f'a sign that says "{WORDS[i]}"' for i in picks])
    results: dict[str, Any] = {"settings": vars(args) | {"out": str(args.out)}}
    # Workers share the node's cores: one ONNX thread each rather than oversubscribing them.
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    with gunicorn_server("ocr", {"SCORER_OCR_ONNX_THREADS": str(threads)}, workers=args.workers) as server:
        print(f"steady: {args.requests} requests at concurrency {args.concurrency}", flush=True)
        results["steady"] = asyncio.run(_load(server.url, bodies, args.concurrency, args.retries))
        print(json.dumps(results["steady"]), flush=True)

        print(f"chaos: the same with a worker SIGKILLed every {args.kill_every:g}s", flush=True)
        stop, killed = threading.Event(), []
        killer = threading.Thread(target=kill_workers, args=(server, args.kill_every, stop, killed))
        killer.start()
        try:
            results["chaos"] = asyncio.run(_load(server.url, bodies, args.concurrency, args.retries))
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
