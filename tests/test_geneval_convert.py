"""The converter on an mmdet 2.x Mask2Former state dict built here from mmdet's own key names
and shapes (``SwinTransformer``, ``MSDeformAttnPixelDecoder``, ``Mask2FormerHead``, as
mmdet 2.x's source names them) at tiny widths: it loads strictly into transformers' model,
every tensor used, the split and reordered ones where they belong."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.geneval.convert import ConversionError, convert, main, swin_merge_order
from services.geneval.detector import Detector

# Integration tier: importing transformers' model stack (torch._dynamo, sympy) costs the quick
# loop about 8 s of CPU on its own.
pytestmark = pytest.mark.integration

EMBED, DEPTHS, HEADS, WINDOW = 12, (1, 1, 2, 1), (1, 1, 2, 2), 7
FEAT, FFN, QUERIES, CLASSES, ENCODER_LAYERS, DECODER_LAYERS, ATTENTION_HEADS = 32, 64, 20, 80, 1, 2, 2
LEVELS, POINTS = 3, 4


def mmdet_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under mmdet 2.x's names, with its shapes."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}

    def add(name: str, *shape: int) -> None:
        state[name] = torch.randn(*shape, generator=generator)

    # SwinTransformer: PatchEmbed, SwinBlockSequence (SwinBlock: norm1, attn.w_msa (WindowMSA), norm2,
    # ffn (FFN)), PatchMerging (norm, reduction without bias), an output norm per out_index.
    add("backbone.patch_embed.projection.weight", EMBED, 3, 4, 4)
    add("backbone.patch_embed.projection.bias", EMBED)
    add("backbone.patch_embed.norm.weight", EMBED)
    add("backbone.patch_embed.norm.bias", EMBED)
    channels = [EMBED * 2**i for i in range(len(DEPTHS))]
    for stage, (depth, heads, dim) in enumerate(zip(DEPTHS, HEADS, channels)):
        for block in range(depth):
            prefix = f"backbone.stages.{stage}.blocks.{block}."
            for norm in ("norm1", "norm2"):
                add(prefix + norm + ".weight", dim)
                add(prefix + norm + ".bias", dim)
            add(prefix + "attn.w_msa.relative_position_bias_table", (2 * WINDOW - 1) ** 2, heads)
            state[prefix + "attn.w_msa.relative_position_index"] = torch.zeros(WINDOW**2, WINDOW**2, dtype=torch.long)
            add(prefix + "attn.w_msa.qkv.weight", 3 * dim, dim)
            add(prefix + "attn.w_msa.qkv.bias", 3 * dim)
            add(prefix + "attn.w_msa.proj.weight", dim, dim)
            add(prefix + "attn.w_msa.proj.bias", dim)
            add(prefix + "ffn.layers.0.0.weight", 4 * dim, dim)
            add(prefix + "ffn.layers.0.0.bias", 4 * dim)
            add(prefix + "ffn.layers.1.weight", dim, 4 * dim)
            add(prefix + "ffn.layers.1.bias", dim)
        if stage < len(DEPTHS) - 1:
            add(f"backbone.stages.{stage}.downsample.norm.weight", 4 * dim)
            add(f"backbone.stages.{stage}.downsample.norm.bias", 4 * dim)
            add(f"backbone.stages.{stage}.downsample.reduction.weight", 2 * dim, 4 * dim)
        add(f"backbone.norm{stage}.weight", dim)
        add(f"backbone.norm{stage}.bias", dim)
    # MSDeformAttnPixelDecoder: input_convs (ConvModule with bias and GN) from the top level down,
    # the encoder's BaseTransformerLayers (MultiScaleDeformableAttention, FFN, 2 norms),
    # level_encoding, one lateral and output ConvModule (GN, no bias), mask_feature.
    pixel = "panoptic_head.pixel_decoder."
    for index, level in enumerate(range(3, 0, -1)):
        add(f"{pixel}input_convs.{index}.conv.weight", FEAT, channels[level], 1, 1)
        add(f"{pixel}input_convs.{index}.conv.bias", FEAT)
        add(f"{pixel}input_convs.{index}.gn.weight", FEAT)
        add(f"{pixel}input_convs.{index}.gn.bias", FEAT)
    for layer in range(ENCODER_LAYERS):
        prefix = f"{pixel}encoder.layers.{layer}."
        add(prefix + "attentions.0.sampling_offsets.weight", ATTENTION_HEADS * LEVELS * POINTS * 2, FEAT)
        add(prefix + "attentions.0.sampling_offsets.bias", ATTENTION_HEADS * LEVELS * POINTS * 2)
        add(prefix + "attentions.0.attention_weights.weight", ATTENTION_HEADS * LEVELS * POINTS, FEAT)
        add(prefix + "attentions.0.attention_weights.bias", ATTENTION_HEADS * LEVELS * POINTS)
        for projection in ("value_proj", "output_proj"):
            add(prefix + f"attentions.0.{projection}.weight", FEAT, FEAT)
            add(prefix + f"attentions.0.{projection}.bias", FEAT)
        add(prefix + "ffns.0.layers.0.0.weight", FFN, FEAT)
        add(prefix + "ffns.0.layers.0.0.bias", FFN)
        add(prefix + "ffns.0.layers.1.weight", FEAT, FFN)
        add(prefix + "ffns.0.layers.1.bias", FEAT)
        for norm in range(2):
            add(prefix + f"norms.{norm}.weight", FEAT)
            add(prefix + f"norms.{norm}.bias", FEAT)
    add(pixel + "level_encoding.weight", LEVELS, FEAT)
    add(pixel + "lateral_convs.0.conv.weight", FEAT, channels[0], 1, 1)
    add(pixel + "output_convs.0.conv.weight", FEAT, FEAT, 3, 3)
    for conv in ("lateral_convs", "output_convs"):
        add(pixel + f"{conv}.0.gn.weight", FEAT)
        add(pixel + f"{conv}.0.gn.bias", FEAT)
    add(pixel + "mask_feature.weight", FEAT, FEAT, 1, 1)
    add(pixel + "mask_feature.bias", FEAT)
    # Mask2FormerHead: the DetrTransformerDecoder's layers (cross-attention, self-attention as
    # nn.MultiheadAttention, FFN, 3 norms) and post_norm, the queries, level_embed, cls_embed, mask_embed.
    head = "panoptic_head."
    for layer in range(DECODER_LAYERS):
        prefix = f"{head}transformer_decoder.layers.{layer}."
        for attention in range(2):
            add(prefix + f"attentions.{attention}.attn.in_proj_weight", 3 * FEAT, FEAT)
            add(prefix + f"attentions.{attention}.attn.in_proj_bias", 3 * FEAT)
            add(prefix + f"attentions.{attention}.attn.out_proj.weight", FEAT, FEAT)
            add(prefix + f"attentions.{attention}.attn.out_proj.bias", FEAT)
        add(prefix + "ffns.0.layers.0.0.weight", FFN, FEAT)
        add(prefix + "ffns.0.layers.0.0.bias", FFN)
        add(prefix + "ffns.0.layers.1.weight", FEAT, FFN)
        add(prefix + "ffns.0.layers.1.bias", FEAT)
        for norm in range(3):
            add(prefix + f"norms.{norm}.weight", FEAT)
            add(prefix + f"norms.{norm}.bias", FEAT)
    add(head + "transformer_decoder.post_norm.weight", FEAT)
    add(head + "transformer_decoder.post_norm.bias", FEAT)
    add(head + "query_embed.weight", QUERIES, FEAT)
    add(head + "query_feat.weight", QUERIES, FEAT)
    add(head + "level_embed.weight", LEVELS, FEAT)
    add(head + "cls_embed.weight", CLASSES + 1, FEAT)
    add(head + "cls_embed.bias", CLASSES + 1)
    for index in (0, 2, 4):
        add(head + f"mask_embed.{index}.weight", FEAT, FEAT)
        add(head + f"mask_embed.{index}.bias", FEAT)
    return state


def test_an_mmdet_state_dict_loads_strictly_with_every_tensor_used() -> None:
    state = mmdet_state()
    model = convert(state)
    converted = model.state_dict()
    config = model.config
    assert (config.num_queries, config.decoder_layers, config.encoder_layers) == (QUERIES, DECODER_LAYERS + 1, 1)
    assert list(config.backbone_config.depths) == list(DEPTHS) and config.num_labels == CLASSES
    used = sum(t.numel() for k, t in state.items() if not k.endswith("relative_position_index"))
    filled = (
        "criterion.empty_weight",
        "model.pixel_level_module.encoder.swin.layernorm.weight",
        "model.pixel_level_module.encoder.swin.layernorm.bias",
    )
    held = sum(t.numel() for k, t in converted.items() if k not in filled)
    assert used == held
    swin = "model.pixel_level_module.encoder.swin.encoder.layers.2.blocks.1.attention."
    qkv = state["backbone.stages.2.blocks.1.attn.w_msa.qkv.weight"]
    assert torch.equal(torch.cat([converted[swin + f"{p}_proj.weight"] for p in "qkv"]), qkv)
    decoder = "model.transformer_module.decoder.layers.1."
    cross = state["panoptic_head.transformer_decoder.layers.1.attentions.0.attn.in_proj_weight"]
    assert torch.equal(converted[decoder + "cross_attn.in_proj_weight"], cross)
    assert torch.equal(converted["class_predictor.weight"], state["panoptic_head.cls_embed.weight"])
    assert torch.equal(
        converted["model.transformer_module.decoder.mask_predictor.mask_embedder.2.0.weight"],
        state["panoptic_head.mask_embed.4.weight"],
    )


def test_the_filled_swin_norm_is_never_used() -> None:
    model = convert(mmdet_state())
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(pixel_values=pixels).class_queries_logits
        model.model.pixel_level_module.encoder.swin.layernorm.weight.mul_(7)
        after = model(pixel_values=pixels).class_queries_logits
    assert torch.equal(before, after)


def test_the_patch_merging_order_is_swins() -> None:
    """mmdet's unfold lays a 2 x 2 patch's channels out channel by channel, (0,0) (0,1) (1,0)
    (1,1) (row, column); Swin's concatenates the patches (0,0), (1,0), (0,1), (1,1)."""
    channels = 3
    unfold = torch.tensor([[c * 10 + row * 2 + column for c in range(channels) for row in (0, 1) for column in (0, 1)]])
    swin = torch.tensor(
        [[c * 10 + row * 2 + column for row, column in ((0, 0), (1, 0), (0, 1), (1, 1)) for c in range(channels)]]
    )
    assert torch.equal(swin_merge_order(unfold.float()), swin.float())
    assert torch.equal(swin_merge_order(unfold[0].float()), swin[0].float())


def test_an_unknown_key_is_refused() -> None:
    state = mmdet_state()
    state["panoptic_head.extra.weight"] = torch.zeros(1)
    with pytest.raises(ConversionError, match=r"panoptic_head\.extra\.weight"):
        convert(state)


def test_the_command_saves_a_model_the_service_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = tmp_path / "mask2former.pth"
    torch.save({"meta": {}, "state_dict": mmdet_state()}, checkpoint)
    assert main([str(checkpoint), str(tmp_path / "out")]) == 0, capsys.readouterr().err
    detector = Detector(str(tmp_path / "out"), "cpu", torch.float32, 96, 128, 100, bgr=False)
    assert detector.num_classes == CLASSES
