"""OCR engines. Each runs on the request threads (``prepare``, then ``read``) and sends only
its model calls through batched stages, so per-image Python work runs in parallel.

- ``RapidOCREngine`` (default): PP-OCRv4 ONNX models shipped in the ``rapidocr-onnxruntime``
  wheel, so it works offline; the CPU default. The CUDA provider when onnxruntime-gpu is
  installed; ``TorchOCREngine`` (services/ocr/torch_engine.py) runs the same pipeline on torch,
  the GPU default.
- ``PaddleOCREngine``: PaddleOCR configured as flow_grpo does (``use_angle_cls=False``,
  ``lang="en"``), one image at a time; local model directories for offline nodes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image

from common.configuration.config import ConfigError, env_name
from common.limits.deadlines import check_deadline
from common.limits.errors import PayloadTooLarge
from common.models.ocr_rule import Line

# Recognizer input widths are rounded up to this many pixels (see ``recognition_input``).
REC_WIDTH_STEP = 32

# Wraps a model call so that concurrent request threads share its invocations
# (``Scorer.batched_stage``): (fn, stage name, max_batch) -> batched callable.
StageFactory = Callable[..., Callable[[Sequence[Any]], list[Any]]]


class OcrEngine(Protocol):
    name: str
    # Bytes an image's work holds per pixel of its input (``input_size``), from ``prepare``
    # until it is read; the scorer holds them against SCORER_MAX_WORK_BYTES before preparing.
    work_bytes_per_pixel: int

    def start(self, stage: StageFactory) -> None:
        """Wrap the engine's model calls as batched stages; called once, in ``setup``."""

    def input_size(self, width: int, height: int) -> tuple[int, int] | None:
        """The size the engine resizes an image of this size to before its first model call,
        from the size alone (None: it cannot); the scorer bounds the engine's work with it."""

    def prepare(self, image: Image.Image) -> Any:
        """Per-image work before the first model call; runs on the request thread."""

    def read(self, prepared: Sequence[Any], max_text_width: int | None = None) -> list[list[Line]]:
        """The recognized lines of each image; runs on the request thread. An image whose text
        lines are wider than ``max_text_width`` together, as the recognizer reads them, is a
        413 before the recognizer runs (an engine that cannot tell reads it whole)."""

    def info(self) -> dict[str, Any]: ...


@dataclass
class DetInput:
    """An image ready for RapidOCR's detector: the resized BGR image and its input tensor."""

    image: np.ndarray
    tensor: np.ndarray


