"""LAION aesthetic score: CLIP image embedding, L2-normalised, through the LAION MLP head.

The score is the head's raw output (about 1 to 10), as flow_grpo and deepgen_rl return it;
``scale``/``offset`` map it linearly when a trainer wants another range. CLIP's own
preprocessing (resize, centre crop, normalise) runs in ``decode`` on the request threads, so
the inference thread only stacks ready tensors and runs the model, in micro-batches.
"""

from __future__ import annotations

import logging
import math
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from huggingface_hub import try_to_load_from_cache
from PIL import Image
from torch import nn
from transformers import AutoImageProcessor, CLIPModel

from common.config import ConfigError, env_name, from_env
from common.errors import Unprocessable
from common.images import decode_image, parse_image_request
from common.scorer import Scorer
from common.settings import CoreSettings

log = logging.getLogger(__name__)

SECTION = "aesthetic"
HEAD_FILE = "laion-aesthetic-sac-logos-ava1-l14-linearMSE.pth"
# The sibling ``shared/`` of the checkout (repo root is two levels above this package).
DEFAULT_HEAD = Path(__file__).resolve().parents[2].parent / "shared" / "models" / HEAD_FILE
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


@dataclass(frozen=True)
class AestheticSettings:
    """``SCORER_AESTHETIC_<FIELD>``; ``run.sh aesthetic --clip`` / ``--head`` set the first two."""

    # A local directory (``save_pretrained`` layout) or a hub id.
    clip: str = "openai/clip-vit-large-patch14"
    # The released ``sac+logos+ava1-l14-linearMSE.pth`` state dict.
    head: str = str(DEFAULT_HEAD)
    # Used on GPU only; the CPU always runs float32.
    precision: Literal["float16", "bfloat16", "float32"] = "float16"
    # Images per forward pass: bounds GPU memory whatever the batch size.
    micro_batch: int = 32
    # score = raw * scale + offset; the defaults give the raw score.
    scale: float = 1.0
    offset: float = 0.0


