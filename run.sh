#!/usr/bin/env bash
# Start the scorer services, or run the tests. Each command does its own set-up.
#
#   bash run.sh                       start every service that runs on offline defaults
#   bash run.sh ocr [--port N] [--workers N]
#   bash run.sh aesthetic [--port N] [--workers N] [--clip DIR_OR_HUB_ID] [--head PATH]
#   bash run.sh code --infra-failure-score nan|zero [--port N] [--workers N] [--env NAME]
#   bash run.sh test [pytest args]    install everything, run the test suite
#
# Every flag is also a setting (SCORER_PORT, SCORER_WORKERS, SCORER_AESTHETIC_CLIP, ...);
# see the README's configuration table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
ROOT=$PWD
PYTHON=${PYTHON:-python3}

log() { printf '[run.sh] %s\n' "$*" >&2; }

default_port() { case $1 in ocr) echo 18082 ;; aesthetic) echo 18080 ;; code) echo 18090 ;; esac; }

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# requirement files of a service, core first
requirements_of() {
  case $1 in
    ocr) if [ "${SCORER_OCR_ENGINE:-rapidocr}" = paddleocr ]; then echo requirements-ocr-paddle.txt
         else echo requirements.txt requirements-ocr.txt; fi ;;
    aesthetic) echo requirements.txt requirements-aesthetic.txt ;;
    code) echo requirements.txt requirements-code.txt ;;
    test) echo requirements.txt requirements-ocr.txt requirements-aesthetic.txt requirements-code.txt requirements-dev.txt ;;
  esac
}

# ensure_venv NAME: a virtual environment .venv-NAME (.venv for the tests) with NAME's packages.
# Installs only when the requirement files changed since the last install.
ensure_venv() {
  local name=$1 dir files stamp
  dir=$ROOT/.venv
  [ "$name" = test ] || dir+="-$name"
  if [ "$name" = ocr ] && [ "${SCORER_OCR_ENGINE:-}" = paddleocr ]; then dir+=-paddle; fi
  files=$(requirements_of "$name")
  if [ ! -x "$dir/bin/python" ]; then
    log "creating $dir"
    "$PYTHON" -m venv "$dir"
  fi
  # shellcheck disable=SC2086
  stamp=$(cat $files | sha256sum | cut -d' ' -f1)
  if has_gpu; then stamp+=-gpu; fi
  if [ "$(cat "$dir/.installed" 2>/dev/null)" != "$stamp" ]; then
    log "installing $name requirements into $dir"
    "$dir/bin/python" -m pip install -q --upgrade pip
    local args=()
    for f in $files; do args+=(-r "$f"); done
    "$dir/bin/python" -m pip install -q "${args[@]}"
    if [[ " $files " == *" requirements-ocr.txt "* ]]; then
      # RapidOCR without its opencv-python dependency (the headless build is installed instead).
      "$dir/bin/python" -m pip install -q --no-deps rapidocr-onnxruntime==1.4.4
      if has_gpu && [ "$name" != test ]; then
        log "GPU found: installing onnxruntime-gpu for the OCR service"
        "$dir/bin/python" -m pip uninstall -q -y onnxruntime
        "$dir/bin/python" -m pip install -q -r requirements-ocr-gpu.txt
      fi
    fi
    echo "$stamp" >"$dir/.installed"
  fi
  VENV=$dir
}

# start SERVICE: runs gunicorn for SERVICE in the foreground with its own environment.
start() {
  local service=$1
  ensure_venv "$service"
  log "starting $service on port ${SCORER_PORT:-$(default_port "$service")}"
  SCORER_SERVICE=$service exec "$VENV/bin/python" -m gunicorn -c "$ROOT/gunicorn.conf.py"
}

# preflight SERVICE: says why SERVICE cannot start on this node (non-zero), or nothing.
preflight() {
  ensure_venv "$1"
  SCORER_SERVICE=$1 "$VENV/bin/python" -m common.preflight
}

parse_flags() {
  while [ $# -gt 0 ]; do
    case $1 in
      --port) export SCORER_PORT=$2; shift 2 ;;
      --workers) export SCORER_WORKERS=$2; shift 2 ;;
      --clip) export SCORER_AESTHETIC_CLIP=$2; shift 2 ;;
      --head) export SCORER_AESTHETIC_HEAD=$2; shift 2 ;;
      --infra-failure-score) export SCORER_CODE_INFRA_FAILURE_SCORE=$2; shift 2 ;;
      --env) export SCORER_CODE_ENV=$2; shift 2 ;;
      -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
      *) log "unknown flag $1 (see bash run.sh --help)"; exit 2 ;;
    esac
  done
}

start_all() {
  local pids=() service
  for service in ocr aesthetic code; do
    if ! (preflight "$service"); then
      log "skipping $service (see the reason above)"
      continue
    fi
    (start "$service") &
    pids+=($!)
  done
  [ ${#pids[@]} -gt 0 ] || { log "no service can start"; exit 1; }
  trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' INT TERM
  wait -n "${pids[@]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait
}

command=${1:-all}
[ $# -gt 0 ] && shift
case $command in
  test)
    ensure_venv test
    tests_venv=$VENV
    if [ -z "${SCORER_TEST_SKIP_PADDLE:-}" ]; then
      # PaddleOCR lives in its own environment (its OpenCV builds clash with RapidOCR's);
      # tests/test_ocr_paddle.py starts the OCR service with it.
      SCORER_OCR_ENGINE=paddleocr ensure_venv ocr
      export SCORER_TEST_PADDLE_PYTHON=$VENV/bin/python
    fi
    exec "$tests_venv/bin/python" -m pytest "$@"
    ;;
  ocr|aesthetic|code)
    parse_flags "$@"
    start "$command"
    ;;
  all)
    parse_flags "$@"
    start_all
    ;;
  -h|--help) sed -n '2,12p' "$0" ;;
  *) log "unknown command $command (see bash run.sh --help)"; exit 2 ;;
esac
