"""Where a scorer's weights come from (aesthetic, the CLIP family, HPSv3, GenEval): a local
directory, a local file or a hub id, judged from the disk and the hub cache only, so that
``run.sh`` with no argument never waits on a download.

Standard library only: ``run.sh`` runs the services' ``preflight`` with the system python3,
before any virtual environment (and so before huggingface_hub) exists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from common.configuration.config import PATH_OR_HUB_ID, ConfigError, setting

# The weight files of a ``save_pretrained`` (transformers) checkpoint.
PRETRAINED_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

T = TypeVar("T")
# What the hub accepts as a repository id (huggingface_hub's validate_repo_id, in short).
HUB_ID = re.compile(r"(?:[\w.-]+/)?[\w.-]+")


def weights_setting(default: str, help: str) -> Any:
    """A setting naming where weights come from: a path or a hub id (not blank), a ``run.sh`` flag."""
    return setting(default, help, flag=True, check=PATH_OR_HUB_ID)


def hub_cache() -> Path:
    """The hub cache directory, found as huggingface_hub finds it (its documented variables)."""
    if os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ.get("HF_HUB_CACHE") or os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def in_hub_cache(repo_id: str, filename: str, revision: str = "main") -> bool:
    """Whether ``filename`` of model ``repo_id`` at ``revision`` is in the local hub cache: the
    cache's documented layout (``models--org--name/refs/<revision>`` names a snapshot)."""
    repo = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    return (repo / "snapshots" / commit / filename).is_file()


def looks_like_path(value: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else must be a local path."""
    return value.startswith(("/", ".", "~")) or value.count("/") > 1 or "\\" in value


def missing_weights(
    source: str,
    setting: str,
    hint: str,
    allow_download: bool,
    weight_files: tuple[str, ...] = PRETRAINED_WEIGHTS,
    config_file: str | None = "config.json",
    what: str = "weights",
) -> str | None:
    """Why ``source`` (the value of ``setting``) holds no usable weights; None when it does.

    A directory needs ``config_file`` (when given) and one of ``weight_files``; a single-file
    checkpoint (``config_file`` None) may also be named directly; a hub id counts as missing
    unless one of ``weight_files`` is in the local hub cache or ``allow_download``.
    """
    local = Path(source).expanduser()
    if config_file is None and local.is_file():
        return None
    if local.is_dir():
        has_config = config_file is None or (local / config_file).is_file()
        if has_config and any((local / name).is_file() for name in weight_files):
            return None
        wanted = f"{config_file} and " if config_file else ""
        return f"{what} not found: {setting}={source!r} has no {wanted}{' or '.join(weight_files)}. {hint}"
    if looks_like_path(source):
        kind = "a directory or a checkpoint file" if config_file is None else "a directory"
        return f"{what} not found: {setting}={source!r} is not {kind}. {hint}"
    if allow_download:
        return None
    if not HUB_ID.fullmatch(source):
        return f"{setting}={source!r} is not a hub id (org/name). {hint}"
    cached = any(in_hub_cache(source, name) for name in weight_files)
    if cached:
        return None
    return (
        f"{what} not found: {setting}={source!r} is not in the local hub cache. {hint} "
        "(Starting the service by name downloads a hub id where the hub can be reached.)"
    )


def offline_problem(read_settings: Callable[[], T], missing: Callable[[T, bool], str | None]) -> str | None:
    """Why a service cannot start on this node without a download: its settings' error, else
    the weights ``missing(settings, allow_download=False)`` names; None when it can."""
    try:
        settings = read_settings()
    except ConfigError as exc:
        return str(exc)
    return missing(settings, False)


def local_first(load: Callable[[bool], T]) -> T:
    """``load(local_files_only)``: the hub cache (or a directory) first, so that a cached model
    loads without network round trips; the hub only when that fails."""
    try:
        return load(True)
    except OSError:
        return load(False)
