"""``run.sh`` decides which services to start before it builds any environment: every service's
check runs under a bare python3 (no site-packages), and the hub-cache probe agrees with
huggingface_hub's own lookup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import try_to_load_from_cache

from common.models.hub import in_hub_cache
from common.setup import registry
from testing.server import ROOT

pytestmark = pytest.mark.unit


def bare_preflight(service: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python3 -m common.setup.preflight`` as run.sh runs it: ``-S`` leaves every installed package out."""
    return subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.preflight", service],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("service", list(registry.SERVICES))
def test_every_services_check_runs_without_installed_packages(service: str, tmp_path: Path) -> None:
    done = bare_preflight(service, {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr, done.stderr
    # Offline with an empty hub cache: the services below refuse for a setting of their own; the
    # other checks of a service of its own judge its weights, whose defaults are hub ids, missing;
    # a service without a check can start.
    if service == "code":
        assert done.returncode == 1 and "SCORER_CODE_INFRA_FAILURE_SCORE" in done.stderr
        assert bare_preflight(service, {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan"}).returncode == 0
    elif service == "judge":  # no engine named, then no parse-failure score chosen
        assert done.returncode == 1 and "SCORER_JUDGE_ENGINE" in done.stderr, done.stderr
        engine = {"SCORER_JUDGE_ENGINE": "http://127.0.0.1:8000"}
        unset = bare_preflight(service, engine)
        assert unset.returncode == 1 and "SCORER_JUDGE_PARSE_FAILURE_SCORE" in unset.stderr, unset.stderr
        assert bare_preflight(service, {**engine, "SCORER_JUDGE_PARSE_FAILURE_SCORE": "nan"}).returncode == 0
    elif service == "multi":  # no reward listed; then a listed reward's own check, named
        assert done.returncode == 1 and "SCORER_MULTI_REWARDS" in done.stderr, done.stderr
        env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "SCORER_MULTI_REWARDS": "ocr,pickscore"}
        listed = bare_preflight(service, env)
        assert listed.returncode == 1 and "pickscore: " in listed.stderr, listed.stderr
        assert "not in the local hub cache" in listed.stderr
        assert bare_preflight(service, {**env, "SCORER_MULTI_REWARDS": "ocr"}).returncode == 0
    elif registry.get(service).preflight:
        assert done.returncode == 1 and "not in the local hub cache" in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stderr


def test_a_bad_setting_is_named_before_anything_is_installed() -> None:
    done = bare_preflight("pickscore", {"SCORER_PICKSCORE_MICRO_BATCH": "zero"})
    assert done.returncode == 1 and "SCORER_PICKSCORE_MICRO_BATCH" in done.stderr, done.stderr


def test_hub_cache_probe_agrees_with_huggingface_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--org--model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "snapshots" / "fedcba9876543210fedcba9876543210fedcba98").mkdir()
    (repo / "snapshots" / "fedcba9876543210fedcba9876543210fedcba98" / "model.safetensors").write_text("")
    for repo_id, name in [("org/model", "config.json"), ("org/model", "model.safetensors"), ("org/other", "x")]:
        theirs = isinstance(try_to_load_from_cache(repo_id, name, cache_dir=str(tmp_path)), str)
        assert in_hub_cache(repo_id, name) == theirs, (repo_id, name)
    assert in_hub_cache("org/model", "config.json")
