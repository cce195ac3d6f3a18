"""HPSv3's image size is Qwen2-VL's smart resize with min = max = 256 tokens: the service's own
arithmetic (``services/hpsv3/inputs.py``) against the rule as transformers publishes it, on every
shape up to 300 pixels a side and on large random ones, the refusals of extreme shapes included."""

from __future__ import annotations

import random

import pytest
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as published

from services.hpsv3.inputs import smart_resize

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
