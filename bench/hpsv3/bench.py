"""HPSv3 service throughput: concurrent one-image requests, four ways, on one random HPSv3.

(a) locked: in this process, each sample's reward call takes one global lock and runs a batch of
    one, from as many threads as there are samples: how VeRL-Omni's ``hpsv3_reward`` runs it;
(b) in-process at its best batch: batches of a sweep, one after the other, no HTTP: the
    ceiling a server can approach;
(c) simple: the simplest server (``simple_server.py``: one sync worker, one forward pass per
    request);
(d) service: this repo's hpsv3 service under gunicorn, batching across requests.

(a) and (b) run the service's own input building and model code (equal to HPSv3's inference
within 6e-8 in float32, tests/test_hpsv3.py), so the four differ in how they are served only.
The model is random (downloads are not possible here): ``--size tiny`` on a CPU, ``7b``
(Qwen2-VL-7B's real size, built on the GPU in bfloat16 and saved as the released checkpoint is)
on a GPU. Run from the repo root: ``python -m bench.hpsv3.bench --size tiny``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.aesthetic.bench import free_port, make_images, percentiles, serve, stop
from bench.clip.bench import PROMPTS, bodies
from bench.common import (
    burst,
    image_bench_arguments,
    results_dir,
    service_under_gunicorn,
    simple_gunicorn,
    stop_on_sigterm,
)
from common.configuration.settings import CoreSettings
from services.hpsv3.scorer import HPSv3Scorer
from testing.qwen2vl_models import reward_model_state, save_base, save_checkpoint

# The tiny BPE of the test model spells HPSv3's instruction in ~1,400 tokens (Qwen2's: ~300).
MAX_TOKENS = "8192"


class InProcess:
    """(a) and (b): the scorer's ``decode`` and ``score`` in this process."""

    def __init__(self, settings: dict[str, str], device: str) -> None:
        os.environ.update(settings)
        self.scorer = HPSv3Scorer(CoreSettings(service="hpsv3", max_pixels=1 << 30))
        self.scorer.setup(device)
        self.lock = threading.Lock()

    def _one(self, image: bytes, prompt: str) -> tuple[float, float]:
        """One sample as VeRL-Omni's reward scores it: its input built and scored under the lock."""
        started = time.perf_counter()
        with self.lock:
            score = self.scorer.score(self.scorer.prepare({"images": [image], "prompts": [prompt]}))[0].score
        return score, time.perf_counter() - started

    def locked(self, images: list[bytes], prompts: list[str]) -> tuple[float, list[float], list[float]]:
        """Seconds for all samples, each sample's latency, the scores."""
        started = time.perf_counter()
        with ThreadPoolExecutor(len(images)) as pool:
            results = list(pool.map(self._one, images, prompts))
        return time.perf_counter() - started, [r[1] for r in results], [r[0] for r in results]

    def batched(
        self, images: list[bytes], prompts: list[str], batch_size: int
    ) -> tuple[float, list[float], list[float]]:
        """Seconds for all samples in batches of ``batch_size``, each batch's latency, the scores."""
        latencies, scores = [], []
        started = time.perf_counter()
        for start in range(0, len(images), batch_size):
            batch_started = time.perf_counter()
            chunk = slice(start, start + batch_size)
            items = self.scorer.prepare({"images": images[chunk], "prompts": prompts[chunk]})
            scores.extend(result.score for result in self.scorer.score(items))
            latencies.append(time.perf_counter() - batch_started)
        return time.perf_counter() - started, latencies, scores


def save_model(directory: Path, size: str, device: str) -> tuple[Path, Path]:
    """(checkpoint, base) of a random HPSv3 of ``size``; the 7B one is built on ``device``."""
    base = save_base(directory / "base", size)
    state = reward_model_state(base, init_std=0.1 if size == "tiny" else 0.02, device=device)
    checkpoint = save_checkpoint(directory / "model", base, "old", state=state)
    del state
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
    return checkpoint, base


def scratch_dir(size: str) -> str | None:
    """Where the checkpoint is written: /dev/shm for the 7B one when it has room (memory speed:
    the GPU step's time goes to loading, not to the disk), else the default temporary directory."""
    if size == "7b" and Path("/dev/shm").is_dir() and shutil.disk_usage("/dev/shm").free > 24 * 2**30:
        return "/dev/shm"
    return None


