"""Shared bench helpers: a concurrent one-request-per-sample load and its statistics."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

# gunicorn reads ./gunicorn.conf.py unless told otherwise: a baseline server started from the
# repository root would get this service's settings (128 threads turn ``-k sync`` into gthread,
# post_fork hides the GPU). Baselines start with an empty configuration instead.
NO_CONFIG = ["-c", "/dev/null"]
ROOT = Path(__file__).resolve().parent.parent


def image_bench_arguments(
    parser: argparse.ArgumentParser, precision: str, requests: int, batch_sizes: list[int]
) -> None:
    """The flags the image benches share: the device and precision, the load (concurrent
    one-image requests, measured rounds, the images' size), the in-process batch sizes swept and
    the JSON written; a bench adds its model's own."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default=precision, choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--requests", type=int, default=requests, help="concurrent one-image requests per round")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of each (after a warm-up)")
    parser.add_argument("--image-size", type=int, default=512)
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=batch_sizes)
    parser.add_argument("--out", type=Path, help="the JSON file (default: a dated one in bench/results/)")


def results_dir() -> Path:
    """``bench/results/``, where the benches write their figures and their servers' logs."""
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    return results


def service_under_gunicorn(service: str, port: int, device: str, settings: dict[str, str]) -> tuple[list[str], dict]:
    """The command and environment of ``service`` as ``run.sh`` serves it: one worker on
    ``127.0.0.1:port`` on ``device``, with ``settings`` (its own ``SCORER_<SERVICE>_*``, core ones)."""
    env = {
        "SCORER_SERVICE": service,
        "SCORER_BIND": f"127.0.0.1:{port}",
        "SCORER_WORKERS": "1",
        "SCORER_DEVICE": device,
        **settings,
    }
    return [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")], env


def simple_gunicorn(port: int, app: str) -> list[str]:
    """The command of a baseline server: ``app`` under gunicorn with one sync worker (a slow
    model call may take its time: 600 s), on ``127.0.0.1:port``, importable from the repository."""
    worker = ["-w", "1", "-k", "sync", "-t", "600", "-b", f"127.0.0.1:{port}"]
    return [sys.executable, "-m", "gunicorn", *NO_CONFIG, *worker, "--pythonpath", str(ROOT), app]


def pickle_image_app(score: Callable[[list[Any], list[str]], list[float]]) -> Any:
    """The baseline servers' request handling, the way a user's first server does it: a Flask app
    whose ``POST /`` takes a pickled ``{"images": [bytes], "prompts": [str]}``, opens the images
    with PIL, calls ``score(images, prompts)`` under ``torch.no_grad`` and answers the pickled
    ``{"scores", "outputs"}``. Trusted benchmark traffic only: a real server must not unpickle
    network bodies."""
    import io
    import pickle

    import torch
    from flask import Flask, Response, request
    from PIL import Image

    app = Flask(__name__)

    @app.post("/")
    def answer() -> Response:
        payload = pickle.loads(request.get_data())
        images = [Image.open(io.BytesIO(data)).convert("RGB") for data in payload["images"]]
        with torch.no_grad():
            scores = score(images, payload["prompts"])
        return Response(pickle.dumps({"scores": scores, "outputs": scores}), mimetype="application/octet-stream")

    return app


def stop_on_sigterm() -> None:
    """Turn SIGTERM (``timeout`` in bench/gpu/check.sh) into an exit through the context managers
    and ``finally`` blocks, so the servers a bench started (in their own sessions) stop with it."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def _burst(url: str, bodies: Sequence[bytes], headers: dict[str, str], concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def one(body: bytes) -> tuple[bytes, tuple[float, float]]:
            async with limit:
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    content = await response.read()
                    statuses[response.status] = statuses.get(response.status, 0) + 1
                ended = time.perf_counter()
                latencies.append(ended - started)
                return content, (started, ended)

        started = time.perf_counter()
        answered = await asyncio.gather(*(one(body) for body in bodies))
        wall = time.perf_counter() - started
    return {
        "answers": [content for content, _ in answered],
        # (sent, answered) of each body, in order, on ``time.perf_counter``'s clock.
        "spans": [span for _, span in answered],
        "sent_bytes": sum(len(body) for body in bodies),
        "wall_s": wall,
        "per_s": len(bodies) / wall,
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "latencies": latencies,
        "statuses": statuses,
    }


def burst(
    url: str, bodies: Sequence[bytes], headers: dict[str, str] | None = None, concurrency: int | None = None
) -> dict[str, Any]:
    """Send every body at once (up to ``concurrency`` in flight); throughput and latencies."""
    return asyncio.run(_burst(url, bodies, headers or {}, concurrency or len(bodies)))


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def median_of(rounds: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


class ProcessServer:
    """A server command run as a subprocess until its URL answers; stopped on exit."""

    def __init__(self, command: Sequence[str], url: str, probe: str = "/", env: dict[str, str] | None = None) -> None:
        import os
        import subprocess

        self.url = url
        self.process = subprocess.Popen(
            list(command), env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        import requests

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                requests.get(url + probe, timeout=2)
                return
            except requests.RequestException:  # not listening yet, or still loading
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{command} did not answer on {url}")

    def __enter__(self) -> ProcessServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def stage_totals(url: str) -> dict[str, float]:
    """A service's stage metrics now (``common.pipeline.metrics.Stages``): per stage its requests'
    wall seconds, their count and their threads' CPU seconds, and the model calls' seconds."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    text = requests.get(url.rstrip("/") + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            stage = sample.labels.get("stage")
            if stage is None:
                continue
            if sample.name in ("scorer_stage_seconds_sum", "scorer_stage_seconds_count"):
                key = f"{stage}:{sample.name.rsplit('_', 1)[1]}"
            elif sample.name == "scorer_stage_cpu_seconds_total":
                key = f"{stage}:cpu"
            elif sample.name == "scorer_batch_seconds_sum":
                key = f"model {stage}:sum"
            else:
                continue
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def stage_profile(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, dict[str, float]]:
    """Where the requests between two ``stage_totals`` spent their time: per stage, the mean wall
    and CPU milliseconds per request (a model stage: its calls' seconds per request)."""
    path = ("arrival", "parse", "ready", "decode_wait", "decode", "score", "answer")
    stages = sorted(
        {key.rsplit(":", 1)[0] for key in after}, key=lambda s: (s not in path, path.index(s) if s in path else 0, s)
    )
    profile = {}
    for stage in stages:

        def spent(kind: str, stage: str = stage) -> float:
            return after.get(f"{stage}:{kind}", 0.0) - before.get(f"{stage}:{kind}", 0.0)

        profile[stage] = {"wall_ms": 1000 * spent("sum") / requests, "cpu_ms": 1000 * spent("cpu") / requests}
    return profile


def print_profile(title: str, profile: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}: milliseconds per request (wall, the request thread's CPU)")
    print("| stage | wall ms | CPU ms |\n|---|---|---|")
    for stage, spent in profile.items():
        cpu = "" if stage.startswith("model") else f"{spent['cpu_ms']:.2f}"
        print(f"| {stage} | {spent['wall_ms']:.2f} | {cpu} |")


def write_report(args: Any, run: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """``run(args)``, stopped cleanly by SIGTERM, its report written to ``args.out`` as JSON."""
    import json

    stop_on_sigterm()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = run(args)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report
