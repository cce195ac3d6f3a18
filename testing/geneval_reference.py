"""An independent re-statement of GenEval's evaluator (djghosh13/geneval
``evaluation/evaluate_images.py``) and of the reward server's strict rule and partial score
(yifan123/reward-server ``reward_server/gen_eval.py``), written from their description in
NumPy on mmdet-shaped detections (per class, an array of rows x1, y1, x2, y2, score). Imports
nothing from the service it checks.

The colour classifier is a callable given (classname, boxes) -> colour names, so that a test
chooses the colours; the position reason lists the relations in the order GenEval adds them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

COLOR_NAMES = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
GROUP_KEYS = ["single_object", "two_object", "counting", "colors", "position", "color_attr"]

ColorFn = Callable[[str, list[np.ndarray]], list[str]]


def keep(bbox: dict[str, np.ndarray], tag: str, options: dict[str, float]) -> dict[str, list[np.ndarray]]:
    """Per class: argsort of the scores reversed, those over the threshold, the first max_objects."""
    limit = options["counting_threshold"] if tag == "counting" else options["threshold"]
    detected: dict[str, list[np.ndarray]] = {}
    for name, rows in bbox.items():
        order = np.argsort(rows[:, 4], kind="stable")[::-1]
        order = order[rows[order, 4] > limit][: int(options["max_objects"])]
        if len(order):
            detected[name] = [rows[i] for i in order]
    return detected


def relative(box_a: np.ndarray, box_b: np.ndarray, threshold: float) -> list[str]:
    pair = np.array([box_a[:4], box_b[:4]]).reshape(2, 2, 2)  # mmdet's float32 rows
    centers = pair.mean(axis=1)
    sizes = np.abs(pair[:, 1, :] - pair[:, 0, :])
    delta = centers[0] - centers[1]
    moved = np.maximum(np.abs(delta) - threshold * sizes.sum(axis=0), 0) * np.sign(delta)
    if np.all(np.abs(moved) < 1e-3):
        return []
    dx, dy = moved / np.linalg.norm(delta)
    out = []
    for cond, name in ((dx < -0.5, "left of"), (dx > 0.5, "right of"), (dy < -0.5, "above"), (dy > 0.5, "below")):
        if cond:
            out.append(name)
    return out


def _colour_text(req: dict[str, Any], colors: list[str]) -> str:
    return (
        f"expected {req['color']} {req['class']}>={req['count']}, found {colors.count(req['color'])} "
        f"{req['color']}; and " + ", ".join(f"{colors.count(c)} {c}" for c in COLOR_NAMES if c in colors)
    )


def evaluate(objects: dict[str, list[np.ndarray]], meta: dict[str, Any], color_fn: ColorFn, threshold: float):
    """GenEval's correctness: (correct, reasons)."""
    ok, why, groups = True, [], []
    for req in meta.get("include", []):
        name, n = req["class"], req["count"]
        good = True
        found = objects.get(name, [])[:n]
        if len(found) < n:
            ok = good = False
            why.append(f"expected {name}>={n}, found {len(found)}")
        else:
            if "color" in req:
                colors = color_fn(name, found)
                if colors.count(req["color"]) < n:
                    ok = good = False
                    why.append(_colour_text(req, colors))
            if "position" in req and good:
                rel, target = req["position"]
                if groups[target] is None:
                    ok = good = False
                    why.append(f"no target for {name} to be {rel}")
                else:
                    for obj in found:
                        for other in groups[target]:
                            rels = relative(obj, other, threshold)
                            if rel not in rels:
                                ok = good = False
                                why.append(f"expected {name} {rel} target, found {' and '.join(rels)} target")
                                break
                        if not good:
                            break
        groups.append(found if good else None)
    for req in meta.get("exclude", []):
        if len(objects.get(req["class"], [])) >= req["count"]:
            ok = False
            why.append(f"expected {req['class']}<{req['count']}, found {len(objects[req['class']])}")
    return ok, why


def evaluate_reward(objects: dict[str, list[np.ndarray]], meta: dict[str, Any], color_fn: ColorFn, threshold: float):
    """The reward server's strict rule: (strict_correct, score, reasons)."""
    ok, why, terms, groups = True, [], [], []
    for req in meta.get("include", []):
        name, n = req["class"], req["count"]
        good = True
        found = objects.get(name, [])
        terms.append(1 - abs(n - len(found)) / n)
        if len(found) != n:
            ok = good = False
            why.append(f"expected {name}=={n}, found {len(found)}")
            if "color" in req or "position" in req:
                terms.append(0.0)
        else:
            if "color" in req:
                colors = color_fn(name, found)
                terms.append(1 - abs(n - colors.count(req["color"])) / n)
                if colors.count(req["color"]) != n:
                    ok = good = False
                    why.append(_colour_text(req, colors))
            if "position" in req and good:
                rel, target = req["position"]
                if groups[target] is None:
                    ok = good = False
                    why.append(f"no target for {name} to be {rel}")
                    terms.append(0.0)
                else:
                    for obj in found:
                        for other in groups[target]:
                            rels = relative(obj, other, threshold)
                            if rel not in rels:
                                ok = good = False
                                why.append(f"expected {name} {rel} target, found {' and '.join(rels)} target")
                                terms.append(0.0)
                                break
                        if not good:
                            break
                    terms.append(1.0)
        groups.append(found if good else None)
    return ok, (sum(terms) / len(terms) if terms else 0), why


