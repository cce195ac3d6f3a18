"""Loading a scorer's model in its worker, the same steps for every model: refused with the
setting to fix when its weights are missing or unreadable, on a device torch can see, warmed
before ``/ready`` says ready. Each scorer keeps only its model, the errors its loader raises
and what they mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from PIL import Image

from common.configuration.config import ConfigError
from common.configuration.devices import require_torch_device

T = TypeVar("T")
WARM_UP_COLOUR = (128, 128, 128)


@dataclass(frozen=True)
class Refusal:
    """Errors of a kind a model's loader raises and what they mean: ``says`` names the setting to
    fix, the error follows it, then ``hint`` (how to get the weights) where one helps."""

    errors: type[Exception] | tuple[type[Exception], ...]
    says: str
    hint: str = ""

    def message(self, error: Exception) -> str:
        return f"{self.says}: {error}" + (f" {self.hint}" if self.hint else "")


def require_weights(problem: str | None) -> None:
    """Refuse to start with ``problem`` (the service's ``missing``: which setting names weights
    that are not there), before the model's packages are imported."""
    if problem:
        raise ConfigError(problem)


def load_model(device: str, load: Callable[[], T], *refusals: Refusal) -> T:
    """``load()`` on ``device`` (a ``cuda`` device torch cannot see refused first); an error of a
    kind one of ``refusals`` names (the first that matches) becomes a ``ConfigError`` with its
    message, so that the service refuses to start with the reason, not a traceback."""
    require_torch_device(device)
    try:
        return load()
    except Exception as exc:
        for refusal in refusals:
            if isinstance(exc, refusal.errors):
                raise ConfigError(refusal.message(exc)) from None
        raise


def warm_up(run: Callable[[list[Image.Image], list[str]], Any], device: str, count: int, size: int = 256) -> None:
    """``run(images, prompts)`` once on grey images: ``count`` of them on a GPU (a full micro-batch,
    so its kernels are chosen and its memory reserved before the first request), one on the CPU."""
    many = count if device.startswith("cuda") else 1
    run([Image.new("RGB", (size, size), WARM_UP_COLOUR)] * many, ["a photo"] * many)


def dtype_name(model: Any) -> str | None:
    """``/info``'s precision: the loaded model's dtype without torch's prefix; None before setup."""
    return str(model.dtype).removeprefix("torch.") if model else None
