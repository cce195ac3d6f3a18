#!/usr/bin/env bash
# Builds .whl/: the wheels one run of bench/gpu/check.sh installs on a GPU machine that has no
# package index (Python 3.12, x86_64), from bench/gpu/requirements-runRUN.txt. The whole check's
# wheels are over the 64 MiB one device run carries (SciPy alone is 34 MiB), so the check is two
# runs, each with its own wheels: run 1, then run 2. Run on a machine that has the index, from
# anywhere; at most 64 MiB together (checked).
#
#   bash bench/gpu/wheels.sh 1      # then, on the GPU: bash bench/gpu/check.sh --out DIR --run 1
#   bash bench/gpu/wheels.sh 2      # then, on the GPU: bash bench/gpu/check.sh --out DIR --run 2
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
RUN=${1:-}
[[ $RUN == 1 || $RUN == 2 ]] || { echo "usage: bash bench/gpu/wheels.sh 1|2 (the run of check.sh)" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
rm -rf .whl
mkdir .whl
"$PYTHON" -m pip download -q --dest .whl --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -r "bench/gpu/requirements-run$RUN.txt"
echo "$RUN" >.whl/run
bytes=$(du -cb .whl/* | tail -1 | cut -f1)
echo "[wheels.sh] run $RUN: $(ls .whl/*.whl | wc -l) wheels, $((bytes / 1024 / 1024)) MiB in .whl/"
if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
  echo "[wheels.sh] over the 64 MiB a device run carries" >&2
  exit 1
fi
