"""LAION aesthetic score as a service: settings, request validation, and the model's errors
turned into messages that name the setting to fix.

The score is the head's raw output (about 1 to 10), as flow_grpo and deepgen_rl return it;
``scale``/``offset`` map it linearly when a trainer wants another range. CLIP's own
preprocessing runs in ``decode`` on the request threads, so the inference thread only stacks
ready tensors and runs the model, in micro-batches.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from PIL import Image

from common.config import ConfigError, env_name, from_env
from common.devices import require_torch_device
from common.errors import Unprocessable
from common.images import decode_images, parse_image_request
from common.scorer import Scorer
from common.settings import CoreSettings
from services.clip.weights import missing_weights

if TYPE_CHECKING:
    from services.aesthetic.model import AestheticModel

log = logging.getLogger(__name__)

SECTION = "aesthetic"
HEAD_FILE = "laion-aesthetic-sac-logos-ava1-l14-linearMSE.pth"
# Shipped with the service, as flow_grpo ships it (weights/README.md: origin, licence, checksum).
WEIGHTS = Path(__file__).resolve().parent / "weights"
DEFAULT_HEAD = WEIGHTS / HEAD_FILE
GPU_MICRO_BATCH, CPU_MICRO_BATCH = 32, 8


@dataclass(frozen=True)
class AestheticSettings:
    """``SCORER_AESTHETIC_<FIELD>``; ``run.sh aesthetic --clip`` / ``--head`` set the first two."""

    # A local directory (``save_pretrained`` layout) or a hub id.
    clip: str = "openai/clip-vit-large-patch14"
    # The released ``sac+logos+ava1-l14-linearMSE.pth`` state dict.
    head: str = str(DEFAULT_HEAD)
    # Used on GPU only; the CPU always runs float32.
    precision: Literal["float16", "bfloat16", "float32"] = "float16"
    # Images per forward pass: bounds GPU memory whatever the batch size. Unset: 32 on GPU, 8 on
    # CPU, where larger batches run slower (measured with ViT-B/16, bench/aesthetic/README.md).
    micro_batch: int | None = None
    # score = raw * scale + offset; the defaults give the raw score.
    scale: float = 1.0
    offset: float = 0.0


CLIP_HINT = (
    "Set {setting} (run.sh --clip) to a directory holding the CLIP config, weights and "
    "preprocessor_config.json (`hf download openai/clip-vit-large-patch14 --local-dir DIR` on a "
    "machine with internet), or to a hub id this node can download."
)


class AestheticScorer(Scorer):
    name = "aesthetic"
    max_batch = 64
    max_wait_ms = 5.0

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = from_env(AestheticSettings, SECTION)
        if self.settings.micro_batch is not None and self.settings.micro_batch < 1:
            raise ConfigError(f"{env_name(SECTION, 'micro_batch')} must be at least 1")
        if not self.settings.clip.strip():
            raise ConfigError(f"{env_name(SECTION, 'clip')} is empty; give a CLIP directory or hub id")
        self.model: AestheticModel | None = None

    def preflight(self) -> str | None:
        """Weights missing here; a hub id not in the local cache counts as missing, since
        ``run.sh`` with no argument must not depend on a download."""
        return self._missing_head() or self._missing_clip(allow_download=False)

    def setup(self, device: str) -> None:
        problem = self._missing_head() or self._missing_clip(allow_download=True)
        if problem:
            raise ConfigError(problem)
        from services.aesthetic.model import AestheticModel, HeadError  # not at module level: see model.py

        require_torch_device(device)
        settings = self.settings
        micro_batch = settings.micro_batch or (GPU_MICRO_BATCH if device.startswith("cuda") else CPU_MICRO_BATCH)
        try:
            model = AestheticModel(settings.clip, settings.head, device, settings.precision, micro_batch)
        except OSError as exc:
            setting = env_name(SECTION, "clip")
            raise ConfigError(
                f"CLIP weights could not be loaded from {setting}={settings.clip!r}: {exc} "
                + CLIP_HINT.format(setting=setting)
            ) from None
        except HeadError as exc:
            raise ConfigError(
                f"{env_name(SECTION, 'head')}={settings.head!r} is not a LAION aesthetic head for this CLIP's "
                f"embeddings (768-d, ViT-L/14): {exc}"
            ) from None
        warm = micro_batch if device.startswith("cuda") else 1
        model.raw_scores(model.preprocess([Image.new("RGB", (256, 256), (128, 128, 128))] * warm))
        self.model = model
        log.info("aesthetic: CLIP %s, head %s, on %s in %s", settings.clip, settings.head, device, model.dtype)

    def _missing_head(self) -> str | None:
        path = Path(self.settings.head).expanduser()
        if not path.is_file():
            return (
                f"aesthetic head not found: {env_name(SECTION, 'head')}={str(path)!r} (run.sh --head); it is the "
                f"released sac+logos+ava1-l14-linearMSE.pth, shipped as {DEFAULT_HEAD}"
            )
        if path.resolve() == DEFAULT_HEAD and not _shipped_head_intact():
            return f"the shipped aesthetic head {DEFAULT_HEAD} does not match {WEIGHTS / 'SHA256SUMS'}: restore it"
        return None

    def _missing_clip(self, allow_download: bool) -> str | None:
        setting = env_name(SECTION, "clip")
        hint = CLIP_HINT.format(setting=setting)
        return missing_weights(self.settings.clip, setting, hint, allow_download, what="CLIP weights")

    def _check_resize(self, image: Image.Image, index: int) -> None:
        """CLIP resizes the shortest edge up to its input size: a 1 x 300,000 PNG would grow to
        billions of pixels, so refuse shapes whose resized size passes the pixel limit."""
        assert self.model is not None
        shortest = self.model.shortest_edge
        width, height = image.size
        if not shortest:
            return
        longest = math.ceil(max(width, height) * shortest / max(1, min(width, height)))
        if shortest * longest > self.core.max_pixels:
            raise Unprocessable(
                f"images[{index}] is {width}x{height}: resized to a shortest edge of {shortest} it would "
                f"have {shortest * longest} pixels, over the limit of {self.core.max_pixels}; "
                "the aspect ratio is too extreme"
            )

    def decode(self, payload: dict[str, Any]) -> list[Any]:
        assert self.model is not None, "setup() has not run"
        request = parse_image_request(payload, self.core)
        images = decode_images(request.images, self.core)
        for index, image in enumerate(images):
            self._check_resize(image, index)
        return self.model.preprocess(images) if images else []

    def score(self, batch: Sequence[Any]) -> list[float]:
        assert self.model is not None, "setup() has not run"
        scale, offset = self.settings.scale, self.settings.offset
        return [raw * scale + offset for raw in self.model.raw_scores(batch)]

    def info(self) -> dict[str, Any]:
        return {
            "clip": self.settings.clip,
            "head": self.settings.head,
            # Where the weights actually are, not the setting.
            "device": str(next(self.model.clip.parameters()).device) if self.model else None,
            "precision": str(self.model.dtype).removeprefix("torch.") if self.model else None,
            "micro_batch": self.model.micro_batch if self.model else self.settings.micro_batch,
            "scale": self.settings.scale,
            "offset": self.settings.offset,
        }


def _shipped_head_intact() -> bool:
    """Whether the shipped head's SHA-256 is the one recorded beside it (3.7 MB: milliseconds)."""
    expected = (WEIGHTS / "SHA256SUMS").read_text().split()[0]
    return hashlib.sha256(DEFAULT_HEAD.read_bytes()).hexdigest() == expected
