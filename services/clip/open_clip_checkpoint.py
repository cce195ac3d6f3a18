"""An open_clip CLIP checkpoint (HPSv2's) as a transformers ``CLIPModel``.

open_clip's plain ViT CLIP and transformers' CLIP are the same network in two layouts: the
state dict is renamed and the fused attention projection split, nothing is recomputed. The
scorers then run every CLIP-family model through one code path, without open_clip (which
imports torchvision at import time) on the serving node. Architectures with options beyond the
plain ViT (timm towers, attentional pooling, layer scale, ...) are refused, not approximated.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from transformers import CLIPConfig, CLIPModel

# open_clip's model_configs/ViT-H-14.json, the architecture HPSv2 trains.
VIT_H_14: dict[str, Any] = {
    "embed_dim": 1024,
    "vision_cfg": {"image_size": 224, "layers": 32, "width": 1280, "head_width": 80, "patch_size": 14},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 1024, "heads": 16, "layers": 24},
}
VISION_KEYS = {"image_size", "layers", "width", "head_width", "patch_size", "mlp_ratio"}
TEXT_KEYS = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"}
MODEL_KEYS = {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu"}
# The hub layout of open_clip models: {"model_cfg": {...}, "preprocess_cfg": {...}}.
CONFIG_FILE = "open_clip_config.json"


class CheckpointError(ValueError):
    """The file is not an open_clip CLIP checkpoint this converter can take."""


def read_config(directory: Path) -> dict[str, Any]:
    """The model configuration in ``directory``'s ``open_clip_config.json``, else ViT-H-14."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        return VIT_H_14
    try:
        config = json.loads(path.read_text())
        return config.get("model_cfg", config)
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path} is not an open_clip model configuration: {exc}") from None


def hf_config(model_cfg: dict[str, Any]) -> CLIPConfig:
    """The transformers configuration of the same network."""
    vision, text = model_cfg.get("vision_cfg", {}), model_cfg.get("text_cfg", {})
    extra = (set(vision) - VISION_KEYS) | (set(text) - TEXT_KEYS) | (set(model_cfg) - MODEL_KEYS)
    if extra:
        raise CheckpointError(f"open_clip options {sorted(extra)} are not supported (plain ViT CLIP only)")
    act = "quick_gelu" if model_cfg.get("quick_gelu") else "gelu"
    vision_width, text_width = vision.get("width", 768), text.get("width", 512)
    return CLIPConfig(
        projection_dim=model_cfg["embed_dim"],
        vision_config={
            "hidden_size": vision_width,
            "intermediate_size": int(vision_width * vision.get("mlp_ratio", 4.0)),
            "num_hidden_layers": vision.get("layers", 12),
            "num_attention_heads": vision_width // vision.get("head_width", 64),
            "image_size": vision.get("image_size", 224),
            "patch_size": vision.get("patch_size", 16),
            "hidden_act": act,
            "layer_norm_eps": 1e-5,
        },
        text_config={
            "hidden_size": text_width,
            "intermediate_size": int(text_width * text.get("mlp_ratio", 4.0)),
            "num_hidden_layers": text.get("layers", 12),
            "num_attention_heads": text.get("heads", 8),
            "max_position_embeddings": text.get("context_length", 77),
            "vocab_size": text.get("vocab_size", 49408),
            "hidden_act": act,
            "layer_norm_eps": 1e-5,
            # 2 selects transformers' legacy pooling, the argmax of the token ids: open_clip's rule
            # (the end-of-text token has the largest id).
            "eos_token_id": 2,
        },
    )


def _blocks(prefix: str, target: str, state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    out = {}
    for i in range(layers):
        src, dst = f"{prefix}.resblocks.{i}", f"{target}.encoder.layers.{i}"
        for name in ("weight", "bias"):
            out[f"{dst}.layer_norm1.{name}"] = state[f"{src}.ln_1.{name}"]
            out[f"{dst}.layer_norm2.{name}"] = state[f"{src}.ln_2.{name}"]
            out[f"{dst}.self_attn.out_proj.{name}"] = state[f"{src}.attn.out_proj.{name}"]
            out[f"{dst}.mlp.fc1.{name}"] = state[f"{src}.mlp.c_fc.{name}"]
            out[f"{dst}.mlp.fc2.{name}"] = state[f"{src}.mlp.c_proj.{name}"]
            q, k, v = state[f"{src}.attn.in_proj_{name}"].chunk(3)
            out[f"{dst}.self_attn.q_proj.{name}"] = q
            out[f"{dst}.self_attn.k_proj.{name}"] = k
            out[f"{dst}.self_attn.v_proj.{name}"] = v
    return out


def hf_state_dict(state: dict[str, torch.Tensor], config: CLIPConfig) -> dict[str, torch.Tensor]:
    """open_clip's parameter names and layout to transformers'."""
    out = {
        "vision_model.embeddings.patch_embedding.weight": state["visual.conv1.weight"],
        "vision_model.embeddings.class_embedding": state["visual.class_embedding"],
        "vision_model.embeddings.position_embedding.weight": state["visual.positional_embedding"],
        "visual_projection.weight": state["visual.proj"].t(),
        "text_model.embeddings.token_embedding.weight": state["token_embedding.weight"],
        "text_model.embeddings.position_embedding.weight": state["positional_embedding"],
        "text_projection.weight": state["text_projection"].t(),
        "logit_scale": state["logit_scale"],
    }
    for name in ("weight", "bias"):
        out[f"vision_model.pre_layrnorm.{name}"] = state[f"visual.ln_pre.{name}"]
        out[f"vision_model.post_layernorm.{name}"] = state[f"visual.ln_post.{name}"]
        out[f"text_model.final_layer_norm.{name}"] = state[f"ln_final.{name}"]
    out |= _blocks("visual.transformer", "vision_model", state, config.vision_config.num_hidden_layers)
    out |= _blocks("transformer", "text_model", state, config.text_config.num_hidden_layers)
    return out


def load_open_clip_checkpoint(path: Path, model_cfg: dict[str, Any]) -> CLIPModel:
    """A float32 ``CLIPModel`` with the weights of the open_clip checkpoint at ``path``
    (``{"state_dict": ...}`` as HPSv2 ships it, or the bare state dict)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise CheckpointError(f"{path} could not be read as a torch checkpoint: {type(exc).__name__}: {exc}") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds no state dict")
    config = hf_config(model_cfg)
    try:
        converted = hf_state_dict({k: v.float() for k, v in state.items() if isinstance(v, torch.Tensor)}, config)
        # From a state dict, transformers builds the model without initialising it first (a
        # random ViT-H/14 takes a minute on a CPU).
        model, info = CLIPModel.from_pretrained(None, config=config, state_dict=converted, output_loading_info=True)
    except (KeyError, RuntimeError, ValueError) as exc:  # a missing parameter, or shapes of another architecture
        raise CheckpointError(
            f"{path} does not fit the open_clip architecture {json.dumps(model_cfg)}: {type(exc).__name__}: {exc}"
        ) from None
    problems = {key: value for key, value in info.items() if value and key != "error_msgs"} | (
        {"errors": info["error_msgs"]} if info.get("error_msgs") else {}
    )
    if problems:
        raise CheckpointError(f"{path} does not fit the open_clip architecture {json.dumps(model_cfg)}: {problems}")
    return model.eval()
