"""Can the code verifier start on this node? Standard library only: ``run.sh`` asks with the
system python3 before any virtual environment exists; the scorer asks again when it starts."""

from __future__ import annotations

import os

from common.configuration.config import ConfigError, env_name, from_env
from services.code.settings import CodeSettings

SECTION = "code"
INFRA_HELP = (
    f"{env_name(SECTION, 'infra_failure_score')} (run.sh --infra-failure-score) must be set to 'nan' or "
    "'zero': the reward of a sample the sandbox infrastructure failed to grade. 'nan' is recommended "
    "with OpenRLHF's --algo.dynamic_filtering_enable, which then drops that prompt's group; 'zero' "
    "scores it as if the code had failed, which biases training against correct code when the "
    "infrastructure is at fault. There is no default because the right choice depends on the trainer."
)


def preflight(service: str = SECTION) -> str | None:
    """Why the code verifier cannot start here (its settings, its privileges); None when it can."""
    try:
        settings = from_env(CodeSettings, SECTION)
    except ConfigError as exc:
        return str(exc)
    if settings.infra_failure_score is None:
        return INFRA_HELP
    if os.geteuid() != 0:
        return "the code sandbox must start as root to run each test under its own unprivileged uid"
    return None
