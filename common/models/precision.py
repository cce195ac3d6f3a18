"""The precision a model runs in: the one type of every ``SCORER_<SERVICE>_PRECISION`` setting
and the one rule that turns it into a torch dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from common.configuration.config import at_least, setting

if TYPE_CHECKING:
    import torch

Precision = Literal["float16", "bfloat16", "float32"]


def torch_dtype(precision: Precision, device: str) -> torch.dtype:
    """``precision`` on a GPU; float32 on the CPU, where half precision is slow or missing."""
    import torch  # imported by the services that run a model, not by the master or run.sh

    return getattr(torch, precision) if device.startswith("cuda") else torch.float32


# Images per forward pass of the CLIP-sized image models (aesthetic, the CLIP family,
# ImageReward) when their setting is unset: a large batch never runs the GPU out of memory, and
# larger batches run slower on a CPU (bench/aesthetic/README.md).
GPU_MICRO_BATCH, CPU_MICRO_BATCH = 32, 8


def micro_batch_setting(
    help: str = "images per forward pass: a large request or batch never runs the GPU out of memory",
) -> Any:
    """The ``micro_batch`` field of a model run in micro-batches: unset, the device's default."""
    return setting(None, help, shown_default=f"{GPU_MICRO_BATCH} on GPU, {CPU_MICRO_BATCH} on CPU", check=at_least(1))


def micro_batch(configured: int | None, device: str) -> int:
    """The setting's micro-batch, else the device's default."""
    return configured or (GPU_MICRO_BATCH if device.startswith("cuda") else CPU_MICRO_BATCH)
