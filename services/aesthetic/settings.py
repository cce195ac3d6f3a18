"""Settings of the aesthetic service and the weights it needs, judged from the disk.

Standard library only: ``run.sh`` calls ``preflight`` with the system python3 before any
virtual environment exists, so a service that is going to be skipped costs no install.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from common.configuration.config import env_name, from_env, setting
from common.models.hub import missing_weights, offline_problem, weights_setting
from common.models.precision import Precision, micro_batch_setting

SECTION = "aesthetic"
HEAD_FILE = "laion-aesthetic-sac-logos-ava1-l14-linearMSE.pth"
# Shipped with the service, as flow_grpo ships it (weights/README.md: origin, licence, checksum).
WEIGHTS = Path(__file__).resolve().parent / "weights"
DEFAULT_HEAD = WEIGHTS / HEAD_FILE
CLIP_HINT = (
    "Set {setting} (run.sh --clip) to a directory holding the CLIP config, weights and "
    "preprocessor_config.json (`hf download openai/clip-vit-large-patch14 --local-dir DIR` on a "
    "machine with internet), or to a hub id this node can download."
)


@dataclass(frozen=True)
class AestheticSettings:
    """``SCORER_AESTHETIC_<FIELD>``; ``run.sh aesthetic --clip`` / ``--head`` set the first two."""

    clip: str = weights_setting(
        "openai/clip-vit-large-patch14",
        "the CLIP: a local directory (`save_pretrained` layout) or a hub id (read from the hub cache first, "
        "downloaded at start otherwise)",
    )
    head: str = setting(
        str(DEFAULT_HEAD),
        "the released `sac+logos+ava1-l14-linearMSE.pth` state dict (keys `layers.0/2/4/6/7`)",
        flag=True,
        shown_default="the shipped, checksum-verified `services/aesthetic/weights/` copy",
    )
    # Used on GPU only; the CPU always runs float32.
    precision: Precision = setting(
        "float16", "`float16`, `bfloat16` or `float32` for CLIP on GPU; the CPU always uses float32"
    )
    # Images per forward pass: bounds GPU memory whatever the batch size. Unset: 32 on GPU, 8 on
    # CPU, where larger batches run slower (measured with ViT-B/16, bench/aesthetic/README.md).
    micro_batch: int | None = micro_batch_setting()
    # score = raw * scale + offset; the defaults give the raw score.
    scale: float = setting(1.0, "score = raw × scale + offset")
    offset: float = setting(0.0, "score = raw × scale + offset")


def read_settings() -> AestheticSettings:
    """The settings from the environment; ``ConfigError`` for a bad one."""
    return from_env(AestheticSettings, SECTION)


def missing(settings: AestheticSettings, allow_download: bool) -> str | None:
    """Why the head or CLIP can't be loaded, judged from the disk and the hub cache."""
    path = Path(settings.head).expanduser()
    if not path.is_file():
        return (
            f"aesthetic head not found: {env_name(SECTION, 'head')}={str(path)!r} (run.sh --head); it is the "
            f"released sac+logos+ava1-l14-linearMSE.pth, shipped as {DEFAULT_HEAD}"
        )
    if path.resolve() == DEFAULT_HEAD and not _shipped_head_intact():
        return f"the shipped aesthetic head {DEFAULT_HEAD} does not match {WEIGHTS / 'SHA256SUMS'}: restore it"
    setting = env_name(SECTION, "clip")
    hint = CLIP_HINT.format(setting=setting)
    return missing_weights(settings.clip, setting, hint, allow_download, what="CLIP weights")


def preflight(service: str = SECTION) -> str | None:
    """Why the service cannot start on this node without a download; None when it can."""
    return offline_problem(read_settings, missing)


def _shipped_head_intact() -> bool:
    """Whether the shipped head's SHA-256 is the one recorded beside it (3.7 MB: milliseconds)."""
    expected = (WEIGHTS / "SHA256SUMS").read_text().split()[0]
    return hashlib.sha256(DEFAULT_HEAD.read_bytes()).hexdigest() == expected
