"""``python -m common.preflight``: can the service of ``SCORER_SERVICE`` start on this node?

Builds the scorer (which checks its settings) and asks it for anything missing, without
loading a model. Prints the reason and exits 1 when it cannot start; ``run.sh`` with no
argument uses this to skip a service rather than fail.
"""

from __future__ import annotations

import sys

from common.config import ConfigError, from_env
from common.registry import load_scorer_class
from common.settings import CoreSettings


def main() -> int:
    core = from_env(CoreSettings)
    try:
        scorer = load_scorer_class(core.service)(core)
        problem = scorer.preflight()
    except (ConfigError, ImportError) as exc:
        problem = str(exc)
    if problem:
        print(f"{core.service}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
