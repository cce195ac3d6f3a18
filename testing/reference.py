"""The tests' reference environments (``.venv-reference``; ``.venv-reference-imagereward``, the
``image-reward`` package on its old transformers; both built by ``bash run.sh test``): the public
libraries a reward is compared with run there, one job per subprocess."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from testing.server import ROOT

REFERENCE_PYTHON = os.environ.get("SCORER_TEST_REFERENCE_PYTHON")
IMAGEREWARD_PYTHON = os.environ.get("SCORER_TEST_IMAGEREWARD_PYTHON")
needs_reference = pytest.mark.skipif(
    not REFERENCE_PYTHON, reason="reference environment not built (run via 'bash run.sh test')"
)
needs_imagereward = pytest.mark.skipif(
    not IMAGEREWARD_PYTHON, reason="image-reward's reference environment not built (run via 'bash run.sh test')"
)


def run_reference(script: str, job: dict, python: str | None = REFERENCE_PYTHON, timeout: float = 300) -> dict:
    """``job`` (JSON) through ``testing/<script>`` in a reference environment (``python``, the
    shared one by default); its JSON answer."""
    assert python, "the reference environment is not built (run via 'bash run.sh test')"
    done = subprocess.run(
        [python, str(ROOT / "testing" / script)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
