"""Configuration from environment variables, all under one prefix (``SCORER_``).

A settings class is a frozen dataclass; ``from_env`` fills each field from
``SCORER_<SECTION>_<FIELD>`` (section empty for the core settings), converting by the
field's type. Every field has a default, so a service starts on its offline defaults.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

PREFIX = "SCORER_"

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting is missing or has a value that cannot be used; raised at startup."""


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
        if name in environ:
            values[field.name] = _convert(environ[name], hints[field.name], name)
    return cls(**values)


def describe(settings: Any) -> dict[str, Any]:
    """Settings as a plain dict for ``/info`` (secrets masked)."""
    out = {}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if "token" in field.name and value:
            value = "***"
        out[field.name] = value
    return out
