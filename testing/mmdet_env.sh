#!/usr/bin/env bash
# Builds .venv-mmdet: mmdet 2.x's own Mask2Former, which tests/test_geneval_mmdet.py compares the
# GenEval detector with. Slow and large: PyPI has mmcv-full 1.7 only as source, built here CPU-only
# with its ops (MMCV_WITH_OPS=1, MAX_JOBS=2, under nice); torch 2.1.2 (mmcv-full 1.7 wants torch
# <= 2.1) is PyPI's CUDA build, about 5 GB with its libraries. Needs Python 3.8 to 3.11 (PYTHON).
#
#   bash run.sh reference-mmdet
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case ${1:-} in
  "") ;;
  -h|--help) sed -n '2,/^set /{/^#/p}' "$0"; exit 0 ;;
  *) echo "[mmdet_env.sh] takes no arguments (bash run.sh reference-mmdet --help)" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
VENV=.venv-mmdet
"$PYTHON" -c 'import sys; sys.exit(not (3, 8) <= sys.version_info[:2] <= (3, 11))' ||
  { echo "[mmdet_env.sh] $PYTHON is not Python 3.8 to 3.11 (torch 2.1 has no wheels for it): set PYTHON" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -r requirements-reference-mmdet.txt
MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-2} nice -n 19 \
  "$VENV/bin/python" -m pip install -q --no-build-isolation mmcv-full==1.7.2
"$VENV/bin/python" -c 'import mmcv, mmcv.ops, mmdet; print(f"[mmdet_env.sh] mmcv-full {mmcv.__version__}, mmdet {mmdet.__version__} in '"$VENV"'")'
