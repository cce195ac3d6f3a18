"""mmdet 2.x's own Mask2Former, GenEval's config at tiny widths, for the comparison in
tests/test_geneval_mmdet.py. Runs in the reference environment that ``bash run.sh
reference-mmdet`` builds (Python 3.11, torch 2.1, mmcv-full 1.7, mmdet 2.28), never in the
service's: it imports only mmdet's stack.

    .venv-mmdet/bin/python testing/mmdet_reference.py OUT IMAGE.npy...

builds GenEval's ``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco`` (mmdet's own config file) with
the tiny widths of testing/geneval_models.py and random weights, pushed as that module pushes
them; saves it as an mmdet checkpoint (OUT/checkpoint.pth) and runs mmdet's
``inference_detector`` on each RGB image (handed as BGR, as GenEval's evaluator reads files),
writing OUT/detections.npz: per image ``labels``, ``boxes`` (x1 y1 x2 y2), ``scores``, ``masks``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mmdet
import numpy as np
import torch
from mmcv import Config
from mmdet.apis import inference_detector, init_detector

CONFIG = "mask2former/mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py"
# The test scale of the tiny detector (SCORER_GENEVAL_MAX_SIZE, SCORER_GENEVAL_MIN_SIZE).
SCALE = (128, 96)
# testing/geneval_models.py's tiny widths and pushes, restated for mmdet's modules.
EMBED, DEPTHS, HEADS = 12, [1, 1, 2, 1], [1, 1, 2, 2]
HIDDEN, FEEDFORWARD, ATTENTION_HEADS, QUERIES = 32, 64, 2, 20
CLASS_SCALE, MASK_SCALE, BOOSTS = 30.0, 6.0, {16: 6.0, 15: 5.0, 41: 5.0}


def tiny_config() -> Config:
    cfg = Config.fromfile(str(Path(mmdet.__file__).parent / ".mim" / "configs" / CONFIG))
    backbone = cfg.model.backbone
    backbone.update(embed_dims=EMBED, depths=DEPTHS, num_heads=HEADS, init_cfg=None, drop_path_rate=0.0)
    head = cfg.model.panoptic_head
    head.update(in_channels=[EMBED * 2**i for i in range(4)], feat_channels=HIDDEN, out_channels=HIDDEN)
    head.num_queries = QUERIES
    head.positional_encoding.num_feats = HIDDEN // 2
    pixel = head.pixel_decoder
    pixel.positional_encoding.num_feats = HIDDEN // 2
    pixel.encoder.num_layers = 1
    layer = pixel.encoder.transformerlayers
    layer.attn_cfgs.update(embed_dims=HIDDEN, num_heads=ATTENTION_HEADS)
    layer.ffn_cfgs.update(embed_dims=HIDDEN, feedforward_channels=FEEDFORWARD)
    decoder = head.transformer_decoder
    decoder.num_layers = 1
    layer = decoder.transformerlayers
    layer.attn_cfgs.update(embed_dims=HIDDEN, num_heads=ATTENTION_HEADS)
    layer.ffn_cfgs.update(embed_dims=HIDDEN, feedforward_channels=FEEDFORWARD)
    layer.feedforward_channels = FEEDFORWARD
    cfg.data.test.pipeline[1].img_scale = SCALE
    return cfg


def build(cfg: Config, checkpoint: Path) -> torch.nn.Module:
    torch.manual_seed(0)
    model = init_detector(cfg, checkpoint=None, device="cpu")
    model.init_weights()
    head = model.panoptic_head
    with torch.no_grad():
        head.cls_embed.weight.mul_(CLASS_SCALE)
        for name, parameter in head.mask_embed.named_parameters():
            if name.endswith("weight"):
                parameter.mul_(MASK_SCALE)
        head.pixel_decoder.mask_feature.bias.zero_()
        for label, boost in BOOSTS.items():
            head.cls_embed.bias[label] += boost
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    return model.eval()


def detections(result: object) -> dict[str, np.ndarray]:
    boxes_by_class, masks_by_class = result if isinstance(result, tuple) else result["ins_results"]
    labels = np.concatenate([np.full(len(b), label) for label, b in enumerate(boxes_by_class)]).astype(np.int64)
    boxes = np.concatenate(boxes_by_class).astype(np.float32)
    masks = [m for per_class in masks_by_class for m in per_class]
    return {"labels": labels, "boxes": boxes[:, :4], "scores": boxes[:, 4], "masks": np.stack(masks).astype(bool)}


def main(out: Path, images: list[Path]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config()
    model = build(cfg, out / "checkpoint.pth")
    arrays: dict[str, np.ndarray] = {}
    for index, path in enumerate(images):
        bgr = np.ascontiguousarray(np.load(path)[..., ::-1])
        with torch.no_grad():
            (result,) = inference_detector(model, [bgr])
        for key, value in detections(result).items():
            arrays[f"{index}_{key}"] = value
    np.savez_compressed(out / "detections.npz", **arrays)
    print(f"mmdet {mmdet.__version__}: {len(images)} images, checkpoint {out / 'checkpoint.pth'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
