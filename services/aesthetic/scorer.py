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

from common.configuration.config import env_name
from common.configuration.settings import CoreSettings
from common.imaging.media import MediaRequest
from common.models.loading import Refusal, dtype_name, load_model, require_weights, warm_up
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
        require_weights(missing(self.settings, allow_download=True))
        from services.aesthetic.model import AestheticModel, HeadError  # not at module level: see model.py

        settings = self.settings
        micro_batch = default_micro_batch(settings.micro_batch, device)
        clip = env_name(SECTION, "clip")
        model = load_model(
            device,
            lambda: AestheticModel(settings.clip, settings.head, device, settings.precision, micro_batch),
            Refusal(
                OSError,
                f"CLIP weights could not be loaded from {clip}={settings.clip!r}",
                CLIP_HINT.format(setting=clip),
            ),
            Refusal(
                HeadError,
                f"{env_name(SECTION, 'head')}={settings.head!r} is not a LAION aesthetic head for this CLIP's "
                "embeddings (768-d, ViT-L/14)",
            ),
        )
        warm_up(lambda images, _: model.raw_scores(model.preprocess(images)), device, micro_batch)
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
            "precision": dtype_name(self.model),
            "micro_batch": self.model.micro_batch if self.model else self.settings.micro_batch,
            "scale": self.settings.scale,
            "offset": self.settings.offset,
        }
