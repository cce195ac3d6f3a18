"""Every ``SCORER_*`` variable a document names is a real setting (or one of the test suite's
variables): a misspelt or removed name in prose is caught. That every setting has its row is
tests/test_settings_docs.py's: the tables are made from the declarations."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from common.configuration.config import declared, env_name
from common.configuration.settings import CoreSettings
from common.setup import registry

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]

# Variables the documents name that are not settings of a service.
NOT_SETTINGS = {
    "SCORER_TEST_SKIP_REFERENCE",
    "SCORER_TEST_VERL_OMNI_HPSV3",
    "SCORER_TEST_VERL_OMNI",
    "SCORER_TEST_FLOW_GRPO_REWARDS",
    "SCORER_TEST_FLOW_GRPO_QWENVL",
    "SCORER_TEST_MMDET_PYTHON",
    "SCORER_TEST_SKIP_ENGINE",
    "SCORER_TEST_SKIP_PADDLE",
    "SCORER_TEST_SKIP_IMAGEREWARD",
    "SCORER_TEST_IMAGEREWARD_PYTHON",
    "SCORER_TEST_REFERENCE_PYTHON",
    "SCORER_TEST_ENGINE_PYTHON",
    "SCORER_TEST_PADDLE_PYTHON",
    "SCORER_TEST_CORPUS",
    "SCORER_TEST_LOGS",
    "SCORER_TEST_TIME_FACTOR",
    "SCORER_TEST_VERL_SANDBOX_FUSION",
    "SCORER_BRIGHTNESS_THRESHOLD",
}


def test_every_documented_variable_is_a_setting() -> None:
    sections = [("", CoreSettings), *((name, registry.settings_class(name)) for name in registry.SERVICES)]
    real = {
        env_name(section, name)
        for section, settings in sections
        if settings is not None
        for field in dataclasses.fields(settings)
        for name in (field.name, getattr(declared(field), "renamed_from", ""))  # a former name is still read
        if name
    }
    documents = [
        ROOT / "README.md",
        ROOT / "deploy" / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("services/*/README.md"),
    ]
    named = {
        name for document in documents for name in re.findall(r"\bSCORER_[A-Z0-9_]*[A-Z0-9]\b", document.read_text())
    }
    prefixes = {env_name(section, "").rstrip("_") for section, _ in sections}
    unknown = sorted(named - real - NOT_SETTINGS - prefixes)
    assert not unknown, f"documented but not a setting: {unknown}"
