"""Random ImageReward checkpoints in the release's own layout (``ImageReward.pt``: the state dict
of the ``image-reward`` package's ``ImageReward`` module, keys and shapes as its BLIP ViT, BERT
with cross-attention and MLP head have them; ``med_config.json``) and a small BERT tokenizer
directory, for tests and benchmarks on machines that cannot download the real ones. The
service loads them as it loads the release; tests/test_imagereward.py checks the layout against
the package's own module.

Weights are drawn so that every layer keeps its input's scale (standard deviation
1/sqrt(fan in)), so scores spread over images and prompts and a wrong tensor shows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

# ViT sizes (width, layers, MLP width, patch) by name: "large" is ImageReward's ViT-L/16 (the
# package builds no other), "base" BLIP's ViT-B/16, "tiny" one a test runs in milliseconds.
VISION: dict[str, tuple[int, int, int, int]] = {
    "tiny": (64, 2, 128, 32),
    "base": (768, 12, 3072, 16),
    "large": (1024, 24, 4096, 16),
}
# BERT sizes (width, layers, heads, MLP width): "base" is ImageReward's (med_config.json); the
# package's head reads 768 features, so a checkpoint it loads has a 768-wide BERT.
TEXT: dict[str, tuple[int, int, int, int]] = {
    "tiny": (32, 2, 4, 64),
    "small": (768, 2, 12, 256),
    "base": (768, 12, 12, 3072),
}
# A WordPiece vocabulary in bert-base-uncased's format: its special tokens, whole words,
# letters and their continuations, digits, punctuation and a few non-Latin characters.
WORDS = [
    *("a", "an", "the", "of", "in", "on", "with", "photo", "picture", "cat", "dog", "red", "blue", "green"),
    *("big", "small", "sitting", "table", "tree", "sky"),
]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = list(
    dict.fromkeys(  # each token once ("a" is a word and a letter)
        [
            *SPECIAL,
            *WORDS,
            *LETTERS,
            *(f"##{letter}" for letter in LETTERS),
            *"0123456789",
            *".,!?'\"-()[]:;/",
            *"猫狗中文",
        ]
    )
)
# BLIP adds [DEC] and [ENC] to the tokenizer; the BERT's vocabulary counts them.
VOCAB_SIZE = len(VOCAB) + 2
MAX_POSITIONS = 512


def save_tokenizer(directory: Path) -> Path:
    """A BERT tokenizer directory (``vocab.txt``, lower-casing) as ``bert-base-uncased`` is laid out."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 512}))
    return directory


def med_config(text: str = "tiny") -> dict[str, Any]:
    """``med_config.json`` as the release's, at the BERT size ``text``."""
    width, layers, heads, intermediate = TEXT[text]
    return {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": width,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": MAX_POSITIONS,
        "model_type": "bert",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "pad_token_id": 0,
        "type_vocab_size": 2,
        "vocab_size": VOCAB_SIZE,
        "encoder_width": VISION["large"][0],
        "add_cross_attention": True,
    }


def layout(vision: str = "tiny", text: str = "tiny") -> dict[str, tuple[int, ...]]:
    """Every tensor of the package's ``ImageReward`` module with its shape, by state-dict key."""
    width, depth, mlp, patch = VISION[vision]
    text_width, text_layers, _, text_mlp = TEXT[text]
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(name: str, out: int, inp: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out, inp), (out,)

    def norm(name: str, size: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (size,), (size,)

    v = "blip.visual_encoder."
    shapes[v + "cls_token"] = (1, 1, width)
    shapes[v + "pos_embed"] = (1, (224 // patch) ** 2 + 1, width)
    shapes[v + "patch_embed.proj.weight"], shapes[v + "patch_embed.proj.bias"] = (width, 3, patch, patch), (width,)
    for i in range(depth):
        block = f"{v}blocks.{i}."
        norm(block + "norm1", width)
        linear(block + "attn.qkv", 3 * width, width)
        linear(block + "attn.proj", width, width)
        norm(block + "norm2", width)
        linear(block + "mlp.fc1", mlp, width)
        linear(block + "mlp.fc2", width, mlp)
    norm(v + "norm", width)
    t = "blip.text_encoder."
    shapes[t + "embeddings.position_ids"] = (1, MAX_POSITIONS)
    shapes[t + "embeddings.word_embeddings.weight"] = (VOCAB_SIZE, text_width)
    shapes[t + "embeddings.position_embeddings.weight"] = (MAX_POSITIONS, text_width)
    norm(t + "embeddings.LayerNorm", text_width)
    for i in range(text_layers):
        layer = f"{t}encoder.layer.{i}."
        for attention, source in (("attention", text_width), ("crossattention", width)):
            linear(layer + attention + ".self.query", text_width, text_width)
            linear(layer + attention + ".self.key", text_width, source)
            linear(layer + attention + ".self.value", text_width, source)
            linear(layer + attention + ".output.dense", text_width, text_width)
            norm(layer + attention + ".output.LayerNorm", text_width)
        linear(layer + "intermediate.dense", text_mlp, text_width)
        linear(layer + "output.dense", text_width, text_mlp)
        norm(layer + "output.LayerNorm", text_width)
    linear("blip.vision_proj", 256, width)
    linear("blip.text_proj", 256, text_width)
    for index, (out, inp) in zip((0, 2, 4, 6, 7), ((1024, text_width), (128, 1024), (64, 128), (16, 64), (1, 16))):
        linear(f"mlp.layers.{index}", out, inp)
    return shapes


def random_state(vision: str = "tiny", text: str = "tiny", seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors in the package's layout: norms near 1 (weights) and 0 (biases), the rest
    scaled to their fan in."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for key, shape in layout(vision, text).items():
        if key.endswith("position_ids"):
            state[key] = torch.arange(shape[1]).unsqueeze(0)
            continue
        noise = torch.randn(shape, generator=generator)
        if "norm" in key.lower() and key.endswith("weight"):
            state[key] = 1 + 0.1 * noise
        elif key.endswith("bias") or len(shape) == 1:
            state[key] = 0.1 * noise
        elif "embed" in key or "cls_token" in key:
            state[key] = noise
        else:
            state[key] = noise / math.prod(shape[1:]) ** 0.5
    return state


def save_checkpoint(
    directory: Path, vision: str = "tiny", text: str = "tiny", seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """``ImageReward.pt`` and ``med_config.json`` in ``directory``, as the release lays them out."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {key: t.to(dtype) if t.is_floating_point() else t for key, t in random_state(vision, text, seed).items()}
    torch.save(state, directory / "ImageReward.pt")
    config = med_config(text)
    config["encoder_width"] = VISION[vision][0]
    (directory / "med_config.json").write_text(json.dumps(config, indent=2))
    return directory
