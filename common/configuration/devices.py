"""GPU discovery without touching CUDA (safe in the gunicorn master) and device choice."""

from __future__ import annotations

import os
import subprocess

from common.configuration.config import ConfigError, env_name

GPU_ENV = "SCORER_GPU"  # set per worker by gunicorn.conf.py's post_fork


def visible_gpus() -> list[str]:
    """GPU ids this node may use: ``CUDA_VISIBLE_DEVICES`` if set, else what the driver lists."""
    preset = os.environ.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        return [gpu for gpu in preset.split(",") if gpu.strip() and gpu.strip() != "-1"]
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in listed.splitlines() if line.strip()]


def choose_device(setting: str) -> str:
    """``auto`` is ``cuda`` in a worker pinned to a GPU, ``cpu`` otherwise."""
    if setting != "auto":
        return setting
    return "cuda" if os.environ.get(GPU_ENV) else "cpu"


def require_torch_device(device: str) -> None:
    """Refuse a ``cuda`` device that torch cannot see (a CPU build, no driver): the model would
    otherwise fail later, or run elsewhere than ``/info`` says. Imports torch: call it in setup."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{env_name('', 'device')}={device} but torch {torch.__version__} sees no CUDA GPU")
