"""Every setting is documented, once, where its service is: each field of the typed settings
has a row in its document's tables (as ``SCORER_<SECTION>_<FIELD>``, or as ``<FIELD>`` in a
table of that section), and every ``SCORER_*`` variable a document names is a real setting."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from common.config import declared
from common.settings import CoreSettings, MultiSettings
from services.aesthetic.settings import AestheticSettings
from services.clip.settings import WEIGHTS
from services.code.settings import CodeSettings
from services.geneval.settings import GenEvalSettings
from services.hpsv3.settings import HPSv3Settings
from services.judge.settings import JudgeSettings
from services.ocr.settings import OcrSettings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# (environment prefix, settings class, the document that describes them)
DOCUMENTED: list[tuple[str, type, str]] = [
    ("SCORER_", CoreSettings, "docs/settings.md"),
    # The OCR matching options' table is with the OCR scorer, its other settings with the core's.
    ("SCORER_OCR_", OcrSettings, "docs/settings.md docs/services.md"),
    ("SCORER_MULTI_", MultiSettings, "docs/settings.md"),
    ("SCORER_AESTHETIC_", AestheticSettings, "services/aesthetic/README.md"),
    *((f"SCORER_{name.upper()}_", spec.settings_class, "services/clip/README.md") for name, spec in WEIGHTS.items()),
    ("SCORER_HPSV3_", HPSv3Settings, "services/hpsv3/README.md"),
    ("SCORER_CODE_", CodeSettings, "services/code/README.md"),
    ("SCORER_GENEVAL_", GenEvalSettings, "services/geneval/README.md"),
    ("SCORER_JUDGE_", JudgeSettings, "services/judge/README.md"),
]
# Variables the documents name that are not settings of a service.
NOT_SETTINGS = {
    "SCORER_TEST_SKIP_REFERENCE",
    "SCORER_TEST_VERL_OMNI_HPSV3",
    "SCORER_TEST_VERL_OMNI",
    "SCORER_TEST_FLOW_GRPO_REWARDS",
    "SCORER_TEST_MMDET_PYTHON",
    "SCORER_TEST_SKIP_ENGINE",
    "SCORER_TEST_SKIP_PADDLE",
    "SCORER_TEST_REFERENCE_PYTHON",
    "SCORER_TEST_ENGINE_PYTHON",
    "SCORER_TEST_PADDLE_PYTHON",
    "SCORER_TEST_CORPUS",
    "SCORER_TEST_LOGS",
    "SCORER_TEST_TIME_FACTOR",
    "SCORER_TEST_VERL_SANDBOX_FUSION",
    "SCORER_BRIGHTNESS_THRESHOLD",
}


def table_cells(paths: str) -> set[str]:
    """The back-quoted words in the first column of the tables of the documents (paths
    separated by spaces)."""
    text = "\n".join((ROOT / path).read_text() for path in paths.split())
    cells = set()
    for row in re.findall(r"^\|([^|\n]*)\|", text, re.MULTILINE):
        cells.update(re.findall(r"`([^`]+)`", row))
    return cells


@pytest.mark.parametrize(("prefix", "settings", "document"), DOCUMENTED, ids=[p for p, _, _ in DOCUMENTED])
def test_every_setting_has_a_row(prefix: str, settings: type, document: str) -> None:
    cells = table_cells(document)
    words = {word for cell in cells for word in re.split(r"[\s,/]+", cell)}
    # The CLIP family's document has one row per field for the three (``SCORER_<S>_MODEL``).
    shared = "SCORER_<S>_" if settings in {spec.settings_class for spec in WEIGHTS.values()} else prefix
    names = {field.name: field.name.upper() for field in dataclasses.fields(settings)}
    missing = [
        f"{prefix}{upper}" for name, upper in names.items() if not {prefix + upper, shared + upper, upper, name} & words
    ]
    assert not missing, f"{document} has no row for {missing}"


def test_every_documented_variable_is_a_setting() -> None:
    real = {
        f"{prefix}{name.upper()}"
        for prefix, settings, _ in DOCUMENTED
        for field in dataclasses.fields(settings)
        for name in (field.name, getattr(declared(field), "renamed_from", ""))  # a former name is still read
        if name
    }
    named = set()
    documents = {"README.md", "deploy/README.md", *(d for _, _, ds in DOCUMENTED for d in ds.split())}
    for document in documents | {str(page.relative_to(ROOT)) for page in (ROOT / "docs").glob("*.md")}:
        named |= set(re.findall(r"\bSCORER_[A-Z0-9_]*[A-Z0-9]\b", (ROOT / document).read_text()))
    prefixes = {prefix.rstrip("_") for prefix, _, _ in DOCUMENTED}
    unknown = sorted(named - real - NOT_SETTINGS - prefixes)
    assert not unknown, f"documented but not a setting: {unknown}"
