"""OCR engines. Each splits its work in two: ``prepare`` (per image, on the request threads)
and ``recognize`` (a batch of prepared images, on the inference thread).

- ``RapidOCREngine`` (default): PP-OCRv4 ONNX models shipped in the ``rapidocr-onnxruntime``
  wheel, so it works offline; the CUDA provider when onnxruntime-gpu is installed. Detection
  runs once for all same-size images of a batch, recognition once for all text lines.
- ``PaddleOCREngine``: PaddleOCR configured as flow_grpo does (``use_angle_cls=False``,
  ``lang="en"``), one image at a time; local model directories for offline nodes.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image

from common.config import ConfigError
from services.ocr.reward import Line

log = logging.getLogger(__name__)


class OcrEngine(Protocol):
    name: str

    def prepare(self, image: Image.Image) -> Any: ...

    def recognize(self, batch: Sequence[Any]) -> list[list[Line]]: ...

    def info(self) -> dict[str, Any]: ...


@dataclass
class DetInput:
    """An image ready for RapidOCR's detector: the resized BGR image and its input tensor."""

    image: np.ndarray
    tensor: np.ndarray


class RapidOCREngine:
    name = "rapidocr"

    def __init__(self, device: str, text_score: float, rec_batch: int, threads: int | None) -> None:
        import onnxruntime as ort
        from rapidocr_onnxruntime import RapidOCR
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess

        use_cuda = device.startswith("cuda")
        if use_cuda and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ConfigError(
                "SCORER_DEVICE asks for cuda but onnxruntime has no CUDA provider; "
                "install onnxruntime-gpu (requirements-ocr-gpu.txt) or set SCORER_DEVICE=cpu"
            )
        kwargs: dict[str, Any] = dict(
            det_use_cuda=use_cuda,
            rec_use_cuda=use_cuda,
            cls_use_cuda=use_cuda,
            rec_batch_num=rec_batch,
            text_score=text_score,
            use_cls=False,
        )
        if threads:
            kwargs["intra_op_num_threads"] = threads
        self.engine = RapidOCR(**kwargs)
        det = self.engine.text_det
        self._det_pre = DetPreProcess(det.limit_side_len, det.limit_type, det.mean, det.std)
        self.providers = det.infer.session.get_providers()

    def prepare(self, image: Image.Image) -> DetInput | None:
        """RapidOCR's own steps up to the detector input; None for an image too small to read."""
        bgr = np.ascontiguousarray(np.asarray(image)[:, :, ::-1])
        resized, _, _ = self.engine.preprocess(bgr)
        resized, _ = self.engine.maybe_add_letterbox(resized, {})
        tensor = self._det_pre(resized)
        return None if tensor is None else DetInput(resized, tensor)

    def recognize(self, batch: Sequence[DetInput | None]) -> list[list[Line]]:
        det = self.engine.text_det
        crops_of: list[list[np.ndarray]] = [[] for _ in batch]
        by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for index, item in enumerate(batch):
            if item is not None:
                by_shape[item.tensor.shape].append(index)
        for indices in by_shape.values():
            maps = det.infer(np.concatenate([batch[i].tensor for i in indices]))[0]
            for row, index in enumerate(indices):
                image = batch[index].image
                boxes, _ = det.postprocess_op(maps[row : row + 1], image.shape[:2])
                boxes = det.filter_tag_det_res(boxes, image.shape[:2])
                if len(boxes):
                    crops_of[index] = self.engine.get_crop_img_list(image, self.engine.sorted_boxes(boxes))
        flat = [crop for crops in crops_of for crop in crops]
        texts = self.engine.text_rec(flat)[0] if flat else []
        results: list[list[Line]] = []
        position = 0
        for crops in crops_of:
            lines = texts[position : position + len(crops)]
            position += len(crops)
            results.append([(text, float(conf)) for text, conf, *_ in lines if float(conf) >= self.engine.text_score])
        return results

    def info(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "models": "PP-OCRv4 det/rec (rapidocr-onnxruntime wheel)",
            "providers": self.providers,
        }


class PaddleOCREngine:
    name = "paddleocr"

    def __init__(self, device: str, det_dir: str | None, rec_dir: str | None) -> None:
        try:
            from paddleocr import PaddleOCR
        except ImportError as exc:
            raise ConfigError(
                "SCORER_OCR_ENGINE=paddleocr needs paddleocr and paddlepaddle installed "
                "(pip install -r requirements-ocr-paddle.txt)"
            ) from exc
        kwargs: dict[str, Any] = dict(use_angle_cls=False, lang="en", use_gpu=device.startswith("cuda"), show_log=False)
        if det_dir:
            kwargs["det_model_dir"] = det_dir
        if rec_dir:
            kwargs["rec_model_dir"] = rec_dir
        self.engine = PaddleOCR(**kwargs)

    def prepare(self, image: Image.Image) -> np.ndarray:
        return np.asarray(image)

    def recognize(self, batch: Sequence[np.ndarray]) -> list[list[Line]]:
        results = []
        for image in batch:
            found = self.engine.ocr(image, cls=False)
            page = found[0] if found else None
            results.append([(res[1][0], float(res[1][1])) for res in page] if page else [])
        return results

    def info(self) -> dict[str, Any]:
        return {"engine": self.name, "config": "use_angle_cls=False, lang=en"}
