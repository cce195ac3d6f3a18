"""A synthetic scorer whose model call costs what a GPU's does: a fixed latency per call plus a
small cost per item, with the GIL released meanwhile (a kernel launch and its wait), e.g.
20 ms + 0.2 ms per item. The score of an image is a checksum of its bytes, so every answer can be
checked against the in-process one.

Served by the real stack (gunicorn, ``common.server.app``, the dynamic batcher) with
``gunicorn -c gunicorn.conf.py 'bench.batching.synthetic:app()'``; its cost comes from
``SCORER_SYNTHETIC_FIXED_MS`` and ``SCORER_SYNTHETIC_PER_ITEM_MS``.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.configuration.config import from_env
from common.configuration.settings import CoreSettings
from common.imaging.media import MEAN, parse_media_request
from common.pipeline.scorer import Scorer


@dataclass(frozen=True)
class SyntheticSettings:
    """``SCORER_SYNTHETIC_*``: the cost of one model call."""

    fixed_ms: float = 20.0
    per_item_ms: float = 0.2


def image_score(data: bytes) -> float:
    return zlib.crc32(data) / 0xFFFFFFFF


def model_call(batch: Sequence[bytes], settings: SyntheticSettings) -> list[float]:
    """The stand-in for a GPU forward pass: sleeps (GIL released) for its cost."""
    time.sleep((settings.fixed_ms + settings.per_item_ms * len(batch)) / 1000)
    return [image_score(data) for data in batch]


class SyntheticScorer(Scorer):
    name = "synthetic"
    max_batch = 256
    uses_gpu = False

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = from_env(SyntheticSettings, "synthetic")

    def setup(self, device: str) -> None:
        pass

    def prepare(self, payload: dict[str, Any]) -> list[bytes]:
        return parse_media_request(payload, self.core, {MEAN.name: MEAN}).images

    def score(self, batch: Sequence[bytes]) -> list[float]:
        return model_call(batch, self.settings)

    def info(self) -> dict[str, Any]:
        return {"fixed_ms": self.settings.fixed_ms, "per_item_ms": self.settings.per_item_ms}


def app() -> Any:
    from common.server.app import create_app

    return create_app(SyntheticScorer(from_env(CoreSettings)))
