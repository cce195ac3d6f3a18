"""ImageReward-v1.0 on transformers' BLIP: the ViT encodes the image, BLIP's BERT reads the
prompt attending to it, the MLP head scores the [CLS] state, normalised by the release's mean
and standard deviation, as the ``image-reward`` package's ``score`` and ``inference_rank``.

Kept apart from ``scorer.py`` and imported by ``setup`` only: torch and transformers take
seconds to import, and a worker should answer ``/health`` while they load.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import BertTokenizer

from common.imaging.images import once_per_image
from common.models.hub import local_first
from common.models.precision import torch_dtype
from services.clip.preprocess import centre_crop_normalised, resized_size
from services.imagereward.convert import IMAGE_SIZE, ConversionError, convert
from services.imagereward.settings import CHECKPOINT, MED_CONFIG

# ImageReward.py's normalisation of the head's output (ImageReward-v1.0's reward statistics).
MEAN, STD = 0.16717362830052426, 1.0333394966054072
# The package pads and truncates every prompt to 35 tokens ([CLS] and [SEP] included).
MAX_TOKENS = 35
# The package's ``_transform``: CLIP's statistics after a bicubic resize of the uint8 image.
PIXEL_MEAN = (0.48145466, 0.4578275, 0.40821073)
PIXEL_STD = (0.26862954, 0.26130258, 0.27577711)
# One image's model input, twice (the per-image array beside the batch stacked from it).
INPUT_BYTES = 2 * 3 * IMAGE_SIZE * IMAGE_SIZE * 4


@dataclass(frozen=True)
class RewardInput:
    """One sample's model input: its image's pixels (shared by every reference to that image)
    and its prompt's tokens."""

    pixels: torch.Tensor  # (3, 224, 224) float32
    input_ids: torch.Tensor  # (35,) int64
    attention_mask: torch.Tensor  # (35,) int64


class ImageRewardModel:
    """The ViT, the BERT and the head on one device; scores in micro-batches."""

    def __init__(self, weights: str, tokenizer: str, device: str, precision: str, micro_batch: int) -> None:
        """Load everything; ``OSError`` when a file can't be found or read, ``ConversionError``
        when the checkpoint is not ImageReward's or its tokenizer does not fit it."""
        self.device = device
        self.dtype = torch_dtype(precision, device)
        self.micro_batch = micro_batch
        checkpoint, med_config = (_weight_file(weights, name) for name in (CHECKPOINT, MED_CONFIG))
        try:
            state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
            med = json.loads(Path(med_config).read_text())
        except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as exc:
            # not a torch zip file, refused by the weights-only unpickler, or not JSON
            raise ConversionError(f"{type(exc).__name__}: {exc}") from None
        if not isinstance(state, dict) or not isinstance(med, dict):
            raise ConversionError(f"{CHECKPOINT} must hold a state dict and {MED_CONFIG} a JSON object")
        vision, text, head = convert(state, med)
        self.vision = vision.to(device=device, dtype=self.dtype)
        self.text = text.to(device=device, dtype=self.dtype)
        self.head = head.to(device)  # float32, as the package runs it on the .float() features
        self.tokenizer = _blip_tokenizer(tokenizer)
        if len(self.tokenizer) > text.config.vocab_size:
            raise ConversionError(
                f"the tokenizer has {len(self.tokenizer)} tokens with BLIP's [DEC] and [ENC]; the BERT has "
                f"{text.config.vocab_size}: not this checkpoint's tokenizer"
            )

    def prepare(self, images: list[Image.Image], prompts: list[str]) -> list[RewardInput]:
        """Each image's pixels (once per distinct image) with its prompt's tokens; NumPy only,
        on the request threads."""
        pixels = once_per_image(images, lambda distinct: [torch.from_numpy(_pixels(image)) for image in distinct])
        tokens = self.tokenizer(
            prompts, padding="max_length", truncation=True, max_length=MAX_TOKENS, return_tensors="np"
        )
        ids = torch.from_numpy(tokens["input_ids"].astype(np.int64))
        mask = torch.from_numpy(tokens["attention_mask"].astype(np.int64))
        return [RewardInput(p, ids[i], mask[i]) for i, p in enumerate(pixels)]

    @torch.inference_mode()
    def scores(self, batch: Sequence[RewardInput]) -> list[float]:
        """The normalised reward per input, ``micro_batch`` inputs per forward pass; an image
        several inputs share goes through the ViT once."""
        scores: list[float] = []
        for start in range(0, len(batch), self.micro_batch):
            scores.extend(self._scores(batch[start : start + self.micro_batch]))
        return scores

    def _scores(self, inputs: Sequence[RewardInput]) -> list[float]:
        distinct = {id(item.pixels): item.pixels for item in inputs}
        position = {key: index for index, key in enumerate(distinct)}
        pixels = torch.stack(list(distinct.values())).to(self.device, self.dtype)
        image_states = self.vision(pixel_values=pixels).last_hidden_state
        which = torch.tensor([position[id(item.pixels)] for item in inputs], device=self.device)
        text = self.text(
            input_ids=torch.stack([item.input_ids for item in inputs]).to(self.device),
            attention_mask=torch.stack([item.attention_mask for item in inputs]).to(self.device),
            encoder_hidden_states=image_states.index_select(0, which),
        )
        rewards = self.head(text.last_hidden_state[:, 0, :].float()).squeeze(-1)
        return ((rewards - MEAN) / STD).tolist()


def _pixels(image: Image.Image) -> np.ndarray:
    """The package's ``_transform(224)``: torchvision's ``Resize(224, BICUBIC)`` of the image
    (PIL's bicubic on its uint8 pixels), ``CenterCrop(224)``, ``ToTensor``, ``Normalize``."""
    size = resized_size(image.width, image.height, IMAGE_SIZE)
    resized = np.asarray(image.convert("RGB").resize(size, Image.Resampling.BICUBIC), dtype=np.float32)
    scaled = resized.transpose(2, 0, 1) / np.float32(255)
    return centre_crop_normalised(scaled, (IMAGE_SIZE, IMAGE_SIZE), PIXEL_MEAN, PIXEL_STD)


def _weight_file(source: str, name: str) -> str:
    """``name`` in the directory ``source``, or from the hub repository ``source`` (its cache first)."""
    local = Path(source).expanduser()
    if local.is_dir():
        path = local / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        return str(path)
    from huggingface_hub import hf_hub_download

    return local_first(lambda offline: hf_hub_download(source, name, local_files_only=offline))


def _blip_tokenizer(source: str) -> BertTokenizer:
    """BERT's tokenizer with the two tokens BLIP adds (``init_tokenizer``): ``[DEC]`` as its
    beginning of sentence and ``[ENC]``; neither is in a prompt's tokens unless the prompt spells it."""
    tokenizer = local_first(lambda offline: BertTokenizer.from_pretrained(source, local_files_only=offline))
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer
