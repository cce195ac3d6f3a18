"""``-m unit`` skips importing the test modules that mark no test unit (tests/conftest.py's
pytest_ignore_collect): it must still collect every unit test there is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Collects in a fresh interpreter, then prints the test modules it imported as its last line.
COLLECT = """
import json, sys, pytest
code = pytest.main(sys.argv[1:])
print(json.dumps(sorted(name for name in sys.modules if name.startswith("tests."))))
sys.exit(code)
"""


def collected(*args: str) -> tuple[set[str], set[str]]:
    """The test ids ``pytest --collect-only -m unit`` lists with ``args`` added, and the test
    modules it imported."""
    done = subprocess.run(
        [sys.executable, "-c", COLLECT, "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "unit", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    return {line for line in lines if "::" in line}, set(json.loads(lines[-1]))


def test_skipping_modules_drops_no_unit_test() -> None:
    every_ids, every_modules = collected("--collect-every-module")
    ids, modules = collected()
    assert len(every_ids) > 100
    assert ids == every_ids
    # The hook did skip: a module of fuzzers only (no unit test) was imported only when asked.
    assert "tests.test_fuzz" in every_modules
    assert "tests.test_fuzz" not in modules
    assert modules < every_modules
