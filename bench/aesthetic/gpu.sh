#!/usr/bin/env bash
# The aesthetic bench on a GPU node: a ViT-L/14-sized CLIP (random weights), float16, the same
# three-way comparison as on CPU (in-process at its best batch size, the one-sync-worker simple
# server, this service), 64 concurrent one-image requests. One command, under 5 minutes:
#
#   PYTHON=/path/to/venv/bin/python bash bench/aesthetic/gpu.sh [extra bench.py flags]
#
# PYTHON must have the CUDA build of torch 2.13.0 and requirements-clip.txt installed
# (bash run.sh aesthetic builds such a venv, .venv-clip, on a GPU node).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else f"torch {torch.__version__}: no CUDA GPU")'
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
exec timeout 290 "$PYTHON" -m bench.aesthetic.bench --size l14 --device cuda --precision float16 \
  --requests 64 --rounds 5 --batch-sizes 8,16,32,64 "$@"
