"""Settings of the CLIP-family rewards and the weights each one needs, judged from the disk.

Standard library only: ``run.sh`` calls ``preflight`` with the system python3 before any
virtual environment exists, so a service that is going to be skipped costs no install.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from common.configuration.config import NONZERO, env_name, from_env, setting
from common.models.hub import missing_weights, offline_problem, weights_setting
from common.models.precision import Precision, micro_batch_setting

VIT_H_14_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
HPS_FILE = "HPS_v2.1_compressed.pt"
# A processor: image preprocessing and a tokenizer (one file of each group).
PROCESSOR_FILES = (("preprocessor_config.json",), ("tokenizer.json", "vocab.json"))


def model_setting(default: str) -> Any:
    """The ``model`` field, whose default each reward sets."""
    return weights_setting(default, "the model: a local directory (or, for HPSv2, a checkpoint file) or a hub id")


def divisor_setting(default: float) -> Any:
    """The ``divisor`` field, whose default each reward sets."""
    return setting(default, "the score's divisor", check=NONZERO)


@dataclass(frozen=True)
class ClipRewardSettings:
    """``SCORER_<SERVICE>_<FIELD>``; ``run.sh <service> --model`` / ``--processor`` set the first two."""

    model: str = model_setting("")
    processor: str | None = setting(
        None,
        "tokenizer and image preprocessing: a directory or hub id",
        flag=True,
        shown_default="the model directory when it holds them, else the model's usual processor",
    )
    # Used on GPU only; the CPU always runs float32.
    precision: Precision = setting("float16", "`float16`, `bfloat16` or `float32` on GPU; the CPU always uses float32")
    # Samples per forward pass of each tower. Unset: 32 on GPU, 8 on CPU.
    micro_batch: int | None = micro_batch_setting("samples per forward pass of each tower")
    # score = cosine x (logit_scale.exp() where the recipe uses it) / divisor.
    divisor: float = divisor_setting(1.0)


@dataclass(frozen=True)
class PickScoreSettings(ClipRewardSettings):
    model: str = model_setting("yuvalkirstain/PickScore_v1")
    divisor: float = divisor_setting(26.0)


@dataclass(frozen=True)
class ClipScoreSettings(ClipRewardSettings):
    model: str = model_setting("openai/clip-vit-large-patch14")
    divisor: float = divisor_setting(30.0)


@dataclass(frozen=True)
class HPSv2Settings(ClipRewardSettings):
    model: str = model_setting("xswu/HPSv2")


@dataclass(frozen=True)
class Weights:
    """What one reward loads: its settings, checkpoint format, usual processor, and how to fetch it."""

    settings_class: type[ClipRewardSettings]
    usual_processor: str
    # How to get the weights on a machine with internet (completes "Set ... to ").
    download: str
    checkpoint: Literal["pretrained", "open_clip"] = "pretrained"


WEIGHTS = {
    "pickscore": Weights(
        PickScoreSettings,
        VIT_H_14_PROCESSOR,
        "a directory holding PickScore's config.json and weights (`hf download yuvalkirstain/PickScore_v1 "
        f"--local-dir DIR`; the processor comes from {VIT_H_14_PROCESSOR}, or --processor",
    ),
    "clipscore": Weights(
        ClipScoreSettings,
        "openai/clip-vit-large-patch14",
        "a directory holding the CLIP (`hf download openai/clip-vit-large-patch14 --local-dir DIR`",
    ),
    "hpsv2": Weights(
        HPSv2Settings,
        VIT_H_14_PROCESSOR,
        f"{HPS_FILE} or a directory holding it (`hf download xswu/HPSv2 {HPS_FILE} --local-dir DIR`; the "
        f"processor comes from {VIT_H_14_PROCESSOR}, or --processor",
        checkpoint="open_clip",
    ),
}


def read_settings(service: str) -> ClipRewardSettings:
    """The settings of ``service`` from the environment; ``ConfigError`` for a bad one."""
    return from_env(WEIGHTS[service].settings_class, service)


def model_hint(service: str) -> str:
    return (
        f"Set {env_name(service, 'model')} (run.sh {service} --model) to {WEIGHTS[service].download} "
        "on a machine with internet), or to a hub id this node can download."
    )


def processor_source(service: str, settings: ClipRewardSettings) -> str:
    """``--processor``, else the model directory when it holds a processor, else the usual one."""
    if settings.processor:
        return settings.processor
    local = Path(settings.model).expanduser()
    directory = local if local.is_dir() else local.parent
    if local.exists() and all(any((directory / n).is_file() for n in names) for names in PROCESSOR_FILES):
        return str(directory)
    return WEIGHTS[service].usual_processor


def missing(service: str, settings: ClipRewardSettings, allow_download: bool) -> str | None:
    """Why the weights or the processor can't be loaded, judged from the disk and the hub cache."""
    setting, hint = env_name(service, "model"), model_hint(service)
    if WEIGHTS[service].checkpoint == "open_clip":
        problem = missing_weights(settings.model, setting, hint, allow_download, (HPS_FILE,), None)
    else:
        problem = missing_weights(settings.model, setting, hint, allow_download)
    if problem:
        return problem
    processor = processor_source(service, settings)
    setting = env_name(service, "processor")
    hint = f"Set {setting} (run.sh {service} --processor) to a directory or hub id with them."
    for names in PROCESSOR_FILES:
        problem = missing_weights(processor, setting, hint, allow_download, names, None, "processor files")
        if problem:
            return problem
    return None


def preflight(service: str) -> str | None:
    """Why ``service`` cannot start on this node without a download; None when it can."""
    return offline_problem(lambda: read_settings(service), lambda settings, ok: missing(service, settings, ok))
