"""One OCR node under training load, through the client semantics of VeRL-Omni: one request per
image, 256 in flight, each retried by the clients' one policy (``common.sdk.retry``: each attempt
given 120 s, two retries, after 0.5 s and 1 s, of a dropped connection, a timeout, 408, 429 or
5xx). Three scenarios on the same node:

- steady: the node as it is;
- chaos: a worker SIGKILLed every ``--kill-every`` seconds (gunicorn starts a replacement);
- slow: ``--slow-connections`` connections held open with a partial head all along (each is
  answered 408 at its head deadline and opened again at once).

Each reports lost requests (no 200 after the retries), wrong scores (every image shows the
word its prompt asks for, so a 200 below 0.9 is wrong), p50/p99/max latency of a request
(retries included), throughput and the first attempts' outcomes.

    .venv/bin/python -m bench.load.run [--requests 2000] [--concurrency 256] [--workers 2]
        [--scenarios steady,chaos,slow] [--kill-every 30] [--slow-connections 300] [--image-size 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
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
from common.sdk.client import parse_answer  # noqa: E402
from common.sdk.retry import RetryPolicy, post_async  # noqa: E402
from testing.images import render_text  # noqa: E402
from testing.server import Server, gunicorn_server  # noqa: E402

WORDS = ["Open", "Bakery", "Garden", "Coffee", "Sale", "Hotel", "Museum", "Pizza"]
PARTIAL_HEAD = b"POST / HTTP/1.1\r\nHost: scorer\r\nContent-Type: application/octet-stream\r\n"


async def _load(url: str, bodies: list[bytes], concurrency: int, policy: RetryPolicy) -> dict[str, Any]:
    """Send every body to ``url`` as a trainer gives it (a path, a query: ``http://node:18100/?ocr=1``),
    ``concurrency`` requests in flight, each retried by ``policy`` (the clients' own,
    ``common.sdk.retry``); count outcomes instead of raising."""
    first: Counter[str] = Counter()
    final: Counter[str] = Counter()
    attempts_made: Counter[int] = Counter()
    latencies: list[float] = []
    messages: dict[str, str] = {}  # one error message per status, to say why
    wrong = 0
    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(body: bytes) -> None:
            nonlocal wrong
            outcomes: list[str] = []
            async with limit:
                started = time.perf_counter()
                try:
                    answer = await post_async(session, url, body, policy, observe=outcomes.append)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass  # its outcome observed
                else:
                    parsed = parse_answer(answer.body, answer.content_type)
                    if answer.status == 200:
                        wrong += parsed["scores"][0] < 0.9
                    else:
                        messages.setdefault(str(answer.status), str(parsed.get("error")))
                first[outcomes[0]] += 1
                final[outcomes[-1]] += 1
                attempts_made[len(outcomes)] += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(one(body) for body in bodies))
        wall = time.perf_counter() - started
    return {
        "requests": len(bodies),
        "answered_200": final.get("200", 0),
        "lost": sum(count for key, count in final.items() if key != "200"),
        "lost_by_outcome": {key: count for key, count in sorted(final.items()) if key != "200"},
        "wrong_scores": wrong,
        "wall_s": round(wall, 1),
        "per_s": round(len(bodies) / wall, 2),
        "p50_s": round(percentile(latencies, 50), 2),
        "p99_s": round(percentile(latencies, 99), 2),
        "max_s": round(max(latencies), 2),
        "first_attempt": dict(sorted(first.items())),
        "attempts": dict(sorted(attempts_made.items())),
        "error_messages": messages,
    }


def kill_workers(server: Server, every: float, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL one random worker of ``server`` every ``every`` seconds until ``stop``."""
    while not stop.wait(every):
        pids = server.worker_pids()
        if pids:
            victim = random.choice(pids)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)


async def hold_slow_connections(port: int, count: int, stop: asyncio.Event, answers: Counter[str]) -> None:
    """Keep ``count`` connections open with a partial head until ``stop``; each one the server
    closes is opened again at once. ``answers`` counts the first line of what the server said."""

    async def holder() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                answers["connect failed"] += 1
                await asyncio.sleep(0.5)
                continue
            writer.write(PARTIAL_HEAD)
            try:
                read = asyncio.ensure_future(reader.read())
                stopped = asyncio.ensure_future(stop.wait())
                done, _ = await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if read in done:
                    answers[read.result().split(b"\r\n", 1)[0].decode(errors="replace") or "closed silently"] += 1
                else:
                    read.cancel()
                stopped.cancel()
            except OSError as exc:
                answers[type(exc).__name__] += 1
            finally:
                writer.close()

    await asyncio.gather(*(holder() for _ in range(count)))


async def _load_with_slow_clients(
    server: Server, bodies: list[bytes], concurrency: int, policy: RetryPolicy, slow: int
) -> dict[str, Any]:
    stop, answers = asyncio.Event(), Counter()
    holders = asyncio.ensure_future(hold_slow_connections(server.port, slow, stop, answers))
    await asyncio.sleep(2)  # all held before the load starts
    try:
        result = await _load(server.url + "/", bodies, concurrency, policy)
    finally:
        stop.set()
        await holders
    return result | {"slow_connections": slow, "slow_answers": dict(answers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers of the node")
    parser.add_argument("--scenarios", default="steady,chaos,slow")
    parser.add_argument("--kill-every", type=float, default=30.0, help="chaos: seconds between worker kills")
    parser.add_argument("--slow-connections", type=int, default=300)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load.json")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))

    images = [render_text(word, size=args.image_size) for word in WORDS]
    picks = [i % len(WORDS) for i in range(args.requests)]
    bodies = one_image_bodies([images[i] for i in picks], [f'a sign that says "{WORDS[i]}"' for i in picks])
    policy = RetryPolicy()  # VeRL-Omni's own: two retries after 0.5 s, doubling, 120 s an attempt
    results: dict[str, Any] = {"settings": vars(args) | {"out": str(args.out)}, "client": vars(policy)}
    # Workers share the node's cores: one ONNX thread each rather than oversubscribing them.
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    env = {"SCORER_OCR_ONNX_THREADS": str(threads)}
    with gunicorn_server("ocr", env, workers=args.workers) as server:
        for scenario in args.scenarios.split(","):
            print(f"{scenario}: {args.requests} requests at concurrency {args.concurrency}", flush=True)
            load_before = os.getloadavg()[0]  # the machine is shared: how busy it was
            if scenario == "steady":
                result = asyncio.run(_load(server.url + "/", bodies, args.concurrency, policy))
            elif scenario == "chaos":
                stop, killed = threading.Event(), []
                killer = threading.Thread(target=kill_workers, args=(server, args.kill_every, stop, killed))
                killer.start()
                try:
                    result = asyncio.run(_load(server.url + "/", bodies, args.concurrency, policy))
                finally:
                    stop.set()
                    killer.join()
                result["workers_killed"] = len(killed)
                server.wait_ready()  # the last replacement is up before the next scenario
            elif scenario == "slow":
                slow = args.slow_connections
                result = asyncio.run(_load_with_slow_clients(server, bodies, args.concurrency, policy, slow))
            else:
                raise SystemExit(f"unknown scenario {scenario!r}")
            result["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
            results[scenario] = result
            print(json.dumps(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
