"""The registry: one entry per service, readable before any virtual environment exists."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common.configuration.config import ConfigError, env_name
from common.configuration.settings import CoreSettings
from common.pipeline.scorer import Scorer
from common.setup import install, registry, shell
from services.code import languages

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_run_sh_can_read_it_with_the_standard_library_alone() -> None:
    """``-S``: no site-packages, as the system python3 of a fresh machine has none of ours."""
    names = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.shell", "names"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert names.stdout.split() == list(registry.SERVICES)
    shell = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.shell", "shell", "code"], cwd=ROOT, capture_output=True, text=True
    )
    assert shell.returncode == 0, shell.stderr
    assert "SYSTEM_PACKAGES=(bubblewrap gcc g++ openjdk-17-jdk-headless rustc-web nodejs)" in shell.stdout
    assert "SYSTEM_COMMANDS=(bwrap gcc g++ javac rustc node)" in shell.stdout
    assert f"SYSTEM_COMMAND_DIRS=('' {' '.join(['/usr/bin:/bin'] * 5)})" in shell.stdout
    assert "SYSTEM_COMMAND_MINIMUM=('' '' '' '' 1.65 '')" in shell.stdout
    assert "SYSTEM_PACKAGES_DNF=(bubblewrap gcc gcc-c++ java-17-openjdk-devel rust nodejs)" in shell.stdout
    assert f"GO_HOME={install.GO_HOME}" in shell.stdout.splitlines()
    assert "GO_BUILD_ENV=(GO111MODULE=off CGO_ENABLED=0 GOTOOLCHAIN=local GOENV=off GOFLAGS= " in shell.stdout
    unknown = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.shell", "shell", "nope"], cwd=ROOT, capture_output=True, text=True
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
        assert set(install.packages_of(service)) <= set(install.known_packages())


def test_run_sh_counts_a_toolchain_only_where_the_code_sandbox_finds_it() -> None:
    """Each language's packages are code toolchains, whose commands run.sh looks for in the
    directories the sandbox searches (``languages.tool_paths``), and each such command is one
    the language needs: a rustc that only rustup's ``~/.cargo/bin`` holds gets installed."""
    for language in languages.LANGUAGES.values():
        known = install.known_packages()
        assert all(known[p.name].dirs == install.SANDBOX_TOOL_DIRS for p in language.packages)
        assert {p.command for p in language.packages} <= set(language.tools)


def test_the_sandbox_finds_the_pinned_go_and_its_standard_library() -> None:
    """The Go run.sh installs is under /usr, which the sandbox shows; the sandbox builds with
    the variables its standard library was precompiled with; only the code service needs it."""
    assert install.GOROOT.startswith("/usr/") and f"{install.GOROOT}/bin/go" == install.GO_COMMAND
    assert languages.LANGUAGES["go"].tools == (install.GO_COMMAND,)
    assert languages.GO_ENV.items() >= install.GO_BUILD_ENV.items() and languages.GO_ENV["GOROOT"] == install.GOROOT
    assert install.setup_of("code", {}).go_home == install.GO_HOME == install.setup_of("test", {}).go_home
    assert install.setup_of("ocr", {}).go_home == ""


def test_what_each_command_sets_up() -> None:
    test = install.setup_of("test", {})
    assert test.venv == ".venv" and test.requirements[-1] == "requirements-dev.txt"
    assert set(test.system_packages) == {*install.packages_of(registry.SERVICES["code"]), "nginx"}
    assert install.setup_of("all", {}).venv == ""  # each service has its own
    paddle = install.setup_of("ocr", {"SCORER_OCR_ENGINE": "paddleocr"})
    assert paddle.venv == ".venv-ocr-paddleocr" and paddle.requirements == ("requirements-ocr-paddle.txt",)
    code = install.setup_of("code", {})
    assert code.prepare == ("services.code.packages",) and test.prepare == code.prepare


def test_what_run_sh_installs_reads_the_settings_as_the_service_does() -> None:
    """The engine and the rewards listed are read through their declarations: a value the
    service would refuse is refused here too, never taken for the default's set-up."""
    with pytest.raises(ConfigError, match=r"^SCORER_OCR_ENGINE='paddle': must be one of auto, rapidocr, torch"):
        install.setup_of("ocr", {"SCORER_OCR_ENGINE": "paddle"})
    with pytest.raises(ConfigError, match=r"^SCORER_OCR_ENGINE='Torch': must be one of"):
        install.setup_of("multi", {"SCORER_MULTI_REWARDS": "ocr,pickscore", "SCORER_OCR_ENGINE": "Torch"})
    # The judge's SCORER_JUDGE_ENGINE is its engine's URL, no choice of requirements.
    judge = install.setup_of("judge", {"SCORER_JUDGE_ENGINE": "http://127.0.0.1:8000"})
    assert judge.venv == ".venv-judge"
    assert shell.flag_variables("code") == (
        "--port=SCORER_PORT",
        "--workers=SCORER_WORKERS",
        "--infra-failure-score=SCORER_CODE_INFRA_FAILURE_SCORE",
        "--env=SCORER_CODE_ENV",
    )


