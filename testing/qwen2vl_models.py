"""Random HPSv3 checkpoints on a tiny Qwen2-VL, laid out as the real ones are, for tests and
benchmarks on machines that cannot download weights; the service loads them by its own path.

Two directories, as a user has them:

- the base (``--base``, Qwen2-VL-7B-Instruct's layout): ``config.json`` in the flat format the
  hub's copy has (text settings at the top, ``rope_scaling`` of type ``mrope``), a Qwen2
  tokenizer (byte-level BPE with Qwen2's pre-tokenizer; its BPE vocabulary is small, trained
  here on a few sentences, but its special tokens are Qwen2-VL's, in Qwen2-VL's order, after the
  vocabulary), the published chat template, and ``preprocessor_config.json``;
- the checkpoint (``--model``): ``HPSv3.safetensors``, the state dict of HPSv3's reward model
  (``Qwen2VLForConditionalGeneration`` with the ``<|Reward|>`` token added and a RankNet head),
  in either key layout: ``"old"`` as transformers 4.45 (HPSv3's training) saved it
  (``model.layers...``, ``visual...``), ``"new"`` as transformers since 4.52 names it
  (``model.language_model...``, ``model.visual...``).

``"7b"`` is Qwen2-VL-7B's real size (for the GPU bench).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2Tokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration

from services.hpsv3.model import ranknet_head

# Qwen2-VL's special tokens, in the order of their ids (151643 on) in the real tokenizer.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen2-VL-7B-Instruct's published chat template (chat_template.json and tokenizer_config.json).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen2-VL-7B-Instruct's preprocessor_config.json.
PREPROCESSOR = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
}
# Text the tiny BPE is trained on: words of HPSv3's instruction and of prompts, so that the
# instruction tokenizes into merged tokens, as with the real vocabulary.
CORPUS = (
    "You are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give a "
    "overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being the "
    "worst and 10 being the best. Evaluate the overall visual quality of the image. Reasonableness Clarity "
    "Detail Richness Aesthetic and Creativity Safety Subject Relevance Style Relevance Contextual Consistency "
    "Attribute Fidelity Semantic Coherence Textual prompt - a photo of a cat on a mat, an astronaut riding a "
    "horse, a red car in the rain. Please provide the overall ratings of this image: END\n\n"
)
# The model sizes: Qwen2-VL-7B's layout at tiny widths, and the real 7B.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "text": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_window_layers": 2,
            "mrope_section": [2, 3, 3],  # half the head dimension (16)
        },
        "vision": {"depth": 2, "embed_dim": 32, "mlp_ratio": 4, "num_heads": 4},
    },
    "7b": {
        "text": {
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_window_layers": 28,
            "mrope_section": [16, 24, 24],
        },
        "vision": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16},
    },
}
CHECKPOINT = "HPSv3.safetensors"


def _bpe(vocab_size: int = 600) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE trained on ``CORPUS`` through Qwen2's normalizer and pre-tokenizer."""
    trainer_tokenizer = Tokenizer(models.BPE())
    reference = Qwen2Tokenizer()  # Qwen2's pipeline, whose normalizer and pre-tokenizer we reuse
    trainer_tokenizer.normalizer = normalizers.NFC()
    trainer_tokenizer.pre_tokenizer = reference.backend_tokenizer.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    trainer_tokenizer.train_from_iterator([CORPUS] * 4, trainer)
    model = json.loads(trainer_tokenizer.to_str())["model"]
    merges = [tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in model["merges"]]
    return model["vocab"], merges


def save_base(directory: Path, size: str = "tiny", tokenizer_template: bool = True) -> Path:
    """The base directory: config, tokenizer, chat template and image preprocessor. The chat
    template in ``chat_template.json`` (the processor's) and, unless ``tokenizer_template`` is
    False, in ``tokenizer_config.json``, as the hub's Qwen2-VL-7B-Instruct has it."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab, merges = _bpe()
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, errors="replace")
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tokenizer.model_max_length = 32768
    tokenizer.save_pretrained(directory)
    if tokenizer_template:
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
        tokenizer_config["chat_template"] = CHAT_TEMPLATE
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    assert list(ids.values()) == list(range(len(vocab), len(vocab) + len(SPECIAL_TOKENS))), ids
    text, vision = dict(SIZES[size]["text"]), SIZES[size]["vision"]
    mrope_section = text.pop("mrope_section")
    config = {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_token_id": ids["<|vision_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        **text,
        "vision_config": {
            **vision,
            "in_chans": 3,
            "hidden_size": text["hidden_size"],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "rope_scaling": {"type": "mrope", "mrope_section": mrope_section},
        # The real one is padded past the tokenizer (152064 for 151657 tokens); HPSv3 resizes it.
        "vocab_size": len(tokenizer) + 7,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2))
    return directory


def reward_model_state(
    base: Path, seed: int = 0, init_std: float = 0.02, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """HPSv3's reward model as its training builds it, with random weights, in the new key layout:
    Qwen2-VL from the base config, the embeddings resized to the tokenizer with ``<|Reward|>``
    added, the RankNet head (hidden -> 1024 -> 16 -> 2). The backbone in bfloat16, as the released
    checkpoint, the head in float32. ``init_std``: the weights' spread (larger: scores that vary
    more between samples, for the tests). Built on ``device`` (the 7B size on a GPU: seconds)."""
    torch.manual_seed(seed)
    config = Qwen2VLConfig.from_pretrained(base)
    config.text_config.initializer_range = config.vision_config.initializer_range = init_std
    vocab = len(Qwen2Tokenizer.from_pretrained(base)) + 1  # + <|Reward|>
    with torch.device(device):
        model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
        model.resize_token_embeddings(vocab)
        head = ranknet_head(config.text_config.hidden_size)
    return {
        **model.state_dict(),
        **{f"rm_head.{key}": value.float() for key, value in head.state_dict().items()},
    }


def old_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The keys as transformers before 4.52 named them (HPSv3's training, transformers 4.45)."""
    renamed = {}
    for key, value in state.items():
        if key.startswith("model.visual."):
            key = key.removeprefix("model.")
        elif key.startswith("model.language_model."):
            key = "model." + key.removeprefix("model.language_model.")
        renamed[key] = value
    return renamed


def save_checkpoint(
    directory: Path, base: Path, layout: str = "old", seed: int = 0, state: dict[str, torch.Tensor] | None = None
) -> Path:
    """``HPSv3.safetensors`` in ``directory``, of a random reward model on ``base`` (or ``state``)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = state if state is not None else reward_model_state(base, seed)
    if layout == "old":
        state = old_layout(state)
    path = directory / CHECKPOINT
    save_file({key: value.contiguous() for key, value in state.items()}, str(path))
    return path


def save_hpsv3(directory: Path, layout: str = "old", seed: int = 0) -> tuple[Path, Path]:
    """A tiny HPSv3: (the checkpoint file, the base directory)."""
    base = save_base(directory / "base")
    return save_checkpoint(directory / "model", base, layout, seed), base
