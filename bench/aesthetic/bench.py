"""Aesthetic service throughput: 64 concurrent one-image requests (VeRL-Omni's traffic), three ways.

(a) in-process: the same model and preprocessing, no HTTP, at each batch size; the best one
    is the ceiling a server can approach;
(b) simple: the simplest server a user would write (``simple_server.py``: one sync worker,
    one forward pass per request);
(c) service: this repo's aesthetic service under gunicorn, batching across requests.

The CLIP is random (downloads are not possible here) but real-sized: ``--size b16`` (ViT-B/16)
on CPU, ``--size l14`` (ViT-L/14) on a GPU. After a sweep picks (a)'s best batch size, the
measured rounds take turns, (a) (b) (c) (a) (b) (c) ..., so that other load on a shared machine
weighs on the three alike. Run from the repo root:
``python -m bench.aesthetic.bench --size b16``; results go to ``bench/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import pickle
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import requests
from PIL import Image

from bench.common import (
    image_bench_arguments,
    print_profile,
    results_dir,
    service_under_gunicorn,
    simple_gunicorn,
    stage_profile,
    stage_totals,
    stop_on_sigterm,
)
from services.aesthetic.settings import DEFAULT_HEAD
from testing.images import decoded
from testing.random_clip import save_random_clip

ROOT = Path(__file__).resolve().parents[2]


def make_images(count: int, size: int) -> list[bytes]:
    """Distinct ``size``-square JPEGs at PIL's default quality (75), as trainers send them."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        base = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((size, size), Image.Resampling.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG")
        out.append(buffer.getvalue())
    return out


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_s": ordered[len(ordered) // 2],
        "p99_s": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


class InProcess:
    """(a): decode + CLIP preprocessing + forward, batch by batch, in this process."""

    def __init__(self, clip_dir: Path, images: list[bytes], args: argparse.Namespace) -> None:
        from services.aesthetic.model import AestheticModel

        self.model = AestheticModel(str(clip_dir), args.head, args.device, args.precision, micro_batch=1)
        self.images = images

    def round(self, batch_size: int) -> tuple[float, list[float]]:
        """Seconds for all images, and the latency of each batch."""
        self.model.micro_batch = batch_size
        latencies = []
        started = time.perf_counter()
        for start in range(0, len(self.images), batch_size):
            batch_started = time.perf_counter()
            chunk = [decoded(data) for data in self.images[start : start + batch_size]]
            self.model.raw_scores(self.model.preprocess(chunk))  # ``tolist`` synchronises the GPU
            latencies.append(time.perf_counter() - batch_started)
        return time.perf_counter() - started, latencies

    def forward_only(self, batch_size: int) -> float:
        """Images/s of the model alone, tensors ready: the ceiling of any server."""
        self.model.micro_batch = batch_size
        pixels = self.model.preprocess([decoded(data) for data in self.images])
        started = time.perf_counter()
        self.model.raw_scores(pixels)
        return len(self.images) / (time.perf_counter() - started)

    def sweep(self, batch_sizes: list[int]) -> dict[int, float]:
        """Images/s at each batch size (one warm-up round, one measured)."""
        rates = {}
        for batch_size in batch_sizes:
            self.round(batch_size)
            seconds, _ = self.round(batch_size)
            rates[batch_size] = len(self.images) / seconds
            print(f"  in-process batch {batch_size:3d}: {rates[batch_size]:.2f} images/s", flush=True)
        return rates


