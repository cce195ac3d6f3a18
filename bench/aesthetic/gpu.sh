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
source "$(dirname "${BASH_SOURCE[0]}")/../gpu_node.sh" torch
exec timeout 290 "$PYTHON" -m bench.aesthetic.bench --size l14 --device cuda --precision float16 \
  --requests 64 --rounds 5 --batch-sizes 8,16,32,64 "$@"
