"""Settings of the HPSv3 service and the files it needs, judged from the disk.

Standard library only: ``run.sh`` calls ``preflight`` with the system python3 before any
virtual environment exists, so a service that is going to be skipped costs no install.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.configuration.config import FINITE, at_least, env_name, from_env, setting
from common.models.hub import missing_weights, offline_problem, weights_setting
from common.models.precision import Precision

SECTION = "hpsv3"
CHECKPOINT = "HPSv3.safetensors"


@dataclass(frozen=True)
class HPSv3Settings:
    """``SCORER_HPSV3_<FIELD>``; ``run.sh hpsv3 --model`` / ``--base`` set the first two."""

    model: str = weights_setting(
        "MizzenAI/HPSv3", "the checkpoint: `HPSv3.safetensors`, a directory holding it, or a hub id"
    )
    base: str = weights_setting(
        "Qwen/Qwen2-VL-7B-Instruct",
        "Qwen2-VL-7B-Instruct's configuration, tokenizer, chat template and `preprocessor_config.json`: a "
        "directory or a hub id",
    )
    # The backbone's precision on GPU (the reference's bfloat16); the head is float32, and the CPU
    # runs float32 throughout.
    precision: Precision = setting(
        "bfloat16",
        "the backbone's precision on a GPU (HPSv3's own `bfloat16`); the head is float32; the CPU runs float32",
    )
    # score = mu x scale. 1.0: HPSv3's own scale; VeRL-Omni's hpsv3_reward multiplies by 0.1.
    scale: float = setting(1.0, "score = mu × scale (`0.1`: VeRL-Omni's)", check=FINITE)
    # Tokens of one sample's whole sequence (instruction, image and prompt); a longer prompt is a 413.
    max_tokens: int = setting(
        2048,
        "tokens of one sample's sequence (instruction ~330, image ~256, the prompt); over it a 413",
        check=at_least(1),
    )


def read_settings() -> HPSv3Settings:
    """The settings from the environment; ``ConfigError`` for a bad one."""
    return from_env(HPSv3Settings, SECTION)


def missing(settings: HPSv3Settings, allow_download: bool) -> str | None:
    """Why the checkpoint or the base files can't be loaded, judged from the disk and the hub cache."""
    setting = env_name(SECTION, "model")
    model_hint = (
        f"Set {setting} (run.sh hpsv3 --model) to {CHECKPOINT} or a directory holding it "
        f"(`hf download MizzenAI/HPSv3 {CHECKPOINT} --local-dir DIR` on a machine with internet), or to a "
        "hub id this node can download."
    )
    problem = missing_weights(settings.model, setting, model_hint, allow_download, (CHECKPOINT,), None, "checkpoint")
    if problem:
        return problem
    setting = env_name(SECTION, "base")
    base_hint = (
        f"Set {setting} (run.sh hpsv3 --base) to a directory with Qwen2-VL-7B-Instruct's "
        "config.json, tokenizer and preprocessor_config.json (`hf download Qwen/Qwen2-VL-7B-Instruct --exclude "
        "'*.safetensors' --local-dir DIR`: the weights are not needed), or to a hub id this node can download."
    )
    for files in (("tokenizer.json",), ("preprocessor_config.json",)):
        problem = missing_weights(settings.base, setting, base_hint, allow_download, files, "config.json", "base files")
        if problem:
            return problem
    return None


def preflight(service: str = SECTION) -> str | None:
    """Why the service cannot start on this node without a download; None when it can."""
    return offline_problem(read_settings, missing)
