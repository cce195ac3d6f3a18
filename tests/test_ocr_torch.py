"""The torch OCR engine against the ONNX Runtime one, in-process, on the real PP-OCRv4 weights:
the same lines and the same scores on rendered flow_grpo prompts, on the CPU (a GPU node runs the
same comparison in float16/bfloat16 through ``bench/gpu/check.sh``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.configuration.config import ConfigError
from common.models.ocr_rule import RuleOptions, reward
from services.ocr.engines import RapidOCREngine, check_providers
from services.ocr.torch_engine import TorchOCREngine
from testing.images import decoded, ocr_prompts, quoted, render_text

PROMPTS = ocr_prompts(24)


@pytest.fixture(scope="module")
def engines() -> tuple[RapidOCREngine, TorchOCREngine]:
    onnx = RapidOCREngine("cpu", text_score=0.5, det_batch=8, rec_batch=64, threads=None)
    return onnx, TorchOCREngine("cpu", 0.5, det_batch=8, rec_batch=64, threads=1, dtype="float32")


@pytest.mark.unit
@pytest.mark.unit
def test_model_outputs_match_onnxruntime(engines: tuple[RapidOCREngine, TorchOCREngine]) -> None:
    onnx, torch_engine = engines
    rng = np.random.default_rng(0)
    images = rng.standard_normal((2, 3, 256, 320)).astype(np.float32)
    lines = rng.standard_normal((3, 3, 48, 352)).astype(np.float32)
    assert np.abs(onnx.run_detector(images) - torch_engine.run_detector(images)).max() < 1e-4
    assert np.abs(onnx.run_recognizer(lines) - torch_engine.run_recognizer(lines)).max() < 1e-4


def test_same_lines_and_scores_on_flow_grpo_prompts(engines: tuple[RapidOCREngine, TorchOCREngine]) -> None:
    onnx, torch_engine = engines
    images = [decoded(render_text(quoted(prompt))) for prompt in PROMPTS]
    read_onnx = onnx.read([onnx.prepare(image) for image in images])
    read_torch = torch_engine.read([torch_engine.prepare(image) for image in images])
    assert [[text for text, _ in lines] for lines in read_torch] == [[text for text, _ in lines] for lines in read_onnx]
    for lines_torch, lines_onnx in zip(read_torch, read_onnx):
        assert [conf for _, conf in lines_torch] == pytest.approx([conf for _, conf in lines_onnx], abs=1e-5)
    options = RuleOptions()
    scores_onnx = [reward([quoted(p)], lines, options) for p, lines in zip(PROMPTS, read_onnx)]
    scores_torch = [reward([quoted(p)], lines, options) for p, lines in zip(PROMPTS, read_torch)]
    assert scores_torch == scores_onnx
    assert sum(scores_onnx) > len(PROMPTS) / 2  # the images are readable: a comparison of real text


@pytest.mark.unit
@pytest.mark.unit
def test_a_gpu_asked_for_and_not_there_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("this node has a GPU")
    with pytest.raises(ConfigError, match="sees no CUDA GPU"):
        TorchOCREngine("cuda", 0.5, det_batch=8, rec_batch=64, threads=None, dtype="float32")
    with pytest.raises(ConfigError, match="CUDA only"):
        TorchOCREngine("cpu", 0.5, det_batch=8, rec_batch=64, threads=None, dtype="float16")


@pytest.mark.unit
@pytest.mark.unit
def test_onnxruntime_fallen_back_to_cpu_is_refused(engines: tuple[RapidOCREngine, TorchOCREngine]) -> None:
    """onnxruntime-gpu whose CUDA libraries fail to load builds a CPU-only session, silently."""
    onnx, _ = engines
    in_use = onnx.engine.text_det.infer.session.get_providers()
    assert in_use[0] == "CPUExecutionProvider"
    check_providers("cpu", in_use)
    with pytest.raises(ConfigError, match="failed to load"):
        check_providers("cuda", in_use)
