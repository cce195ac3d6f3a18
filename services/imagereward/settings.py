"""Settings of the ImageReward service and the files it needs, judged from the disk.

Standard library only: ``run.sh`` calls ``preflight`` with the system python3 before any
virtual environment exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.configuration.config import env_name, from_env, setting
from common.models.hub import missing_weights, offline_problem, weights_setting
from common.models.precision import Precision, micro_batch_setting

SECTION = "imagereward"
# The release's files (THUDM/ImageReward on the hub), as the package's ``RM.load`` reads them.
CHECKPOINT, MED_CONFIG = "ImageReward.pt", "med_config.json"


@dataclass(frozen=True)
class ImageRewardSettings:
    """``SCORER_IMAGEREWARD_<FIELD>``; ``run.sh imagereward --weights`` / ``--tokenizer`` set the first two."""

    weights: str = weights_setting(
        "THUDM/ImageReward",
        f"ImageReward-v1.0: a directory holding the released `{CHECKPOINT}` and `{MED_CONFIG}` "
        "(`hf download THUDM/ImageReward --local-dir DIR`), or that hub id (read from the hub cache first, "
        "downloaded at start otherwise)",
    )
    # The package tokenizes with bert-base-uncased plus BLIP's [DEC] and [ENC] tokens.
    tokenizer: str = weights_setting(
        "bert-base-uncased", "BERT's tokenizer (`vocab.txt`), as the package loads it: a directory or a hub id"
    )
    # Used on GPU only; the CPU always runs float32. The head runs in float32 everywhere.
    precision: Precision = setting(
        "float16", "`float16`, `bfloat16` or `float32` for BLIP on GPU; the CPU always uses float32"
    )
    # Images per forward pass: bounds GPU memory whatever the batch size.
    micro_batch: int | None = micro_batch_setting()


def read_settings() -> ImageRewardSettings:
    """The settings from the environment; ``ConfigError`` for a bad one."""
    return from_env(ImageRewardSettings, SECTION)


def missing(settings: ImageRewardSettings, allow_download: bool) -> str | None:
    """Why the checkpoint, its med config or the tokenizer can't be loaded, judged from the disk
    and the hub cache."""
    setting = env_name(SECTION, "weights")
    hint = (
        f"Set {setting} (run.sh imagereward --weights) to a directory holding {CHECKPOINT} and {MED_CONFIG} "
        "(`hf download THUDM/ImageReward --local-dir DIR` on a machine with internet), or to THUDM/ImageReward."
    )
    problem = missing_weights(
        settings.weights, setting, hint, allow_download, weight_files=(CHECKPOINT,), config_file=MED_CONFIG
    )
    if problem:
        return problem
    setting = env_name(SECTION, "tokenizer")
    hint = (
        f"Set {setting} (run.sh imagereward --tokenizer) to a directory holding BERT's vocab.txt "
        "(`hf download bert-base-uncased vocab.txt tokenizer_config.json --local-dir DIR`), or to bert-base-uncased."
    )
    return missing_weights(
        settings.tokenizer, setting, hint, allow_download, weight_files=("vocab.txt",), config_file=None,
        what="tokenizer",
    )  # fmt: skip


def preflight(service: str = SECTION) -> str | None:
    """Why the service cannot start on this node without a download; None when it can."""
    return offline_problem(read_settings, missing)