class AestheticHead(nn.Module):
    """The LAION MLP: same layers and state-dict keys (``layers.0/2/4/6/7``) as the release."""

    def __init__(self, dim: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(dim, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.layers(embeddings)


def _looks_like_path(value: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else must be a local directory."""
    return value.startswith(("/", ".", "~")) or value.count("/") > 1 or "\\" in value


def image_features(model: CLIPModel, pixels: torch.Tensor) -> torch.Tensor:
    """``get_image_features``: a tensor before transformers 5, the output's ``pooler_output`` since."""
    out = model.get_image_features(pixel_values=pixels)
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class AestheticScorer(Scorer):
    name = "aesthetic"
    max_batch = 64
    max_wait_ms = 5.0

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = from_env(AestheticSettings, SECTION)
        if self.settings.micro_batch < 1:
            raise ConfigError(f"{env_name(SECTION, 'micro_batch')} must be at least 1")
        if not self.settings.clip.strip():
            raise ConfigError(f"{env_name(SECTION, 'clip')} is empty; give a CLIP directory or hub id")
        self.device = "cpu"
        self.dtype = torch.float32
        self.model: CLIPModel | None = None
        self.processor: Any = None
        self.head: AestheticHead | None = None

    def preflight(self) -> str | None:
        """Weights missing here; a hub id not in the local cache counts as missing, since
        ``run.sh`` with no argument must not depend on a download."""
        return self._missing_head() or self._missing_clip(allow_download=False)

    def setup(self, device: str) -> None:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"{env_name('', 'device')}={device} but torch {torch.__version__} sees no CUDA GPU")
        problem = self._missing_head() or self._missing_clip(allow_download=True)
        if problem:
            raise ConfigError(problem)
        self.device = device
        self.dtype = DTYPES[self.settings.precision] if device.startswith("cuda") else torch.float32
        self.model, self.processor = self._load_clip()
        self.head = self._load_head(self.model.config.projection_dim)
        warm = self.settings.micro_batch if device.startswith("cuda") else 1
        self.score(self._preprocess([Image.new("RGB", (256, 256), (128, 128, 128))] * warm))
        log.info("aesthetic: CLIP %s + head %s on %s (%s)", self.settings.clip, self.settings.head, device, self.dtype)

    def _missing_head(self) -> str | None:
        path = Path(self.settings.head).expanduser()
        if path.is_file():
            return None
        return (
            f"aesthetic head not found: {env_name(SECTION, 'head')}={str(path)!r} (run.sh --head); it is the "
            f"released sac+logos+ava1-l14-linearMSE.pth, by default ../shared/models/{HEAD_FILE}"
        )

    def _missing_clip(self, allow_download: bool) -> str | None:
        """Why the CLIP weights can't be loaded, checked on disk and in the hub cache only."""
        source = self.settings.clip
        setting = env_name(SECTION, "clip")
        hint = (
            f"Set {setting} (run.sh --clip) to a directory holding the CLIP config, weights and "
            "preprocessor_config.json (`hf download openai/clip-vit-large-patch14 --local-dir DIR` on a "
            "machine with internet), or to a hub id this node can download."
        )
        local = Path(source).expanduser()
        if local.is_dir():
            if (local / "config.json").is_file() and any((local / name).is_file() for name in WEIGHT_FILES):
                return None
            return f"CLIP weights not found: {setting}={source!r} has no config.json and model weights. {hint}"
        if _looks_like_path(source):
            return f"CLIP weights not found: {setting}={source!r} is not a directory. {hint}"
        if allow_download:
            return None
        try:
            cached = any(isinstance(try_to_load_from_cache(source, name), str) for name in WEIGHT_FILES)
        except ValueError as exc:  # not a valid hub id
            return f"{setting}={source!r}: {exc}. {hint}"
        if cached:
            return None
        return (
            f"CLIP weights not found: {setting}={source!r} is not in the local hub cache. {hint} "
            "(`bash run.sh aesthetic` downloads a hub id at start where the hub can be reached.)"
        )

    def _load_clip(self) -> tuple[CLIPModel, Any]:
        """Load CLIP and its processor from a directory, the hub cache, or the hub."""
        source = self.settings.clip
        local = Path(source).expanduser()
        try:
            if local.is_dir():
                return self._from_pretrained(str(local), local_files_only=True)
            try:  # the hub cache first: no network round trips when the weights are there
                return self._from_pretrained(source, local_files_only=True)
            except OSError:
                return self._from_pretrained(source, local_files_only=False)
        except OSError as exc:
            raise ConfigError(
                f"CLIP weights could not be loaded from {env_name(SECTION, 'clip')}={source!r} (run.sh --clip): {exc}"
            ) from None

    def _from_pretrained(self, source: str, local_files_only: bool) -> tuple[CLIPModel, Any]:
        model = CLIPModel.from_pretrained(source, dtype=self.dtype, local_files_only=local_files_only)
        processor = AutoImageProcessor.from_pretrained(source, local_files_only=local_files_only)
        return model.to(self.device).eval(), processor

    def _load_head(self, dim: int) -> AestheticHead:
        path = Path(self.settings.head).expanduser()
        setting = env_name(SECTION, "head")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            head = AestheticHead(dim)
            head.load_state_dict(state)
        except (
            RuntimeError,
            pickle.UnpicklingError,
            EOFError,
            TypeError,
            AttributeError,
        ) as exc:
            # not a state dict, refused by the safe unpickler, wrong keys or shapes
            raise ConfigError(
                f"{setting}={str(path)!r} is not a LAION aesthetic head for {dim}-d CLIP embeddings "
                f"(ViT-L/14): {type(exc).__name__}: {exc}"
            ) from None
        return head.to(self.device).eval()

    def _preprocess(self, images: list[Image.Image]) -> list[torch.Tensor]:
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"]
        return list(pixels.to(self.dtype).unbind(0))

    def _check_resize(self, image: Image.Image, index: int) -> None:
        """CLIP resizes the shortest edge up to its input size; a 1 x 16M image would grow to
        billions of pixels, so refuse shapes whose resized size passes the pixel limit."""
        shortest = (getattr(self.processor, "size", None) or {}).get("shortest_edge")
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

    def decode(self, payload: dict[str, Any]) -> list[torch.Tensor]:
        request = parse_image_request(payload, self.core)
        images = [decode_image(data, self.core.max_pixels, i) for i, data in enumerate(request.images)]
        for index, image in enumerate(images):
            self._check_resize(image, index)
        return self._preprocess(images) if images else []

    @torch.inference_mode()
    def score(self, batch: Sequence[torch.Tensor]) -> list[float]:
        assert self.model is not None and self.head is not None, "setup() has not run"
        step = self.settings.micro_batch
        scores: list[float] = []
        for start in range(0, len(batch), step):
            pixels = torch.stack(list(batch[start : start + step])).to(self.device, non_blocking=True)
            # The head runs in float32 on the normalised embedding, whatever CLIP's precision.
            embeddings = image_features(self.model, pixels).float()
            embeddings = embeddings / embeddings.norm(dim=-1, keepdim=True)
            raw = self.head(embeddings).squeeze(-1)
            scores.extend((raw * self.settings.scale + self.settings.offset).tolist())
        return scores

    def info(self) -> dict[str, Any]:
        return {
            "clip": self.settings.clip,
            "head": self.settings.head,
            "dtype": str(self.dtype).removeprefix("torch."),
            "micro_batch": self.settings.micro_batch,
            "scale": self.settings.scale,
            "offset": self.settings.offset,
        }
