"""GenEval's detector checkpoint (mmdet 2.x ``Mask2Former``, Swin backbone,
``MSDeformAttnPixelDecoder``) as a transformers ``Mask2FormerForUniversalSegmentation``, without
mmcv or mmdet: the state dict renamed, the fused projections split, the patch merging's channel
order mmdet's ``nn.Unfold`` gives put back in Swin's; every tensor is used and the model is
loaded strictly. The architecture (widths, depths, heads, layers, queries, classes) is read from
the tensors' shapes.

    python -m services.geneval.convert mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth DIR
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, SwinConfig

from services.geneval.rules import CLASSNAMES

SWIN = "model.pixel_level_module.encoder."
SWIN_BODY = SWIN + "swin."
PIXEL = "model.pixel_level_module.decoder."
DECODER = "model.transformer_module.decoder."
# mmdet's Swin window and pretraining size for this config (swin-s-p4-w7-224).
WINDOW, PRETRAIN_SIZE = 7, 224


class ConversionError(ValueError):
    """The checkpoint is not an mmdet 2.x Mask2Former this converter knows."""


def _count(state: dict[str, torch.Tensor], pattern: str) -> int:
    found = {int(m.group(1)) for key in state if (m := re.fullmatch(pattern, key))}
    return max(found) + 1 if found else 0


def config_of(state: dict[str, torch.Tensor]) -> Mask2FormerConfig:
    """The transformers configuration of the network the checkpoint holds."""
    try:
        embed = state["backbone.patch_embed.projection.weight"].shape[0]
        stages = _count(state, r"backbone\.stages\.(\d+)\..*")
        depths = [_count(state, rf"backbone\.stages\.{i}\.blocks\.(\d+)\..*") for i in range(stages)]
        heads = [
            state[f"backbone.stages.{i}.blocks.0.attn.w_msa.relative_position_bias_table"].shape[1]
            for i in range(stages)
        ]
        hidden = state["panoptic_head.query_feat.weight"].shape[1]
        queries = state["panoptic_head.query_feat.weight"].shape[0]
        classes = state["panoptic_head.cls_embed.weight"].shape[0] - 1
        head_prefix = "panoptic_head.transformer_decoder.layers.0."
        encoder_prefix = "panoptic_head.pixel_decoder.encoder.layers.0."
        attention_weights = state[encoder_prefix + "attentions.0.attention_weights.weight"].shape[0]
    except KeyError as exc:
        raise ConversionError(f"not an mmdet 2.x Mask2Former with a Swin backbone: no {exc}") from None
    levels = state["panoptic_head.level_embed.weight"].shape[0]
    # attention_weights: heads x levels x points outputs; sampling_offsets twice that.
    points = 4
    heads_count = attention_weights // (levels * points)
    return Mask2FormerConfig(
        backbone_config=SwinConfig(
            embed_dim=embed,
            depths=depths,
            num_heads=heads,
            window_size=WINDOW,
            image_size=PRETRAIN_SIZE,
            drop_path_rate=0.0,
            out_features=[f"stage{i + 1}" for i in range(stages)],
        ),
        num_labels=classes,
        num_queries=queries,
        hidden_dim=hidden,
        mask_feature_size=state["panoptic_head.pixel_decoder.mask_feature.weight"].shape[0],
        feature_size=hidden,
        encoder_feedforward_dim=state[encoder_prefix + "ffns.0.layers.0.0.weight"].shape[0],
        dim_feedforward=state[head_prefix + "ffns.0.layers.0.0.weight"].shape[0],
        encoder_layers=_count(state, r"panoptic_head\.pixel_decoder\.encoder\.layers\.(\d+)\..*"),
        # mmdet's 9 decoder layers are transformers' decoder_layers - 1 plus its first prediction.
        decoder_layers=_count(state, r"panoptic_head\.transformer_decoder\.layers\.(\d+)\..*") + 1,
        num_attention_heads=heads_count,
        common_stride=4,
        id2label=dict(enumerate(CLASSNAMES)) if classes == len(CLASSNAMES) else None,
    )


def swin_merge_order(weight: torch.Tensor) -> torch.Tensor:
    """A patch merging's (out, 4C) reduction or (4C,) norm from mmdet's unfold order (channel
    major, then the 2 x 2 patch row by row) to Swin's (the four patches (0,0), (1,0), (0,1),
    (1,1) one after another)."""
    if weight.dim() == 1:
        return weight.reshape(-1, 4).t()[[0, 2, 1, 3]].reshape(-1)
    out = weight.shape[0]
    return weight.reshape(out, -1, 4).transpose(1, 2)[:, [0, 2, 1, 3]].reshape(out, -1)


def _rules() -> list[tuple[str, str, Callable[[torch.Tensor], list[tuple[str, torch.Tensor]]] | None]]:
    """(mmdet key pattern, transformers key template, split) renaming rules, in order."""

    def thirds(*names: str) -> Callable[[torch.Tensor], list[tuple[str, torch.Tensor]]]:
        return lambda tensor: list(zip(names, tensor.chunk(3, dim=0)))

    block = SWIN_BODY + r"encoder.layers.\1.blocks.\2."
    return [
        (
            r"backbone\.patch_embed\.projection\.(weight|bias)",
            SWIN_BODY + r"embeddings.patch_embeddings.projection.\1",
            None,
        ),
        (r"backbone\.patch_embed\.norm\.(weight|bias)", SWIN_BODY + r"embeddings.norm.\1", None),
        (r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.norm1\.(weight|bias)", block + r"layernorm_before.\3", None),
        (r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.norm2\.(weight|bias)", block + r"layernorm_after.\3", None),
        (
            r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.attn\.w_msa\.relative_position_bias_table",
            block + "attention.relative_position_bias.relative_position_bias_table",
            None,
        ),
        (
            r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.attn\.w_msa\.qkv\.(weight|bias)",
            block + r"attention.{}.\3",
            thirds("q_proj", "k_proj", "v_proj"),
        ),
        (
            r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.attn\.w_msa\.proj\.(weight|bias)",
            block + r"attention.o_proj.\3",
            None,
        ),
        (r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.ffn\.layers\.0\.0\.(weight|bias)", block + r"mlp.fc1.\3", None),
        (r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.ffn\.layers\.1\.(weight|bias)", block + r"mlp.fc2.\3", None),
        (
            r"backbone\.stages\.(\d+)\.downsample\.(reduction\.weight|norm\.weight|norm\.bias)",
            SWIN_BODY + r"encoder.layers.\1.downsample.\2",
            lambda tensor: [("", swin_merge_order(tensor))],
        ),
        (r"backbone\.norm(\d+)\.(weight|bias)", SWIN + r"hidden_states_norms.stage{}.\2", None),
        # The pixel decoder: the encoder's levels from the lowest resolution, as transformers'.
        (
            r"panoptic_head\.pixel_decoder\.input_convs\.(\d+)\.conv\.(weight|bias)",
            PIXEL + r"input_projections.\1.0.\2",
            None,
        ),
        (
            r"panoptic_head\.pixel_decoder\.input_convs\.(\d+)\.gn\.(weight|bias)",
            PIXEL + r"input_projections.\1.1.\2",
            None,
        ),
        (
            r"panoptic_head\.pixel_decoder\.encoder\.layers\.(\d+)\.attentions\.0\."
            r"(sampling_offsets|attention_weights|value_proj|output_proj)\.(weight|bias)",
            PIXEL + r"encoder.layers.\1.self_attn.\2.\3",
            None,
        ),
        (
            r"panoptic_head\.pixel_decoder\.encoder\.layers\.(\d+)\.norms\.0\.(weight|bias)",
            PIXEL + r"encoder.layers.\1.self_attn_layer_norm.\2",
            None,
        ),
        (
            r"panoptic_head\.pixel_decoder\.encoder\.layers\.(\d+)\.norms\.1\.(weight|bias)",
            PIXEL + r"encoder.layers.\1.final_layer_norm.\2",
            None,
        ),
        (
            r"panoptic_head\.pixel_decoder\.encoder\.layers\.(\d+)\.ffns\.0\.layers\.0\.0\.(weight|bias)",
            PIXEL + r"encoder.layers.\1.fc1.\2",
            None,
        ),
        (
            r"panoptic_head\.pixel_decoder\.encoder\.layers\.(\d+)\.ffns\.0\.layers\.1\.(weight|bias)",
            PIXEL + r"encoder.layers.\1.fc2.\2",
            None,
        ),
        (r"panoptic_head\.pixel_decoder\.level_encoding\.weight", PIXEL + "level_embed", None),
        (r"panoptic_head\.pixel_decoder\.lateral_convs\.0\.conv\.weight", PIXEL + "adapter_1.0.weight", None),
        (r"panoptic_head\.pixel_decoder\.lateral_convs\.0\.gn\.(weight|bias)", PIXEL + r"adapter_1.1.\1", None),
        (r"panoptic_head\.pixel_decoder\.output_convs\.0\.conv\.weight", PIXEL + "layer_1.0.weight", None),
        (r"panoptic_head\.pixel_decoder\.output_convs\.0\.gn\.(weight|bias)", PIXEL + r"layer_1.1.\1", None),
        (r"panoptic_head\.pixel_decoder\.mask_feature\.(weight|bias)", PIXEL + r"mask_projection.\1", None),
        # The masked-attention decoder: each layer cross-attention, norm, self-attention, norm, FFN, norm.
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.attentions\.0\.attn\.(in_proj_weight|in_proj_bias)",
            DECODER + r"layers.\1.cross_attn.\2",
            None,
        ),
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.attentions\.0\.attn\.out_proj\.(weight|bias)",
            DECODER + r"layers.\1.cross_attn.out_proj.\2",
            None,
        ),
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.attentions\.1\.attn\.in_proj_(weight|bias)",
            DECODER + r"layers.\1.self_attn.{}.\2",
            thirds("q_proj", "k_proj", "v_proj"),
        ),
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.attentions\.1\.attn\.out_proj\.(weight|bias)",
            DECODER + r"layers.\1.self_attn.out_proj.\2",
            None,
        ),
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.norms\.0\.(weight|bias)",
            DECODER + r"layers.\1.cross_attn_layer_norm.\2",
            None,
        ),
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.norms\.1\.(weight|bias)",
            DECODER + r"layers.\1.self_attn_layer_norm.\2",
            None,
        ),
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.norms\.2\.(weight|bias)",
            DECODER + r"layers.\1.final_layer_norm.\2",
            None,
        ),
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.ffns\.0\.layers\.0\.0\.(weight|bias)",
            DECODER + r"layers.\1.fc1.\2",
            None,
        ),
        (
            r"panoptic_head\.transformer_decoder\.layers\.(\d+)\.ffns\.0\.layers\.1\.(weight|bias)",
            DECODER + r"layers.\1.fc2.\2",
            None,
        ),
        (r"panoptic_head\.transformer_decoder\.post_norm\.(weight|bias)", DECODER + r"layernorm.\1", None),
        (r"panoptic_head\.query_embed\.weight", "model.transformer_module.queries_embedder.weight", None),
        (r"panoptic_head\.query_feat\.weight", "model.transformer_module.queries_features.weight", None),
        (r"panoptic_head\.level_embed\.weight", "model.transformer_module.level_embed.weight", None),
        (r"panoptic_head\.cls_embed\.(weight|bias)", r"class_predictor.\1", None),
        (r"panoptic_head\.mask_embed\.(0|2|4)\.(weight|bias)", DECODER + r"mask_predictor.mask_embedder.{}.0.\2", None),
    ]


def convert_state(state: dict[str, torch.Tensor], config: Mask2FormerConfig) -> dict[str, torch.Tensor]:
    """The transformers state dict; ``ConversionError`` for a key no rule takes."""
    rules = [(re.compile(pattern), template, split) for pattern, template, split in _rules()]
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key.endswith("relative_position_index"):
            continue  # derived from the window size; transformers builds its own
        for pattern, template, split in rules:
            match = pattern.fullmatch(key)
            if match is None:
                continue
            name = match.expand(template)
            if "mask_embed" in key:
                name = name.format(int(match.group(1)) // 2)
            elif key.startswith("backbone.norm"):
                name = name.format(int(match.group(1)) + 1)
            if split is None:
                out[name] = tensor
            else:
                for part, value in split(tensor):
                    out[name.format(part) if part else name] = value
            break
        else:
            raise ConversionError(f"no rule for mmdet's {key} {tuple(tensor.shape)}")
    # The Swin model's closing norm, which the backbone's features never pass (they take the
    # per-stage norms): mmdet has none; the identity fills it.
    last = config.backbone_config.embed_dim * 2 ** (len(config.backbone_config.depths) - 1)
    out[SWIN_BODY + "layernorm.weight"] = torch.ones(last)
    out[SWIN_BODY + "layernorm.bias"] = torch.zeros(last)
    # A loss buffer mmdet does not store: the no-object class weighted as transformers' config says.
    weight = torch.ones(config.num_labels + 1)
    weight[-1] = config.no_object_weight
    out["criterion.empty_weight"] = weight
    return out


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of an mmcv checkpoint (``{"meta", "state_dict", ...}``) or a bare one."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    state = checkpoint.get("state_dict", checkpoint)
    return {key.removeprefix("module."): value for key, value in state.items()}


def convert(state: dict[str, torch.Tensor]) -> Mask2FormerForUniversalSegmentation:
    """The transformers model holding the checkpoint's every tensor, loaded strictly."""
    config = config_of(state)
    model = Mask2FormerForUniversalSegmentation(config).eval()
    converted = convert_state(state, config)
    missing, unexpected = model.load_state_dict(converted, strict=False)
    if missing or unexpected:
        raise ConversionError(f"the converted weights do not fit: missing {missing[:5]}, left over {unexpected[:5]}")
    return model


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="GenEval's mmdet .pth")
    parser.add_argument("out", type=Path, help="the directory to save the transformers model in")
    args = parser.parse_args(argv)
    try:
        model = convert(read_checkpoint(args.checkpoint))
    except ConversionError as exc:
        print(f"{args.checkpoint}: {exc}", file=sys.stderr)
        return 1
    model.save_pretrained(args.out)
    print(f"saved to {args.out}; serve it with: bash run.sh geneval --detector {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
