#!/usr/bin/env bash
# The OCR bench on a GPU node: RapidOCR's PP-OCRv4 models on ONNX Runtime's CUDA provider, the
# same three-way comparison as on CPU (in-process at its best batch size, the one-sync-worker
# simple server, this service), 64 concurrent one-image requests, the service's detection
# batch swept. One command, under 5 minutes:
#
#   PYTHON=/path/to/venv/bin/python bash bench/ocr/gpu.sh
#
# PYTHON needs requirements-ocr.txt with onnxruntime-gpu instead of onnxruntime, and
# rapidocr-onnxruntime (--no-deps): `bash run.sh ocr` builds such a venv, .venv-ocr, on a GPU node.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../gpu_node.sh" onnxruntime
for det_batch in 1 16; do
  timeout 140 "$PYTHON" -m bench.ocr.run --device cuda --det-batch "$det_batch" --rounds 2 \
    --batches 1,8,16,32 --out "bench/results/ocr-gpu-det$det_batch.json"
done
