"""The registry: one entry per service, readable before any virtual environment exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common import registry
from common.scorer import Scorer
from services.code import languages

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_run_sh_can_read_it_with_the_standard_library_alone() -> None:
    """``-S``: no site-packages, as the system python3 of a fresh machine has none of ours."""
    names = subprocess.run(
        [sys.executable, "-S", "-m", "common.registry", "names"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert names.stdout.split() == list(registry.SERVICES)
    shell = subprocess.run(
        [sys.executable, "-S", "-m", "common.registry", "shell", "code"], cwd=ROOT, capture_output=True, text=True
    )
    assert shell.returncode == 0, shell.stderr
    assert "SYSTEM_PACKAGES=(bubblewrap gcc g++ openjdk-17-jdk-headless rustc-web nodejs)" in shell.stdout
    assert "SYSTEM_COMMANDS=(bwrap gcc g++ javac rustc node)" in shell.stdout
    assert f"SYSTEM_COMMAND_DIRS=('' {' '.join(['/usr/bin:/bin'] * 5)})" in shell.stdout
    assert "SYSTEM_COMMAND_MINIMUM=('' '' '' '' 1.65 '')" in shell.stdout
    assert "SYSTEM_PACKAGES_DNF=(bubblewrap gcc gcc-c++ java-17-openjdk-devel rust nodejs)" in shell.stdout
    assert f"GO_HOME={registry.GO_HOME}" in shell.stdout.splitlines()
    assert "GO_BUILD_ENV=(GO111MODULE=off CGO_ENABLED=0 GOTOOLCHAIN=local GOENV=off GOFLAGS= " in shell.stdout
    unknown = subprocess.run(
        [sys.executable, "-S", "-m", "common.registry", "shell", "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "unknown service 'nope'" in unknown.stderr


def test_every_entry_is_whole() -> None:
    ports = [service.port for service in registry.SERVICES.values()]
    assert len(set(ports)) == len(ports)
    for name, service in registry.SERVICES.items():
        assert service.name == name
        assert issubclass(registry.load_scorer_class(name), Scorer)
        files = [*service.requirements, *service.gpu_requirements, *sum(service.engine_requirements.values(), ())]
        assert all((ROOT / f).is_file() for f in files), files
        assert set(service.system_packages) <= set(registry.SYSTEM_COMMANDS)


def test_run_sh_counts_a_toolchain_only_where_the_code_sandbox_finds_it() -> None:
    """Each language's packages are code toolchains, whose commands run.sh looks for in the
    directories the sandbox searches (``languages.tool_paths``), and each such command is one
    the language needs: a rustc that only rustup's ``~/.cargo/bin`` holds gets installed."""
    for language in languages.LANGUAGES.values():
        assert all(registry.SYSTEM_COMMAND_DIRS[p] == registry.SANDBOX_TOOL_DIRS for p in language.packages)
        assert {registry.SYSTEM_COMMANDS[p] for p in language.packages} <= set(language.tools)


def test_the_sandbox_finds_the_pinned_go_and_its_standard_library() -> None:
    """The Go run.sh installs is under /usr, which the sandbox shows; the sandbox builds with
    the variables its standard library was precompiled with; only the code service needs it."""
    assert registry.GOROOT.startswith("/usr/") and f"{registry.GOROOT}/bin/go" == registry.GO_COMMAND
    assert languages.LANGUAGES["go"].tools == (registry.GO_COMMAND,)
    assert languages.GO_ENV.items() >= registry.GO_BUILD_ENV.items() and languages.GO_ENV["GOROOT"] == registry.GOROOT
    assert registry.setup_of("code", {}).go_home == registry.GO_HOME == registry.setup_of("test", {}).go_home
    assert registry.setup_of("ocr", {}).go_home == ""


def test_what_each_command_sets_up() -> None:
    test = registry.setup_of("test", {})
    assert test.venv == ".venv" and test.requirements[-1] == "requirements-dev.txt"
    assert set(test.system_packages) == {*registry.SERVICES["code"].system_packages, "nginx"}
    assert registry.setup_of("all", {}).venv == ""  # each service has its own
    paddle = registry.setup_of("ocr", {"SCORER_OCR_ENGINE": "paddleocr"})
    assert paddle.venv == ".venv-ocr-paddleocr" and paddle.requirements == ("requirements-ocr-paddle.txt",)
    code = registry.setup_of("code", {})
    assert code.prepare == ("services.code.packages",) and test.prepare == code.prepare
    assert code.flags == (
        "--infra-failure-score=SCORER_CODE_INFRA_FAILURE_SCORE",
        "--env=SCORER_CODE_ENV",
    )
