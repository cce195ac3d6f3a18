"""HPSv3 as a service: the human-preference score of an (image, prompt) pair.

HPSv3 (MizzenAI, ``HPSv3.safetensors``) is Qwen2-VL-7B-Instruct with a reward token and a
RankNet head; the base model's configuration, tokenizer, chat template and image preprocessing
come from ``--base`` (Qwen2-VL-7B-Instruct's files; its weights are not needed: the checkpoint
holds them all). The request threads resize each image and tokenize its prompt
(``inputs.py``); the inference thread runs the items of concurrent requests in one forward
pass. The score is mu x ``SCORER_HPSV3_SCALE``; mu and sigma travel as the extras ``mu`` and
``sigma``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from common.configuration.config import env_name
from common.configuration.settings import CoreSettings
from common.imaging.images import once_per_image, shown_size
from common.imaging.media import MediaRequest
from common.limits.budget import hold_work
from common.limits.errors import PayloadTooLarge, Unprocessable
from common.models.hub import local_first
from common.models.loading import Refusal, dtype_name, load_model, require_weights, warm_up
from common.models.precision import torch_dtype
from common.pipeline.scorer import ImageScorer, Scored
from services.hpsv3.inputs import REWARD_TOKEN, Item, PromptLayout, image_tokens, input_bytes, resized, smart_resize
from services.hpsv3.settings import CHECKPOINT, missing, read_settings

if TYPE_CHECKING:
    from services.hpsv3.model import HPSv3

log = logging.getLogger(__name__)

CHAT_TEMPLATE_FILE = "chat_template.json"


class HPSv3Scorer(ImageScorer):
    name = "hpsv3"
    max_batch = 16
    max_wait_ms = 5.0

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = read_settings()
        self.model: HPSv3 | None = None
        self.layout: PromptLayout | None = None
        self.image_processor: Any = None

    def setting(self, field: str) -> str:
        return env_name(self.name, field)

    def checkpoint_path(self) -> Path:
        local = Path(self.settings.model).expanduser()
        if local.is_file():
            return local
        if local.is_dir():
            return local / CHECKPOINT
        from huggingface_hub import hf_hub_download

        return Path(
            local_first(lambda offline: hf_hub_download(self.settings.model, CHECKPOINT, local_files_only=offline))
        )

    def _chat_template(self, tokenizer: Any) -> None:
        """The base's chat template: the tokenizer's, else the processor's ``chat_template.json``."""
        if tokenizer.chat_template:
            return
        base = Path(self.settings.base).expanduser()
        if base.is_dir():
            path = base / CHAT_TEMPLATE_FILE
        else:
            from huggingface_hub import hf_hub_download

            base_id = self.settings.base
            path = Path(
                local_first(lambda offline: hf_hub_download(base_id, CHAT_TEMPLATE_FILE, local_files_only=offline))
            )
        tokenizer.chat_template = json.loads(path.read_text())["chat_template"]

    def setup(self, device: str) -> None:
        require_weights(missing(self.settings, allow_download=True))
        from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLImageProcessorPil

        from services.hpsv3.model import CheckpointError, HPSv3, load_reward_model

        settings = self.settings
        dtype = torch_dtype(settings.precision, device)
        base = settings.base

        def load_base() -> tuple[Any, Any]:
            config = local_first(lambda offline: Qwen2VLConfig.from_pretrained(base, local_files_only=offline))
            tokenizer = local_first(lambda offline: AutoTokenizer.from_pretrained(base, local_files_only=offline))
            # The PIL image processor: the default one needs torchvision, which this service does without.
            self.image_processor = local_first(
                lambda offline: Qwen2VLImageProcessorPil.from_pretrained(base, local_files_only=offline)
            )
            self._chat_template(tokenizer)
            return config, tokenizer

        config, tokenizer = load_model(
            device,
            load_base,
            Refusal(
                (OSError, KeyError, ValueError),
                f"hpsv3 could not load the base files of {self.setting('base')}={base!r}",
            ),
        )
        # As HPSv3 does: the reward token added, the embeddings sized to the tokenizer.
        tokenizer.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
        reward_id = tokenizer.convert_tokens_to_ids(REWARD_TOKEN)
        self.layout = PromptLayout(tokenizer, reward_id, config.image_token_id)
        checkpoint = self.checkpoint_path()
        reward_model = load_model(
            device,
            lambda: load_reward_model(checkpoint, config, len(tokenizer), device, dtype),
            Refusal(
                CheckpointError,
                f"{self.setting('model')}={settings.model!r} is not an HPSv3 checkpoint on the base "
                f"{self.setting('base')}={base!r}",
            ),
        )
        model = HPSv3(reward_model, tokenizer.pad_token_id, config.image_token_id, device, dtype)
        warm_up(lambda images, prompts: model.rewards(self.prepare_images(images, prompts, {})), device, 1)
        self.model = model
        log.info("hpsv3: checkpoint %s, base %s, on %s in %s", checkpoint, base, device, dtype)

    def check_images(self, images: Sequence[Image.Image], request: MediaRequest) -> None:
        """Each image's smart resize (Qwen2-VL refuses extreme shapes: 422) and each sample's
        sequence length (413), from the headers and the prompts before any pixel is decoded; then
        the model inputs, each reference's (an 8x8 image's are 4.8 MB twice), held."""
        assert self.layout is not None, "setup() has not run"
        text_tokens: dict[str, int] = {}  # a video's prompt, tokenized once for all its frames
        nbytes = 0
        for image, prompt, name in zip(images, request.item_prompts, request.names):
            width, height = shown_size(image)
            try:
                resized_height, resized_width = smart_resize(height, width)
            except ValueError as exc:
                raise Unprocessable(f"{name} is {width}x{height}: {exc}") from None
            if prompt not in text_tokens:
                text_tokens[prompt] = len(self.layout.text_ids(prompt))
            sequence, _ = self.layout.input_ids([], image_tokens(resized_height, resized_width))
            tokens = len(sequence) + text_tokens[prompt]
            if tokens > self.settings.max_tokens:
                raise PayloadTooLarge(
                    f"the prompt of {name} makes a sequence of {tokens} tokens; the limit is "
                    f"{self.settings.max_tokens} ({self.setting('max_tokens')})"
                )
            nbytes += input_bytes(resized_height, resized_width, tokens)
        hold_work(nbytes, f"{self.name} inputs")

    def prepare_images(self, images: list[Image.Image], prompts: list[str], metadata: dict[str, Any]) -> list[Item]:
        """Each image at its smart-resize size through Qwen2-VL's image processor (once per
        distinct image, its references sharing the pixel values), and its prompt in HPSv3's
        instruction and chat template."""
        assert self.layout is not None, "setup() has not run"
        items = []
        text_ids: dict[str, list[int]] = {}  # a video's prompt, tokenized once for all its frames
        for pixels, prompt in zip(once_per_image(images, self._pixels), prompts):
            grid = tuple(int(n) for n in pixels["image_grid_thw"][0])
            merged = grid[0] * grid[1] * grid[2] // self.image_processor.merge_size**2
            if prompt not in text_ids:
                text_ids[prompt] = self.layout.text_ids(prompt)
            input_ids, reward_index = self.layout.input_ids(text_ids[prompt], merged)
            items.append(Item(pixels["pixel_values"], grid, input_ids, reward_index))
        return items

    def _pixels(self, images: list[Image.Image]) -> list[Any]:
        """Each image's pixel values and patch grid, one image at a time."""
        return [self.image_processor(images=[resized(image)], return_tensors="np") for image in images]

    def score(self, batch: Sequence[Any]) -> list[Scored]:
        assert self.model is not None, "setup() has not run"
        return [Scored(mu * self.settings.scale, {"mu": mu, "sigma": sigma}) for mu, sigma in self.model.rewards(batch)]

    def info(self) -> dict[str, Any]:
        return {
            "model": self.settings.model,
            "base": self.settings.base,
            "precision": dtype_name(self.model),
            "scale": self.settings.scale,
            "max_tokens": self.settings.max_tokens,
        }
