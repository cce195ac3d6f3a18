"""ImageReward as a service: settings, request validation, and the model's errors turned into
messages that name the setting to fix.

The score is the package's (``ImageReward.score``, and ``inference_rank`` per image as flow_grpo
calls it): the head's output normalised by the release's mean and standard deviation. The
image's preprocessing and the prompt's tokens are made in ``prepare_images`` on the request
threads, so the inference thread only stacks ready tensors and runs the model.
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
from services.clip.preprocess import check_clip_inputs
from services.imagereward.settings import SECTION, missing, read_settings

if TYPE_CHECKING:
    from services.imagereward.model import ImageRewardModel, RewardInput

log = logging.getLogger(__name__)


class ImageRewardScorer(ImageScorer):
    name = "imagereward"
    max_batch = 64
    max_wait_ms = 5.0

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = read_settings()
        self.model: ImageRewardModel | None = None

    def setup(self, device: str) -> None:
        require_weights(missing(self.settings, allow_download=True))
        from services.imagereward.convert import ConversionError  # not at module level: see model.py
        from services.imagereward.model import ImageRewardModel

        settings = self.settings
        micro_batch = default_micro_batch(settings.micro_batch, device)
        weights = env_name(SECTION, "weights")
        model = load_model(
            device,
            lambda: ImageRewardModel(settings.weights, settings.tokenizer, device, settings.precision, micro_batch),
            Refusal(
                OSError,
                f"ImageReward could not be loaded from {weights}={settings.weights!r} and "
                f"{env_name(SECTION, 'tokenizer')}={settings.tokenizer!r}",
            ),
            Refusal(
                ConversionError,
                f"{weights}={settings.weights!r} is not ImageReward-v1.0's ImageReward.pt and med_config.json",
            ),
        )
        warm_up(lambda images, prompts: model.scores(model.prepare(images, prompts)), device, micro_batch, size=224)
        self.model = model
        log.info("imagereward: %s on %s in %s", settings.weights, device, model.dtype)

    def check_images(self, images: Sequence[Image.Image], request: MediaRequest) -> None:
        """The pixels of the resize to a 224 shortest edge, and the model inputs (one per
        distinct image), bounded as the CLIP scorers bound theirs."""
        from services.imagereward.model import INPUT_BYTES

        check_clip_inputs(images, request.names, 224, INPUT_BYTES, "imagereward inputs", self.core)

    def prepare_images(self, images: list[Image.Image], prompts: list[str], metadata: dict[str, Any]) -> list[Any]:
        assert self.model is not None, "setup() has not run"
        return self.model.prepare(images, prompts)

    def score(self, batch: Sequence[RewardInput]) -> list[float]:
        assert self.model is not None, "setup() has not run"
        return self.model.scores(batch)

    def info(self) -> dict[str, Any]:
        return {
            "weights": self.settings.weights,
            "tokenizer": self.settings.tokenizer,
            # Where the weights actually are, not the setting.
            "device": str(next(self.model.vision.parameters()).device) if self.model else None,
            "precision": dtype_name(self.model),
            "micro_batch": self.model.micro_batch if self.model else self.settings.micro_batch,
        }
