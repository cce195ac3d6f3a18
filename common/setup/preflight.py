"""``python3 -m common.setup.preflight SERVICE``: can SERVICE start on this node?

Standard library only, like the checks it calls (``Service.preflight`` in common/setup/registry.py):
``run.sh`` with no argument runs it with the system python3 before it builds the service's
virtual environment, and skips a service that cannot start, printing the reason, without
installing anything for it. The scorers run the same checks when they start.
"""

from __future__ import annotations

import sys

from common.configuration.config import ConfigError, from_env
from common.configuration.settings import CoreSettings
from common.setup import registry


def reason(service: str) -> str | None:
    """Why ``service`` cannot start here (its settings, missing weights); None when it can."""
    check = registry.get(service).preflight
    if not check:
        return None
    return registry.load_class(check)(service)


def main(argv: list[str]) -> int:
    """``SERVICE``, else the one ``SCORER_SERVICE`` names (as the server reads it): exit 1 and
    the reason when it cannot start here."""
    try:
        service = argv[0] if argv else from_env(CoreSettings).service
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        problem = reason(service)
    except ValueError as exc:  # an unknown service
        problem = str(exc)
    if problem:
        print(f"{service}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