def compute(samples: list[tuple[dict[str, np.ndarray], dict[str, Any]]], only_strict: bool, color_fn: ColorFn,
            options: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """The reward server's answer for (detections, metadata) samples: its five lists."""
    scores, rewards, strict, groups, strict_groups = [], [], [], defaultdict(list), defaultdict(list)
    for bbox, meta in samples:
        objects = keep(bbox, meta["tag"], options)
        strict_ok, score, _ = evaluate_reward(objects, meta, color_fn, options["position_threshold"])
        ok = False if only_strict else evaluate(objects, meta, color_fn, options["position_threshold"])[0]
        scores.append(score)
        rewards.append(1.0 if ok else 0.0)
        strict.append(1.0 if strict_ok else 0.0)
        for key in GROUP_KEYS:
            groups[key].append((1.0 if ok else 0.0) if key == meta["tag"] else -10.0)
            strict_groups[key].append((1.0 if strict_ok else 0.0) if key == meta["tag"] else -10.0)
    return {
        "scores": scores,
        "rewards": rewards,
        "strict_rewards": strict,
        "group_rewards": dict(groups),
        "group_strict_rewards": dict(strict_groups),
    }


def mmdet_test_input(rgb: np.ndarray, img_scale: tuple[int, int], swap: bool = False) -> tuple[np.ndarray, tuple]:
    """mmdet 2.x's test pipeline on an image file's pixels, as mmcv runs it: the BGR image
    (``imread``; ``swap``: handed RGB, as the reward server does) rescaled with cv2's bilinear
    to fit ``img_scale`` (long, short) with its edges rounded, padded with 128 to a multiple of
    32 (mmdet 2.28's config pads before it normalises), normalised to RGB. Returns (C, H, W)
    float32 and the resized (height, width)."""
    import cv2

    bgr = rgb if swap else rgb[..., ::-1]
    height, width = bgr.shape[:2]
    factor = min(max(img_scale) / max(height, width), min(img_scale) / min(height, width))
    size = (int(width * factor + 0.5), int(height * factor + 0.5))
    resized = cv2.resize(np.ascontiguousarray(bgr), size, interpolation=cv2.INTER_LINEAR)
    pad_h, pad_w = -(-resized.shape[0] // 32) * 32, -(-resized.shape[1] // 32) * 32
    padded = np.full((pad_h, pad_w, 3), 128, np.uint8)
    padded[: resized.shape[0], : resized.shape[1]] = resized
    img = padded[..., ::-1].astype(np.float32)  # to_rgb
    img = (img - np.array([123.675, 116.28, 103.53], np.float32)) / np.array([58.395, 57.12, 57.375], np.float32)
    return img.transpose(2, 0, 1), resized.shape[:2]


def mmdet_instances(cls_logits: Any, mask_logits: Any, img_shape: tuple, ori_shape: tuple, max_per_image: int = 100):
    """``Mask2FormerHead.simple_test`` and ``MaskFormerFusionHead.instance_postprocess`` of one
    image (torch tensors (Q, C + 1) and (Q, h, w) of the last decoder layer): rows of
    (label, x1, y1, x2, y2, score), in top-k's order."""
    import torch
    import torch.nn.functional as F

    batch_input_shape = (-(-img_shape[0] // 32) * 32, -(-img_shape[1] // 32) * 32)
    masks = F.interpolate(mask_logits[None], size=batch_input_shape, mode="bilinear", align_corners=False)[0]
    masks = masks[:, : img_shape[0], : img_shape[1]]
    masks = F.interpolate(masks[:, None], size=ori_shape, mode="bilinear", align_corners=False)[:, 0]
    num_classes = cls_logits.shape[-1] - 1
    scores = F.softmax(cls_logits, dim=-1)[:, :-1]
    labels = torch.arange(num_classes).unsqueeze(0).repeat(cls_logits.shape[0], 1).flatten(0, 1)
    top_scores, top = scores.flatten(0, 1).topk(max_per_image, sorted=False)
    labels = labels[top]
    chosen = masks[top // num_classes]
    binary = (chosen > 0).float()
    mask_scores = (chosen.sigmoid() * binary).flatten(1).sum(1) / (binary.flatten(1).sum(1) + 1e-6)
    det = top_scores * mask_scores
    rows = []
    for i in range(len(labels)):
        ys, xs = np.nonzero(binary[i].numpy())
        box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] if len(xs) else [0, 0, 0, 0]
        rows.append((int(labels[i]), *map(float, box), float(det[i])))
    return rows
