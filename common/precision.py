"""The precision a model runs in: the one type of every ``SCORER_<SERVICE>_PRECISION`` setting
and the one rule that turns it into a torch dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Precision = Literal["float16", "bfloat16", "float32"]


def torch_dtype(precision: Precision, device: str) -> torch.dtype:
    """``precision`` on a GPU; float32 on the CPU, where half precision is slow or missing."""
    import torch  # imported by the services that run a model, not by the master or run.sh

    return getattr(torch, precision) if device.startswith("cuda") else torch.float32
