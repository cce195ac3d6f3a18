"""The tests' reference environment (``.venv-reference``, built by ``bash run.sh test``): the
public libraries a reward is compared with run there, one job per subprocess."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from testing.server import ROOT

REFERENCE_PYTHON = os.environ.get("SCORER_TEST_REFERENCE_PYTHON")
needs_reference = pytest.mark.skipif(
    not REFERENCE_PYTHON, reason="reference environment not built (run via 'bash run.sh test')"
)


def run_reference(script: str, job: dict) -> dict:
    """``job`` (JSON) through ``testing/<script>`` in the reference environment; its JSON answer."""
    assert REFERENCE_PYTHON, "the reference environment is not built (run via 'bash run.sh test')"
    done = subprocess.run(
        [REFERENCE_PYTHON, str(ROOT / "testing" / script)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
