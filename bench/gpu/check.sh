#!/usr/bin/env bash
# One GPU check, for a bare GPU machine (Python 3.12 with torch, transformers, onnx, onnxruntime,
# numpy, pillow, prometheus-client, werkzeug, opencv-python-headless; no package index). Run from
# the repository root, in two runs, each with its own .whl/ made beforehand by bench/gpu/wheels.sh
# (all the wheels together are over the 64 MiB one device run carries), in this order:
#
#   bash bench/gpu/wheels.sh 1, then on the GPU: bash bench/gpu/check.sh --out DIR1 --run 1   (9 min 20 s at most)
#   bash bench/gpu/wheels.sh 2, then on the GPU: bash bench/gpu/check.sh --out DIR2 --run 2   (5 min 30 s at most)
#   bash bench/gpu/check.sh --out DIR            every step, where the interpreter has every package
#   bash bench/gpu/check.sh --out DIR --cpu-smoke   the same steps on the CPU, tiny sizes (< 3 min)
#   ... --no-wheels                                  the interpreter's own packages, .whl/ or not
#   ... --steps multi                                only the steps named (comma-separated)
#   ... --run 1                                      run 1's steps (pinning ocr_agreement aesthetic ocr batching
#                                                    pickscore multi), run 2's (hpsv3 geneval judge)
#   CHECK_TIME_FACTOR=3 bash bench/gpu/check.sh ... --cpu-smoke   the smoke run's limits x 3
#
# Steps: the wheels installed with pip --no-index --target; the OCR service under gunicorn with
# its workers pinned to the GPUs (/info of each); the OCR engines' agreement (ONNX Runtime on the
# CPU against torch in float32/float16/bfloat16); the aesthetic three-way bench at ViT-L/14 size in
# float16; the OCR three-way bench on the torch engine; the batching bench; the PickScore three-way
# bench (ViT-B widths, 14-pixel patches, float16); the HPSv3 bench at Qwen2-VL-7B's real size
# (random weights built on the GPU in bfloat16); the GenEval bench at GenEval's real sizes (Swin-S
# Mask2Former and a ViT-L/14 colour classifier, random, built on the GPU) against the reward
# server's design restated; the multi bench (OCR + PickScore and OCR +
# PickScore + aesthetic in one call against each reward's own service); the judge bench (the judge
# service in front of transformers serve with a tiny random Qwen2-VL on the GPU, against the same
# chat completions sent as VeRL-Omni's unified_reward.py sends them; ENGINE_PYTHON, default
# SCORER_TEST_ENGINE_PYTHON or PYTHON, runs the engine: with --cpu-smoke, one without
# transformers' serving extras and torchvision skips the step). Every figure goes to
# DIR/check.json (each step's own JSON and log beside it). PYTHON picks the interpreter; without
# .whl/ (or with --no-wheels) its own packages must have everything: the test venv does, and
# tests/test_gpu_check.py runs --cpu-smoke --no-wheels with it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON=${PYTHON:-python3}
OUT="" SMOKE=0 WHEELS=1 STEPS="" RUN=""
# The two runs the wheels are split into (bench/gpu/requirements-run1.txt, -run2.txt).
RUN_STEPS=("" pinning,ocr_agreement,aesthetic,ocr,batching,pickscore,multi hpsv3,geneval,judge,imagereward)
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --cpu-smoke) SMOKE=1; shift ;;
    --no-wheels) WHEELS=0; shift ;;
    --steps) STEPS=$2; shift 2 ;;
    --run) RUN=$2; shift 2 ;;
    *) echo "usage: bash bench/gpu/check.sh --out DIR [--cpu-smoke] [--no-wheels] [--steps A,B] [--run 1|2]" >&2; exit 2 ;;
  esac
done
STEP_NAMES=(pinning ocr_agreement aesthetic ocr batching pickscore hpsv3 geneval multi judge imagereward)
if [ -n "$RUN" ]; then
  [[ $RUN == 1 || $RUN == 2 ]] || { echo "--run: 1 or 2, not '$RUN'" >&2; exit 2; }
  [ -z "$STEPS" ] || { echo "--run and --steps: give one" >&2; exit 2; }
  STEPS=${RUN_STEPS[$RUN]}
fi
IFS=, read -r -a wanted <<<"$STEPS"
for name in ${wanted[@]+"${wanted[@]}"}; do
  [[ " ${STEP_NAMES[*]} " == *" $name "* ]] || { echo "--steps: no step '$name'; the steps: ${STEP_NAMES[*]}" >&2; exit 2; }
