"""HPSv3's image size is Qwen2-VL's smart resize with min = max = 256 tokens: the service's own
arithmetic (``services/hpsv3/inputs.py``) against the rule as transformers publishes it, on every
shape up to 300 pixels a side and on large random ones, the refusals of extreme shapes included.
So is the judge's ``qwenvl`` size (``qwen_vl_utils``' bounds, ``common/models/qwen_resize.py``) where
``qwen_vl_utils`` and transformers agree: from 15 pixels a side (a shorter side rounds to 0,
which ``qwen_vl_utils`` raises to 28 before its bounds, transformers after)."""

from __future__ import annotations

import random

import pytest
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as published

from common.models import qwen_resize
from services.hpsv3.inputs import smart_resize
from services.judge.scorer import QWENVL_PIXELS

# Integration tier: importing transformers' model stack (torch._dynamo, sympy) costs the quick
# loop about 8 s of CPU on its own.
pytestmark = pytest.mark.integration

PIXELS = 256 * 28 * 28


def resized(rule, height: int, width: int) -> tuple[int, int] | str:
    try:
        return tuple(rule(height, width))
    except ValueError:
        return "refused"


def test_the_service_resizes_as_qwen2_vl_publishes() -> None:
    rng = random.Random(0)
    shapes = [(h, w) for h in range(1, 301) for w in range(1, 301)]
    shapes += [(rng.randint(1, 8000), rng.randint(1, 8000)) for _ in range(20_000)]
    shapes += [(1, 200), (1, 201), (5600, 28), (5601, 28)]  # the aspect ratio's limit, either side
    differ = [
        (h, w)
        for h, w in shapes
        if resized(smart_resize, h, w)
        != resized(lambda a, b: published(a, b, factor=28, min_pixels=PIXELS, max_pixels=PIXELS), h, w)
    ]
    assert not differ, differ[:10]
    assert resized(smart_resize, 1, 201) == "refused" and resized(smart_resize, 512, 512) == (448, 448)


def test_the_qwenvl_judge_resizes_as_qwen2_vl_publishes_from_15_pixels_a_side() -> None:
    rng = random.Random(1)
    shapes = [(h, w) for h in range(15, 301) for w in range(15, 301)]
    shapes += [(rng.randint(15, 40_000), rng.randint(15, 40_000)) for _ in range(20_000)]
    shapes += [(15, 3000), (15, 3001), (4000, 4000)]  # the aspect ratio's limit; past 16,384 tokens
    low, high = QWENVL_PIXELS

    def ours(h: int, w: int) -> tuple[int, int]:
        return qwen_resize.smart_resize(h, w, low, high)

    def theirs(h: int, w: int) -> tuple[int, int]:
        return published(h, w, factor=28, min_pixels=low, max_pixels=high)

    differ = [(h, w) for h, w in shapes if resized(ours, h, w) != resized(theirs, h, w)]
    assert not differ, differ[:10]
    assert resized(ours, 4000, 4000) == (3584, 3584) and resized(ours, 1, 1) == (56, 56)
    assert resized(ours, 15, 3001) == "refused"
