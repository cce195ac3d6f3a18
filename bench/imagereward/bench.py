"""ImageReward service throughput: concurrent one-image requests against the same model in
this process at its best batch.

(b) in-process: the service's own preprocessing and model code, batches of a sweep one after
    the other, no HTTP: the ceiling a server can approach;
(d) service: this repo's imagereward service under gunicorn, batching across requests.

The model is random, in the release's layout (downloads are not possible here): ``--size base``
is BLIP's ViT-B/16 with BERT-base (a CPU can run it), ``large`` ImageReward's own ViT-L/16 with
BERT-base, ``tiny`` a seconds-long smoke run. Each figure is the median of ``--rounds`` rounds.
Run from the repo root: ``python -m bench.imagereward.bench --size base``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image

from bench.aesthetic.bench import free_port, make_images, percentiles, serve, stop
from bench.clip.bench import PROMPTS, bodies
from bench.common import burst, image_bench_arguments, results_dir, service_under_gunicorn, stop_on_sigterm
from services.imagereward.model import ImageRewardModel
from testing.imagereward_models import save_checkpoint, save_tokenizer

SIZES = {"tiny": ("tiny", "tiny"), "base": ("base", "base"), "large": ("large", "base")}


def in_process_round(
    model: ImageRewardModel, images: list[bytes], prompts: list[str], batch: int
) -> tuple[float, list[float]]:
    """Seconds for every sample in batches of ``batch`` (decode, preprocess, tokens, model), and the scores."""
    scores: list[float] = []
    started = time.perf_counter()
    for start in range(0, len(images), batch):
        decoded = [Image.open(io.BytesIO(data)).convert("RGB") for data in images[start : start + batch]]
        scores.extend(model.scores(model.prepare(decoded, prompts[start : start + batch])))
    return time.perf_counter() - started, scores


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="base")
    image_bench_arguments(parser, precision="float16", requests=32, batch_sizes=[1, 4, 8, 16])
    args = parser.parse_args()

    logs = results_dir()
    images = make_images(args.requests, args.image_size)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    with tempfile.TemporaryDirectory(prefix="imagereward-bench-") as tmp:
        vision, text = SIZES[args.size]
        weights = save_checkpoint(Path(tmp) / "weights", vision=vision, text=text)
        tokenizer = save_tokenizer(Path(tmp) / "tokenizer")
        model = ImageRewardModel(str(weights), str(tokenizer), args.device, args.precision, max(args.batch_sizes))
        sweep = {}
        for batch in args.batch_sizes:
            in_process_round(model, images, prompts, batch)  # warm-up
            sweep[batch] = len(images) / in_process_round(model, images, prompts, batch)[0]
            print(f"  in-process batch {batch:3d}: {sweep[batch]:.2f} images/s", flush=True)
        best = max(sweep, key=sweep.__getitem__)
        _, expected = in_process_round(model, images, prompts, 1)
        port = free_port()
        settings = {
            "SCORER_MAX_BATCH": str(best),
            "SCORER_IMAGEREWARD_MICRO_BATCH": str(best),
            "SCORER_IMAGEREWARD_WEIGHTS": str(weights),
            "SCORER_IMAGEREWARD_TOKENIZER": str(tokenizer),
            "SCORER_IMAGEREWARD_PRECISION": args.precision,
        }
        argv, env = service_under_gunicorn("imagereward", port, args.device, settings)
        server = serve(argv, env, port, logs / "imagereward-service.log")
        try:
            url, requests_of = f"http://127.0.0.1:{port}/", bodies(images, prompts)
            burst(url, requests_of)  # warm-up
            runs: dict[str, list[float]] = {"in_process": [], "service": []}
            latencies: list[float] = []
            difference = 0.0
            for index in range(args.rounds):
                runs["in_process"].append(in_process_round(model, images, prompts, best)[0])
                result = burst(url, requests_of)
                if result["statuses"] != {200: len(requests_of)}:
                    raise RuntimeError(f"service: statuses {result['statuses']}")
                runs["service"].append(result["wall_s"])
                latencies.extend(result["latencies"])
                scores = [pickle.loads(answer)["scores"][0] for answer in result["answers"]]
                difference = max(difference, *(abs(a - b) for a, b in zip(scores, expected)))
                print(
                    f"  round {index + 1}: in-process {len(images) / runs['in_process'][-1]:.2f}, "
                    f"service {len(images) / runs['service'][-1]:.2f} images/s",
                    flush=True,
                )
        finally:
            stop(server)
    results = {name: statistics.median(len(images) / s for s in seconds) for name, seconds in runs.items()}
    summary = {
        "config": vars(args),
        "cpus": len(os.sched_getaffinity(0)),
        "in_process": {"images_per_s": results["in_process"], "best_batch": best, "sweep": sweep},
        "service": {
            "images_per_s": results["service"],
            "max_score_diff_vs_batch_1": difference,
            **percentiles(latencies),
        },
        "service_vs_in_process": results["service"] / results["in_process"],
    }
    out = args.out or logs / f"imagereward-{args.size}-{args.device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(summary, indent=2, default=str))
    print(
        f"\nin-process batch {best}: {results['in_process']:.2f} images/s; service: {results['service']:.2f} "
        f"images/s (p50 {summary['service']['p50_s']:.2f} s, max score diff vs batch 1 {difference:.1e}); "
        f"service / in-process = {summary['service_vs_in_process']:.3f} ({out})"
    )


if __name__ == "__main__":
    main()
