"""The PaddleOCR engine, served for real: PaddleOCR 2.x configured as flow_grpo does, in its own
virtual environment (``run.sh test`` builds it and sets ``SCORER_TEST_PADDLE_PYTHON``).

PaddleOCR cannot download its models here, so it runs the PP-OCRv4 models of RapidOCR's wheel
through its own ONNX path (``use_onnx``), given as local model files — the offline-node setup.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import rapidocr_onnxruntime
import requests

from common.sdk.client import ScorerClient
from testing.images import blank, ocr_prompts, quoted, render_text
from testing.server import gunicorn_server

PYTHON = os.environ.get("SCORER_TEST_PADDLE_PYTHON")
MODELS = Path(rapidocr_onnxruntime.__file__).parent / "models"

pytestmark = pytest.mark.skipif(not PYTHON, reason="PaddleOCR environment not built (run via 'bash run.sh test')")


def paddle_env(python: str) -> dict[str, str]:
    site = Path(python).parent.parent  # the venv (not resolved: bin/python links outside it)
    (keys,) = site.glob("lib/python*/site-packages/paddleocr/ppocr/utils/ppocr_keys_v1.txt")
    return {
        "SCORER_OCR_ENGINE": "paddleocr",
        "SCORER_OCR_PADDLE_DET_DIR": str(MODELS / "ch_PP-OCRv4_det_infer.onnx"),
        "SCORER_OCR_PADDLE_REC_DIR": str(MODELS / "ch_PP-OCRv4_rec_infer.onnx"),
        "SCORER_OCR_PADDLE_CLS_DIR": str(MODELS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"),
        "SCORER_OCR_PADDLE_REC_DICT": str(keys),
    }


def test_paddleocr_engine_scores_like_flow_grpo(tmp_path) -> None:
    prompts = ocr_prompts(6)
    with gunicorn_server("ocr", paddle_env(PYTHON), log_dir=tmp_path, python=PYTHON) as server:
        info = requests.get(server.url + "/info", timeout=10).json()
        assert info["model"]["engine"] == "paddleocr"
        assert info["model"]["config"]["use_angle_cls"] is False and info["model"]["config"]["lang"] == "en"
        client = ScorerClient(server.url)
        right = client.scores([render_text(quoted(p)) for p in prompts], prompts)
        wrong = client.scores(
            [render_text(quoted(prompts[(i + 1) % 6])) for i in range(6)] + [blank()], [*prompts, prompts[0]]
        )
    assert all(score >= 0.9 for score in right), right
    assert all(score < 0.5 for score in wrong), wrong


def test_paddleocr_without_models_is_not_ready_with_a_clear_reason(tmp_path) -> None:
    env = {"SCORER_OCR_ENGINE": "paddleocr", "SCORER_OCR_PADDLE_DET_DIR": str(tmp_path / "missing.onnx")}
    with gunicorn_server("ocr", env, log_dir=tmp_path, python=PYTHON, require_ready=False) as server:
        ready = server.settled_ready(tries=240, pause=0.5)
        assert ready.status_code == 503
        assert "SCORER_OCR_PADDLE_DET_DIR" in ready.json()["reason"]


def test_paddleocr_asked_for_a_gpu_on_a_cpu_build_refuses_to_start(tmp_path) -> None:
    """paddlepaddle's CPU build would serve on the CPU while the service says cuda."""
    env = {**paddle_env(PYTHON), "SCORER_DEVICE": "cuda"}
    with gunicorn_server("ocr", env, log_dir=tmp_path, python=PYTHON, require_ready=False) as server:
        ready = server.settled_ready(tries=240, pause=0.5)
        assert ready.status_code == 503
        assert "has no CUDA GPU" in ready.json()["reason"]
        body = pickle.dumps({"images": [render_text("Open")], "prompts": ['a sign that says "Open"']})
        refused = requests.post(server.url + "/", data=body, timeout=30)
        assert refused.status_code == 503 and "has no CUDA GPU" in pickle.loads(refused.content)["error"]
