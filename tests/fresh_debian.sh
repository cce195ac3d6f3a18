#!/usr/bin/env bash
# By hand, as root: run.sh's set-up on a fresh Debian 12 that has python3 and nothing else
# (no bubblewrap, no nginx, no python3-venv), without touching this machine's packages.
#
#   bash tests/fresh_debian.sh [ROOTFS_DIR]     (default /var/tmp/scorer-fresh-debian)
#
# Builds a minimal Debian with debootstrap (once; apt-get install debootstrap), clones this
# repository's HEAD into it and, inside a chroot in a private mount namespace:
#   1. as an unprivileged user without sudo, `bash run.sh test` stops at once with the exact
#      apt-get command and creates nothing;
#   2. as root, `bash run.sh code --infra-failure-score nan` installs bubblewrap,
#      python3-venv and the toolchains (rustc-web among them) with apt-get and the pinned Go
#      into /usr/local/lib/scorer-toolchains/go, builds .venv-code and serves: one OpenRLHF
#      request is graded under bwrap;
#   3. as root, `bash run.sh system-packages test` installs nginx.
# Each run first removes what an earlier run installed in the chroot.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
R=${1:-/var/tmp/scorer-fresh-debian}
PORT=18990

if [ ! -x "$R/usr/bin/python3" ]; then
  debootstrap --variant=minbase --include=python3,ca-certificates bookworm "$R" http://deb.debian.org/debian
fi

if [ -z "${FRESH_DEBIAN_INSIDE:-}" ]; then
  FRESH_DEBIAN_INSIDE=1 exec unshare --mount --propagation private bash "$0" "$R"
fi

mount --bind "$R" "$R" # "/" of the chroot is a mount point, as on a machine (bwrap needs it)
mount -t proc proc "$R/proc"
mount --bind /dev "$R/dev"
mount --bind /sys "$R/sys"
cp /etc/resolv.conf "$R/etc/resolv.conf"
# The host's certificate authorities, so that a registry reached through a proxy works as here.
cp /etc/ssl/certs/ca-certificates.crt "$R/etc/ssl/certs/ca-certificates.crt"
# Package scripts must not start services (nginx) on this machine's network: the chroot rule.
printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
chmod 755 "$R/usr/sbin/policy-rc.d"

inside() {
  chroot "$R" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt /bin/bash -c "$1"
}

inside 'apt-get purge -y -qq bubblewrap nginx nginx-common python3-venv python3.11-venv python3-pip-whl \
  python3-setuptools-whl >/dev/null 2>&1; apt-get autoremove -y -qq --purge >/dev/null 2>&1
  rm -rf /usr/local/lib/scorer-toolchains' || true
rm -rf "$R/srv/repo"
git clone -q "$REPO" "$R/srv/repo"
chmod 755 "$R/srv/repo"
echo "== fresh: $(git -C "$R/srv/repo" log --oneline -1)"
inside 'cat /etc/debian_version; python3 --version; command -v bwrap nginx sudo || true
  python3 -c "import ensurepip" 2>&1 | tail -1'

echo "== 1. unprivileged, no sudo: bash run.sh test"
inside 'cd /srv/repo && setpriv --reuid=65534 --regid=65534 --clear-groups bash run.sh test; echo "exit $?"
  ls -d .venv* 2>/dev/null || echo "no virtual environment created"'

echo "== 2. root: bash run.sh code --infra-failure-score nan --port $PORT"
inside "cd /srv/repo && exec bash run.sh code --infra-failure-score nan --port $PORT" >"$R/srv/code.log" 2>&1 &
server=$!
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || break
  sleep 2
done
grep -E '^\[run.sh\]|sandbox isolation' "$R/srv/code.log" || true
echo "/ready: $(curl -s "http://127.0.0.1:$PORT/ready")"
curl -s "http://127.0.0.1:$PORT/reward/score" -H 'Content-Type: application/json' \
  -d '{"outputs": ["```python\nprint(int(input()) * 2)\n```"], "prompts": ["p"], "labels": [{"inputs": ["21\n"], "outputs": ["42"]}]}'
echo
# The gunicorn master is the chroot's process, a child of the background job: it stops its workers.
for pid in $(pgrep -P "$server" || true); do kill -TERM "$pid"; done
wait "$server" 2>/dev/null || true

echo "== 3. root: bash run.sh system-packages test"
inside 'cd /srv/repo && bash run.sh system-packages test; echo "exit $?"'
inside 'command -v bwrap nginx; dpkg -l bubblewrap nginx python3-venv | tail -3
  rustc --version; /usr/local/lib/scorer-toolchains/go/go/bin/go version'
