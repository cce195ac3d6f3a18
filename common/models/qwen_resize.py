"""Qwen2-VL's smart resize as ``qwen_vl_utils`` applies it before the processor (HPSv3's
inference, flow_grpo's Qwen-VL judge): the size an image is resized to, bicubic, before the
model sees it. Standard library only: the judge service has no torch."""

from __future__ import annotations

import math

# Each LLM token of Qwen2-VL and Qwen2.5-VL covers 28 x 28 pixels (14-pixel patches merged 2 x 2).
FACTOR = 28
# Qwen2-VL's smart resize refuses more extreme shapes.
MAX_RATIO = 200


def smart_resize(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width), each a multiple of 28, the aspect ratio kept as far as the rounding
    allows, their product brought within ``min_pixels``-``max_pixels`` when the rounded size is
    not. ``ValueError`` for an aspect ratio over 200, as Qwen2-VL's."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(f"aspect ratio over {MAX_RATIO}")
    h_bar = max(FACTOR, round(height / FACTOR) * FACTOR)
    w_bar = max(FACTOR, round(width / FACTOR) * FACTOR)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = math.floor(height / beta / FACTOR) * FACTOR
        w_bar = math.floor(width / beta / FACTOR) * FACTOR
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / FACTOR) * FACTOR
        w_bar = math.ceil(width * beta / FACTOR) * FACTOR
    return h_bar, w_bar
