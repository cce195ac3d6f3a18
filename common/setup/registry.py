# Over 400 lines: the table of every service, one entry each; the entries are the length.
"""The services: one entry each, read by ``run.sh``, ``gunicorn.conf.py`` and the app.

Adding a scorer is one module (``services/<name>/scorer.py``) and one ``Service`` entry in
``SERVICES``. ``run.sh`` reads this module before any virtual environment exists, so it uses
the standard library only; what each command installs is ``common.setup.install``, what ``run.sh``
reads of both ``common.setup.shell``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.configuration.config import ConfigError, from_env

if TYPE_CHECKING:
    from common.pipeline.scorer import Scorer


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
    # Distribution packages (apt-get's names; ``common.setup.install.HOST_PACKAGES`` has each one's record).
    system_packages: tuple[str, ...] = ()
    # "module:name" of the distribution packages of its toolchains (``common.setup.install.SystemPackage``
    # records: the code service's languages'), standard library only as ``run.sh`` reads them.
    toolchains: str = ""
    # Needs the pinned Go toolchain (``GO_HOME``), which ``run.sh`` installs with the system packages.
    go: bool = False
    # ``SCORER_<NAME>_ENGINE`` values that need other requirement files, in their own environment.
    engine_requirements: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # "module:Class" of its own settings (``SCORER_<NAME>_<FIELD>``, ``common.configuration.config.setting``
    # declarations), standard library only: ``run.sh`` takes those declared as flags.
    settings: str = ""
    # The virtual environment's name (``.venv-<venv>``), shared by services with the same
    # requirements; unset: the service's name.
    venv: str = ""
    # Request threads per worker when ``SCORER_THREADS`` is unset (``request_threads``).
    threads: int = 128
    # "module:function" answering why the service cannot start on this node (``None``: it can),
    # called as ``function(name)``; standard library only, since ``run.sh`` calls it with the
    # system python3 before it builds the environment (``python3 -m common.setup.preflight NAME``).
    preflight: str = ""
    # "module:Class" of each wire protocol it speaks beside the core's (a ``WireProtocol``
    # subclass, on the same request path: common/server/protocols.py).
    protocols: tuple[str, ...] = ()
    # Modules ``run.sh`` runs (``python -m``) in its environment once its packages are in,
    # to set up what it needs besides them.
    prepare: tuple[str, ...] = ()
    # An image scorer (``ImageScorer``): the ``multi`` service can serve it beside others.
    image: bool = False
    # "module:function" naming, called with the environment, the services it serves together
    # (their settings, requirements and preparations are its own; it reads their weights in the
    # URL's query); standard library only, as ``run.sh`` calls it (``members``).
    members: str = ""
    # "module:function" the master calls, with no argument, after one of its workers exited
    # (gunicorn's ``child_exit``), to clean up what a worker killed or cut short left on the node.
    worker_exited: str = ""


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
            settings="services.ocr.settings:OcrSettings",
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
            settings="services.aesthetic.settings:AestheticSettings",
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
                settings=f"services.clip.settings:{settings}",
                image=True,
                venv="clip",
                preflight="services.clip.settings:preflight",
            )
            for name, port, scorer, settings in (
                ("pickscore", 18081, "PickScoreScorer", "PickScoreSettings"),
                ("clipscore", 18083, "ClipScoreScorer", "ClipScoreSettings"),
                ("hpsv2", 18084, "HPSv2Scorer", "HPSv2Settings"),
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
            settings="services.hpsv3.settings:HPSv3Settings",
            image=True,
        ),
        Service(
            name="geneval",
            port=18087,
            scorer="services.geneval.scorer:GenEvalScorer",
            uses_gpu=True,
            requirements=("requirements.txt", "requirements-clip.txt", "requirements-geneval.txt"),
            settings="services.geneval.settings:GenEvalSettings",
            image=True,
            preflight="services.geneval.settings:preflight",
            # flow_grpo's GenEval client, on the core's routes.
            protocols=("services.geneval.protocol:GenEvalProtocol",),
        ),
        Service(
            name="imagereward",
            port=18088,
            scorer="services.imagereward.scorer:ImageRewardScorer",
            uses_gpu=True,
            requirements=("requirements.txt", "requirements-clip.txt"),
            settings="services.imagereward.settings:ImageRewardSettings",
            image=True,
            venv="clip",
            preflight="services.imagereward.settings:preflight",
        ),
        Service(
            name="judge",
            port=18086,
            scorer="services.judge.scorer:JudgeScorer",
            # The model runs in the engine; the service only talks to it.
            uses_gpu=False,
            requirements=("requirements.txt", "requirements-judge.txt"),
            settings="services.judge.settings:JudgeSettings",
            preflight="services.judge.settings:preflight",
            image=True,
        ),
        *(
            Service(
                name=name,
                port=port,
                scorer=f"services.jpeg.scorer:{scorer}",
                # No model: the JPEG encoding runs on the CPU, one worker.
                uses_gpu=False,
                requirements=("requirements.txt",),
                venv="jpeg",
                image=True,
            )
            for name, port, scorer in (
                ("jpeg_compressibility", 18091, "JpegCompressibilityScorer"),
                ("jpeg_incompressibility", 18092, "JpegIncompressibilityScorer"),
            )
        ),
        Service(
            name="multi",
            port=18100,
            scorer="services.multi.scorer:CombinedScorer",
            uses_gpu=True,
            # The listed rewards' requirements, system packages and preparations (``setup_of``).
            requirements=(),
            settings="services.multi.settings:MultiSettings",
            preflight="services.multi.settings:preflight",
            members="services.multi.settings:listed_rewards",
        ),
        Service(
            name="code",
            port=18090,
            scorer="services.code.scorer:CodeScorer",
            uses_gpu=False,
            requirements=("requirements.txt", "requirements-code.txt"),
            system_packages=("bubblewrap",),
            toolchains="services.code.languages:TOOLCHAINS",
            go=True,
            settings="services.code.settings:CodeSettings",
            preflight="services.code.preflight:preflight",
            protocols=(
                "services.code.protocols.openrlhf:OpenRLHFProtocol",
                "services.code.protocols.sandbox_fusion.protocol:RunCodeProtocol",
                "services.code.protocols.sandbox_fusion.protocol:RunJupyterProtocol",
            ),
            # The packages graded programs may import, in a directory of their own.
            prepare=("services.code.packages",),
            # A request waits for its run slots on its thread: a trainer's burst (hundreds of
            # one-sample requests) is admitted on arrival, at the rate measured until then.
            threads=1024,
            # A worker killed, or stopped while its samples' processes still ran, leaves its
            # cgroup directories: the master removes them once it has reaped the worker.
            worker_exited="services.code.sandbox.cgroups:sweep_dead_workers",
        ),
    )
}


def request_threads(threads: int | None, service: str) -> int:
    """A worker's request threads: ``SCORER_THREADS`` (``threads``), else the service's own."""
    return threads or (SERVICES[service].threads if service in SERVICES else Service.threads)


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


def settings_class(name: str) -> type | None:
    """The class of service ``name``'s own settings (``Service.settings``); None when it has none."""
    path = get(name).settings
    return load_class(path) if path else None


def read_settings(name: str) -> None:
    """Read service ``name``'s own settings as its scorer will (and each of its ``members``'),
    so that a bad value stops the service before a worker starts: ``ConfigError``, one line
    naming the variable. A list of members that cannot be served is left to its scorer."""
    names = [get(name).name]
    try:
        names += members(name)
    except ConfigError:  # a bad value of a member's setting (a ValueError too): it is the one line
        raise
    except ValueError:
        pass
    for each in names:
        if own := settings_class(each):
            from_env(own, each)


def engine_of(name: str, environ: Mapping[str, str] = os.environ) -> str:
    """The engine service ``name``'s settings choose (``SCORER_<NAME>_ENGINE``), where some of
    its engines need requirements of their own (``Service.engine_requirements``); else ""."""
    own = settings_class(name)
    return from_env(own, name, environ).engine if own and get(name).engine_requirements else ""


def members(name: str, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The services service ``name`` serves together (``Service.members``), as ``environ``
    lists them; none for a service of its own. ``ValueError`` says why a list cannot be served."""
    path = get(name).members
    return tuple(load_class(path)(environ)) if path else ()


def joint_services() -> list[Service]:
    """The services that serve others together, and read their weights in the URL's query."""
    return [service for service in SERVICES.values() if service.members]
