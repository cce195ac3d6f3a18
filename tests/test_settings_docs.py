"""The docs' settings tables (docs/settings.md's, each service's beside its documentation) are the
ones the settings' declarations make, defaults included."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from common.configuration.config import declared
from common.configuration.settings import CoreSettings
from common.setup import registry
from common.setup.settings_docs import pages, render

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "settings.md"


@pytest.mark.parametrize("path", pages(), ids=lambda path: str(path.relative_to(ROOT)))
def test_each_page_s_tables_are_what_the_declarations_make(path: Path) -> None:
    """After changing a setting: ``.venv/bin/python -m common.setup.settings_docs``."""
    page = path.read_text()
    assert render(page) == page


def test_each_service_s_own_table_is_beside_its_documentation() -> None:
    """Every service with settings of its own has its table on one page besides docs/settings.md:
    its README, or docs/services.md for those without one; the pages found hold every marker,
    and every README of a service with settings (the JPEG rewards' has none to show) is found."""
    found = {path.relative_to(ROOT).as_posix(): path.read_text() for path in pages()}
    assert {"docs/settings.md", "docs/services.md"} <= found.keys()
    with_settings = {
        registry.get(name).scorer.split(":")[0].rsplit(".", 1)[0].replace(".", "/")
        for name in registry.SERVICES
        if registry.settings_class(name) is not None
    }
    assert {name for name in found if name.startswith("services/")} == {
        path.relative_to(ROOT).as_posix()
        for path in ROOT.glob("services/*/README.md")
        if path.parent.relative_to(ROOT).as_posix() in with_settings
    }
    for name in registry.SERVICES:
        if registry.settings_class(name) is not None:
            marker = f"<!-- settings:{name}:start -->"
            holders = [page for page, text in found.items() if marker in text]
            assert len(holders) == 1, (name, holders)


def test_every_setting_is_declared_with_its_help() -> None:
    classes = [CoreSettings, *(registry.settings_class(name) for name in registry.SERVICES)]
    undeclared = [
        f"{cls.__name__}.{field.name}"
        for cls in classes
        if cls
        for field in dataclasses.fields(cls)
        if not (declared(field) and declared(field).help)
    ]
    assert not undeclared


def row(variable: str) -> str:
    [line] = [line for line in PAGE.read_text().splitlines() if line.startswith(f"| `{variable}`")]
    return line


def test_each_service_s_batching_default_is_shown() -> None:
    """The defaults are the scorer classes' own, HPSv3's and GenEval's included, one for each
    service that batches; those that batch nothing (code, judge, multi) have none."""
    shown = row("SCORER_MAX_BATCH").split(" | ")[2].removeprefix("each service's own: ").split(", ")
    assert {"ocr 16", "aesthetic 64", "pickscore 64", "hpsv3 16", "geneval 16", "imagereward 64"} <= set(shown)
    batched = [name for name in registry.SERVICES if registry.load_scorer_class(name).batched]
    assert [each.split(" ")[0] for each in shown] == batched
    assert {"code", "judge", "multi"}.isdisjoint(batched)


def test_a_renamed_setting_shows_both_names() -> None:
    assert "formerly `SCORER_MAX_QUEUE_BYTES`" in row("SCORER_MAX_WORK_BYTES")


def test_flags_and_per_service_defaults() -> None:
    assert row("SCORER_PORT").split(" | ")[1] == "`--port`"
    assert row("SCORER_PICKSCORE_MODEL").split(" | ")[1:3] == ["`--model`", "`yuvalkirstain/PickScore_v1`"]
    assert row("SCORER_CLIPSCORE_MODEL").split(" | ")[2] == "`openai/clip-vit-large-patch14`"


def test_a_page_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="settings:start"):
        render("# Settings\n")
    every = render("intro\n<!-- settings:start -->\nstale row\n<!-- settings:end -->\nafter\n")
    assert every.startswith("intro\n<!-- settings:start -->\n## Every service") and "stale row" not in every


def test_a_service_marker_holds_its_own_settings_and_its_batching_defaults() -> None:
    """HPSv3's table: its own rows, then the core's batching rows at HPSv3's defaults; another
    block of the same page is left alone."""
    page = (
        "a\n<!-- settings:hpsv3:start -->\nstale row\n<!-- settings:hpsv3:end -->\n"
        "b\n<!-- settings:multi:start -->\n<!-- settings:multi:end -->\n"
    )
    rendered = render(page)
    hpsv3 = rendered.split("<!-- settings:hpsv3:start -->\n")[1].split("\n<!-- settings:hpsv3:end -->")[0]
    variables = [line.split(" | ")[0].strip("| `") for line in hpsv3.splitlines()[2:]]
    assert variables[0] == "SCORER_HPSV3_MODEL" and variables[-2:] == ["SCORER_MAX_BATCH", "SCORER_MAX_WAIT_MS"]
    assert "| `SCORER_MAX_BATCH` |  | `16` |" in hpsv3 and "SCORER_PORT" not in hpsv3
    assert "`SCORER_MULTI_REWARDS`" in rendered.split("<!-- settings:multi:start -->")[1]
    assert "stale row" not in rendered
    # A name no service has (not "brightness": tests/test_adding_a_scorer.py adds that one).
    with pytest.raises(ValueError, match="unknown service 'nosuchservice'"):
        render("<!-- settings:nosuchservice:start -->\n<!-- settings:nosuchservice:end -->\n")
