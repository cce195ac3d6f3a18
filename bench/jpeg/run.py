"""flow_grpo's JPEG rewards: the ``jpeg_compressibility`` service against the same function
in-process (issue 41).

``--requests`` images of ``--size`` pixels square (a smooth random field with noise on top, so
that their JPEGs weigh what generated images do), sent as PNGs (a PNG gives flow_grpo's number
exactly), scored two ways in each round:

  in-process  decode each PNG to RGB and the service's own function (``jpeg_kb``, then the
              rule), on ``--threads`` threads (Pillow's codecs release the GIL): no HTTP
  ours        the service under gunicorn (one worker), ``--images-per-request`` images a request,
              every request at once (pickle protocol)

Each answer is checked against the in-process score; the figure is the median over rounds of
ours / in-process, images/s.

    .venv/bin/python -m bench.jpeg.run [--requests 64] [--size 512] [--rounds 3] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import burst, stop_on_sigterm  # noqa: E402
from services.jpeg.scorer import JpegCompressibilityScorer, jpeg_kb  # noqa: E402
from testing.server import gunicorn_server  # noqa: E402


def generated_like(count: int, size: int, seed: int = 0) -> list[bytes]:
    """PNGs of smooth random colour fields (a 16 x 16 field upsampled) with noise on top."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        field = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).resize((size, size), Image.BICUBIC)
        noisy = np.asarray(field, np.int16) + rng.integers(-12, 13, (size, size, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buffer, "PNG", compress_level=1)
        images.append(buffer.getvalue())
    return images


def in_process(images: list[bytes], threads: int) -> tuple[float, list[float]]:
    """Images/s of decode + the rule, on ``threads`` threads."""

    def score(data: bytes) -> float:
        return JpegCompressibilityScorer.reward(jpeg_kb(Image.open(io.BytesIO(data)).convert("RGB")))

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        scores = list(pool.map(score, images))
    return len(images) / (time.perf_counter() - started), scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64, help="images in all")
    parser.add_argument("--size", type=int, default=512, help="each image's side, in pixels")
    parser.add_argument("--images-per-request", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="in-process thread counts to measure (comma-separated)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "jpeg.json")
    args = parser.parse_args()
    stop_on_sigterm()
    images = generated_like(args.requests, args.size)
    step = args.images_per_request
    bodies = [
        pickle.dumps({"images": images[i : i + step], "prompts": [""] * len(images[i : i + step]), "metadata": {}})
        for i in range(0, len(images), step)
    ]
    thread_counts = [int(n) for n in args.threads.split(",")]
    rounds = []
    with gunicorn_server("jpeg_compressibility", log_dir=Path(tempfile.mkdtemp())) as server:
        for number in range(args.rounds):
            result: dict[str, float] = {}
            for threads in thread_counts:
                result[f"in_process_t{threads}_per_s"], expected = in_process(images, threads)
            measured = burst(server.url + "/", bodies)
            assert measured["statuses"] == {200: len(bodies)}, measured["statuses"]
            got = [score for answer in measured["answers"] for score in pickle.loads(answer)["scores"]]
            result["ours_per_s"], result["ours_p50_s"] = len(images) / measured["wall_s"], measured["p50_s"]
            result["wrong"] = sum(a != b for a, b in zip(got, expected))
            rounds.append(result)
            print(f"round {number + 1}: {json.dumps(result)}", flush=True)
    summary: dict[str, object] = {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds}
    for key in rounds[0]:
        summary[f"median_{key}"] = statistics.median(r[key] for r in rounds)
    for threads in thread_counts:
        ratios = [r["ours_per_s"] / r[f"in_process_t{threads}_per_s"] for r in rounds]
        summary[f"ours_vs_in_process_t{threads}"] = statistics.median(ratios)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("rounds", "args")}, indent=2))


if __name__ == "__main__":
    main()
