"""What one image's canvas costs a GenEval worker (issue 39): a single-colour PNG (a few KB to
59 KB) at each size, alone on a geneval server under gunicorn with the tiny random Mask2Former
and CLIP (``testing/geneval_models.py``, ``testing/clip_models.py``) at mmdet's test scale
(1333 x 800, the service's default). Per size and metadata (``plain``: a dog, no colour clause;
``colour``: a red dog, whose masks the colour rule keeps): the status, how long the worker was
held (the request's wall time, alone) and the worker's resident memory (``/proc/<pid>/status``)
before (its peak reset to it), right after, and its peak meanwhile. Then ``contention``: a
small request (an 80 x 64 image) alone, then small requests one after the other while the
largest canvas (with a colour clause) is in flight: the slowest of them.

    .venv/bin/python -m bench.geneval.canvas [--sizes 512,2048,4096] [--timeout 900]

``--timeout`` is the server's ``SCORER_REQUEST_TIMEOUT_S``: high, so that a costly canvas is
measured to its end rather than cut at the default 110 s.
"""

from __future__ import annotations

import argparse
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

from bench.ocr.tiny import worker_pid  # noqa: E402
from testing.clip_models import save_random_clip_model  # noqa: E402
from testing.geneval_models import save_random_mask2former  # noqa: E402
from testing.images import blank, encode  # noqa: E402
from testing.ocr import memory_kb, peak_memory_reset  # noqa: E402
from testing.server import Server, gunicorn_server  # noqa: E402

METADATA = {
    "plain": {"tag": "single_object", "include": [{"class": "dog", "count": 1}]},
    "colour": {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}]},
}
SMALL = encode(Image.new("RGB", (80, 64), (20, 20, 20)))


def body(image: bytes, metadata: dict[str, Any]) -> bytes:
    """flow_grpo's request for one image."""
    return pickle.dumps({"images": [image], "meta_datas": [metadata], "only_strict": False})


def post(server: Server, data: bytes) -> tuple[int, float]:
    started = time.perf_counter()
    status = requests.post(server.url, data=data, timeout=1000).status_code
    return status, round(time.perf_counter() - started, 2)


def alone(server: Server, image: bytes, metadata: dict[str, Any]) -> dict[str, Any]:
    pid = worker_pid(server)
    before = peak_memory_reset(pid)
    status, held = post(server, body(image, metadata))
    return {
        "png_bytes": len(image),
        "status": status,
        "held_s": held,
        "rss_before_mb": round(before / 1024, 1),
        "rss_after_mb": round(memory_kb(pid, "VmRSS") / 1024, 1),
        "rss_peak_mb": round(memory_kb(pid, "VmHWM") / 1024, 1),
    }


def contention(server: Server, large: bytes) -> dict[str, Any]:
    """The small request alone; then, while ``large`` is in flight, small requests one after the
    other: how many, their statuses, the slowest."""
    small = body(SMALL, METADATA["plain"])
    small_alone = post(server, small)
    behind = []
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, server, body(large, METADATA["colour"]))
        while not first.done():
            behind.append(post(server, small))
        large_answer = first.result()
    return {
        "small_alone": {"status": small_alone[0], "seconds": small_alone[1]},
        "small_while_large": {
            "count": len(behind),
            "statuses": sorted({status for status, _ in behind}),
            "slowest_s": max(seconds for _, seconds in behind),
        },
        "large": {"status": large_answer[0], "seconds": large_answer[1]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.geneval.canvas", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="512,2048,4096")
    parser.add_argument("--timeout", type=float, default=900.0, help="the server's SCORER_REQUEST_TIMEOUT_S")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "geneval-canvas.json")
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.sizes.split(","))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        models = Path(scratch)
        env = {
            "SCORER_GENEVAL_DETECTOR": str(save_random_mask2former(models / "detector")),
            "SCORER_GENEVAL_CLIP": str(save_random_clip_model(models / "clip")),
            "SCORER_DEVICE": "cpu",
            "SCORER_REQUEST_TIMEOUT_S": str(args.timeout),
        }
        with gunicorn_server("geneval", env, threads=8, require_ready=False, log_dir=models) as server:
            server.wait_ready(timeout=400)
            for size in sizes:
                image = blank(size, "PNG")
                for name, metadata in METADATA.items():
                    results[f"{size}x{size} {name}"] = alone(server, image, metadata)
                    print(f"{size}x{size} {name}: {results[f'{size}x{size} {name}']}", flush=True)
            results["contention"] = contention(server, blank(sizes[-1], "PNG"))
            print(f"contention: {results['contention']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
