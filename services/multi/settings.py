"""The ``multi`` service's settings and what they list: the image rewards it serves together
(``listed_rewards``), and whether they can start on this node (``preflight``). Standard library
only: ``run.sh`` reads them with the system python3 before any virtual environment exists."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from common.configuration.config import from_env, setting
from common.setup import preflight as core_preflight
from common.setup import registry

SECTION = "multi"


@dataclass(frozen=True)
class MultiSettings:
    """``SCORER_MULTI_*``: the rewards the ``multi`` service serves together (services/multi/scorer.py)."""

    # Each reward with its own service's settings.
    rewards: str = setting(
        "",
        "the image rewards the `multi` service serves together, comma-separated (`ocr,pickscore`); none listed, it "
        "does not start",
        flag=True,
    )


def listed_rewards(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The rewards ``SCORER_MULTI_REWARDS`` lists for the ``multi`` service, checked: image
    scorers, each once, at least one; ``ValueError`` with the fix otherwise."""
    raw = from_env(MultiSettings, SECTION, environ).rewards
    names = [name.strip() for name in raw.split(",") if name.strip()]
    images = [service.name for service in registry.SERVICES.values() if service.image]
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
        engine = registry.engine_of(name, environ)
        requirements = registry.SERVICES[name].engine_requirements.get(engine)
        if requirements is not None and not set(registry.SERVICES[name].requirements) <= set(requirements):
            raise ValueError(
                f"SCORER_{name.upper()}_ENGINE={engine} needs an environment of its own (its packages clash with the "
                f"others'), so the multi service cannot serve it: serve {name} with this engine alone "
                f"(bash run.sh {name}), or choose another engine"
            )
    return tuple(names)


def preflight(service: str = SECTION) -> str | None:
    """Why the ``multi`` service cannot start: its list of rewards, else the first listed reward
    that cannot (its own preflight), named."""
    try:
        rewards = listed_rewards()
    except ValueError as exc:
        return str(exc)
    for reward in rewards:
        if problem := core_preflight.reason(reward):
            return f"{reward}: {problem}"
    return None