def test_the_flags_are_the_settings_declared_flags() -> None:
    """Every flag ``run.sh all`` takes is a field declared ``flag=True`` of the core's or a
    service's settings, read with the standard library alone (``-S``), and each such field is one."""
    flags = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.shell", "flags", "all"], cwd=ROOT, capture_output=True, text=True
    )
    assert flags.returncode == 0, flags.stderr
    shown = set(flags.stdout.strip().removeprefix("FLAGS=(").removesuffix(")").split())
    sections = [("", CoreSettings)] + [(n, registry.settings_class(n)) for n in registry.SERVICES]
    declared = {
        f"--{field.name.replace('_', '-')}={env_name(section, field.name)}"
        for section, cls in sections
        if cls
        for field in dataclasses.fields(cls)
        if field.metadata.get("setting") and field.metadata["setting"].flag
    }
    assert shown == declared
    assert {"--port=SCORER_PORT", "--clip=SCORER_AESTHETIC_CLIP", "--rewards=SCORER_MULTI_REWARDS"} <= shown
    assert "--model=SCORER_PICKSCORE_MODEL" in shown and "--serve=SCORER_JUDGE_SERVE" in shown


def test_run_sh_help_lists_each_flag_with_its_variable_and_help() -> None:
    """``--help`` is made from the declarations too: a new flag needs no edit of run.sh."""
    shown = subprocess.run(["bash", "run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for entry in shell.flag_variables("all"):
        flag, variable = entry.split("=")
        assert re.search(rf"^    {flag} +{variable} +\S", shown, re.MULTILINE), entry
    code = subprocess.run(["bash", "run.sh", "code", "--help"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert code.stdout.startswith("# Start the scorer services")
    help_ = "what a sample left without a verdict scores: `nan` or `zero`"
    assert f"SCORER_CODE_INFRA_FAILURE_SCORE    {help_}" in code.stdout and "--clip" not in code.stdout


def test_a_misspelt_setting_is_warned_of_and_the_others_are_not() -> None:
    """A variable no service reads leaves the setting it meant at its default: run.sh says so."""
    env = {
        "PATH": "/usr/bin:/bin",
        "SCORER_CODE_SCORNG": "all",  # meant SCORER_CODE_SCORING
        "SCORER_CODE_TEST_CPU": "8",  # meant SCORER_CODE_TEST_CPU_S
        "SCORER_CODE_SCORING": "all",
        "SCORER_PICKSCORE_MODEL": "/models/pickscore",  # another service's, on the same node
        "SCORER_MAX_QUEUE_BYTES": "1000",  # a former name, still read
        "SCORER_TEST_SKIP_ENGINE": "1",
    }
    result = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.shell", "check", "code"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        f"warning: {name} is no setting of any service (docs/settings.md lists them): ignored"
        for name in ("SCORER_CODE_SCORNG", "SCORER_CODE_TEST_CPU")
    ]


@pytest.mark.parametrize(
    ("command", "variable", "refused"),
    [
        ("aesthetic", "SCORER_AESTHETIC_MICRO_BATCH", True),
        ("all", "SCORER_PORT", True),
        # `run.sh all` skips a service whose own settings cannot be used (its preflight), the others start.
        ("all", "SCORER_AESTHETIC_MICRO_BATCH", False),
    ],
)
def test_what_run_sh_checks_before_it_installs(command: str, variable: str, refused: bool) -> None:
    env = {"PATH": "/usr/bin:/bin", variable: "x"}
    result = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.shell", "check", command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == ((2, f"{variable}='x': expected int\n") if refused else (0, ""))


def test_run_sh_refuses_a_value_against_its_declared_rule_before_it_installs() -> None:
    """``run.sh geneval`` with the system python3: the rule's error, one line, exit 2."""
    env = {"PATH": "/usr/bin:/bin", "SCORER_GENEVAL_THRESHOLD": "1.5"}
    result = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.shell", "check", "geneval"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == (2, "SCORER_GENEVAL_THRESHOLD='1.5': must be a number from 0 to 1\n")