def measure(
    in_process: InProcess,
    best_batch: int,
    images: list[bytes],
    prompts: list[str],
    rounds: int,
    simple_port: int,
    service_port: int,
) -> tuple[dict[str, tuple[list[float], list[float]]], dict[str, float]]:
    """Rounds of the four in turn: seconds and latencies of each, and its largest score
    difference from the in-process batch-1 scores."""
    urls = {"simple": f"http://127.0.0.1:{simple_port}/", "service": f"http://127.0.0.1:{service_port}/"}
    requests_of = bodies(images, prompts)
    for url in urls.values():  # warm-up rounds
        burst(url, requests_of)
    runs: dict[str, tuple[list[float], list[float]]] = {
        name: ([], []) for name in ("locked", "in_process", "simple", "service")
    }
    differences: dict[str, float] = {}
    for index in range(rounds):
        _, _, expected = in_process.batched(images, prompts, 1)
        for name, (seconds, latencies) in runs.items():
            if name == "locked":
                took, round_latencies, scores = in_process.locked(images, prompts)
            elif name == "in_process":
                took, round_latencies, scores = in_process.batched(images, prompts, best_batch)
            else:
                result = burst(urls[name], requests_of)
                if result["statuses"] != {200: len(requests_of)}:
                    raise RuntimeError(f"{name}: statuses {result['statuses']}")
                took, round_latencies = result["wall_s"], result["latencies"]
                scores = [pickle.loads(answer)["scores"][0] for answer in result["answers"]]
            difference = max(abs(a - b) for a, b in zip(scores, expected))
            differences[name] = max(differences.get(name, 0.0), difference)
            seconds.append(took)
            latencies.extend(round_latencies)
            print(f"  round {index + 1} {name}: {len(images) / took:.2f} images/s", flush=True)
    return runs, differences


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "7b"], default="tiny")
    image_bench_arguments(parser, precision="bfloat16", requests=32, batch_sizes=[1, 4, 8])
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts per round (GRPO groups)")
    args = parser.parse_args()

    logs = results_dir()
    images = make_images(args.requests, args.image_size)
    prompts = [PROMPTS[i % args.prompts % len(PROMPTS)] for i in range(args.requests)]
    with tempfile.TemporaryDirectory(prefix="hpsv3-bench-", dir=scratch_dir(args.size)) as tmp:
        started = time.perf_counter()
        checkpoint, base = save_model(Path(tmp), args.size, args.device)
        print(f"random HPSv3 {args.size} saved in {time.perf_counter() - started:.0f} s", flush=True)
        settings = {
            "SCORER_HPSV3_MODEL": str(checkpoint),
            "SCORER_HPSV3_BASE": str(base),
            "SCORER_HPSV3_PRECISION": args.precision,
            "SCORER_HPSV3_MAX_TOKENS": MAX_TOKENS,
        }
        simple_port, service_port = free_port(), free_port()
        service_argv, service_env = service_under_gunicorn(
            "hpsv3", service_port, args.device, {**settings, "SCORER_MAX_BATCH": str(max(args.batch_sizes))}
        )
        simple_argv = simple_gunicorn(simple_port, "bench.hpsv3.simple_server:app")
        # The two servers load while this process loads its own copy and sweeps (at the 7B size,
        # loading is most of the time).
        with ThreadPoolExecutor(2) as starting:
            servers = [
                starting.submit(
                    serve, simple_argv, {**settings, "DEVICE": args.device}, simple_port, logs / "hpsv3-simple.log"
                ),
                starting.submit(serve, service_argv, service_env, service_port, logs / "hpsv3-service.log"),
            ]
            try:
                in_process = InProcess(settings, args.device)
                sweep = {}
                for batch_size in args.batch_sizes:
                    in_process.batched(images, prompts, batch_size)
                    seconds, _, _ = in_process.batched(images, prompts, batch_size)
                    sweep[batch_size] = len(images) / seconds
                    print(f"  in-process batch {batch_size:3d}: {sweep[batch_size]:.2f} images/s", flush=True)
                best_batch = max(sweep, key=sweep.__getitem__)
                runs, differences = measure(
                    in_process, best_batch, images, prompts, args.rounds, simple_port, service_port
                )
            finally:
                for server in servers:
                    if server.exception() is None:
                        stop(server.result())

    results = {
        name: {
            "images_per_s": statistics.median(len(images) / s for s in seconds),
            "max_score_diff_vs_batch_1": differences[name],
            **percentiles(latencies),
        }
        for name, (seconds, latencies) in runs.items()
    }
    results["in_process"].update(best_batch=best_batch, sweep=sweep)
    service = results["service"]["images_per_s"]
    summary = {
        "config": vars(args),
        "results": results,
        "service_vs_locked": service / results["locked"]["images_per_s"],
        "service_vs_in_process": service / results["in_process"]["images_per_s"],
        "service_vs_simple": service / results["simple"]["images_per_s"],
    }
    out = args.out or logs / f"hpsv3-{args.size}-{args.device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(summary, indent=2, default=str))
    print("\n| run | images/s | p50 s | p99 s | max score diff vs batch 1 |\n|---|---|---|---|---|")
    labels = {
        "locked": "(a) in-process, batch 1 under a lock (VeRL-Omni)",
        "in_process": f"(b) in-process, batch {best_batch} (latency per batch)",
        "simple": "(c) simple server",
        "service": "(d) hpsv3 service",
    }
    for name, label in labels.items():
        r = results[name]
        print(
            f"| {label} | {r['images_per_s']:.2f} | {r['p50_s']:.3f} | {r['p99_s']:.3f} | "
            f"{r['max_score_diff_vs_batch_1']:.1e} |"
        )
    print(
        f"\nservice / locked = {summary['service_vs_locked']:.2f}; service / in-process = "
        f"{summary['service_vs_in_process']:.3f}; service / simple = {summary['service_vs_simple']:.2f} ({out})"
    )


if __name__ == "__main__":
    main()
