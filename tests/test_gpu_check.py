"""The GPU check script, end to end on the CPU with tiny sizes (``--cpu-smoke``), so that the one
command a GPU machine runs keeps working: every step runs, every figure lands in check.json, and
the answers it measures are right (the engines agree, no wrong score over HTTP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The --cpu-smoke steps' limits only guard against a hang: scaled (CHECK_TIME_FACTOR, 3 unless
# set) so that a loaded shared machine does not fail them, and the whole run's 15 minutes with them.
TIME_FACTOR = os.environ.get("CHECK_TIME_FACTOR", "3")


def check_env(python: str) -> dict[str, str]:
    env = {**os.environ, "PYTHON": python, "CHECK_TIME_FACTOR": TIME_FACTOR}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


def test_check_script_runs_every_step_on_cpu(tmp_path: Path) -> None:
    run = subprocess.run(
        ["bash", "bench/gpu/check.sh", "--out", str(tmp_path), "--cpu-smoke", "--no-wheels"],
        cwd=ROOT,
        env=check_env(sys.executable),
        capture_output=True,
        text=True,
        timeout=900 * float(TIME_FACTOR),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["failed"] == []
    assert report["environment"]["gpus"] == []
    assert report["pinning"]["problems"] == [] and report["pinning"]["workers"][0]["model"]["device"] == "cpu"
    agreement = report["ocr_agreement"]["torch_cpu_float32"]
    assert agreement["equal_scores"] == report["ocr_agreement"]["count"] and agreement["max_score_diff"] == 0
    assert report["ocr"]["median"]["ours_agree"] == report["ocr"]["median"]["simple_agree"] == 2
    assert report["aesthetic"]["results"]["service"]["images_per_s"] > 0
    assert report["pickscore"]["results"]["service"]["images_per_s"] > 0
    assert report["hpsv3"]["results"]["service"]["images_per_s"] > 0
    assert report["hpsv3"]["results"]["service"]["max_score_diff_vs_batch_1"] < 1e-4
    geneval = report["geneval"]["images_per_s"]
    assert geneval["original"] > 0 and geneval["ours"] > 0 and report["geneval"]["args"]["size"] == "tiny"
    for result in report["batching"]["results"].values():
        assert result["median"]["ours_wrong"] == result["median"]["simple_wrong"] == 0
    assert report["imagereward"]["service"]["images_per_s"] > 0
    assert report["imagereward"]["service"]["max_score_diff_vs_batch_1"] < 1e-4
    for result in report["multi"]["sets"].values():
        assert result["check"]["wrong"] == 0 and result["median"]["combined"]["decodes_per_sample"] == 1
    if os.environ.get("SCORER_TEST_ENGINE_PYTHON"):
        judge = report["judge"]["median"]
        assert judge["service"]["wrong"] == judge["direct"]["wrong"] == 0, report["judge"]
        assert judge["service"]["samples_per_s"] > 0 and report["judge"]["ratio"] > 0
    else:  # run.sh test built no engine environment
        assert report["skipped"] == ["judge"]


def test_a_hung_step_fails_at_its_scaled_limit(tmp_path: Path) -> None:
    """A step that never ends is stopped at its limit times CHECK_TIME_FACTOR (the pinning
    step's 120 s x 0.05), named as failed, and the run fails."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n[ "$2" = bench.gpu.pinning ] && exec sleep 600\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {**check_env(str(python)), "CHECK_TIME_FACTOR": "0.05"}
    out = tmp_path / "out"
    argv = ["bash", "bench/gpu/check.sh", "--out", str(out), "--cpu-smoke", "--no-wheels", "--steps", "pinning"]
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    assert json.loads((out / "check.json").read_text())["failed"] == ["pinning"]
    assert int((out / "pinning.seconds").read_text()) <= 30, run.stderr[-3000:]