done
# .whl/ holds one run's wheels (bench/gpu/wheels.sh RUN): only that run's steps can use them.
if [ $WHEELS = 1 ] && [ -f .whl/run ]; then
  held=$(cat .whl/run)
  for name in ${wanted[@]+"${wanted[@]}"}; do
    [[ ",${RUN_STEPS[$held]}," == *",$name,"* ]] || wanted=()
  done
  [ ${#wanted[@]} -gt 0 ] || {
    echo "check.sh: .whl/ holds run $held's wheels, for its steps only (${RUN_STEPS[$held]}): give --run $held, or build the others' with bench/gpu/wheels.sh" >&2
    exit 2
  }
fi
[ -n "$OUT" ] || { echo "check.sh: --out DIR is required" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log() { printf '[check.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ $WHEELS = 1 ] && compgen -G ".whl/*.whl" >/dev/null; then
  SITE=$(mktemp -d)
  trap 'rm -rf "$SITE"' EXIT
  log "installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into $SITE"
  "$PYTHON" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$SITE" .whl/*.whl
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
# The aesthetic head ships with the service (services/aesthetic/weights/README.md).
HEAD=services/aesthetic/weights/laion-aesthetic-sac-logos-ava1-l14-linearMSE.pth

if [ $SMOKE = 1 ]; then
  DEVICE=cpu
  export CUDA_VISIBLE_DEVICES=""
  AESTHETIC=(--size tiny --device cpu --precision float32 --requests 4 --rounds 1 --batch-sizes 4)
  PICKSCORE=(--size tiny --device cpu --precision float32 --requests 4 --prompts 2 --rounds 1 --batch-sizes 4)
  OCR=(--device cpu --engine torch --requests 2 --rounds 1 --batches 2)
  AGREEMENT=(--device cpu --count 2 --batch 2)
  BATCHING=(--cases 16:8 --rounds 1 --requests 2 --simple-requests 1)
  HPSV3=(--size tiny --device cpu --precision float32 --requests 4 --prompts 2 --rounds 1 --batch-sizes 4)
  GENEVAL=(--size tiny --device cpu --requests 2 --images 2 --rounds 1)
  MULTI=(--device cpu --requests 4 --rounds 1 --image-size 256)
  JUDGE=(--device cpu --samples 4 --rounds 1 --image-size 64)
  IMAGEREWARD=(--size tiny --device cpu --precision float32 --requests 4 --rounds 1 --batch-sizes 4)
  # Guards against a hang only: CHECK_TIME_FACTOR scales them for a slow shared machine.
  LIMITS=(120 120 120 180 120 180 240 120 240 180 120)
  FACTOR=${CHECK_TIME_FACTOR:-1}
  [[ $FACTOR =~ ^[0-9]*\.?[0-9]+$ && ! $FACTOR =~ ^[0.]+$ ]] || {
    echo "CHECK_TIME_FACTOR: a positive number, not '$FACTOR'" >&2
    exit 2
  }
  for i in "${!LIMITS[@]}"; do LIMITS[i]=$(awk -v s="${LIMITS[i]}" -v f="$FACTOR" 'BEGIN { printf "%.1f", s * f < 1 ? 1 : s * f }'); done
else
  DEVICE=cuda
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  AESTHETIC=(--size l14 --device cuda --precision float16 --requests 64 --rounds 3 --batch-sizes 8,16,32,64)
  # ViT-B widths with PickScore's 14-pixel patches: a random ViT-H/14 takes longer to build and
  # save than the step's minute (bench/clip/gpu.sh runs it).
  PICKSCORE=(--size b14 --device cuda --precision float16 --requests 64 --prompts 4 --rounds 3 --batch-sizes 8,32,64)
  OCR=(--device cuda --engine torch --requests 64 --rounds 3 --batches 1,8,16,32)
  AGREEMENT=(--device cuda --count 128 --batch 16)
  BATCHING=(--cases 64:32,256:64 --rounds 3 --requests 4 --simple-requests 1)
  # Qwen2-VL-7B's size: the random checkpoint (16.6 GB) is written once and loaded three times.
  HPSV3=(--size 7b --device cuda --precision bfloat16 --requests 32 --prompts 4 --rounds 2 --batch-sizes 16,32)
  # GenEval's Swin-S Mask2Former and a ViT-L/14 CLIP, random, built on the GPU, at mmdet's scale.
  GENEVAL=(--size real --device cuda --precision float16 --image-size 512 --requests 2 --images 8 --rounds 2)
  # The rewards at their real sizes but PickScore's (ViT-B widths, as in the PickScore step);
  # five services on the one GPU, each reward's own and one multi service per set.
  MULTI=(--device cuda --ocr-engine torch --pickscore-size b14 --aesthetic-size l14 --precision float16
         --requests 64 --rounds 2)
  JUDGE=(--device cuda --samples 64 --rounds 3 --image-size 256)
  # ImageReward-v1.0's size (ViT-L/16 and BERT-base), random, built on the GPU.
  IMAGEREWARD=(--size large --device cuda --precision float16 --requests 64 --rounds 3 --batch-sizes 8,32,64)
  LIMITS=(45 75 105 105 60 50 120 60 120 90 60)
fi

log "environment"
"$PYTHON" - "$DEVICE" >"$OUT/environment.json" <<'PY'
import json, platform, sys
from importlib.metadata import version
from importlib.util import find_spec
import flask, gunicorn, numpy, onnx, onnxruntime, torch, transformers  # all importable
device = sys.argv[1]
if device == "cuda" and not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA GPU")
print(json.dumps({
    "python": platform.python_version(),
    "torch": torch.__version__, "cuda": torch.version.cuda,
    "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if device == "cuda" else [],
    "transformers": transformers.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
    "onnxruntime_providers": onnxruntime.get_available_providers(), "numpy": numpy.__version__,
    "flask": version("flask"), "gunicorn": gunicorn.__version__,
    "rapidocr": version("rapidocr-onnxruntime") if find_spec("rapidocr_onnxruntime") else None,  # run 1's
}, indent=2))
PY
cat "$OUT/environment.json" >&2

# step NAME SECONDS COMMAND...: runs a step under a time limit, its output in NAME.log; a failed
# step is named in check.json's "failed" and the others still run (a step stopped by its limit
# stops the servers it started: bench.common.stop_on_sigterm).
FAILED=()
step() {
  local name=$1 limit=$2
  shift 2
  [ -z "$STEPS" ] || [[ ",$STEPS," == *",$name,"* ]] || return 0
  log "$name"
  local started=$SECONDS
  if ! timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
    FAILED+=("$name")
    log "$name FAILED (see $OUT/$name.log):"
    tail -20 "$OUT/$name.log" >&2
  fi
  echo $((SECONDS - started)) >"$OUT/$name.seconds"
}

# Time limits per step (seconds), in this order; together 14 min 50 s at most on the GPU, 9 min
# 20 s without the geneval, multi and judge steps (--steps runs a part, for a machine lent 10
# minutes at a time).
step pinning "${LIMITS[0]}" "$PYTHON" -m bench.gpu.pinning --device "$DEVICE" --out "$OUT/pinning.json"
step ocr_agreement "${LIMITS[1]}" "$PYTHON" -m bench.gpu.ocr_agreement "${AGREEMENT[@]}" --out "$OUT/ocr_agreement.json"
step aesthetic "${LIMITS[2]}" "$PYTHON" -m bench.aesthetic.bench "${AESTHETIC[@]}" --head "$HEAD" --out "$OUT/aesthetic.json"
step ocr "${LIMITS[3]}" "$PYTHON" -m bench.ocr.run "${OCR[@]}" --out "$OUT/ocr.json"
step batching "${LIMITS[4]}" "$PYTHON" -m bench.batching.run "${BATCHING[@]}" --out "$OUT/batching.json"
step pickscore "${LIMITS[5]}" "$PYTHON" -m bench.clip.bench "${PICKSCORE[@]}" --out "$OUT/pickscore.json"
step hpsv3 "${LIMITS[6]}" "$PYTHON" -m bench.hpsv3.bench "${HPSV3[@]}" --out "$OUT/hpsv3.json"
step geneval "${LIMITS[7]}" "$PYTHON" -m bench.geneval.bench "${GENEVAL[@]}" --out "$OUT/geneval.json"
step multi "${LIMITS[8]}" "$PYTHON" -m bench.multi.run "${MULTI[@]}" --out "$OUT/multi.json"
step imagereward "${LIMITS[10]}" "$PYTHON" -m bench.imagereward.bench "${IMAGEREWARD[@]}" --out "$OUT/imagereward.json"
ENGINE_PYTHON=${ENGINE_PYTHON:-${SCORER_TEST_ENGINE_PYTHON:-$PYTHON}}
SKIPPED=()
if [ $SMOKE = 1 ] && ! "$ENGINE_PYTHON" -c 'import fastapi, openai, torchvision, uvicorn' 2>/dev/null; then
  log "judge skipped: $ENGINE_PYTHON has no transformers serving extras or torchvision (set ENGINE_PYTHON)"
  SKIPPED+=(judge)
else
  step judge "${LIMITS[9]}" "$PYTHON" -m bench.judge.run --engine-python "$ENGINE_PYTHON" "${JUDGE[@]}" --out "$OUT/judge.json"
fi

"$PYTHON" - "$OUT" "${SKIPPED[*]-}" ${FAILED[@]+"${FAILED[@]}"} <<'PY'
import json, sys
from pathlib import Path
out, skipped, failed = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
steps = ["environment", "pinning", "ocr_agreement", "aesthetic", "ocr", "batching", "pickscore", "hpsv3", "geneval", "multi", "judge", "imagereward"]
report = {"failed": failed, "skipped": skipped, "seconds": {}}
for step in steps:
    path = out / f"{step}.json"
    report[step] = json.loads(path.read_text()) if path.exists() and step not in failed else None
    if (out / f"{step}.seconds").exists():
        report["seconds"][step] = int((out / f"{step}.seconds").read_text())
(out / "check.json").write_text(json.dumps(report, indent=2))
PY
log "figures in $OUT/check.json ($SECONDS s in all)"
[ ${#FAILED[@]} -eq 0 ] || { log "failed steps: ${FAILED[*]}"; exit 1; }
