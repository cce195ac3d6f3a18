"""A random-weight CLIP saved in the hub layout, for tests and benchmarks on machines that
cannot download the real one: the service loads it exactly as it loads real weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

# Vision towers by name; the text tower is always tiny (the aesthetic score never uses it).
# ``projection_dim`` is 768 in all of them so that the real LAION head fits.
VISION = {
    "tiny": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "patch_size": 32,
    },
    "b16": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "patch_size": 16,
    },
    "l14": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "patch_size": 14,
    },
}
TEXT = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "vocab_size": 8,
    "max_position_embeddings": 16,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 1,
}


def save_random_clip(directory: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random CLIP (``size`` in ``VISION``), its image processor and a stub tokenizer
    to ``directory`` with ``save_pretrained``, as a downloaded checkpoint is laid out."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=TEXT,
        vision_config={**VISION[size], "image_size": 224},
        projection_dim=768,
    )
    CLIPModel(config).eval().save_pretrained(directory)
    CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}).save_pretrained(directory)
    # A stub tokenizer, so that ``CLIPProcessor.from_pretrained`` works on the directory.
    vocab = directory / "vocab.json"
    merges = directory / "merges.txt"
    vocab.write_text(json.dumps({"<|startoftext|>": 0, "<|endoftext|>": 1, "a</w>": 2, "a": 3}))
    merges.write_text("#version: 0.2\n")
    CLIPTokenizer(vocab_file=str(vocab), merges_file=str(merges)).save_pretrained(directory)
    return directory
