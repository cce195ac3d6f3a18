#!/usr/bin/env bash
# What `bash run.sh` costs a new user: a clone of REV alone in an empty folder, pip's and uv's caches
# empty (a fresh machine's), then `bash run.sh` with no argument. Prints the seconds until the
# OCR service scores a request, the seconds until run.sh has decided about every service (its
# last "skipping"/"starting" line), and the disk of the environments it built.
#
#   bash bench/setup/fresh.sh [REV] [LIMIT_S]      (REV: HEAD by default; LIMIT_S: 1500)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REV=${1:-HEAD}
LIMIT=${2:-1500}
WORK=$(mktemp -d)
trap 'pkill -TERM -f "gunicorn -c $WORK/" 2>/dev/null || true; rm -rf "$WORK"' EXIT
git clone -q . "$WORK/clone"
git -C "$WORK/clone" checkout -q "$REV"
export PIP_CACHE_DIR=$WORK/pip-cache UV_CACHE_DIR=$WORK/uv-cache
PYTHON=${PYTHON:-python3}
start=$(date +%s.%N)
(cd "$WORK/clone" && exec timeout "$LIMIT" bash run.sh >"$WORK/log" 2>&1) &
runner=$!
"$PYTHON" - "$start" "$WORK" "$LIMIT" <<'PY'
import io, json, pickle, sys, time, urllib.request
start, work, limit = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])
from pathlib import Path
body = pickle.dumps({"images": [], "prompts": [], "metadata": {}})
scored = None
while time.time() - start < limit:
    if scored is None:
        try:
            with urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:18082/", data=body), timeout=5) as r:
                if r.status == 200:
                    scored = time.time() - start
        except OSError:
            pass
    log = Path(work, "log").read_text(errors="replace")
    decided = log.count("skipping ") + log.count("starting ")
    if scored is not None and decided >= 6:
        break
    time.sleep(1)
lines = [l for l in Path(work, "log").read_text(errors="replace").splitlines() if l.startswith("[run.sh]")]
print(json.dumps({"ocr_scores_after_s": scored and round(scored, 1), "decided_after_s": round(time.time() - start, 1),
                  "run_sh_lines": lines}, indent=1))
PY
du -sh "$WORK"/clone/.venv* 2>/dev/null || true
du -shc "$WORK"/clone/.venv* 2>/dev/null | tail -1
kill -TERM "$runner" 2>/dev/null || true
