"""Do the OCR engines agree? ONNX Runtime on the CPU (the reference), and the torch engine in
every precision its device allows, on the same rendered flow_grpo prompts: equal scores, equal
texts, largest confidence difference.

    python -m bench.gpu.ocr_agreement --device cuda --count 256 --out agreement.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common.models.ocr_rule import RuleOptions, reward
from services.ocr.engines import RapidOCREngine
from services.ocr.torch_engine import TorchOCREngine
from testing.images import decoded, ocr_prompts, quoted, render_text


def read_all(engine: RapidOCREngine, images: list, batch: int) -> tuple[list, float]:
    started = time.perf_counter()
    lines = []
    for start in range(0, len(images), batch):
        lines += engine.read([engine.prepare(image) for image in images[start : start + batch]])
    return lines, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    prompts = ocr_prompts(args.count)
    targets = [quoted(prompt) for prompt in prompts]
    images = [decoded(render_text(target)) for target in targets]
    options = RuleOptions()
    reference = RapidOCREngine("cpu", 0.5, det_batch=args.batch, rec_batch=64, threads=None)
    ref_lines, ref_seconds = read_all(reference, images, args.batch)
    ref_scores = [reward([t], lines, options) for t, lines in zip(targets, ref_lines)]
    results: dict = {
        "count": len(images),
        "onnxruntime_cpu": {"seconds": ref_seconds, "mean": sum(ref_scores) / len(images)},
    }
    dtypes = ["float32", "float16", "bfloat16"] if args.device.startswith("cuda") else ["float32"]
    for dtype in dtypes:
        engine = TorchOCREngine(args.device, 0.5, args.batch, 64, None, dtype)
        read_all(engine, images[: args.batch], args.batch)  # warm-up
        lines, seconds = read_all(engine, images, args.batch)
        scores = [reward([t], found, options) for t, found in zip(targets, lines)]
        conf_diffs = [
            abs(a[1] - b[1]) for mine, ref in zip(lines, ref_lines) if len(mine) == len(ref) for a, b in zip(mine, ref)
        ]
        results[f"torch_{args.device}_{dtype}"] = {
            "seconds": seconds,
            "equal_scores": sum(a == b for a, b in zip(scores, ref_scores)),
            "equal_texts": sum([t for t, _ in a] == [t for t, _ in b] for a, b in zip(lines, ref_lines)),
            "max_confidence_diff": max(conf_diffs, default=0.0),
            "max_score_diff": max(abs(a - b) for a, b in zip(scores, ref_scores)),
            "mean": sum(scores) / len(images),
        }
        print(dtype, json.dumps(results[f"torch_{args.device}_{dtype}"]), flush=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
