"""docs/ARCHITECTURE.md's layout lists the house as it is: every module of each ``common/<package>/``
and of each ``services/<name>/`` is named there, and every module it names exists.

The layout is the first code block of §1. A line that starts at its left edge with a directory
(``common/server/``, ``services/ocr/``) opens that directory's entry; every ``name.py`` from there to
the next line that starts at the left edge is a module of it. A new service adds one line: ``services/<name>/`` and its
modules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def layout() -> dict[str, set[str]]:
    """Each directory the layout block lists (``common``, ``services/ocr``) -> the modules it names."""
    text = ARCHITECTURE.read_text()
    block = re.search(r"```\n(common/.*?)```", text, re.DOTALL)
    assert block, "docs/ARCHITECTURE.md has no layout block starting with common/"
    named: dict[str, set[str]] = {}
    directory = None
    for line in block.group(1).splitlines():
        if line and not line[0].isspace():  # an entry: a directory's, or a file's (run.sh)
            opening = re.match(r"([\w./<>-]+)/\s", line + " ")
            directory = opening.group(1) if opening else None
            if directory is not None:
                named.setdefault(directory, set())
        if directory is not None:
            named[directory].update(re.findall(r"(?<![\w.])(\w+)\.py\b", line))
    return named


def modules(directory: Path) -> set[str]:
    return {path.stem for path in directory.glob("*.py") if path.stem != "__init__"}


def listed_directories() -> list[Path]:
    """Each package of ``common/`` and each service's directory: the ones the layout must list in full."""
    return sorted(path.parent for package in ("common", "services") for path in (ROOT / package).glob("*/__init__.py"))


@pytest.mark.parametrize("directory", listed_directories(), ids=lambda path: str(path.relative_to(ROOT)))
def test_the_layout_names_every_module(directory: Path) -> None:
    name = str(directory.relative_to(ROOT))
    named = layout()
    assert name in named, f"docs/ARCHITECTURE.md's layout has no line for {name}/"
    missing = modules(directory) - named[name]
    assert not missing, f"docs/ARCHITECTURE.md's layout does not name {sorted(missing)} under {name}/"


def test_every_module_the_layout_names_exists() -> None:
    for name, named in layout().items():
        if name.startswith(("common/", "services/")) and "<" not in name:
            directory = ROOT / name
            assert directory.is_dir(), f"docs/ARCHITECTURE.md's layout names {name}/, which does not exist"
            gone = named - modules(directory)
            assert not gone, f"docs/ARCHITECTURE.md's layout names {sorted(gone)} under {name}/, which do not exist"
