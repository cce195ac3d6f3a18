"""OCR scorer: does the image show the text the prompt asked for (docs/ARCHITECTURE.md §7)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image, ImageDraw, ImageFont

from common.batching import check_deadline, hold_work
from common.config import describe, env_name, from_env
from common.errors import PayloadTooLarge, Unprocessable
from common.images import check_image_sizes, load_image, open_images, parse_image_request, shown_size
from common.scorer import Scorer
from common.settings import CoreSettings
from services.ocr.engines import OcrEngine, PaddleOCREngine, RapidOCREngine
from services.ocr.reward import RuleOptions, check_targets, reward


@dataclass(frozen=True)
class OcrSettings(RuleOptions):
    """``SCORER_OCR_*``: the engine, and the server-wide matching options."""

    # auto: torch on a GPU, rapidocr (ONNX Runtime) on the CPU.
    engine: Literal["auto", "rapidocr", "torch", "paddleocr"] = "auto"
    # The torch engine's precision on CUDA (float32 everywhere else).
    torch_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    # Lines the engine reports below this confidence are dropped (RapidOCR's and PaddleOCR's 0.5).
    text_score: float = 0.5
    # Images per detector call and text lines per recognizer call, gathered across requests.
    # Detection defaults to 16 on a GPU and 1 on a CPU, where bench/ocr measured a batched
    # call slower per image than single ones.
    det_batch: int | None = None
    rec_batch: int = 64
    onnx_threads: int | None = None
    # Pixels of the detector's input after the engine's own resizing, computed from the image
    # header before any resizing (413). Every image within SCORER_MAX_PIXELS and
    # SCORER_MAX_ASPECT_RATIO stays under it: RapidOCR's largest such input, of an 8:1 image,
    # is 5888x736 = 4.3 Mpx.
    max_input_pixels: int = 6_000_000
    # Recognizer work per image: the widths of its detected text lines as the recognizer reads
    # them (48 pixels high), summed, checked before the recognizer runs (413). A render of a
    # flow_grpo OCR prompt (all 1,017) is one line of at most 768; a 64 KB PNG of 46 lines of small text
    # was 128,000 (30 s of recognizer work on a loaded 2-core CPU).
    max_text_width: int = 65_536
    # Quoted targets per prompt (with ``target="all"``), each matched against every run of
    # recognized words with ``ngram_candidates`` (413): 2,730 of them cost 2.9 s per sample.
    max_targets: int = 16
    # PaddleOCR model locations for offline nodes (directories, or .onnx files).
    paddle_det_dir: str | None = None
    paddle_rec_dir: str | None = None
    paddle_cls_dir: str | None = None
    paddle_rec_dict: str | None = None

    def rule(self) -> RuleOptions:
        return RuleOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RuleOptions)})


@dataclass
class OcrItem:
    prepared: Any
    targets: list[str] | None
    options: RuleOptions


class OCRScorer(Scorer):
    name = "ocr"
    max_wait_ms = 10.0

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = from_env(OcrSettings, "ocr")
        self.options = self.settings.rule()
        self.engine: OcrEngine | None = None

    def setup(self, device: str) -> None:
        s = self.settings
        engine = s.engine if s.engine != "auto" else ("torch" if device.startswith("cuda") else "rapidocr")
        det_batch = s.det_batch or (16 if device.startswith("cuda") else 1)
        if engine == "paddleocr":
            paths = {
                "det_model_dir": s.paddle_det_dir,
                "rec_model_dir": s.paddle_rec_dir,
                "cls_model_dir": s.paddle_cls_dir,
                "rec_char_dict_path": s.paddle_rec_dict,
            }
            self.engine = PaddleOCREngine(device, {key: path for key, path in paths.items() if path})
        elif engine == "torch":
            from services.ocr.torch_engine import TorchOCREngine

            self.engine = TorchOCREngine(device, s.text_score, det_batch, s.rec_batch, s.onnx_threads, s.torch_dtype)
        else:
            self.engine = RapidOCREngine(device, s.text_score, det_batch, s.rec_batch, s.onnx_threads)
        self.engine.start(self.batched_stage)
        self._warm_up()

    def _warm_up(self) -> None:
        """One real pass, so the first request does not pay for lazy initialisation."""
        image = Image.new("RGB", (512, 512), "white")
        ImageDraw.Draw(image).text((40, 230), "warm up", fill="black", font=ImageFont.load_default(size=48))
        self.engine.read([self.engine.prepare(image)], self.settings.max_text_width)

    def prepare(self, payload: dict[str, Any]) -> list[OcrItem]:
        request = parse_image_request(payload, self.core)
        options = self.options.override(request.metadata.get("ocr"))
        wanted = [self._targets(prompt, options, i) for i, prompt in enumerate(request.prompts)]
        images = open_images(request.images, self.core)
        check_image_sizes(images, self.core)
        sizes = [self._check_input_size(image, index) for index, image in enumerate(images)]
        hold_work(sum(width * height for width, height in sizes) * self.engine.work_bytes_per_pixel, "OCR inputs")
        items = []
        for index, (image, targets) in enumerate(zip(images, wanted)):
            check_deadline("decoding its images")
            items.append(OcrItem(self.engine.prepare(load_image(image, index)), targets, options))
        return items

    def _targets(self, prompt: str, options: RuleOptions, index: int) -> list[str] | None:
        wanted = check_targets(prompt, options, index)
        limit = self.settings.max_targets
        if wanted is not None and len(wanted) > limit:
            raise PayloadTooLarge(
                f"prompts[{index}] has {len(wanted)} quoted targets; the limit is {limit} "
                f"({env_name('ocr', 'max_targets')})"
            )
        return wanted

    def _check_input_size(self, image: Image.Image, index: int) -> tuple[int, int]:
        """Bound the engine's work on one image before any pixel work: engines enlarge thin
        images, and RapidOCR turns a 70-byte 200x1 PNG into a 9 Mpx detector input. Returns
        the input's (width, height)."""
        width, height = shown_size(image)
        size = self.engine.input_size(width, height)
        if size is None:
            raise Unprocessable(f"images[{index}] is {width}x{height}, too thin for the OCR engine to resize")
        limit = self.settings.max_input_pixels
        if size[0] * size[1] > limit:
            raise PayloadTooLarge(
                f"images[{index}] is {width}x{height}, which the OCR engine would read at {size[0]}x{size[1]} = "
                f"{size[0] * size[1]} pixels; the limit is {limit} ({env_name('ocr', 'max_input_pixels')})"
            )
        return size

    def score_request(self, items: Sequence[OcrItem]) -> list[float]:
        """The engine batches its model calls stage by stage across requests (see ``OcrEngine``)."""
        lines = self.engine.read([item.prepared for item in items], self.settings.max_text_width)
        check_deadline("the reward rule")
        return [reward(item.targets, found, item.options) for item, found in zip(items, lines)]

    def info(self) -> dict[str, Any]:
        return {
            **(self.engine.info() if self.engine else {"engine": self.settings.engine}),
            "settings": describe(self.settings),
        }