class RapidOCREngine:
    """RapidOCR's pipeline with its two model calls batched across requests.

    Request thread: decode, resize, normalise (``prepare``); box post-processing, line crops
    and their normalisation between the calls. Batched: the detector over same-size images,
    the recognizer over the same-width lines of all waiting images.
    """

    name = "rapidocr"
    # The resized BGR image (uint8), its float32 tensor, the detector's float32 map.
    work_bytes_per_pixel = 3 + 12 + 4

    def __init__(self, device: str, text_score: float, det_batch: int, rec_batch: int, threads: int | None) -> None:
        import onnxruntime as ort

        use_cuda = device.startswith("cuda")
        if use_cuda and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ConfigError(
                "SCORER_DEVICE asks for cuda but onnxruntime has no CUDA provider; "
                "install onnxruntime-gpu instead of onnxruntime, use SCORER_OCR_ENGINE=torch, or set SCORER_DEVICE=cpu"
            )
        self._load_pipeline(use_cuda, text_score, det_batch, rec_batch)
        self._tune_for_concurrency(threads)
        self.providers = self.engine.text_det.infer.session.get_providers()
        check_providers(device, self.providers, self.engine.text_rec.session.session.get_providers())

    def _load_pipeline(self, use_cuda: bool, text_score: float, det_batch: int, rec_batch: int) -> None:
        """RapidOCR itself: its pre- and post-processing, and its ONNX sessions."""
        from rapidocr_onnxruntime import RapidOCR
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess

        self.engine = RapidOCR(
            det_use_cuda=use_cuda,
            rec_use_cuda=use_cuda,
            cls_use_cuda=use_cuda,
            rec_batch_num=rec_batch,
            text_score=text_score,
            use_cls=False,
        )
        self.det_batch, self.rec_batch = det_batch, rec_batch
        det = self.engine.text_det
        self._det_pre = DetPreProcess(det.limit_side_len, det.limit_type, det.mean, det.std)
        self._detect: Callable[[Sequence[np.ndarray]], list[np.ndarray]] = self.detect_maps
        self._recognize: Callable[[Sequence[np.ndarray]], list[Line]] = self.recognize_lines

    def _tune_for_concurrency(self, threads: int | None) -> None:
        """Rebuild RapidOCR's ONNX sessions for a server, where request threads pre- and
        post-process while the model runs: idle intra-op threads must not spin-wait on the cores
        those threads need (bench/ocr: spinning cost 10-15% of throughput on 2 cores), and
        OpenCV gets one thread per call, the request threads being the parallelism."""
        import cv2
        import onnxruntime as ort

        cv2.setNumThreads(1)
        for holder in (self.engine.text_det.infer, self.engine.text_rec.session):
            built = holder.session
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.enable_cpu_mem_arena = False
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if threads:
                options.intra_op_num_threads = threads
            providers = built.get_providers()
            provider_options = [built.get_provider_options().get(name, {}) for name in providers]
            holder.session = ort.InferenceSession(
                built._model_path, sess_options=options, providers=providers, provider_options=provider_options
            )

    def input_size(self, width: int, height: int) -> tuple[int, int] | None:
        """The (width, height) of the detector input ``prepare`` makes of an image of this size,
        computed from the size alone; None for an image RapidOCR cannot resize.

        RapidOCR's steps, in its own arithmetic: shrink the longest side to ``max_side_len``,
        enlarge the shortest to ``min_side_len``, pad a wide or low image's height (letterbox),
        then enlarge the shortest side to the detector's ``limit_side_len``; each resize rounds
        both sides to multiples of 32. The enlarging steps have no upper bound: a 200x1 strip
        becomes 6016x1504 (9 Mpx), a 1000x1 one 30016x7488 (225 Mpx).
        """
        engine, det = self.engine, self._det_pre
        if max(width, height) > engine.max_side_len:
            width, height = _rescaled(width, height, engine.max_side_len / max(width, height))
        if width and height and min(width, height) < engine.min_side_len:
            width, height = _rescaled(width, height, engine.min_side_len / min(width, height))
        if not width or not height:
            return None  # RapidOCR raises ResizeImgError
        ratio = engine.width_height_ratio
        if height <= engine.min_height or (ratio != -1 and width / height > ratio):
            height += 2 * engine._get_padding_h(height, width)
        scale = 1.0  # the detector's resize rounds to 32 even when it keeps the scale
        if det.limit_type == "max" and max(width, height) > det.limit_side_len:
            scale = det.limit_side_len / max(width, height)
        elif det.limit_type != "max" and min(width, height) < det.limit_side_len:
            scale = det.limit_side_len / min(width, height)
        width, height = _rescaled(width, height, scale)
        return (width, height) if width and height else None

    def start(self, stage: StageFactory) -> None:
        self._detect = stage(self.detect_maps, "detect", max_batch=self.det_batch)
        self._recognize = stage(self.recognize_lines, "recognize", max_batch=self.rec_batch)

    def prepare(self, image: Image.Image) -> DetInput | None:
        """RapidOCR's own steps up to the detector input; None for an image too small to read."""
        bgr = np.ascontiguousarray(np.asarray(image)[:, :, ::-1])
        resized, _, _ = self.engine.preprocess(bgr)
        resized, _ = self.engine.maybe_add_letterbox(resized, {})
        tensor = self._det_pre(resized)
        return None if tensor is None else DetInput(resized, tensor)

    def detect_maps(self, tensors: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Model call: text probability maps, one detector run per distinct input size."""
        maps: list[np.ndarray] = [np.empty(0)] * len(tensors)
        by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for index, tensor in enumerate(tensors):
            by_shape[tensor.shape].append(index)
        for indices in by_shape.values():
            out = self.run_detector(np.concatenate([tensors[i] for i in indices]))
            for row, index in enumerate(indices):
                maps[index] = out[row : row + 1]
        return maps

    def run_detector(self, batch: np.ndarray) -> np.ndarray:
        """The detector on a batch of equal-size inputs (N, 3, H, W) -> maps (N, 1, H, W)."""
        return self.engine.text_det.infer(batch)[0]

    def run_recognizer(self, batch: np.ndarray) -> np.ndarray:
        """The recognizer on a batch of equal-width lines (N, 3, 48, W) -> character probabilities."""
        return self.engine.text_rec.session(batch)[0]

    def recognition_input(self, crop: np.ndarray) -> np.ndarray:
        """A line crop resized and normalised for the recognizer, padded to a width that depends
        on the crop alone (its own width, at least the model's 320, rounded up to 32 pixels).

        RapidOCR pads every line of a batch to the batch's widest, so a line's text would depend
        on the other lines it was batched with: across requests, on other users' images. With a
        width of its own, a line reads the same in any batch, and lines of equal width batch.
        """
        _, height, min_width = self.engine.text_rec.rec_image_shape
        wanted = max(min_width, math.ceil(height * crop.shape[1] / crop.shape[0]))
        width = -(-wanted // REC_WIDTH_STEP) * REC_WIDTH_STEP
        return self.engine.text_rec.resize_norm_img(crop, width / height)

    def recognize_lines(self, inputs: Sequence[np.ndarray]) -> list[Line]:
        """Model call: (text, confidence) of each prepared line, one run per input width."""
        found: list[Line] = [("", 0.0)] * len(inputs)
        by_width: dict[int, list[int]] = defaultdict(list)
        for index, line in enumerate(inputs):
            by_width[line.shape[-1]].append(index)
        for indices in by_width.values():
            probabilities = self.run_recognizer(np.stack([inputs[i] for i in indices]))
            for index, (text, confidence, *_) in zip(indices, self.engine.text_rec.postprocess_op(probabilities)):
                found[index] = (text, float(confidence))
        return found

    def _lines(self, item: DetInput, probability_map: np.ndarray) -> list[np.ndarray]:
        """Recognizer inputs of the text lines found in one image, top to bottom."""
        det = self.engine.text_det
        shape = item.image.shape[:2]
        boxes, _ = det.postprocess_op(probability_map, shape)
        boxes = det.filter_tag_det_res(boxes, shape)
        if not len(boxes):
            return []
        crops = self.engine.get_crop_img_list(item.image, self.engine.sorted_boxes(boxes))
        return [self.recognition_input(crop) for crop in crops]

    def read(self, prepared: Sequence[DetInput | None], max_text_width: int | None = None) -> list[list[Line]]:
        readable = [item for item in prepared if item is not None]
        maps = iter(self._detect([item.tensor for item in readable]))
        lines_of = [self._lines(item, next(maps)) if item is not None else [] for item in prepared]
        if max_text_width is not None:
            _check_text_width(lines_of, max_text_width)
        check_deadline("recognizing its text")
        found = iter(self._recognize([line for lines in lines_of for line in lines]))
        threshold = self.engine.text_score
        return [[line for line in (next(found) for _ in lines) if line[1] >= threshold] for lines in lines_of]

    def info(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "models": "PP-OCRv4 det/rec (rapidocr-onnxruntime wheel)",
            "device": "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu",
            "providers": self.providers,
            "det_batch": self.det_batch,
            "rec_batch": self.rec_batch,
        }


def _check_text_width(lines_of: Sequence[Sequence[np.ndarray]], limit: int) -> None:
    """The recognizer's work on an image grows with its lines' widths: 46 lines of small text
    on a 64 KB PNG were 30 s of it. Refused whole, never read in part (a score of what was read
    would be wrong)."""
    for index, lines in enumerate(lines_of):
        width = sum(line.shape[-1] for line in lines)
        if width > limit:
            raise PayloadTooLarge(
                f"images[{index}] has {len(lines)} text lines {width} pixels wide together as the recognizer reads "
                f"them; the limit is {limit} ({env_name('ocr', 'max_text_width')})"
            )


def check_providers(device: str, *in_use: list[str]) -> None:
    """No silent CPU: ONNX Runtime falls back to its CPU provider, with only a log line, when the
    node's CUDA or cuDNN libraries do not match onnxruntime-gpu's build; a service asked for a GPU
    then refuses to start rather than serve on the CPU while saying cuda."""
    if device.startswith("cuda") and any(providers[0] != "CUDAExecutionProvider" for providers in in_use):
        raise ConfigError(
            f"SCORER_DEVICE={device} but ONNX Runtime runs on {in_use[0][0]} (providers {in_use}): the CUDA "
            "provider failed to load (CUDA 12 / cuDNN 9 libraries of onnxruntime-gpu's build missing?); use "
            "SCORER_OCR_ENGINE=torch or set SCORER_DEVICE=cpu"
        )


def _rescaled(width: int, height: int, ratio: float) -> tuple[int, int]:
    """RapidOCR's resize arithmetic: scale, truncate, round each side to a multiple of 32
    (Python's round, half to even)."""
    return int(round(int(width * ratio) / 32) * 32), int(round(int(height * ratio) / 32) * 32)


class PaddleOCREngine:
    """PaddleOCR 2.x as flow_grpo calls it, one image per call, RGB arrays as flow_grpo passes.

    ``models`` maps PaddleOCR's own arguments (``det_model_dir``, ``rec_model_dir``,
    ``cls_model_dir``, ``rec_char_dict_path``) to local paths, for nodes that cannot download;
    ``.onnx`` files run through PaddleOCR's ONNX Runtime path (``use_onnx``).
    """

    name = "paddleocr"
    # The RGB array ``prepare`` makes; PaddleOCR's own inputs, within its call, are not counted.
    work_bytes_per_pixel = 3

    def __init__(self, device: str, models: dict[str, str]) -> None:
        try:
            from paddleocr import PaddleOCR
        except ImportError as exc:
            raise ConfigError(
                "SCORER_OCR_ENGINE=paddleocr needs paddleocr and paddlepaddle installed "
                "(pip install -r requirements-ocr-paddle.txt)"
            ) from exc
        if device.startswith("cuda"):  # no silent CPU: a CPU build of paddlepaddle would run on the CPU
            import paddle

            if not paddle.device.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0:
                raise ConfigError(
                    f"SCORER_DEVICE={device} but paddlepaddle {paddle.__version__} has no CUDA GPU; install the "
                    "paddlepaddle-gpu build matching the node's CUDA, or set SCORER_DEVICE=cpu"
                )
        use_onnx = models.get("det_model_dir", "").endswith(".onnx")
        self.config = dict(use_angle_cls=False, lang="en", use_gpu=device.startswith("cuda"), use_onnx=use_onnx)
        try:
            self.engine = PaddleOCR(show_log=False, **self.config, **models)
        except Exception as exc:  # PaddleOCR downloads missing models and fails late
            raise ConfigError(
                f"PaddleOCR could not load its models ({type(exc).__name__}: {exc}); on an offline node set "
                "SCORER_OCR_PADDLE_DET_DIR, SCORER_OCR_PADDLE_REC_DIR and SCORER_OCR_PADDLE_CLS_DIR to local "
                "model directories (or .onnx files)"
            ) from exc
        self._read: Callable[[Sequence[np.ndarray]], list[list[Line]]] = self.read_images

    def start(self, stage: StageFactory) -> None:
        # PaddleOCR reads one image per call; the stage keeps all calls on one thread.
        self._read = stage(self.read_images, "read")

    def input_size(self, width: int, height: int) -> tuple[int, int]:
        """PaddleOCR's detector resize with its defaults (``det_limit_type="max"``, 960): the
        longest side shrunk to 960, both sides rounded to multiples of 32, at least 32."""
        scale = min(1.0, 960 / max(width, height))
        width, height = (max(32, int(round(int(side * scale) / 32) * 32)) for side in (width, height))
        return width, height

    def prepare(self, image: Image.Image) -> np.ndarray:
        return np.asarray(image)

    def read(self, prepared: Sequence[np.ndarray], max_text_width: int | None = None) -> list[list[Line]]:
        return self._read(prepared)  # one PaddleOCR call per image: its lines are not seen before recognition

    def read_images(self, batch: Sequence[np.ndarray]) -> list[list[Line]]:
        results = []
        for image in batch:
            found = self.engine.ocr(image, cls=False)
            page = found[0] if found else None
            results.append([(res[1][0], float(res[1][1])) for res in page] if page else [])
        return results

    def info(self) -> dict[str, Any]:
        return {"engine": self.name, "config": self.config}
