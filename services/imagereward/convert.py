"""The released ``ImageReward.pt`` (BLIP's ViT, BLIP's BERT with cross-attention, the MLP head)
as transformers' ``BlipVisionModel`` and ``BlipTextModel`` and the LAION-style head, in memory:
the ViT's keys renamed, the BERT's kept (transformers' BLIP text model is BLIP's ``med.py``).
Every tensor of the three parts is used and each is loaded strictly; the checkpoint's other
tensors (BLIP's contrastive projections, which ImageReward never runs) are left out.

The ViT's shape is read from its tensors; its heads are its width / 64, as in both of BLIP's
ViTs (base: 768 / 12, large: 1024 / 16). The BERT's is ``med_config.json``'s, with the ViT's
width as its cross-attention's input, as ``BLIP_Pretrain`` sets it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from transformers import BlipTextConfig, BlipTextModel, BlipVisionConfig, BlipVisionModel

from services.aesthetic.model import AestheticHead

VISION, TEXT, HEAD = "blip.visual_encoder.", "blip.text_encoder.", "mlp."
# Never run by ImageReward's score: BLIP's image-text contrastive projections, and BERT's
# position ids (a buffer, not a weight).
UNUSED = re.compile(r"blip\.(vision_proj|text_proj)\.(weight|bias)|blip\.text_encoder\.embeddings\.position_ids")
# BLIP's ViT heads are 64 wide; the package builds its ViTs with LayerNorm eps 1e-6.
HEAD_WIDTH, VISION_EPS = 64, 1e-6
# The package preprocesses every image to this size (``_transform(224)``).
IMAGE_SIZE = 224
VISION_RENAMES = (
    (r"cls_token", "embeddings.class_embedding"),
    (r"pos_embed", "embeddings.position_embedding"),
    (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embedding.\1"),
    (r"blocks\.(\d+)\.norm1\.(weight|bias)", r"encoder.layers.\1.layer_norm1.\2"),
    (r"blocks\.(\d+)\.norm2\.(weight|bias)", r"encoder.layers.\1.layer_norm2.\2"),
    (r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)", r"encoder.layers.\1.self_attn.qkv.\2"),
    (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layers.\1.self_attn.projection.\2"),
    (r"blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"encoder.layers.\1.mlp.\2.\3"),
    (r"norm\.(weight|bias)", r"post_layernorm.\1"),
)


class ConversionError(ValueError):
    """The checkpoint or its med config is not an ImageReward this converter knows."""


def _split(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], ...]:
    """The ViT's, the BERT's and the head's tensors, each without its prefix; an unknown key refused."""
    parts: tuple[dict[str, torch.Tensor], ...] = ({}, {}, {})
    for key, tensor in state.items():
        if UNUSED.fullmatch(key):
            continue
        for part, prefix in zip(parts, (VISION, TEXT, HEAD)):
            if key.startswith(prefix):
                part[key.removeprefix(prefix)] = tensor
                break
        else:
            raise ConversionError(f"unknown tensor {key!r}: not ImageReward's BLIP ViT, BERT or MLP head")
    for part, prefix in zip(parts, (VISION, TEXT, HEAD)):
        if not part:
            raise ConversionError(f"no {prefix}* tensors: not an ImageReward checkpoint")
    return parts


def _renamed(vision: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = {}
    for key, tensor in vision.items():
        for pattern, template in VISION_RENAMES:
            if re.fullmatch(pattern, key):
                renamed[re.sub(pattern, template, key)] = tensor
                break
        else:
            raise ConversionError(f"unknown ViT tensor {VISION + key!r}")
    return renamed


def vision_config(vision: dict[str, torch.Tensor]) -> BlipVisionConfig:
    """The ViT's configuration from its tensors' shapes."""
    try:
        width = vision["cls_token"].shape[-1]
        patch = vision["patch_embed.proj.weight"].shape[-1]
        positions = vision["pos_embed"].shape[1]
        intermediate = vision["blocks.0.mlp.fc1.weight"].shape[0]
    except KeyError as exc:
        raise ConversionError(f"not BLIP's ViT: no {VISION}{exc.args[0]}") from None
    layers = 1 + max(int(m.group(1)) for key in vision if (m := re.match(r"blocks\.(\d+)\.", key)))
    if width % HEAD_WIDTH or math.isqrt(positions - 1) ** 2 != positions - 1:
        raise ConversionError(f"not BLIP's ViT: width {width}, {positions} positions")
    image_size = math.isqrt(positions - 1) * patch
    if image_size != IMAGE_SIZE:
        raise ConversionError(f"the ViT sees {image_size} px images; ImageReward's sees {IMAGE_SIZE}")
    return BlipVisionConfig(
        hidden_size=width,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=width // HEAD_WIDTH,
        image_size=image_size,
        patch_size=patch,
        hidden_act="gelu",
        layer_norm_eps=VISION_EPS,
    )


def text_config(med: dict[str, Any], vision_width: int) -> BlipTextConfig:
    """BLIP's BERT from ``med_config.json``: every layer with cross-attention on the ViT's output."""
    if not med.get("add_cross_attention"):
        raise ConversionError("med_config.json has no add_cross_attention: ImageReward's BERT attends to the image")
    if med.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(f"med_config.json's position_embedding_type {med['position_embedding_type']!r}")
    try:
        return BlipTextConfig(
            vocab_size=med["vocab_size"],
            hidden_size=med["hidden_size"],
            intermediate_size=med["intermediate_size"],
            num_hidden_layers=med["num_hidden_layers"],
            num_attention_heads=med["num_attention_heads"],
            max_position_embeddings=med["max_position_embeddings"],
            hidden_act=med.get("hidden_act", "gelu"),
            layer_norm_eps=med.get("layer_norm_eps", 1e-12),
            pad_token_id=med.get("pad_token_id", 0),
            # Unused by the encoder; transformers' BERT-vocabulary defaults would not fit a smaller one.
            bos_token_id=None,
            eos_token_id=None,
            sep_token_id=None,
            encoder_hidden_size=vision_width,
            # transformers gives BLIP's text layers their cross-attention only in a decoder's
            # configuration; the forward pass stays bidirectional (``is_decoder=False``).
            is_decoder=True,
        )
    except KeyError as exc:
        raise ConversionError(f"med_config.json has no {exc.args[0]!r}") from None


def convert(
    state: dict[str, torch.Tensor], med: dict[str, Any]
) -> tuple[BlipVisionModel, BlipTextModel, AestheticHead]:
    """The three parts, loaded strictly from ``state`` (``ImageReward.pt``) and ``med`` (its
    ``med_config.json``), in float32 on the CPU, in eval mode."""
    vision_state, text_state, head_state = _split(state)
    config = vision_config(vision_state)
    vision = BlipVisionModel(config)
    text = BlipTextModel(text_config(med, config.hidden_size), add_pooling_layer=False)
    head = AestheticHead(text.config.hidden_size)
    for name, model, part in (
        ("ViT", vision, _renamed(vision_state)),
        ("BERT", text, text_state),
        ("head", head, head_state),
    ):
        try:
            model.load_state_dict({key: tensor.float() for key, tensor in part.items()}, strict=True)
        except RuntimeError as exc:
            raise ConversionError(f"the {name}'s tensors do not fit: {exc}") from None
    return vision.eval(), text.eval(), head.eval()
