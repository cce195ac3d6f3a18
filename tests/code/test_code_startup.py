"""The code verifier's construction is cheap (common/pipeline/scorer.py's contract): it reads and checks
its settings; probing the isolation and setting the interpreter's integer limit wait for
``setup``, where the sandbox starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from testing.server import Server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.unit
def test_constructing_the_scorer_runs_no_process_and_leaves_the_interpreter_as_it_was() -> None:
    code = (
        "import sys\n"
        "started = []\n"
        "sys.addaudithook(lambda event, args: started.append(args[0]) if event == 'subprocess.Popen' else None)\n"
        "from common.configuration.settings import CoreSettings\n"
        "from services.code.scorer import CodeScorer\n"
        "digits = sys.get_int_max_str_digits()\n"
        "CodeScorer(CoreSettings(service='code'))\n"
        "print(started, sys.get_int_max_str_digits() == digits)\n"
    )
    env = {**os.environ, "SCORER_CODE_INFRA_FAILURE_SCORE": "zero", "SCORER_CODE_SANDBOX": "auto"}
    ran = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["[]", "True"]


def test_a_weaker_sandbox_not_named_leaves_the_service_unready_saying_why(tmp_path: Path) -> None:
    """The isolation is chosen with the sandbox's start: refused there, the worker stays up,
    never ready, and ``/ready`` names the setting to accept it."""
    env = {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan", "SCORER_CODE_SANDBOX": "none"}
    os.environ.pop("SCORER_CODE_ALLOW_WEAK_SANDBOX", None)
    srv = Server("code", env, 1, None, tmp_path / "code.log")
    try:
        srv.wait_ready(timeout=120, require_ready=False)
        reason = ""
        for _ in range(240):
            reason = requests.get(srv.url + "/ready", timeout=5).json()["reason"]
            if reason != "model is loading":
                break
            time.sleep(0.5)
        assert "SCORER_CODE_ALLOW_WEAK_SANDBOX=none" in reason, (reason, srv.logs())
    finally:
        srv.stop()
