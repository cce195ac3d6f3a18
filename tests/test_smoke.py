"""The README's smoke test runs as written against a running OCR service."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.server import ROOT, Server


def test_the_readme_smoke_test_runs_as_written(ocr_server: Server, tmp_path: Path) -> None:
    """In a folder of its own; only the port and the environment's interpreter differ
    (``.venv-ocr`` is what ``bash run.sh`` builds, the tests run from ``.venv``)."""
    block = re.search(r"<!-- smoke test -->\n```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block, "no smoke test block in the README"
    script = block.group(1).replace(".venv-ocr/bin/python", sys.executable)
    script = script.replace("http://localhost:18082", ocr_server.url)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["{'scores': [1.0], 'outputs': [1.0]}", "1.0"], done.stdout
