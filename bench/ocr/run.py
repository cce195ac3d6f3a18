"""OCR throughput and latency under VeRL-Omni's traffic: 64 concurrent one-image requests.

Side by side, in one run, alternating rounds:
  ceiling  the same engine and rule in-process, at its best batch size (no HTTP at all)
  ours     this service under gunicorn (one worker, dynamic batching)
  simple   the simplest server a user would write (bench/ocr/simple_server.py)

    .venv/bin/python -m bench.ocr.run [--rounds 3] [--requests 64]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    ProcessServer,
    burst,
    median_of,
    print_profile,
    simple_gunicorn,
    stage_profile,
    stage_totals,
    stop_on_sigterm,
)
from common.models.ocr_rule import RuleOptions, check_targets, reward  # noqa: E402
from services.ocr.engines import RapidOCREngine  # noqa: E402
from services.ocr.torch_engine import TorchOCREngine  # noqa: E402
from testing.images import decoded, ocr_prompts, quoted, render_text  # noqa: E402
from testing.server import free_port, gunicorn_server  # noqa: E402


def in_process(
    engine: RapidOCREngine, images: list[bytes], prompts: list[str], batch: int
) -> tuple[float, list[float]]:
    """Images/s of decode + prepare + read + rule for all images, ``batch`` at a time."""
    options = RuleOptions()
    scores: list[float] = []
    started = time.perf_counter()
    for start in range(0, len(images), batch):
        chunk = range(start, min(start + batch, len(images)))
        prepared = [engine.prepare(decoded(images[i])) for i in chunk]
        lines = engine.read(prepared)
        scores += [reward(check_targets(prompts[i], options, i), found, options) for i, found in zip(chunk, lines)]
    return len(images) / (time.perf_counter() - started), scores


def one_image_bodies(images: list[bytes], prompts: list[str]) -> list[bytes]:
    return [
        pickle.dumps({"images": [image], "prompts": [prompt], "metadata": {}}) for image, prompt in zip(images, prompts)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (rapidocr: needs onnxruntime-gpu)")
    parser.add_argument("--engine", default="rapidocr", choices=["rapidocr", "torch"])
    parser.add_argument("--dtype", default="float32", help="the torch engine's precision on CUDA")
    parser.add_argument("--det-batch", type=int, default=None, help="the service's detection batch (its default)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ocr.json")
    args = parser.parse_args()
    stop_on_sigterm()

    prompts = ocr_prompts(args.requests)
    images = [render_text(quoted(prompt)) for prompt in prompts]
    bodies = one_image_bodies(images, prompts)
    if args.engine == "torch":
        engine: RapidOCREngine = TorchOCREngine(args.device, 0.5, 1, 64, None, args.dtype)
    else:
        engine = RapidOCREngine(args.device, text_score=0.5, det_batch=1, rec_batch=64, threads=None)
    in_process(engine, images[:2], prompts[:2], 2)  # warm up

    rounds: list[dict[str, float]] = []
    profiles: list[dict[str, dict[str, float]]] = []
    port = free_port()
    simple_cmd = simple_gunicorn(port, "bench.ocr.simple_server:app")
    service_env = {"SCORER_DEVICE": args.device, "SCORER_OCR_ENGINE": args.engine, "SCORER_OCR_TORCH_DTYPE": args.dtype}
    if args.det_batch:
        service_env["SCORER_OCR_DET_BATCH"] = str(args.det_batch)
    simple_env = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    simple_env.update(OCR_ENGINE=args.engine, OCR_DTYPE=args.dtype)
    with (
        gunicorn_server("ocr", service_env, threads=128) as ours,
        ProcessServer(simple_cmd, f"http://127.0.0.1:{port}", env=simple_env) as simple,
    ):
        burst(ours.url + "/", bodies[:4])
        burst(simple.url + "/", bodies[:4])
        for round_no in range(args.rounds):
            result: dict[str, float] = {}
            best_batch, best = 0, 0.0
            for batch in (int(b) for b in args.batches.split(",")):
                rate, reference = in_process(engine, images, prompts, batch)
                result[f"ceiling_b{batch}_per_s"] = rate
                if rate > best:
                    best_batch, best = batch, rate
            result["ceiling_per_s"], result["ceiling_batch"] = best, best_batch
            for name, server in (("ours", ours), ("simple", simple)):
                before = stage_totals(ours.url)
                measured = burst(server.url + "/", bodies)
                if name == "ours":
                    profiles.append(stage_profile(before, stage_totals(ours.url), len(bodies)))
                assert measured["statuses"] == {200: len(bodies)}, measured["statuses"]
                got = [pickle.loads(answer)["scores"][0] for answer in measured["answers"]]
                agree = sum(abs(a - b) < 1e-6 for a, b in zip(got, reference))
                result.update(
                    {
                        f"{name}_per_s": measured["per_s"],
                        f"{name}_p50_s": measured["p50_s"],
                        f"{name}_p99_s": measured["p99_s"],
                        f"{name}_agree": agree,
                    }
                )
            rounds.append(result)
            print(f"round {round_no + 1}: " + ", ".join(f"{k}={v:.3f}" for k, v in result.items()), flush=True)

    keys = rounds[0].keys()
    summary = {key: median_of(rounds, key) for key in keys}
    summary["ours_vs_ceiling"] = median_of([{"r": r["ours_per_s"] / r["ceiling_per_s"]} for r in rounds], "r")
    summary["ours_vs_simple"] = median_of([{"r": r["ours_per_s"] / r["simple_per_s"]} for r in rounds], "r")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = {key: str(value) for key, value in vars(args).items()}
    args.out.write_text(
        json.dumps({"config": config, "rounds": rounds, "median": summary, "profiles": profiles}, indent=2)
    )
    print("\n| | images/s | p50 s | p99 s |\n|---|---|---|---|")
    print(f"| in-process ceiling (batch {summary['ceiling_batch']:.0f}) | {summary['ceiling_per_s']:.2f} | | |")
    for name in ("ours", "simple"):
        rate, p50, p99 = (summary[f"{name}_{key}"] for key in ("per_s", "p50_s", "p99_s"))
        print(f"| {name} | {rate:.2f} | {p50:.2f} | {p99:.2f} |")
    print_profile("where the service's requests spent their time (the last round)", profiles[-1])
    print(f"\nours / ceiling = {summary['ours_vs_ceiling']:.3f}, ours / simple = {summary['ours_vs_simple']:.3f}")
    print(
        f"scores agreeing with in-process: ours {summary['ours_agree']:.0f}/{len(bodies)}, "
        f"simple {summary['simple_agree']:.0f}/{len(bodies)}"
    )


if __name__ == "__main__":
    main()
