"""OCR scorer: does the image show the text the prompt asked for (docs/ARCHITECTURE.md §7)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from PIL import Image, ImageDraw, ImageFont

from common.configuration.config import describe, env_name, from_env
from common.configuration.settings import CoreSettings
from common.imaging.images import once_each, once_per_image, shown_size
from common.imaging.media import MEAN, MediaRequest, VideoRule
from common.limits.budget import hold_work
from common.limits.deadlines import check_deadline
from common.limits.errors import PayloadTooLarge, Unprocessable
from common.models.ocr_rule import RuleOptions, check_targets, reward
from common.pipeline.scorer import ImageScorer
from services.ocr.engines import OcrEngine, PaddleOCREngine, RapidOCREngine
from services.ocr.settings import OcrSettings

# flow_grpo's ``video_ocr`` reward (``OcrScorer_video_or_image``): every 4th frame, each scored
# by the plain edit distance (no substring shortcut), the video's score the mean of its frames
# scoring above 0 (0 when none does).
VIDEO_OCR = VideoRule("video_ocr", frame_interval=4, positive_only=True)


@dataclass
class OcrItem:
    prepared: Any
    targets: list[str] | None
    options: RuleOptions
    # False under flow_grpo's video rule: the plain edit distance, a target found inside the text no exception.
    substring: bool = True


class OCRScorer(ImageScorer):
    name = "ocr"
    max_wait_ms = 10.0
    video_rules: ClassVar[dict[str, VideoRule]] = {MEAN.name: MEAN, VIDEO_OCR.name: VIDEO_OCR}

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

    def check_images(self, images: Sequence[Image.Image], request: MediaRequest) -> None:
        """The prompts' targets, and the engine's input of each image from its header: what the
        engine reads, not what was sent, counts (a 72-byte 50x1 PNG is a 2944x736 detector
        input). Its pixels, each reference counted, are bounded as the request's decoded pixels
        are (413 past ``SCORER_MAX_REQUEST_PIXELS``); the work of each distinct image, which
        is prepared and read once (``once_per_image``), is held."""
        options = self.options.override(request.metadata.get("ocr"))
        for index, prompt in zip(request.sample_positions, request.prompts):
            self._targets(prompt, options, index)
        sizes = once_each(images, request.names, self._check_input_size)
        total, limit = 0, self.core.max_request_pixels
        for (width, height), name in zip(sizes, request.names):
            total += width * height
            if total > limit:
                raise PayloadTooLarge(
                    f"the request's images as the OCR engine reads them ({name} at {width}x{height}) have over "
                    f"{limit} pixels together; the limit is {limit} ({env_name('', 'max_request_pixels')})"
                )
        distinct = {id(image): size for image, size in zip(images, sizes)}.values()
        hold_work(sum(width * height for width, height in distinct) * self.engine.work_bytes_per_pixel, "OCR inputs")

    def prepare_images(self, images: list[Image.Image], prompts: list[str], metadata: dict[str, Any]) -> list[OcrItem]:
        """Each distinct image prepared once, its references sharing it (and its reading)."""
        options = self.options.override(metadata.get("ocr"))
        substring = metadata.get("video_rule") != VIDEO_OCR.name
        targets: dict[str, list[str] | None] = {}  # a video's prompt, once for all its frames
        for prompt in prompts:
            if prompt not in targets:
                targets[prompt] = check_targets(prompt, options, len(targets))
        prepared = once_per_image(images, self._prepare)
        return [OcrItem(ready, targets[prompt], options, substring) for ready, prompt in zip(prepared, prompts)]

    def _prepare(self, images: list[Image.Image]) -> list[Any]:
        assert self.engine is not None, "setup() has not run"
        prepared = []
        for image in images:
            check_deadline("preparing its images")
            prepared.append(self.engine.prepare(image))
        return prepared

    def _targets(self, prompt: str, options: RuleOptions, index: int) -> list[str] | None:
        wanted = check_targets(prompt, options, index)
        limit = self.settings.max_targets
        if wanted is not None and len(wanted) > limit:
            raise PayloadTooLarge(
                f"prompts[{index}] has {len(wanted)} quoted targets; the limit is {limit} "
                f"({env_name('ocr', 'max_targets')})"
            )
        return wanted

    def _check_input_size(self, image: Image.Image, name: str) -> tuple[int, int]:
        """Bound the engine's work on one image before any pixel work: engines enlarge thin
        images, and RapidOCR turns a 70-byte 200x1 PNG into a 9 Mpx detector input. Returns
        the input's (width, height)."""
        width, height = shown_size(image)
        size = self.engine.input_size(width, height)
        if size is None:
            raise Unprocessable(f"{name} is {width}x{height}, too thin for the OCR engine to resize")
        limit = self.settings.max_input_pixels
        if size[0] * size[1] > limit:
            raise PayloadTooLarge(
                f"{name} is {width}x{height}, which the OCR engine would read at {size[0]}x{size[1]} = "
                f"{size[0] * size[1]} pixels; the limit is {limit} ({env_name('ocr', 'max_input_pixels')})"
            )
        return size

    def score_request(self, items: Sequence[OcrItem]) -> list[float]:
        """The engine batches its model calls stage by stage across requests (see ``OcrEngine``)."""
        lines = once_per_image(
            [item.prepared for item in items], lambda prepared: self.engine.read(prepared, self.settings.max_text_width)
        )
        check_deadline("the reward rule")
        return [reward(item.targets, found, item.options, item.substring) for item, found in zip(items, lines)]

    def score_bounds(self) -> tuple[float, float]:
        """Each target's score is 1 - its capped edit distance over its length; a sample's their mean."""
        return 0.0, 1.0

    def info(self) -> dict[str, Any]:
        return {
            **(self.engine.info() if self.engine else {"engine": self.settings.engine}),
            "settings": describe(self.settings),
        }
