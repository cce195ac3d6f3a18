"""``GET /info`` under gunicorn: the effective settings of the core and of the service's own
section, read by their declarations, credentials masked."""

from __future__ import annotations

from pathlib import Path

import requests

from testing.server import gunicorn_server

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
