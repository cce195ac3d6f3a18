"""HPSv3 on a device: the reward model (Qwen2-VL with HPSv3's RankNet head) and its loading.

HPSv3 is ``Qwen2VLForConditionalGeneration`` with the ``<|Reward|>`` token added to the
tokenizer (the embeddings resized to it) and a head ``hidden -> 1024 -> 16 -> 2`` (ReLU, a
dropout between, float32) on the last hidden state; its two outputs at the reward token are
the score's mean and spread (mu, sigma). The checkpoint is that model's whole state dict.

Imported by ``setup`` only: torch and transformers take seconds to import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import Qwen2VLConfig, Qwen2VLModel

from services.hpsv3.inputs import Item


class CheckpointError(ValueError):
    """The checkpoint does not fit the model (keys or shapes)."""


def ranknet_head(hidden_size: int) -> nn.Sequential:
    """HPSv3's reward head; its keys are ``rm_head.{0,3,5}.*``."""
    return nn.Sequential(
        nn.Linear(hidden_size, 1024),
        nn.ReLU(),
        nn.Dropout(0.05),
        nn.Linear(1024, 16),
        nn.ReLU(),
        nn.Linear(16, 2),
    )


class HPSv3RewardModel(nn.Module):
    """The reward model with the checkpoint's module names: ``model`` (Qwen2-VL's vision tower
    and language model), ``lm_head`` (in the checkpoint, unused by the reward: dropped after
    loading) and ``rm_head``."""

    def __init__(self, config: Qwen2VLConfig) -> None:
        super().__init__()
        text = config.text_config
        self.model = Qwen2VLModel(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.rm_head = ranknet_head(text.hidden_size)


def current_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's keys as transformers names them since 4.52 (``model.language_model.*``,
    ``model.visual.*``). HPSv3 was trained with 4.45, which saved ``model.*`` and ``visual.*``."""
    if any(key.startswith("model.language_model.") for key in state):
        return state
    renamed = {}
    for key, value in state.items():
        if key.startswith("visual."):
            key = "model." + key
        elif key.startswith("model."):
            key = "model.language_model." + key.removeprefix("model.")
        renamed[key] = value
    return renamed


def _materialise_buffers(model: nn.Module, device: str) -> None:
    """Modules built on the meta device keep meta buffers the checkpoint does not hold (the
    rotary embeddings' frequencies, computed from the configuration): build those modules again
    on ``device``."""
    for name, module in list(model.named_modules()):
        if any(buffer.is_meta for buffer in module.buffers(recurse=False)):
            parent_name, _, child = name.rpartition(".")
            with torch.device(device):
                model.get_submodule(parent_name).register_module(child, type(module)(module.config))
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if left:
        raise CheckpointError(f"not loaded: {', '.join(left[:5])}")


def load_reward_model(
    checkpoint: Path, config: Qwen2VLConfig, vocab_size: int, device: str, dtype: torch.dtype
) -> HPSv3RewardModel:
    """The model of ``config`` with its vocabulary at ``vocab_size`` (the tokenizer's, reward
    token included), the checkpoint loaded with ``strict=True`` in either key layout, straight
    onto ``device``: the backbone in ``dtype``, the head in float32."""
    config.text_config.vocab_size = vocab_size
    try:
        state = current_layout(load_file(str(checkpoint), device=device))
    except Exception as exc:  # safetensors raises its own error types for a file that is not one
        raise CheckpointError(f"{checkpoint} could not be read as safetensors: {exc}") from None
    state = {key: value.to(torch.float32 if key.startswith("rm_head.") else dtype) for key, value in state.items()}
    with torch.device("meta"):
        model = HPSv3RewardModel(config)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # torch names the missing, unexpected and misshapen keys, over several lines
        raise CheckpointError(" ".join(str(exc).split())) from None
    _materialise_buffers(model, device)
    # HPSv3's training and inference cast the whole backbone (``model.to(torch.bfloat16)``), the
    # rotary embeddings' frequencies included: the model was trained with them rounded so.
    model.model.to(dtype)
    if hasattr(model, "lm_head"):
        del model.lm_head
    return model.eval()


class HPSv3:
    """The reward model on one device: (mu, sigma) of a batch of items in one forward pass."""

    def __init__(self, model: HPSv3RewardModel, pad_id: int, image_id: int, device: str, dtype: torch.dtype) -> None:
        self.model = model
        self.pad_id = pad_id
        self.image_id = image_id
        self.device = device
        self.dtype = dtype

    @torch.inference_mode()
    def rewards(self, items: Sequence[Item]) -> list[tuple[float, float]]:
        """(mu, sigma) per item. Texts are padded on the right, so the causal model reads each
        item's tokens up to its reward token as it would alone."""
        width = max(len(item.input_ids) for item in items)
        input_ids = np.full((len(items), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        for row, item in enumerate(items):
            input_ids[row, : len(item.input_ids)] = item.input_ids
            mask[row, : len(item.input_ids)] = 1
        token_types = (input_ids == self.image_id).astype(np.int64) * mask  # 1: an image token
        pixels = np.concatenate([item.pixel_values for item in items])
        hidden = self.model.model(
            input_ids=torch.from_numpy(input_ids).to(self.device),
            attention_mask=torch.from_numpy(mask).to(self.device),
            pixel_values=torch.from_numpy(pixels).to(self.device, self.dtype),
            image_grid_thw=torch.tensor([item.grid_thw for item in items], device=self.device),
            mm_token_type_ids=torch.from_numpy(token_types).to(self.device),
            use_cache=False,
        ).last_hidden_state
        rows = torch.arange(len(items), device=self.device)
        positions = torch.tensor([item.reward_index for item in items], device=self.device)
        out = self.model.rm_head(hidden[rows, positions].float())
        return [(mu, sigma) for mu, sigma in out.tolist()]
