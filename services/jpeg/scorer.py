"""flow_grpo's (and DDPO's) JPEG rewards, weightless: the image saved as JPEG at quality 95, its
size in kB (bytes / 1000).

``jpeg_incompressibility`` is that size (flow_grpo's ``jpeg_incompressibility``);
``jpeg_compressibility`` is ``-size / 500`` (flow_grpo's ``jpeg_compressibility``, the one its
``multi_score`` names). flow_grpo saves ``Image.fromarray`` of the image's uint8 HWC RGB array:
a fresh image that carries nothing but its pixels. The scorer saves a copy of the decoded image
with its ``info`` cleared, since Pillow writes an image's own ``comment`` into the JPEG, so the
same decoded pixels give the same bytes and the same number.

No model: the encoding is per-image CPU work, done in ``prepare_images`` on the request threads
under the core's decode slots (one per core, in deadline order), each distinct image once, the
request's deadline checked before each; ``score_request`` hands the sizes back.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from PIL import Image, features

from common.configuration.config import ConfigError
from common.imaging.images import once_per_image
from common.limits.deadlines import check_deadline
from common.pipeline.scorer import ImageScorer

# flow_grpo's ``image.save(buffer, format="JPEG", quality=95)`` and ``buffer.tell() / 1000``.
QUALITY = 95
BYTES_PER_KB = 1000
# flow_grpo's ``jpeg_compressibility``: ``-rew / 500``.
COMPRESSIBILITY_DIVISOR = 500


class _ByteCount:
    """A file that keeps only how many bytes were written: Pillow writes the same bytes to it as
    to flow_grpo's ``BytesIO``, and the JPEG is never held in memory."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        return len(data)


def jpeg_kb(image: Image.Image) -> float:
    """The size in kB of ``image`` (RGB) saved as JPEG at quality 95, as flow_grpo measures it.

    Saved from a copy: ``save`` sets attributes on the image it saves, and the decoded image is
    shared with the request's other rewards; the copy's ``info`` is cleared so that no comment
    the input file carried is written (flow_grpo's ``Image.fromarray`` image has none)."""
    pixels = image.copy()
    pixels.info.clear()
    count = _ByteCount()
    pixels.save(count, format="JPEG", quality=QUALITY)
    return count.written / BYTES_PER_KB


class JpegScorer(ImageScorer):
    """The JPEG size of each image, turned into the reward by ``reward`` (each rule a subclass)."""

    batched = False  # no model call to batch: each request's images are encoded on its thread
    # The rule, as ``/info`` shows it.
    rule: ClassVar[str]

    def setup(self, device: str) -> None:
        """Nothing to load; the JPEG encoder is checked once (a Pillow built without libjpeg)."""
        if not features.check("jpg"):
            raise ConfigError(f"{self.name}: this Pillow has no JPEG encoder (libjpeg); reinstall pillow")
        jpeg_kb(Image.new("RGB", (8, 8)))

    def prepare_images(self, images: list[Image.Image], prompts: list[str], metadata: dict[str, Any]) -> list[Any]:
        def encode(distinct: list[Image.Image]) -> list[float]:
            rewards = []
            for image in distinct:
                check_deadline("encoding its images as JPEG")
                rewards.append(self.reward(jpeg_kb(image)))
            return rewards

        return once_per_image(images, encode)

    def score_request(self, items: Sequence[Any]) -> list[float]:
        return list(items)

    @staticmethod
    @abstractmethod
    def reward(kb: float) -> float:
        """The reward of an image whose JPEG is ``kb`` kB."""

    def info(self) -> dict[str, Any]:
        # The bytes libjpeg writes at a given quality are its own: its version goes with the number.
        return {"rule": self.rule, "quality": QUALITY, "libjpeg_turbo": features.version("libjpeg_turbo")}


class JpegIncompressibilityScorer(JpegScorer):
    """flow_grpo's ``jpeg_incompressibility``: the JPEG's size in kB (larger: more detail)."""

    name = "jpeg_incompressibility"
    rule = "size_kb"

    @staticmethod
    def reward(kb: float) -> float:
        return kb

    def score_bounds(self) -> tuple[float, float]:
        """From 0, with no highest short of the pixel limit's worst case: a dropped one under a
        negative weight leaves the sample no sum (NaN)."""
        return 0.0, float("inf")


class JpegCompressibilityScorer(JpegScorer):
    """flow_grpo's ``jpeg_compressibility`` (``multi_score``'s): ``-size_kb / 500``, always negative."""

    name = "jpeg_compressibility"
    rule = "-size_kb/500"

    @staticmethod
    def reward(kb: float) -> float:
        return -kb / COMPRESSIBILITY_DIVISOR

    def score_bounds(self) -> tuple[float, float]:
        """Up to 0, with no lowest short of the pixel limit's worst case: a dropped one under a
        positive weight leaves the sample no sum (NaN), never a score it did not earn."""
        return float("-inf"), 0.0
