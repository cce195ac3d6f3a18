"""The simplest OCR reward server a user would write (deepgen_rl's style), for comparison:
Flask, one sync gunicorn worker, plain ``pickle.loads`` on the body, the engine called per
request, flow_grpo's rule. Not for production: ``pickle.loads`` on a network body runs code.

    gunicorn -w 1 -k sync -b 127.0.0.1:PORT bench.ocr.simple_server:app
"""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import onnxruntime as ort
from flask import Flask, request
from PIL import Image
from rapidfuzz.distance import Levenshtein
from rapidocr_onnxruntime import RapidOCR

app = Flask(__name__)
_gpu_visible = bool(os.environ.get("CUDA_VISIBLE_DEVICES"))
if os.environ.get("OCR_ENGINE") == "torch":  # the same torch models as the service, one image per call
    from services.ocr.torch_engine import TorchOCREngine

    _engine = TorchOCREngine(
        "cuda" if _gpu_visible else "cpu", 0.5, 1, 64, None, os.environ.get("OCR_DTYPE", "float32")
    )

    def ocr(image: np.ndarray) -> tuple[list, None]:
        rgb = Image.fromarray(np.ascontiguousarray(image[:, :, ::-1]))
        return [(None, text, confidence) for text, confidence in _engine.read([_engine.prepare(rgb)])[0]], None

else:  # RapidOCR as is; the CUDA provider where onnxruntime-gpu is installed and a GPU is visible
    _cuda = _gpu_visible and "CUDAExecutionProvider" in ort.get_available_providers()
    ocr = RapidOCR(use_cls=False, det_use_cuda=_cuda, rec_use_cuda=_cuda)


@app.post("/")
def score():
    payload = pickle.loads(request.get_data())
    scores = []
    for data, prompt in zip(payload["images"], payload["prompts"]):
        target = prompt.split('"')[1].replace(" ", "").lower()
        image = np.array(Image.open(io.BytesIO(data)).convert("RGB"))[:, :, ::-1]
        result, _ = ocr(image)
        text = "".join(line[1] for line in result or [] if line[2] > 0).replace(" ", "").lower()
        dist = 0 if target in text else min(Levenshtein.distance(text, target), len(target))
        scores.append(1 - dist / len(target))
    return pickle.dumps({"scores": scores})
