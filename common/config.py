"""Configuration from environment variables, all under one prefix (``SCORER_``).

A settings class is a frozen dataclass; ``from_env`` fills each field from
``SCORER_<SECTION>_<FIELD>`` (section empty for the core settings), converting by the
field's type. Every field has a default, so a service starts on its offline defaults. A field
declared with ``setting`` also carries its help, whether ``run.sh`` takes it as a flag, and the
name it had before a rename: the flags, ``/info`` and docs/settings.md are made from them.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

PREFIX = "SCORER_"
DECLARATION = "setting"

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting is missing or has a value that cannot be used; raised at startup."""


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


def setting(
    default: Any,
    help: str,
    *,
    flag: bool = False,
    shown_default: str = "",
    renamed_from: str = "",
    scorer_default: str = "",
    secret: bool = False,
) -> Any:
    """A settings field with its declaration (``Setting``)."""
    declaration = Setting(help, flag, shown_default, renamed_from, scorer_default, secret)
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
            values[field.name] = _convert(environ[name], hints[field.name], name)
    return cls(**values)


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
