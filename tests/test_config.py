"""Settings read from the environment: types, clear errors, and a renamed setting's former name."""

from __future__ import annotations

import pytest

from common.config import ConfigError, deprecations, describe, from_env
from common.settings import CoreSettings
from services.judge.settings import JudgeSettings

pytestmark = pytest.mark.unit


def test_a_bad_value_names_its_variable_and_the_type() -> None:
    with pytest.raises(ConfigError, match=r"^SCORER_MAX_ITEMS='many': expected int$"):
        from_env(CoreSettings, environ={"SCORER_MAX_ITEMS": "many"})
    with pytest.raises(ConfigError, match=r"^SCORER_MAX_QUEUE_BYTES='4G': expected int$"):
        from_env(CoreSettings, environ={"SCORER_MAX_QUEUE_BYTES": "4G"})


def test_the_work_budget_is_read_under_its_new_name() -> None:
    assert from_env(CoreSettings, environ={"SCORER_MAX_WORK_BYTES": "123"}).max_work_bytes == 123
    assert deprecations(CoreSettings, environ={"SCORER_MAX_WORK_BYTES": "123"}) == []


def test_the_former_name_still_sets_it_with_a_warning() -> None:
    environ = {"SCORER_MAX_QUEUE_BYTES": "456"}
    assert from_env(CoreSettings, environ=environ).max_work_bytes == 456
    assert deprecations(CoreSettings, environ=environ) == [
        "SCORER_MAX_QUEUE_BYTES is deprecated and goes in the next release: set SCORER_MAX_WORK_BYTES instead "
        "(its value is used)"
    ]


def test_the_new_name_wins_over_the_former() -> None:
    environ = {"SCORER_MAX_QUEUE_BYTES": "456", "SCORER_MAX_WORK_BYTES": "123"}
    assert from_env(CoreSettings, environ=environ).max_work_bytes == 123
    [message] = deprecations(CoreSettings, environ=environ)
    assert message.endswith("(SCORER_MAX_WORK_BYTES is set too and wins)")


def test_a_setting_declared_secret_is_masked_when_set() -> None:
    assert describe(JudgeSettings(api_key="sk-1"))["api_key"] == "***"
    assert describe(CoreSettings(auth_token="t"))["auth_token"] == "***"
    assert describe(JudgeSettings())["api_key"] is None  # unset is shown as unset
    assert describe(CoreSettings(max_items=7))["max_items"] == 7
