"""Text-image rewards of the CLIP family as services: PickScore, CLIPScore and HPSv2.

One scorer, three recipes. Each sample is an image and its prompt; the request threads decode
the image, preprocess it and tokenise the prompt, and the inference thread runs both towers on
the items of concurrent requests, in micro-batches, with a prompt shared by many samples
encoded once per batch. The score is the cosine of the normalised embeddings, times the
model's ``logit_scale.exp()`` for PickScore and CLIPScore, over a divisor:

- ``pickscore``: PickScore v1, ``logit_scale.exp() * cos / 26`` (flow_grpo's ``pickscore_scorer``);
- ``clipscore``: CLIP ViT-L/14, ``logits_per_image`` diagonal ``/ 30`` (flow_grpo's ``clip_scorer``);
- ``hpsv2``: HPS v2.1, an open_clip ViT-H-14 checkpoint, the plain cosine (flow_grpo's ``hpsv2_scorer``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from PIL import Image

from common.configuration.config import env_name
from common.configuration.settings import CoreSettings
from common.imaging.media import MediaRequest
from common.models.hub import local_first
from common.models.loading import Refusal, dtype_name, load_model, require_weights, warm_up
from common.models.precision import micro_batch as default_micro_batch
from common.pipeline.scorer import ImageScorer
from services.clip.preprocess import check_clip_inputs
from services.clip.settings import HPS_FILE, WEIGHTS, missing, model_hint, processor_source, read_settings

if TYPE_CHECKING:
    from services.clip.model import ClipRewardModel

log = logging.getLogger(__name__)


class ClipRewardScorer(ImageScorer):
    """The shared scorer; a subclass names its settings, checkpoint format and formula."""

    max_batch = 64
    max_wait_ms = 5.0
    float_resize: ClassVar[str | None] = None
    open_clip_text: ClassVar[bool] = False
    logit_scale: ClassVar[bool] = True

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = read_settings(self.name)
        self.checkpoint = WEIGHTS[self.name].checkpoint
        self.model: ClipRewardModel | None = None

    def setting(self, field: str) -> str:
        return env_name(self.name, field)

    def processor_source(self) -> str:
        return processor_source(self.name, self.settings)

    def checkpoint_path(self) -> str:
        """The open_clip checkpoint file: the path given, ``HPS_FILE`` in a directory, or from the hub."""
        local = Path(self.settings.model).expanduser()
        if local.is_file():
            return str(local)
        if local.is_dir():
            return str(local / HPS_FILE)
        from huggingface_hub import hf_hub_download

        return local_first(lambda offline: hf_hub_download(self.settings.model, HPS_FILE, local_files_only=offline))

    def setup(self, device: str) -> None:
        require_weights(missing(self.name, self.settings, allow_download=True))
        from services.clip.model import ClipRewardModel, Recipe  # not at module level: see model.py
        from services.clip.open_clip_checkpoint import CheckpointError

        settings = self.settings
        micro_batch = default_micro_batch(settings.micro_batch, device)
        recipe = Recipe(self.checkpoint, self.float_resize, self.open_clip_text, self.logit_scale)
        processor = self.processor_source()

        def load() -> ClipRewardModel:
            model_source = self.checkpoint_path() if self.checkpoint == "open_clip" else settings.model
            return ClipRewardModel(
                recipe, model_source, processor, device, settings.precision, micro_batch, settings.divisor
            )

        model = load_model(
            device,
            load,
            Refusal(CheckpointError, f"{self.setting('model')}={settings.model!r} is not an HPSv2 checkpoint"),
            Refusal(
                OSError,
                f"{self.name} could not load the model {self.setting('model')}={settings.model!r} or the "
                f"processor {self.setting('processor')}={processor!r}",
                model_hint(self.name),
            ),
        )
        warm_up(lambda images, prompts: model.scores(self._pairs(model, images, prompts)), device, micro_batch)
        self.model = model
        log.info("%s: model %s, processor %s, on %s in %s", self.name, settings.model, processor, device, model.dtype)

    @staticmethod
    def _pairs(model: ClipRewardModel, images: list[Image.Image], prompts: list[str]) -> list[Any]:
        from services.clip.model import Pair

        return [Pair(pixels, tokens) for pixels, tokens in zip(model.preprocess(images), model.tokenize(prompts))]

    def check_images(self, images: Sequence[Image.Image], request: MediaRequest) -> None:
        """The pixels of the resize to the shortest edge, and the model inputs (one per image:
        an 8x8 image's are 1,500 times its decoded bytes), bounded."""
        assert self.model is not None
        model = self.model
        check_clip_inputs(
            images, request.names, model.shortest_edge, model.input_bytes, f"{self.name} inputs", self.core
        )

    def prepare_images(self, images: list[Image.Image], prompts: list[str], metadata: dict[str, Any]) -> list[Any]:
        assert self.model is not None, "setup() has not run"
        return self._pairs(self.model, images, prompts)

    def score(self, batch: Sequence[Any]) -> list[float]:
        assert self.model is not None, "setup() has not run"
        return self.model.scores(batch)

    def score_bounds(self) -> tuple[float, float]:
        """A cosine of unit embeddings times the model's factor (``logit_scale.exp()`` over the divisor)."""
        assert self.model is not None, "setup() has not run"
        return -abs(self.model.factor), abs(self.model.factor)

    def info(self) -> dict[str, Any]:
        return {
            "model": self.settings.model,
            "processor": self.processor_source(),
            "precision": dtype_name(self.model),
            "micro_batch": self.model.micro_batch if self.model else self.settings.micro_batch,
            "divisor": self.settings.divisor,
        }


class PickScoreScorer(ClipRewardScorer):
    name = "pickscore"


class ClipScoreScorer(ClipRewardScorer):
    name = "clipscore"
    float_resize = "bilinear"  # flow_grpo resizes the float tensor with torchvision's default


class HPSv2Scorer(ClipRewardScorer):
    name = "hpsv2"
    float_resize = "bicubic"  # HPSv2's preprocess_val: ToTensor, then Resize(BICUBIC) on the tensor
    open_clip_text = True
    logit_scale = False
