#!/usr/bin/env bash
# Builds .whl/: the wheels bench/gpu/check.sh installs on a GPU machine that has no package
# index (Python 3.12, x86_64), from bench/gpu/requirements-bare.txt. Run on a machine that has
# the index, from anywhere; at most 64 MiB together (checked).
#
#   bash bench/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON=${PYTHON:-python3}
rm -rf .whl
mkdir .whl
"$PYTHON" -m pip download -q --dest .whl --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -r bench/gpu/requirements-bare.txt
bytes=$(du -cb .whl/*.whl | tail -1 | cut -f1)
echo "[wheels.sh] $(ls .whl/*.whl | wc -l) wheels, $((bytes / 1024 / 1024)) MiB in .whl/"
if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
  echo "[wheels.sh] over the 64 MiB a device run carries" >&2
  exit 1
fi
