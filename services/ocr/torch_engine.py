"""The OCR engine on torch: RapidOCR's pipeline with its two model calls run by torch.

Same PP-OCRv4 weights (read from the ``.onnx`` files of the rapidocr-onnxruntime wheel at load
time), same pre- and post-processing (``RapidOCREngine``'s own code; only ``run_detector`` and
``run_recognizer`` differ), so the same scores. On a GPU node it needs nothing beyond the torch
the node already has, whose CUDA libraries come with it: no onnxruntime-gpu build to match.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.configuration.config import ConfigError
from common.configuration.devices import require_torch_device
from services.ocr.engines import RapidOCREngine

DTYPES = ("float32", "float16", "bfloat16")


class TorchOCREngine(RapidOCREngine):
    """PP-OCRv4 det and rec as torch modules on ``device``; detection batched over equal-size
    images and recognition over equal-width lines (``RapidOCREngine``'s buckets), so no padding
    ever enters a model input and a score never depends on its batch."""

    name = "torch"

    def __init__(
        self, device: str, text_score: float, det_batch: int, rec_batch: int, threads: int | None, dtype: str
    ) -> None:
        import torch

        from services.ocr.onnx_graph import OnnxGraph

        require_torch_device(device)
        if dtype != "float32" and not device.startswith("cuda"):
            raise ConfigError(f"SCORER_OCR_TORCH_DTYPE={dtype} runs on CUDA only; use float32 on the CPU")
        if not device.startswith("cuda"):
            # One intra-op thread unless told otherwise: the request threads are the parallelism, and
            # idle OpenMP threads spin on the cores they need (on the shared 2-core machine a
            # 2-thread detector call took 2.7x as long as a 1-thread one).
            torch.set_num_threads(threads or 1)
        # RapidOCR on its CPU sessions gives the pipeline; its sessions' model files give the weights.
        self._load_pipeline(False, text_score, det_batch, rec_batch)
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.det_model = self._load(OnnxGraph(self.engine.text_det.infer.session._model_path))
        self.rec_model = self._load(OnnxGraph(self.engine.text_rec.session.session._model_path))
        in_use = next(self.det_model.parameters()).device
        if in_use.type != self.device.type:  # no silent CPU
            raise ConfigError(f"SCORER_DEVICE={device} but the OCR models ended up on {in_use}")
        self.providers = [f"torch {torch.__version__} {self._device_name()}"]

    def _load(self, graph: Any) -> Any:
        return graph.to(self.device, self.dtype).eval()

    def _device_name(self) -> str:
        import torch

        if self.device.type == "cuda":
            return f"cuda ({torch.cuda.get_device_name(self.device)}, CUDA {torch.version.cuda})"
        return "cpu"

    def _run(self, model: Any, batch: np.ndarray) -> np.ndarray:
        import torch

        tensor = torch.from_numpy(batch).to(self.device, self.dtype, non_blocking=True)
        return model(tensor).float().cpu().numpy()

    def run_detector(self, batch: np.ndarray) -> np.ndarray:
        return self._run(self.det_model, batch)

    def run_recognizer(self, batch: np.ndarray) -> np.ndarray:
        return self._run(self.rec_model, batch)

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "models": "PP-OCRv4 det/rec (rapidocr-onnxruntime wheel's weights, run by torch)",
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }
