"""Random CLIP-family models saved as the real ones are laid out, for tests and benchmarks on
machines that cannot download weights; the services load them by their own paths.

The tokenizer is real: CLIP's BPE vocabulary ships inside open_clip's wheel (installed without
its dependencies beside the tests), turned here into the ``vocab.json`` / ``merges.txt`` of a
transformers ``CLIPTokenizer``, the same 49,408 tokens as every CLIP checkpoint.
"""

from __future__ import annotations

import gzip
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

import torch
from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

from testing.reference import run_reference

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
VOCAB_SIZE = 49408

# Towers by name: the layout of ViT-H/14 (PickScore, HPSv2) and ViT-L/14 (CLIPScore) at tiny
# widths for the tests; for benchmarks, "b14" (ViT-B widths, 14-pixel patches: a CPU can run
# it), "l14" (the real ViT-L/14, GenEval's colour classifier) and "h14", the real ViT-H/14.
TOWERS: dict[str, dict[str, Any]] = {
    "tiny": {
        "projection_dim": 32,
        "vision": {"hidden_size": 40, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 2},
        "text": {"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
    },
    "b14": {
        "projection_dim": 512,
        "vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12},
        "text": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 8},
    },
    "l14": {
        "projection_dim": 768,
        "vision": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16},
        "text": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12},
    },
    "h14": {
        "projection_dim": 1024,
        "vision": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 16},
        "text": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16},
    },
}
# The same tiny network in open_clip's configuration format (HPSv2's checkpoint layout).
TINY_OPEN_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 40, "head_width": 20, "patch_size": 14},
    "text_cfg": {"context_length": 77, "vocab_size": VOCAB_SIZE, "width": 32, "heads": 4, "layers": 2},
}


def _byte_alphabet() -> list[str]:
    """GPT-2's reversible byte-to-character table, the alphabet of CLIP's BPE, in vocabulary order:
    the printable bytes as themselves, then the others mapped from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return [chr(byte) for byte in printable] + [chr(256 + n) for n in range(len(others))]


@cache
def _bpe() -> tuple[dict[str, int], list[str]]:
    spec = importlib.util.find_spec("open_clip")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("open_clip_torch is not installed (run.sh test installs it without dependencies)")
    path = Path(next(iter(spec.submodule_search_locations))) / "bpe_simple_vocab_16e6.txt.gz"
    merges = gzip.open(path).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    alphabet = _byte_alphabet()
    tokens = [*alphabet, *(char + "</w>" for char in alphabet), *("".join(m.split()) for m in merges)]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    assert len(tokens) == VOCAB_SIZE
    return {token: index for index, token in enumerate(tokens)}, merges


def save_processor(directory: Path) -> Path:
    """CLIP's tokenizer and the ViT-H/14 / ViT-L/14 image processor (224 px, OpenAI statistics)."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab, merges = _bpe()
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[tuple(merge.split()) for merge in merges])
    tokenizer.model_max_length = 77
    tokenizer.save_pretrained(directory)
    CLIPImageProcessorPil(
        size={"shortest_edge": 224},
        crop_size={"height": 224, "width": 224},
        image_mean=list(OPENAI_MEAN),
        image_std=list(OPENAI_STD),
    ).save_pretrained(directory)
    return directory


def save_random_clip_model(
    directory: Path, size: str = "tiny", hidden_act: str = "gelu", seed: int = 0, processor: bool = True
) -> Path:
    """A random transformers CLIP with 14-pixel patches at 224 px and CLIP's vocabulary, saved
    with ``save_pretrained``; its processor beside it unless ``processor`` is False."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tower = TOWERS[size]
    config = CLIPConfig(
        projection_dim=tower["projection_dim"],
        vision_config={**tower["vision"], "image_size": 224, "patch_size": 14, "hidden_act": hidden_act},
        text_config={
            **tower["text"],
            "vocab_size": VOCAB_SIZE,
            "max_position_embeddings": 77,
            "hidden_act": hidden_act,
        },
    )
    model = CLIPModel(config).eval()
    with torch.no_grad():  # a logit scale other than the init value, so that a wrong one shows
        model.logit_scale.fill_(4.2)
    model.save_pretrained(directory)
    if processor:
        save_processor(directory)
    return directory


def save_model(service: str, directory: Path) -> Path:
    """The tiny model of ``service``, with its processor in the model directory."""
    if service == "hpsv2":
        run_reference(
            "clip_reference.py", {"job": "hpsv2-model", "directory": str(directory), "config": TINY_OPEN_CLIP}
        )
        return save_processor(directory)
    # PickScore is a ViT-H/14 (GELU); OpenAI's ViT-L/14 uses quick GELU.
    return save_random_clip_model(directory, hidden_act="gelu" if service == "pickscore" else "quick_gelu")
