"""The server's side of the sandbox: pick the isolation, keep the warm zygote, lend run slots.

Isolation, strongest first (docs/ARCHITECTURE.md §8):

- ``bwrap``: bubblewrap gives the zygote its own network, pid, ipc and uts namespaces, a
  read-only root, a fresh ``/tmp`` (root-owned, so each sample's private dir is the only
  writable place), a fresh ``/dev`` and ``/proc``, and dies with the server.
- ``unshare``: util-linux ``unshare`` gives network, pid and ipc namespaces only: the host's
  world-writable dirs stay writable.
- ``none``: no namespaces; the network is reachable.

All three drop each test process to an unprivileged uid (one per slot, so concurrent runs can
neither signal nor read each other), clear its environment and set rlimits. The service
refuses anything weaker than ``bwrap`` unless ``SCORER_CODE_ALLOW_WEAK_SANDBOX`` names the
mechanism it would get.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ISOLATIONS = ("bwrap", "unshare", "none")
ZYGOTE_SOURCE = (Path(__file__).parent / "zygote.py").read_text()
# Root may do these inside bwrap; a test process loses them all when it drops its uid.
BWRAP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")


class SandboxFailure(RuntimeError):
    """The infrastructure failed a run (zygote gone, supervisor died): no verdict."""


def _prefix(isolation: str) -> list[str]:
    """Command prefix that puts the zygote in ``isolation``."""
    if isolation == "bwrap":
        caps = [arg for cap in BWRAP_CAPS for arg in ("--cap-add", cap)]
        return [
            "bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session", "--clearenv", "--ro-bind", "/", "/",
            "--perms", "0711", "--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc", *caps,
        ]  # fmt: skip
    if isolation == "unshare":
        return ["unshare", "--net", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc"]
    return []


def available(isolation: str) -> bool:
    """Whether ``isolation`` works on this host (a quick probe run)."""
    if isolation == "none":
        return True
    if shutil.which(_prefix(isolation)[0]) is None:
        return False
    try:
        probe = subprocess.run([*_prefix(isolation), "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def strongest() -> str:
    """The strongest isolation this host offers."""
    return next(name for name in ISOLATIONS if available(name))


def _send(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise SandboxFailure("sandbox supervisor closed the connection before the end")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> dict[str, Any]:
    (length,) = struct.unpack("!I", _recv_exact(sock, 4))
    return json.loads(_recv_exact(sock, length))


def claim_uids(base: int, count: int, blocks: int = 64) -> tuple[int, int]:
    """A block of ``count`` uids no other worker on this host uses: (first uid, lock fd).

    Each worker holds an exclusive lock on its block's file for its lifetime.
    """
    for block in range(blocks):
        fd = os.open(f"/tmp/scorer-code-uids-{base}-{block}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return base + block * count, fd
    raise SandboxFailure(f"all {blocks} uid blocks from {base} are taken by other workers")


class Sandbox:
    """A warm zygote in ``isolation`` plus ``slots`` run slots, each with its own uid."""

    def __init__(self, isolation: str, slots: int, uid_base: int) -> None:
        self.isolation = isolation
        # Each slot has two uids: its candidates' (``uids``) and, ``slots`` above it, its tests'.
        first_uid, self._uid_lock = claim_uids(uid_base, 2 * slots)
        self.uids = range(first_uid, first_uid + slots)
        self._slots: queue.LifoQueue[int] = queue.LifoQueue()
        for uid in self.uids:
            self._slots.put(uid)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="code-sandbox-")
        os.chmod(self._dir, 0o711)
        self._socket_path = os.path.join(self._dir, "zygote.sock")
        self._runs = "/tmp/runs" if isolation == "bwrap" else os.path.join(self._dir, "runs")

    def start(self) -> None:
        """(Re)start the zygote and wait until it accepts runs."""
        with self._lock:
            self._stop_locked()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._socket_path)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(self._socket_path)
            os.chmod(self._socket_path, 0o600)
            listener.listen(512)
            # The base interpreter, not the venv's link to it: the zygote needs only the standard
            # library, and a venv under /tmp would be hidden by the sandbox's own /tmp.
            command = [*_prefix(self.isolation), os.path.realpath(sys.executable), "-I", "-S", "-c", ZYGOTE_SOURCE]
            spawned: queue.Queue[subprocess.Popen[bytes] | BaseException] = queue.Queue()
            # bwrap's --die-with-parent follows the *thread* that spawned it, so the zygote is
            # spawned by a thread that lives exactly as long as the zygote.
            threading.Thread(
                target=self._keep, args=([*command, str(listener.fileno()), self._runs], listener, spawned),
                name="code-zygote", daemon=True,
            ).start()  # fmt: skip
            proc = spawned.get()
            if isinstance(proc, BaseException):
                raise SandboxFailure(f"sandbox zygote ({self.isolation}) failed to start: {proc}")
            self._proc = proc
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"zygote ready":
                self._stop_locked()
                raise SandboxFailure(f"sandbox zygote ({self.isolation}) failed to start")
            log.info("code sandbox ready: isolation=%s", self.isolation)

    @staticmethod
    def _keep(command: list[str], listener: socket.socket, spawned: queue.Queue[Any]) -> None:
        try:
            proc = subprocess.Popen(
                command, pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            spawned.put(exc)
            return
        finally:
            listener.close()
        spawned.put(proc)
        proc.wait()

    def _stop_locked(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop_locked()
        shutil.rmtree(self._dir, ignore_errors=True)
        os.close(self._uid_lock)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @contextlib.contextmanager
    def slot(self, timeout: float) -> Iterator[int | None]:
        """Hold one run slot (its uid) for the duration; ``None`` when none came free in time."""
        try:
            uid = self._slots.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            yield None
            return
        try:
            yield uid
        finally:
            self._slots.put(uid)

    def run(self, job: dict[str, Any], uid: int) -> Iterator[dict[str, Any]]:
        """Run ``job`` as ``uid``; yields one result per test. Raises ``SandboxFailure``.

        ``job["trusted"]`` (assert tests: the label's code) is sent apart, after the rest.
        """
        if not self.alive():
            log.warning("code sandbox zygote is gone; restarting it")
            self.start()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(job["sample_s"] + 10.0)
        try:
            try:
                sock.connect(self._socket_path)
                trusted = job.get("trusted")
                header = {key: value for key, value in job.items() if key != "trusted"}
                _send(
                    sock, {**header, "uid": uid, "gid": uid, "test_uid": uid + len(self.uids), "tmp_root": self._runs}
                )
                if trusted is not None:  # read by the tests' process alone, never by the candidate's
                    _send(sock, trusted)
                while True:
                    message = _recv(sock)
                    if message.get("done"):
                        return
                    yield message
            except (OSError, struct.error, ValueError) as exc:
                raise SandboxFailure(f"sandbox run failed: {exc}") from exc
        finally:
            sock.close()
