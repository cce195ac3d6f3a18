"""docs/settings.md's tables are the ones the settings' declarations make, defaults included."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from common import registry
from common.config import declared
from common.settings import CoreSettings
from common.settings_docs import END, START, render

pytestmark = pytest.mark.unit

PAGE = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def test_the_settings_page_is_what_the_declarations_make() -> None:
    """After changing a setting: ``.venv/bin/python -m common.settings_docs docs/settings.md``."""
    page = PAGE.read_text()
    assert render(page) == page


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
    """The defaults are the scorer classes' own, HPSv3's and GenEval's included; the services
    that batch nothing (code, judge, multi) have none."""
    shown = row("SCORER_MAX_BATCH").split(" | ")[2]
    assert shown == (
        "each service's own: ocr 16, aesthetic 64, pickscore 64, clipscore 64, hpsv2 64, hpsv3 16, geneval 16"
    )


def test_a_renamed_setting_shows_both_names() -> None:
    assert "formerly `SCORER_MAX_QUEUE_BYTES`" in row("SCORER_MAX_WORK_BYTES")


def test_flags_and_per_service_defaults() -> None:
    assert row("SCORER_PORT").split(" | ")[1] == "`--port`"
    assert row("SCORER_PICKSCORE_MODEL").split(" | ")[1:3] == ["`--model`", "`yuvalkirstain/PickScore_v1`"]
    assert row("SCORER_CLIPSCORE_MODEL").split(" | ")[2] == "`openai/clip-vit-large-patch14`"


def test_a_page_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="settings:start"):
        render("# Settings\n")
    assert render(f"intro\n{START}\nold\n{END}\nafter\n").startswith(f"intro\n{START}\n## Every service")
