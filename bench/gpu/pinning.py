"""The OCR service under gunicorn as a GPU node runs it: one worker per visible GPU, each pinned
to its own; every worker's /info must show the torch engine on its GPU (or, on the CPU, the CPU).

    python -m bench.gpu.pinning --device cuda --out pinning.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import requests

from bench.common import stop_on_sigterm
from common.configuration.devices import visible_gpus
from testing.server import gunicorn_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    stop_on_sigterm()

    gpus = visible_gpus() if args.device == "cuda" else []
    env = {"SCORER_WORKERS": "", "SCORER_DEVICE": "auto" if gpus else "cpu"}
    started = time.perf_counter()
    with gunicorn_server("ocr", env, log_dir=args.out.parent) as server:
        ready_s = time.perf_counter() - started
        seen: dict[int, dict] = {}
        deadline = time.monotonic() + 60
        while len(seen) < max(1, len(gpus)) and time.monotonic() < deadline:
            info = requests.get(server.url + "/info", headers={"Connection": "close"}, timeout=10).json()
            seen[info["pid"]] = {key: info[key] for key in ("gpu", "device", "ready", "setup_error", "model")}
    workers = list(seen.values())
    problems = [w for w in workers if not w["ready"] or (gpus and not w["model"].get("device", "").startswith("cuda"))]
    if gpus and sorted(w["gpu"] for w in workers) != sorted(gpus):
        problems.append({"pinned": [w["gpu"] for w in workers], "visible": gpus})
    report = {"visible_gpus": gpus, "first_ready_s": ready_s, "workers": workers, "problems": problems}
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
