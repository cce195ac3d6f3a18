#!/usr/bin/env bash
# The PickScore bench on a GPU node: PickScore's ViT-H/14 at its real size (random weights, CLIP's
# real vocabulary), float16, the same three-way comparison as on CPU (in-process at its best
# batch size, flow_grpo's scorer behind a one-sync-worker server, this service), 64 concurrent
# one-image requests in 4 GRPO groups. One command, under 5 minutes:
#
#   PYTHON=/path/to/venv/bin/python bash bench/clip/gpu.sh [extra bench.py flags]
#
# PYTHON must have the CUDA build of torch 2.13.0 and the pickscore requirements installed
# (bash run.sh pickscore builds such a venv, .venv-clip, on a GPU node), plus
# open_clip_torch==3.3.0 installed with --no-deps for CLIP's vocabulary (tests/clip_models.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../gpu_node.sh" torch
exec timeout 290 "$PYTHON" -m bench.clip.bench --size h14 --device cuda --precision float16 \
  --requests 64 --prompts 4 --rounds 5 --batch-sizes 8,16,32,64 "$@"
