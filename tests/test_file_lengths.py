"""Modules and scripts stay short enough to read as one job: a file over ``LIMIT`` lines says why
in a comment among its first lines (``MARK`` and the reason), so that its length is a decision."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "services", "bench", "tests", "testing", "deploy")
LIMIT = 400
MARK = "# Over 400 lines: "
# Where the reason may be: the first lines, before the module's docstring (a shebang first).
FIRST_LINES = 3


def unexplained(paths: list[Path]) -> list[str]:
    """The files of ``paths`` over ``LIMIT`` lines whose first lines give no reason."""
    found = []
    for path in paths:
        lines = path.read_text().splitlines()
        reasons = [line[len(MARK) :].strip() for line in lines[:FIRST_LINES] if line.startswith(MARK)]
        if len(lines) > LIMIT and not any(reasons):
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {len(lines)} lines")
    return found


def test_a_file_over_400_lines_says_why_in_its_first_lines() -> None:
    packaged = (path for package in PACKAGES for kind in ("*.py", "*.sh") for path in (ROOT / package).rglob(kind))
    paths = [ROOT / "gunicorn.conf.py", *ROOT.glob("*.sh"), *packaged]
    assert not unexplained(paths)


def test_a_long_file_without_its_reason_is_found(tmp_path: Path) -> None:
    body = '"""A module."""\n' + "x = 1\n" * LIMIT
    cases = {
        "short.py": "x = 1\n",
        "explained.py": f"{MARK}one table, one entry per service.\n" + body,
        "bare.py": body,
        "empty_reason.py": MARK + "\n" + body,
        "reason_too_late.py": body + MARK + "one table.\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    found = unexplained(sorted(tmp_path.iterdir()))
    assert [line.split(":")[0].rsplit("/", 1)[-1] for line in found] == [
        "bare.py",
        "empty_reason.py",
        "reason_too_late.py",
    ]
