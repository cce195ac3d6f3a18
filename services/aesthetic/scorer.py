"""LAION aesthetic score as a service: settings, request validation, and the model's errors
turned into messages that name the setting to fix.

The score is the head's raw output (about 1 to 10), as flow_grpo and deepgen_rl return it;
``scale``/``offset`` map it linearly when a trainer wants another range. CLIP's own
preprocessing runs in ``decode`` on the request threads, so the inference thread only stacks
ready tensors and runs the model, in micro-batches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from PIL import Image

from common.configuration.config import ConfigError, env_name
from common.configuration.devices import require_torch_device
from common.configuration.settings import CoreSettings
from common.imaging.media import MediaRequest
from common.models.precision import micro_batch as default_micro_batch
from common.pipeline.scorer import ImageScorer
from services.aesthetic.settings import CLIP_HINT, SECTION, missing, read_settings
from services.clip.preprocess import check_clip_inputs

if TYPE_CHECKING:
    from services.aesthetic.model import AestheticModel

log = logging.getLogger(__name__)


class AestheticScorer(ImageScorer):
    name = "aesthetic"
    max_batch = 64
    max_wait_ms = 5.0

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = read_settings()
        self.model: AestheticModel | None = None

    def setup(self, device: str) -> None:
        problem = missing(self.settings, allow_download=True)
        if problem:
            raise ConfigError(problem)
        from services.aesthetic.model import AestheticModel, HeadError  # not at module level: see model.py

        require_torch_device(device)
        settings = self.settings
        micro_batch = default_micro_batch(settings.micro_batch, device)
        try:
            model = AestheticModel(settings.clip, settings.head, device, settings.precision, micro_batch)
        except OSError as exc:
            setting = env_name(SECTION, "clip")
            raise ConfigError(
                f"CLIP weights could not be loaded from {setting}={settings.clip!r}: {exc} "
                + CLIP_HINT.format(setting=setting)
            ) from None
        except HeadError as exc:
            raise ConfigError(
                f"{env_name(SECTION, 'head')}={settings.head!r} is not a LAION aesthetic head for this CLIP's "
                f"embeddings (768-d, ViT-L/14): {exc}"
            ) from None
        warm = micro_batch if device.startswith("cuda") else 1
        model.raw_scores(model.preprocess([Image.new("RGB", (256, 256), (128, 128, 128))] * warm))
        self.model = model
        log.info("aesthetic: CLIP %s, head %s, on %s in %s", settings.clip, settings.head, device, model.dtype)

    def check_images(self, images: Sequence[Image.Image], request: MediaRequest) -> None:
        """The pixels of CLIP's resize to the shortest edge, and the model inputs (one per image:
        an 8x8 image's are 1,500 times its decoded bytes), bounded."""
        assert self.model is not None
        model = self.model
        check_clip_inputs(images, request.names, model.shortest_edge, model.input_bytes, "aesthetic inputs", self.core)

    def prepare_images(self, images: list[Image.Image], prompts: list[str], metadata: dict[str, Any]) -> list[Any]:
        assert self.model is not None, "setup() has not run"
        return self.model.preprocess(images)

    def score(self, batch: Sequence[Any]) -> list[float]:
        assert self.model is not None, "setup() has not run"
        scale, offset = self.settings.scale, self.settings.offset
        return [raw * scale + offset for raw in self.model.raw_scores(batch)]

    def info(self) -> dict[str, Any]:
        return {
            "clip": self.settings.clip,
            "head": self.settings.head,
            # Where the weights actually are, not the setting.
            "device": str(next(self.model.clip.parameters()).device) if self.model else None,
            "precision": str(self.model.dtype).removeprefix("torch.") if self.model else None,
            "micro_batch": self.model.micro_batch if self.model else self.settings.micro_batch,
            "scale": self.settings.scale,
            "offset": self.settings.offset,
        }