async def one_round(url: str, images: list[bytes]) -> tuple[float, list[float]]:
    """All images at once, one per request (asyncio.gather, as VeRL-Omni sends them)."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def post(data: bytes) -> float:
            started = time.perf_counter()
            async with session.post(url, data=pickle.dumps({"images": [data], "prompts": [""]})) as response:
                body = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{response.status}: {body[:300]!r}")
                pickle.loads(body)
            return time.perf_counter() - started

        started = time.perf_counter()
        latencies = await asyncio.gather(*(post(data) for data in images))
        return time.perf_counter() - started, list(latencies)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(argv: list[str], env: dict[str, str], port: int, log: Path) -> subprocess.Popen:
    """Start a server and wait until it answers (``/ready`` or, for the baseline, a connection)."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{argv[2:]} exited:\n{log.read_text()[-3000:]}")
        try:
            status = requests.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code
            if status in (200, 404, 405):  # 404/405: the baseline has no /ready; it answers once loaded
                return process
        except requests.RequestException:
            pass
        time.sleep(0.5)
    stop(process)
    raise TimeoutError(f"{argv[2:]} did not start:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def summarize(seconds: list[float], latencies: list[float], count: int) -> dict[str, float]:
    return {"images_per_s": statistics.median(count / s for s in seconds), **percentiles(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "b16", "l14"], default="b16", help="random CLIP vision tower")
    parser.add_argument("--clip", help="an existing CLIP directory instead of a random one")
    parser.add_argument("--head", default=str(DEFAULT_HEAD))
    image_bench_arguments(parser, precision="float16", requests=64, batch_sizes=[1, 8, 16, 32])
    parser.add_argument("--micro-batch", type=int, help="the service's micro-batch (default: (a)'s best batch size)")
    args = parser.parse_args()
    stop_on_sigterm()

    logs = results_dir()
    images = make_images(args.requests, args.image_size)
    with tempfile.TemporaryDirectory(prefix="aesthetic-bench-") as tmp:
        clip_dir = Path(args.clip) if args.clip else save_random_clip(Path(tmp) / "clip", size=args.size)
        print(f"CLIP {args.clip or 'random ' + args.size} on {args.device}; {args.requests} concurrent requests")
        in_process = InProcess(clip_dir, images, args)
        sweep = in_process.sweep(args.batch_sizes)
        best_batch = max(sweep, key=sweep.__getitem__)

        simple_port, service_port = free_port(), free_port()
        simple_env = {"CLIP_DIR": str(clip_dir), "HEAD_PATH": args.head, "DEVICE": args.device}
        simple_env["PRECISION"] = args.precision
        simple_argv = simple_gunicorn(simple_port, "bench.aesthetic.simple_server:app")
        settings = {
            "SCORER_AESTHETIC_CLIP": str(clip_dir),
            "SCORER_AESTHETIC_HEAD": args.head,
            "SCORER_AESTHETIC_PRECISION": args.precision,
            "SCORER_AESTHETIC_MICRO_BATCH": str(args.micro_batch or best_batch),
        }
        service_argv, service_env = service_under_gunicorn("aesthetic", service_port, args.device, settings)
        servers = []
        try:
            servers.append(serve(simple_argv, simple_env, simple_port, logs / "aesthetic-simple.log"))
            servers.append(serve(service_argv, service_env, service_port, logs / "aesthetic-service.log"))
            urls = {"simple": f"http://127.0.0.1:{simple_port}/", "service": f"http://127.0.0.1:{service_port}/"}
            for url in urls.values():  # warm-up rounds
                asyncio.run(one_round(url, images))
            profiles: list[dict[str, dict[str, float]]] = []
            runs: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ("in_process", *urls)}
            for index in range(args.rounds):
                for name, (seconds, latencies) in runs.items():
                    if name == "in_process":
                        took, round_latencies = in_process.round(best_batch)
                    else:
                        before = stage_totals(urls["service"])
                        took, round_latencies = asyncio.run(one_round(urls[name], images))
                        if name == "service":
                            profiles.append(stage_profile(before, stage_totals(urls["service"]), len(images)))
                    seconds.append(took)
                    latencies.extend(round_latencies)
                    print(f"  round {index + 1} {name}: {len(images) / took:.2f} images/s", flush=True)
        finally:
            for process in servers:
                stop(process)
        results = {name: summarize(seconds, latencies, len(images)) for name, (seconds, latencies) in runs.items()}
        results["in_process"].update(
            best_batch=best_batch, sweep=sweep, forward_only_images_per_s=in_process.forward_only(best_batch)
        )

    a, b, c = results["in_process"], results["simple"], results["service"]
    summary = {
        "config": {k: str(v) for k, v in vars(args).items() if k != "head"},
        "results": results,
        "service_vs_in_process": c["images_per_s"] / a["images_per_s"],
        "service_vs_simple": c["images_per_s"] / b["images_per_s"],
        "service_profiles": profiles,
    }
    out = args.out or logs / f"aesthetic-{args.size}-{args.device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(summary, indent=2))
    print("\n| run | images/s | p50 s | p99 s |\n|---|---|---|---|")
    rows = [(f"(a) in-process, batch {a['best_batch']} (latency per batch)", a), ("(b) simple server", b)]
    for label, r in [*rows, ("(c) aesthetic service", c)]:
        print(f"| {label} | {r['images_per_s']:.2f} | {r['p50_s']:.3f} | {r['p99_s']:.3f} |")
    print_profile("where the service's requests spent their time (the last round)", profiles[-1])
    print(
        f"\nservice / in-process = {summary['service_vs_in_process']:.3f}; "
        f"service / simple = {summary['service_vs_simple']:.2f}; model alone at batch {a['best_batch']}: "
        f"{a['forward_only_images_per_s']:.2f} images/s  ({out})"
    )


if __name__ == "__main__":
    main()
