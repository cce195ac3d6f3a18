"""The multi bench runs end to end on tiny models (real gunicorn services, RapidOCR and tiny
random CLIPs on the CPU), and what it counts is exact: the combined call uploads each sample
once and decodes it once, the separate services once per reward, and every combined answer
equals what each reward's own service answered. Its speed figures are not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_counts_one_upload_and_one_decode_per_sample(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    out = tmp_path / "multi.json"
    command = [sys.executable, "-m", "bench.multi.run", "--requests", "3", "--rounds", "1", "--image-size", "256"]
    run = subprocess.run([*command, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["sets"]) == {"ocr+pickscore", "ocr+pickscore+aesthetic"}
    for name, result in report["sets"].items():
        rewards = len(name.split("+"))
        median = result["median"]
        assert result["check"]["wrong"] == 0
        assert median["combined"]["decodes_per_sample"] == 1
        assert median["sequential"]["decodes_per_sample"] == median["concurrent"]["decodes_per_sample"] == rewards
        assert median["ratios"]["uploads_separate_vs_combined"] == rewards
        assert median["ratios"]["decodes_separate_vs_combined"] == rewards
        assert all(median[way]["samples_per_s"] > 0 for way in ("combined", "sequential", "concurrent"))
