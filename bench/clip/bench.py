"""PickScore service throughput: 64 concurrent one-image requests in GRPO groups, three ways.

(a) in-process: the service's own decode and score, no HTTP, at each batch size of a sweep;
    the best one is the ceiling a server can approach;
(b) simple: flow_grpo's scorer behind the simplest server (``simple_server.py``: one sync
    worker, one forward pass per request);
(c) service: this repo's pickscore service under gunicorn, batching across requests.

Requests carry GRPO groups: ``--prompts`` distinct prompts, each shared by
``requests / prompts`` images. Beside the three, the bench measures what encoding a shared
prompt once per batch saves: the in-process score of the same batch with every prompt
distinct. The CLIP is random (downloads are not possible here), its vocabulary CLIP's real
one: ``--size b14`` (ViT-B widths, 14-pixel patches) on a CPU, ``h14`` (PickScore's ViT-H/14)
on a GPU. Run from the repo root: ``python -m bench.clip.bench --size b14``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path

from bench.aesthetic.bench import free_port, make_images, percentiles, serve, stop
from bench.common import burst, image_bench_arguments, results_dir, service_under_gunicorn, simple_gunicorn
from common.configuration.settings import CoreSettings
from services.clip.scorer import PickScoreScorer
from testing.clip_models import save_random_clip_model

PROMPTS = [
    "a photo of an astronaut riding a horse on the moon",
    'a neon sign that says "OPEN 24 HOURS" above a diner door at night',
    "an oil painting of a lighthouse in a storm, dramatic waves",
    "a close-up of a ladybug on a dewy green leaf, macro photography",
    "a bowl of ramen with a soft-boiled egg, studio lighting",
    "a medieval castle on a cliff at sunset, fantasy art",
    "a red vintage car parked on a cobblestone street in Rome",
    "a watercolor of a fox sleeping under a tree in autumn",
]


class InProcess:
    """(a): the scorer's ``decode`` and ``score``, batch by batch, in this process."""

    def __init__(self, model_dir: Path, args: argparse.Namespace) -> None:
        os.environ["SCORER_PICKSCORE_MODEL"] = str(model_dir)
        os.environ["SCORER_PICKSCORE_PRECISION"] = args.precision
        self.scorer = PickScoreScorer(CoreSettings(service="pickscore", max_pixels=1 << 30))
        self.scorer.setup(args.device)
        assert self.scorer.model is not None
        self.model = self.scorer.model

    def round(self, images: list[bytes], prompts: list[str], batch_size: int) -> tuple[float, list[float]]:
        """Seconds for all pairs, and the latency of each batch."""
        self.model.micro_batch = batch_size
        latencies = []
        started = time.perf_counter()
        for start in range(0, len(images), batch_size):
            batch_started = time.perf_counter()
            chunk = slice(start, start + batch_size)
            self.scorer.score(self.scorer.prepare({"images": images[chunk], "prompts": prompts[chunk]}))
            latencies.append(time.perf_counter() - batch_started)
        return time.perf_counter() - started, latencies

    def model_only(self, images: list[bytes], prompts: list[str], batch_size: int) -> float:
        """Seconds of the towers alone on ready items, the whole set as one batch."""
        self.model.micro_batch = batch_size
        items = self.scorer.prepare({"images": images, "prompts": prompts})
        started = time.perf_counter()
        self.scorer.score(items)  # ``tolist`` synchronises the GPU
        return time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` and its children (a gunicorn master's workers):
    on a shared machine, what a server spends per image, whatever the other jobs take."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(stat.parent.name) == pid or int(fields[1]) == pid:  # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def bodies(images: list[bytes], prompts: list[str]) -> list[bytes]:
    return [pickle.dumps({"images": [image], "prompts": [prompt]}) for image, prompt in zip(images, prompts)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "b14", "h14"], default="b14", help="random CLIP towers")
    image_bench_arguments(parser, precision="float16", requests=64, batch_sizes=[1, 8, 32])
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts per round (GRPO groups)")
    parser.add_argument("--micro-batch", type=int, help="the service's micro-batch (default: (a)'s best batch size)")
    args = parser.parse_args()

    logs = results_dir()
    images = make_images(args.requests, args.image_size)
    prompts = [PROMPTS[i % args.prompts % len(PROMPTS)] for i in range(args.requests)]
    distinct = [f"{prompts[i]}, variation {i}" for i in range(args.requests)]
    with tempfile.TemporaryDirectory(prefix="clip-bench-") as tmp:
        model_dir = save_random_clip_model(Path(tmp) / "pickscore", size=args.size)
        print(f"PickScore-shaped random {args.size} on {args.device}; {args.requests} requests, {args.prompts} prompts")
        in_process = InProcess(model_dir, args)
        sweep = {}
        for batch_size in args.batch_sizes:
            in_process.round(images, prompts, batch_size)
            seconds, _ = in_process.round(images, prompts, batch_size)
            sweep[batch_size] = len(images) / seconds
            print(f"  in-process batch {batch_size:3d}: {sweep[batch_size]:.2f} images/s", flush=True)
        best_batch = max(sweep, key=sweep.__getitem__)

        simple_port, service_port = free_port(), free_port()
        simple_env = {"MODEL_DIR": str(model_dir), "DEVICE": args.device, "PRECISION": args.precision}
        simple_argv = simple_gunicorn(simple_port, "bench.clip.simple_server:app")
        settings = {
            "SCORER_PICKSCORE_MODEL": str(model_dir),
            "SCORER_PICKSCORE_PRECISION": args.precision,
            "SCORER_PICKSCORE_MICRO_BATCH": str(args.micro_batch or best_batch),
        }
        service_argv, service_env = service_under_gunicorn("pickscore", service_port, args.device, settings)
        requests_of = bodies(images, prompts)
        runs: dict[str, tuple[list[float], list[float]]] = {
            name: ([], []) for name in ("in_process", "simple", "service")
        }
        shared, unshared = [], []
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        servers = []
        try:
            servers.append(serve(simple_argv, simple_env, simple_port, logs / "clip-simple.log"))
            servers.append(serve(service_argv, service_env, service_port, logs / "clip-service.log"))
            urls = {"simple": f"http://127.0.0.1:{simple_port}/", "service": f"http://127.0.0.1:{service_port}/"}
            pids = {"simple": servers[0].pid, "service": servers[1].pid}
            for url in urls.values():  # warm-up rounds
                burst(url, requests_of)
            for index in range(args.rounds):
                for name, (seconds, latencies) in runs.items():
                    if name == "in_process":
                        cpu_before = time.process_time()
                        took, round_latencies = in_process.round(images, prompts, best_batch)
                        cpu[name].append(time.process_time() - cpu_before)
                    else:
                        cpu_before = cpu_seconds(pids[name])
                        result = burst(urls[name], requests_of)
                        cpu[name].append(cpu_seconds(pids[name]) - cpu_before)
                        if result["statuses"] != {200: len(requests_of)}:
                            raise RuntimeError(f"{name}: statuses {result['statuses']}")
                        took, round_latencies = result["wall_s"], result["latencies"]
                    seconds.append(took)
                    latencies.extend(round_latencies)
                    print(f"  round {index + 1} {name}: {len(images) / took:.2f} images/s", flush=True)
                shared.append(in_process.model_only(images, prompts, best_batch))
                unshared.append(in_process.model_only(images, distinct, best_batch))
        finally:
            for process in servers:
                stop(process)

    results = {
        name: {
            "images_per_s": statistics.median(len(images) / s for s in seconds),
            "cpu_s_per_image": statistics.median(cpu[name]) / len(images),
            **percentiles(latencies),
        }
        for name, (seconds, latencies) in runs.items()
    }
    results["in_process"].update(best_batch=best_batch, sweep=sweep)
    a, b, c = results["in_process"], results["simple"], results["service"]
    dedupe = {"shared_prompts_s": statistics.median(shared), "distinct_prompts_s": statistics.median(unshared)}
    summary = {
        "config": vars(args),
        "results": results,
        "prompt_encoding": dedupe,
        "service_vs_in_process": c["images_per_s"] / a["images_per_s"],
        "service_vs_simple": c["images_per_s"] / b["images_per_s"],
    }
    out = args.out or logs / f"clip-pickscore-{args.size}-{args.device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(summary, indent=2, default=str))
    print("\n| run | images/s | CPU s per image | p50 s | p99 s |\n|---|---|---|---|---|")
    rows = [(f"(a) in-process, batch {a['best_batch']} (latency per batch)", a), ("(b) simple server", b)]
    for label, r in [*rows, ("(c) pickscore service", c)]:
        print(
            f"| {label} | {r['images_per_s']:.2f} | {r['cpu_s_per_image']:.3f} | {r['p50_s']:.3f} | {r['p99_s']:.3f} |"
        )
    print(
        f"\nservice / in-process = {summary['service_vs_in_process']:.3f}; "
        f"service / simple = {summary['service_vs_simple']:.2f}; towers alone on {args.requests} pairs: "
        f"{dedupe['shared_prompts_s']:.3f} s with {args.prompts} prompts, {dedupe['distinct_prompts_s']:.3f} s "
        f"with {args.requests} distinct ({out})"
    )


if __name__ == "__main__":
    main()
