"""Batching at GPU-like cost, on any machine: the synthetic scorer (a model call costs a fixed
latency plus a small per-item cost, GIL released, as a GPU's does), three ways side by side in
one run, alternating rounds, at each concurrency (one-image requests kept in flight):

  in-process  the model function called directly at its best batch (at most the concurrency)
  ours        this service under gunicorn (one worker, the dynamic batcher)
  simple      the one-sync-worker Flask server, one model call per request

    .venv/bin/python -m bench.batching.run [--concurrency 64,256] [--fixed-ms 20 --per-item-ms 0.2]
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402

from bench.batching.synthetic import SyntheticSettings, image_score, model_call  # noqa: E402
from bench.common import NO_CONFIG, ProcessServer, burst, stop_on_sigterm  # noqa: E402
from tests.server import free_port  # noqa: E402


def small_jpegs(count: int) -> list[bytes]:
    """Distinct 64-pixel JPEGs: the request is real, the model cost is the synthetic one."""
    out = []
    for index in range(count):
        buffer = io.BytesIO()
        Image.new("RGB", (64, 64), (index % 256, index // 256 % 256, 128)).save(buffer, "JPEG")
        out.append(buffer.getvalue())
    return out


def in_process(images: list[bytes], batch: int, settings: SyntheticSettings) -> float:
    """Images/s of the model function alone, ``batch`` images per call."""
    started = time.perf_counter()
    for start in range(0, len(images), batch):
        model_call(images[start : start + batch], settings)
    return len(images) / (time.perf_counter() - started)


def over_http(url: str, images: list[bytes], concurrency: int) -> dict[str, float]:
    bodies = [pickle.dumps({"images": [image], "prompts": [""]}) for image in images]
    measured = burst(url, bodies, concurrency=concurrency)
    if measured["statuses"] != {200: len(bodies)}:
        raise RuntimeError(f"{url}: statuses {measured['statuses']}")
    wrong = sum(pickle.loads(a)["scores"][0] != image_score(i) for a, i in zip(measured["answers"], images))
    return {"per_s": measured["per_s"], "p50_s": measured["p50_s"], "p99_s": measured["p99_s"], "wrong": wrong}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="64,256", help="one-image requests in flight, comma-separated")
    parser.add_argument("--fixed-ms", type=float, default=20.0)
    parser.add_argument("--per-item-ms", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-wait-ms", help="the service's SCORER_MAX_WAIT_MS (default: the scorer's own)")
    parser.add_argument("--requests", type=int, default=8, help="requests per round, in multiples of the concurrency")
    parser.add_argument("--simple-requests", type=int, default=2, help="the same for the (slow) simple server")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "batching.json")
    args = parser.parse_args(argv)
    stop_on_sigterm()

    settings = SyntheticSettings(args.fixed_ms, args.per_item_ms)
    env = {"SCORER_SYNTHETIC_FIXED_MS": str(args.fixed_ms), "SCORER_SYNTHETIC_PER_ITEM_MS": str(args.per_item_ms)}
    python = sys.executable
    ours_port, simple_port = free_port(), free_port()
    ours_cmd = [python, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "bench.batching.synthetic:app()"]
    ours_env = {**env, "SCORER_SERVICE": "ocr", "SCORER_DEVICE": "cpu", "SCORER_WORKERS": "1"}
    ours_env["SCORER_BIND"] = f"127.0.0.1:{ours_port}"
    if args.max_wait_ms is not None:
        ours_env["SCORER_MAX_WAIT_MS"] = args.max_wait_ms
    simple_cmd = [python, "-m", "gunicorn", *NO_CONFIG, "-w", "1", "-k", "sync", "-t", "600"]
    simple_cmd += ["-b", f"127.0.0.1:{simple_port}"]
    simple_cmd.append("bench.batching.simple_server:app")

    results: dict[str, dict] = {}
    with (
        ProcessServer(ours_cmd, f"http://127.0.0.1:{ours_port}", probe="/ready", env=ours_env) as ours,
        ProcessServer(simple_cmd, f"http://127.0.0.1:{simple_port}", env=env) as simple,
    ):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            images = small_jpegs(concurrency * args.requests)
            simple_images = images[: concurrency * args.simple_requests]
            over_http(ours.url + "/", images[:concurrency], concurrency)  # warm-up
            over_http(simple.url + "/", images[:4], 4)
            # The fixed cost makes bigger batches faster: the best is at or near the concurrency.
            batches = sorted({max(1, concurrency // 4), max(1, concurrency // 2), concurrency})
            rounds = []
            for round_no in range(args.rounds):
                sweep = {b: in_process(images, b, settings) for b in batches}
                best = max(sweep, key=sweep.__getitem__)
                row = {"in_process_per_s": sweep[best], "in_process_batch": best}
                for name, server, sent in (("ours", ours, images), ("simple", simple, simple_images)):
                    row.update({f"{name}_{k}": v for k, v in over_http(server.url + "/", sent, concurrency).items()})
                row["ours_vs_in_process"] = row["ours_per_s"] / row["in_process_per_s"]
                row["ours_vs_simple"] = row["ours_per_s"] / row["simple_per_s"]
                rounds.append(row)
                print(f"c={concurrency} round {round_no + 1}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items()))
            results[str(concurrency)] = {
                "rounds": rounds,
                "median": {key: statistics.median(r[key] for r in rounds) for key in rounds[0]},
            }

    summary = {"config": {k: str(v) for k, v in vars(args).items()}, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"\nmodel call: {args.fixed_ms} ms + {args.per_item_ms} ms per item; medians of {args.rounds} rounds")
    print("| concurrency | in-process (batch) | ours | simple | ours / in-process | ours / simple | ours p50 / p99 s |")
    print("|---|---|---|---|---|---|---|")
    for concurrency, result in results.items():
        m = result["median"]
        print(
            f"| {concurrency} | {m['in_process_per_s']:.0f} ({m['in_process_batch']:.0f}) | {m['ours_per_s']:.0f} "
            f"| {m['simple_per_s']:.1f} | {m['ours_vs_in_process']:.3f} | {m['ours_vs_simple']:.1f} "
            f"| {m['ours_p50_s']:.3f} / {m['ours_p99_s']:.3f} |"
        )
    return summary


if __name__ == "__main__":
    main()
