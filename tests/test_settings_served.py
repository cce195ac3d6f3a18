"""Settings as a served node reads them: a bad value stops gunicorn with one line naming it,
and ``GET /info`` shows the effective settings of the core and of the service's own section,
credentials masked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from testing.server import ROOT, gunicorn_server

KEY = "sk-engine-credential-1234"


def test_the_judge_s_engine_key_is_never_shown(tmp_path: Path) -> None:
    """/info answers anyone (no bearer token): the engine's API key is masked wherever the
    settings are shown, the service's other settings as they are."""
    env = {
        "SCORER_JUDGE_ENGINE": "http://127.0.0.1:9",  # nothing listens: the model never loads
        "SCORER_JUDGE_ENGINE_WAIT_S": "1",
        "SCORER_JUDGE_MODEL": "m",
        "SCORER_JUDGE_PARSE_FAILURE_SCORE": "nan",
        "SCORER_JUDGE_API_KEY": KEY,
        "SCORER_AUTH_TOKEN": "node-token-5678",
    }
    with gunicorn_server("judge", env, require_ready=False, log_dir=tmp_path) as server:
        response = requests.get(f"{server.url}/info", timeout=30)
    assert response.status_code == 200
    assert KEY not in response.text and "node-token-5678" not in response.text
    info = response.json()
    assert info["settings"]["auth_token"] == "***"
    own = info["service_settings"]["judge"]
    assert own["api_key"] == "***" and own["engine"] == "http://127.0.0.1:9" and own["concurrency"] == 64


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"SCORER_SERVICE": "ocr", "SCORER_MAX_ITEMS": "many"}, "SCORER_MAX_ITEMS='many': expected int"),
        (
            {"SCORER_SERVICE": "code", "SCORER_CODE_INFRA_FAILURE_SCORE": "nan", "SCORER_CODE_SCORING": "most"},
            "SCORER_CODE_SCORING='most': must be one of fraction, all",
        ),
        (
            {"SCORER_SERVICE": "multi", "SCORER_MULTI_REWARDS": "ocr", "SCORER_OCR_MAX_TARGETS": "lots"},
            "SCORER_OCR_MAX_TARGETS='lots': expected int",
        ),
    ],
    ids=["core", "service", "multi-reward"],
)
def test_a_bad_value_stops_gunicorn_with_one_line_naming_it(variables: dict[str, str], message: str) -> None:
    """Started without run.sh, gunicorn reads the core's settings and the service's own (each
    listed reward's for multi) before a worker starts: one line, no worker's traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
        cwd=ROOT,
        env={**os.environ, **variables},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.strip() == f"scorer: {message}", result.stderr
