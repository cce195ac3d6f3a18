"""Settings read from the environment: types, clear errors, and a renamed setting's former name."""

from __future__ import annotations

import dataclasses

import pytest

from common.configuration.config import ConfigError, deprecations, describe, from_env
from common.configuration.settings import CoreSettings
from common.setup import registry
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


# A bad value of a setting whose declaration states its rule: (service, variable, value, the error).
AGAINST_THE_RULE = [
    ("aesthetic", "SCORER_AESTHETIC_MICRO_BATCH", "0", "SCORER_AESTHETIC_MICRO_BATCH='0': must be at least 1"),
    ("aesthetic", "SCORER_AESTHETIC_CLIP", " ", "SCORER_AESTHETIC_CLIP=' ': must be a path or a hub id, not blank"),
    ("pickscore", "SCORER_PICKSCORE_DIVISOR", "0", "SCORER_PICKSCORE_DIVISOR='0': must be a finite non-zero number"),
    ("hpsv2", "SCORER_HPSV2_DIVISOR", "inf", "SCORER_HPSV2_DIVISOR='inf': must be a finite non-zero number"),
    ("clipscore", "SCORER_CLIPSCORE_MODEL", "", "SCORER_CLIPSCORE_MODEL='': must be a path or a hub id, not blank"),
    ("hpsv3", "SCORER_HPSV3_SCALE", "nan", "SCORER_HPSV3_SCALE='nan': must be a finite number"),
    ("hpsv3", "SCORER_HPSV3_MAX_TOKENS", "0", "SCORER_HPSV3_MAX_TOKENS='0': must be at least 1"),
    ("geneval", "SCORER_GENEVAL_THRESHOLD", "1.5", "SCORER_GENEVAL_THRESHOLD='1.5': must be a number from 0 to 1"),
    ("geneval", "SCORER_GENEVAL_OWN_SIZE_PIXELS", "-1", "SCORER_GENEVAL_OWN_SIZE_PIXELS='-1': must be at least 0"),
    ("judge", "SCORER_JUDGE_CONCURRENCY", "0", "SCORER_JUDGE_CONCURRENCY='0': must be at least 1"),
    ("judge", "SCORER_JUDGE_READY_PROBE_S", "0", "SCORER_JUDGE_READY_PROBE_S='0': must be a finite number over 0"),
    (
        "code",
        "SCORER_CODE_TIME_SCALES",
        "java=two",
        "SCORER_CODE_TIME_SCALES='java=two': 'java=two': expected LANGUAGE=FACTOR[+SECONDS] with a known language",
    ),
    ("", "SCORER_TRUSTED_PROXIES", "nginx", "SCORER_TRUSTED_PROXIES='nginx': 'nginx' is not an IP address or network"),
]


@pytest.mark.parametrize(("service", "variable", "value", "error"), AGAINST_THE_RULE)
def test_a_value_against_its_declared_rule_names_the_variable_and_what_is_allowed(
    service: str, variable: str, value: str, error: str
) -> None:
    settings = registry.settings_class(service) if service else CoreSettings
    with pytest.raises(ConfigError) as raised:
        from_env(settings, service, environ={variable: value})
    assert str(raised.value) == error


@pytest.mark.parametrize(("service", "variable", "value", "error"), AGAINST_THE_RULE)
def test_a_value_within_its_rule_is_read(service: str, variable: str, value: str, error: str) -> None:
    """The rules refuse only what they say: the declared default, set explicitly, passes each."""
    settings = registry.settings_class(service) if service else CoreSettings
    field = variable.removeprefix(f"SCORER_{service.upper()}_" if service else "SCORER_").lower()
    default = next(f.default for f in dataclasses.fields(settings) if f.name == field)
    if default is not None:
        assert getattr(from_env(settings, service, environ={variable: str(default)}), field) == default
