"""Configuration from environment variables, all under one prefix (``SCORER_``).

A settings class is a frozen dataclass; ``from_env`` fills each field from
``SCORER_<SECTION>_<FIELD>`` (section empty for the core settings), converting by the
field's type. Every field has a default, so a service starts on its offline defaults. A field
declared with ``setting`` also carries its help, whether ``run.sh`` takes it as a flag, the
name it had before a rename and the rule its value must meet (``check``): the flags, ``/info``
and docs/settings.md are made from them, and a value set against its rule stops the service at
start-up (``run.sh`` checks before it installs anything), its variable named.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

PREFIX = "SCORER_"
DECLARATION = "setting"

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting is missing or has a value that cannot be used; raised at startup."""


@dataclass(frozen=True)
class Rule:
    """What a setting's value must be: ``allowed`` says it (docs/settings.md, the error),
    ``holds`` tests it. Unset (None) always passes: its meaning is the declaration's default."""

    allowed: str
    holds: Callable[[Any], bool]

    def __call__(self, value: Any) -> None:
        if value is not None and not self.holds(value):
            raise ValueError(f"must be {self.allowed}")


def at_least(low: float) -> Rule:
    """A number no lower than ``low``."""
    return Rule(f"at least {low:g}", lambda value: value >= low)


def above(low: float) -> Rule:
    """A finite number over ``low``."""
    return Rule(f"a finite number over {low:g}", lambda value: math.isfinite(value) and value > low)


def within(low: float, high: float) -> Rule:
    """A number from ``low`` to ``high``, both included."""
    return Rule(f"a number from {low:g} to {high:g}", lambda value: math.isfinite(value) and low <= value <= high)


FINITE = Rule("a finite number", math.isfinite)
NONZERO = Rule("a finite non-zero number", lambda value: math.isfinite(value) and value != 0)
# Where a model comes from: a local path or a hub id, either way never blank.
PATH_OR_HUB_ID = Rule("a path or a hub id, not blank", lambda value: bool(value.strip()))


@dataclass(frozen=True)
class Setting:
    """What a settings field declares beyond its name, type and default (``setting``)."""

    # One line for docs/settings.md.
    help: str
    # ``run.sh`` takes it as ``--<field-with-dashes> VALUE``.
    flag: bool = False
    # The default as the docs show it, where the value is no plain default (None: "one per core").
    shown_default: str = ""
    # The field's name before a rename: its variable is still read, with a warning, for one release.
    renamed_from: str = ""
    # Unset, each service's scorer class attribute of this name decides (``Scorer.max_batch``).
    scorer_default: str = ""
    # Shown as "***" when set (``describe``): a credential.
    secret: bool = False
    # Called with the value read: ``ValueError`` says what is wrong with it (a ``Rule``, or a
    # parser of the setting's text), and ``from_env`` raises it as a ``ConfigError`` naming the variable.
    check: Callable[[Any], object] | None = None


def setting(
    default: Any,
    help: str,
    *,
    flag: bool = False,
    shown_default: str = "",
    renamed_from: str = "",
    scorer_default: str = "",
    secret: bool = False,
    check: Callable[[Any], object] | None = None,
) -> Any:
    """A settings field with its declaration (``Setting``)."""
    declaration = Setting(help, flag, shown_default, renamed_from, scorer_default, secret, check)
    return dataclasses.field(default=default, metadata={DECLARATION: declaration})


def declared(field: dataclasses.Field) -> Setting | None:
    """The declaration of a settings field; None for a field declared as a plain default."""
    return field.metadata.get(DECLARATION)


def env_name(section: str, field: str) -> str:
    """The environment variable that sets ``field`` of ``section``."""
    parts = [PREFIX.rstrip("_"), section, field] if section else [PREFIX.rstrip("_"), field]
    return "_".join(parts).upper()


def _convert(raw: str, kind: Any, name: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if raw.strip() == "" or raw.strip().lower() == "none":
            return None
        return _convert(raw, args[0], name)
    if origin is typing.Literal:
        allowed = typing.get_args(kind)
        if raw not in allowed:
            raise ConfigError(f"{name}={raw!r}: must be one of {', '.join(map(str, allowed))}")
        return raw
    try:
        if kind is bool:
            value = raw.strip().lower()
            if value in ("1", "true", "yes", "on"):
                return True
            if value in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind in (int, float, str):
            return kind(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r}: expected {kind.__name__}") from exc
    raise ConfigError(f"{name}: unsupported setting type {kind!r}")


def from_env(cls: type[T], section: str = "", environ: Mapping[str, str] | None = None) -> T:
    """Build the settings dataclass ``cls`` from ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = env_name(section, field.name)
        if name not in environ:
            name = _old_name(section, field) or name
        if name in environ:
            values[field.name] = _checked(field, _convert(environ[name], hints[field.name], name), name, environ[name])
    return cls(**values)


def _checked(field: dataclasses.Field, value: Any, name: str, raw: str) -> Any:
    """``value`` of variable ``name`` when it meets its declaration's ``check``, else ``ConfigError``."""
    declaration = declared(field)
    if declaration is not None and declaration.check is not None:
        try:
            declaration.check(value)
        except ValueError as exc:
            raise ConfigError(f"{name}={raw!r}: {exc}") from None
    return value


def flags(cls: type, section: str = "") -> list[tuple[str, str]]:
    """(``--flag``, variable) of each field of ``cls`` declared a flag: ``infra_failure_score``
    of section ``code`` is ``--infra-failure-score``, setting ``SCORER_CODE_INFRA_FAILURE_SCORE``."""
    return [
        (f"--{field.name.replace('_', '-')}", env_name(section, field.name))
        for field in dataclasses.fields(cls)
        if (declaration := declared(field)) and declaration.flag
    ]


def deprecations(cls: type, section: str = "", environ: Mapping[str, str] | None = None) -> list[str]:
    """What ``environ`` sets under a setting's former name (``Setting.renamed_from``): one
    message each, for the log and ``/info``."""
    environ = os.environ if environ is None else environ
    messages = []
    for field in dataclasses.fields(cls):
        old, new = _old_name(section, field), env_name(section, field.name)
        if old and old in environ:
            used = f"{new} is set too and wins" if new in environ else "its value is used"
            messages.append(f"{old} is deprecated and goes in the next release: set {new} instead ({used})")
    return messages


def _old_name(section: str, field: dataclasses.Field) -> str:
    """The variable of the field's former name, or ""."""
    declaration = declared(field)
    return env_name(section, declaration.renamed_from) if declaration and declaration.renamed_from else ""


def describe(settings: Any) -> dict[str, Any]:
    """Settings as a plain dict for ``/info``, those declared secret masked."""
    out = {}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        declaration = declared(field)
        out[field.name] = "***" if value and declaration and declaration.secret else value
    return out
