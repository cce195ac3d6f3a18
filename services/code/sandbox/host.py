# Over 400 lines: the zygote's lifecycle, the run slots and the runs share one lock and one socket protocol.
"""The server's side of the sandbox: pick the isolation, keep the warm zygote, lend run slots.

Isolation, strongest first (docs/ARCHITECTURE.md §8):

- ``bwrap``: bubblewrap gives the zygote its own network, pid, ipc and uts namespaces, a root
  that holds only what a program needs, read-only (``/usr``, the ``/lib*`` links, the
  dynamic linker's cache and the interpreter's own prefix: never the checkout, home
  directories or data), a fresh ``/dev`` and ``/proc``, and dies with the server.
- ``unshare``: util-linux ``unshare`` gives network, pid and ipc namespaces only: the host's
  world-writable dirs stay writable.
- ``none``: no namespaces; the network is reachable.

In every isolation each sample's supervisor takes a mount and an IPC namespace of its own:
a size-limited tmpfs on ``/tmp`` (also ``/dev/shm``), the only writable place, and SysV IPC
that is bounded and dies with the sample. All three drop each test process to an
unprivileged uid (one per slot, so concurrent runs can neither signal nor read each other),
clear its environment and set rlimits. The service
refuses anything weaker than ``bwrap`` unless ``SCORER_CODE_ALLOW_WEAK_SANDBOX`` names the
mechanism it would get.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.code.packages import SANDBOX_PATH
from services.code.preludes import PRELUDES
from services.code.sandbox import cgroups, inside
from services.code.sandbox.inside import messages, relay
from services.code.sandbox.inside.confine import SampleCgroup
from services.code.sandbox.inside.messages import Job, Outcome, TrustedTests
from services.code.scheduling.cancelling import Cancellation, Cancelled, kill_and_wait

log = logging.getLogger(__name__)

ISOLATIONS = ("bwrap", "unshare", "none")
ZYGOTE_SOURCE = inside.bundle().encode()
# Root may do these inside bwrap; a test process loses them all when it drops its uid.
# CAP_SYS_ADMIN lets each supervisor mount its sample's /tmp in a namespace of its own.
BWRAP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SYS_ADMIN")
# What a program may see of the host besides the interpreter: system binaries and libraries.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
# A zygote that dies sooner than this after its start counts as a quick restart: the next
# restart waits (doubling per quick one, up to RESTART_PAUSE_MAX_S).
QUICK_RESTART_S = 10.0
# From this many slots on, one is kept from any single request for the others (fewer: a slot
# kept idle would cost a lone request too large a share).
RESERVE_FROM_SLOTS = 8
RESTART_PAUSE_S = 0.2
RESTART_PAUSE_MAX_S = 5.0
# The most samples' inits kept prepared (one per slot up to this): each holds about 1 MiB and
# its namespaces and cgroup; past it, a wave's inits prepare themselves at once as it starts.
MAX_SPARES = 16
# Uids between the first uids of two workers' blocks (two per slot).
UID_BLOCK = 2048
# What of a sample's output this process holds until the sample ends (a custom checker's
# inputs, ``grader``; call-based answers, or what their label's expected outputs could need
# when more) is at most this many times the job's ``keep_bytes`` in all; the tests past it are
# output limits.
HELD_OUTPUT_FACTOR = 4


class SandboxFailure(RuntimeError):
    """The infrastructure failed a run (zygote gone, supervisor died): no verdict."""


def interpreter_dirs() -> list[str]:
    """The directories this interpreter and its standard library live in (real paths), the
    ones already among ``SYSTEM_DIRS`` left out."""
    found: list[str] = []
    for path in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(path)
        if not any(real == d or real.startswith(d.rstrip("/") + "/") for d in (*SYSTEM_DIRS, *found)):
            found.append(real)
    return found


def _visible_filesystem(packages: str) -> list[str]:
    """bwrap arguments for the zygote's root: system dirs, the interpreter, a root-only ``/tmp``,
    and the programs' packages (``packages``, if any) at ``SANDBOX_PATH``.

    Every directory bwrap creates on the way to a bind is made 0755 first: bwrap would make
    it 0700, which the sandbox uids cannot cross (a Python under ``/root`` would not import).
    """
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    # Traversable, as bwrap would not make it: toolchains read their own files there (the JDK's).
    args += ["--perms", "0755", "--dir", "/etc"]
    for path in SYSTEM_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    args += ["--perms", "0711", "--tmpfs", "/tmp"]  # root's alone: each sample mounts its own over it
    for path in interpreter_dirs():
        parents = Path(path).parents
        for parent in reversed(list(parents)[:-1]):  # from the top, without "/"
            args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", path, path]
    if packages:
        args += ["--ro-bind", packages, SANDBOX_PATH]
    return args


def _prefix(isolation: str, packages: str = "") -> list[str]:
    """Command prefix that puts the zygote in ``isolation``."""
    if isolation == "bwrap":
        caps = [arg for cap in BWRAP_CAPS for arg in ("--cap-add", cap)]
        return [
            "bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session", "--clearenv", *_visible_filesystem(packages),
            "--dev", "/dev", "--proc", "/proc", *caps,
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


def claim_uids(base: int, count: int, blocks: int = 64) -> tuple[int, int]:
    """A block of ``count`` uids no other worker on this host uses: (first uid, lock fd).

    Each worker holds an exclusive lock on its block's file for its lifetime. Blocks are
    ``UID_BLOCK`` apart whatever ``count`` is, so workers with different slot counts never
    overlap.
    """
    if count > UID_BLOCK:
        raise SandboxFailure(f"{count} uids per worker; at most {UID_BLOCK} (max_parallel up to {UID_BLOCK // 2})")
    for block in range(blocks):
        fd = os.open(f"/tmp/scorer-code-uid-block-{base}-{block}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return base + block * UID_BLOCK, fd
    raise SandboxFailure(f"all {blocks} uid blocks from {base} are taken by other workers")


class _Ticket:
    """One wait for a slot; ``uid`` is set by whoever hands it over."""

    def __init__(self) -> None:
        self.granted = threading.Event()
        self.uid: int | None = None


class FairSlots:
    """Run slots (one uid each) lent round-robin between the clients waiting for one, and
    within a client between its requests.

    An owner is ``(client, request)`` (``common.limits.clients``; any object marks a request). A freed
    slot goes straight to a waiter: the clients in turn, and of a client its requests in turn.
    From ``RESERVE_FROM_SLOTS`` slots on no client holds every slot: the last one is kept for
    another client (while only one client runs, it stays idle). So a client's many requests or
    slow samples keep another client waiting neither until they are done nor until their next
    slot frees, and a client's big request does not starve its own small ones.
    """

    def __init__(self, uids: range) -> None:
        self._lock = threading.Lock()
        self._free = list(reversed(uids))
        self._most = len(uids) - (len(uids) >= RESERVE_FROM_SLOTS)  # slots one client may hold
        self._held: dict[object, int] = {}  # client -> slots held
        # client -> its requests -> their waits, each in turn
        self._waiting: OrderedDict[object, OrderedDict[object, deque[_Ticket]]] = OrderedDict()

    def acquire(self, owner: tuple[object, object], timeout: float) -> int | None:
        """A slot for ``owner`` (a client's request), or ``None`` when none came within ``timeout``."""
        client, request = owner
        with self._lock:
            if self._free and self._held.get(client, 0) < self._most:
                return self._lend(client, self._free.pop())
            ticket = _Ticket()
            self._waiting.setdefault(client, OrderedDict()).setdefault(request, deque()).append(ticket)
        ticket.granted.wait(max(timeout, 0.0))
        with self._lock:
            if ticket.uid is None:
                requests = self._waiting[client]
                requests[request].remove(ticket)
                if not requests[request]:
                    del requests[request]
                if not requests:
                    del self._waiting[client]
            return ticket.uid

    def release(self, owner: tuple[object, object], uid: int) -> None:
        client = owner[0]
        with self._lock:
            self._held[client] -= 1
            if not self._held[client]:
                del self._held[client]
            # The first client in turn that may hold one more gets it, for its first request in
            # turn; both then go last.
            for waiter, requests in self._waiting.items():
                if self._held.get(waiter, 0) < self._most:
                    request, line = next(iter(requests.items()))
                    ticket = line.popleft()
                    if line:
                        requests.move_to_end(request)
                    else:
                        del requests[request]
                    if requests:
                        self._waiting.move_to_end(waiter)
                    else:
                        del self._waiting[waiter]
                    ticket.uid = self._lend(waiter, uid)
                    ticket.granted.set()
                    return
            self._free.append(uid)

    def _lend(self, client: object, uid: int) -> int:
        self._held[client] = self._held.get(client, 0) + 1
        return uid


class Sandbox:
    """A warm zygote in ``isolation`` plus ``slots`` run slots, each with its own uid, the
    worker's cgroups (``cgroups.setup``: ``wanted`` is "auto" or "off") its samples' are made
    in, and the directory ``packages`` its programs may import from (read-only)."""

    def __init__(
        self,
        isolation: str,
        slots: int,
        uid_base: int,
        wanted_cgroups: str = "auto",
        packages: str = "",
        binds: tuple[str, ...] = (),
    ) -> None:
        self.isolation = isolation
        self.binds = binds  # more bwrap arguments (the compile cache, toolchains' files)
        self.cgroups = cgroups.setup(wanted_cgroups)
        self.packages = packages
        # Each slot has two uids: its candidates' (``uids``) and, ``slots`` above it, its tests'.
        first_uid, self._uid_lock = claim_uids(uid_base, 2 * slots)
        self.uids = range(first_uid, first_uid + slots)
        self._slots = FairSlots(self.uids)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._quick_restarts = 0
        self._dir = tempfile.mkdtemp(prefix="code-sandbox-")
        os.chmod(self._dir, 0o711)
        self._socket_path = os.path.join(self._dir, "zygote.sock")

    def start(self) -> None:
        """(Re)start the zygote and wait until it accepts runs."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        self._stop_locked()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self._socket_path)
        os.chmod(self._socket_path, 0o600)
        listener.listen(512)
        # The base interpreter, not the venv's link to it: the zygote needs only the standard
        # library, and only the interpreter's own prefix is visible in the sandbox.
        self.cgroups.sweep()
        binds = [*self.cgroups.bwrap_binds(), *self.binds] if self.isolation == "bwrap" else []
        python = os.path.realpath(sys.executable)
        spec = json.dumps({"version": self.cgroups.version, "dirs": self.cgroups.sandbox_dirs(self.isolation)})
        command = [*_prefix(self.isolation, self.packages), *binds, python, "-I", "-S", "-c", inside.LOADER]
        spawned: queue.Queue[subprocess.Popen[bytes] | BaseException] = queue.Queue()
        # bwrap's --die-with-parent follows the *thread* that spawned it, so the zygote is
        # spawned by a thread that lives exactly as long as the zygote.
        # One prepared init per slot: a full wave of samples starts without waiting for one.
        preludes = json.dumps(sorted(set(PRELUDES.values()) - {""}))
        arguments = [
            str(listener.fileno()),
            spec,
            self._packages_path(),
            str(min(len(self.uids), MAX_SPARES)),
            preludes,
        ]
        threading.Thread(
            target=self._keep, args=([*command, *arguments], listener, spawned), name="code-zygote", daemon=True,
        ).start()  # fmt: skip
        proc = spawned.get()
        if isinstance(proc, BaseException):
            raise SandboxFailure(f"sandbox zygote ({self.isolation}) failed to start: {proc}")
        self._proc = proc
        self._started_at = time.monotonic()
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(OSError), proc.stdin:  # a zygote gone already says nothing below
            proc.stdin.write(ZYGOTE_SOURCE)
        if proc.stdout.readline().strip() != b"zygote ready":
            self._stop_locked()
            raise SandboxFailure(f"sandbox zygote ({self.isolation}) failed to start")
        log.info("code sandbox ready: isolation=%s", self.isolation)

    def _packages_path(self) -> str:
        """Where the zygote finds the programs' packages ("" for none)."""
        return SANDBOX_PATH if self.packages and self.isolation == "bwrap" else self.packages

    def _restart(self) -> None:
        """Restart a dead zygote, once however many runs found it dead.

        The first caller restarts while the others wait on the lock and then find it alive (a
        restart that stopped a zygote just started would fail the runs it had begun). A zygote
        that keeps dying soon after its start is restarted after a growing pause.
        """
        with self._lock:
            if self.alive():
                return
            quick = time.monotonic() - self._started_at < QUICK_RESTART_S
            self._quick_restarts = self._quick_restarts + 1 if quick else 0
            pause = min(RESTART_PAUSE_S * 2 ** (self._quick_restarts - 1), RESTART_PAUSE_MAX_S) if quick else 0.0
            log.warning("code sandbox zygote is gone; restarting it%s", f" in {pause:.1f} s" if pause else "")
            time.sleep(pause)
            self._start_locked()

    @staticmethod
    def _keep(command: list[str], listener: socket.socket, spawned: queue.Queue[Any]) -> None:
        try:
            proc = subprocess.Popen(
                command, pass_fds=[listener.fileno()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
        self.cgroups.remove()
        os.close(self._uid_lock)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @contextlib.contextmanager
    def slot(self, owner: tuple[object, object], timeout: float) -> Iterator[int | None]:
        """Hold one run slot (its uid) for ``owner``'s run (a client's request: ``FairSlots``);
        ``None`` when none came free in time."""
        uid = self._slots.acquire(owner, timeout)
        if uid is None:
            yield None
            return
        try:
            yield uid
        finally:
            self._slots.release(owner, uid)

    def run(
        self,
        job: Job,
        uid: int,
        trusted: TrustedTests | None = None,
        held_bytes: int = 0,
        cancellation: Cancellation | None = None,
    ) -> Iterator[Outcome]:
        """Run ``job`` as ``uid``; yields one outcome per test. Raises ``SandboxFailure``, or
        ``Cancelled`` once ``cancellation`` is (its init killed, and gone, at once).

        ``trusted`` (assert tests: the label's code) is sent apart, after the job. Call-based
        tests are relayed from here (``_relay_calls``), their answers held up to ``held_bytes``
        (never in the job, which the candidate can read: it depends on the expected outputs).
        """
        cancellation = cancellation or Cancellation()
        if cancellation.cancelled:
            raise Cancelled()
        if not self.alive():
            self._restart()
        job = dataclasses.replace(job, uid=uid, gid=uid, test_uid=uid + len(self.uids))
        if job.kind == "call":
            yield from self._relay_calls(job, held_bytes, cancellation)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the init's pid comes with Started
        sock.settimeout(job.sample_s + 10.0)
        # The outcomes come together (``messages.Outbox``): read through a buffer, many cost one read.
        outcomes = sock.makefile("rb")
        init = -1  # the sample's init, as a pidfd (``Started``)
        try:
            try:
                sock.connect(self._socket_path)
                messages.send(sock, job)
                if trusted is not None:  # read by the tests' process alone, never by the candidate's
                    messages.send(sock, trusted)
                init = _started(sock, 1)[0][0]
                cancellation.watch(init)
                while True:
                    message = messages.recv(outcomes)
                    if isinstance(message, messages.Done):
                        return
                    yield message
            except (OSError, EOFError, struct.error, ValueError) as exc:
                raise _failure(exc, cancellation) from exc
        finally:
            if init >= 0:
                cancellation.unwatch(init)
                if cancellation.cancelled:  # its slot is given back with nothing of it left
                    kill_and_wait(init)
                os.close(init)
            outcomes.close()
            sock.close()

    def _relay_calls(self, job: Job, held_bytes: int, cancellation: Cancellation) -> Iterator[Outcome]:
        """Call-based tests: this thread sends the calls and times the answers itself
        (``relay.CallRun``), each candidate a sample's init that became it; another is
        started if one dies. The outcomes come when the sample is done (a run that fails is
        re-run whole), never judged meanwhile: how long judging an answer takes (a right one
        may take longer to compare) would delay the next call, which the candidate can time.
        So its answers are held: at most ``held_bytes``, and at least ``HELD_OUTPUT_FACTOR`` x
        ``keep_bytes``, in all; those past it are output limits."""
        outcomes: list[Outcome] = []
        held = 0
        most = max(held_bytes, HELD_OUTPUT_FACTOR * job.keep_bytes)

        def hold(outcome: Outcome) -> None:
            nonlocal held
            if isinstance(outcome, messages.CallOutcome) and outcome.answer is not None:
                held += len(outcome.answer)
                if held > most:
                    outcome = dataclasses.replace(outcome, failure="output_exceeded", answer=None)
            outcomes.append(outcome)

        # The candidate needs the tests' number only (its CPU rlimit): the calls come from here.
        sent = dataclasses.replace(job, tests=[None] * len(job.tests))

        def start() -> relay.Candidate:
            if cancellation.cancelled:  # one killed is not replaced
                raise Cancelled()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # its pid comes with Started
                sock.settimeout(job.sample_s + 10.0)
                sock.connect(self._socket_path)
                messages.send(sock, sent)
                return InitCandidate(sock, self.cgroups, cancellation)

        try:
            relay.run_calls(job, hold, time.monotonic() + job.sample_s, start)
        except (OSError, EOFError, struct.error, ValueError) as exc:
            raise _failure(exc, cancellation) from exc
        if cancellation.cancelled:  # the outcomes of its killed candidate are none of its own
            raise Cancelled()
        yield from outcomes


def _started(sock: socket.socket, count: int) -> tuple[list[int], messages.Started, int]:
    """The descriptors (``count``) that come with a sample's ``Started``, the message and its
    sender's pid; ``ValueError`` for anything else. Started comes alone (the kernel ends a read at
    descriptors) and names one cgroup."""
    started, fds, pid, rest = messages.recv_with_fds(sock, count)
    if not isinstance(started, messages.Started) or rest or "/" in started.cgroup or started.cgroup.startswith("."):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a {type(started).__name__} where Started was expected")
    return fds, started, pid


def _failure(exc: BaseException, cancellation: Cancellation) -> Exception:
    """What a run that failed with ``exc`` raises: ``Cancelled`` once its request was (its
    init was killed), else ``SandboxFailure`` (no verdict; re-run once)."""
    return Cancelled() if cancellation.cancelled else SandboxFailure(f"sandbox run failed: {exc}")


class InitCandidate(relay.Candidate):
    """A call-based sample's init that became its candidate (``supervisor._become_candidate``),
    as the server sees it: the pidfd and pipes it sent with ``Started`` (``STARTED_FDS``), its
    pid (from the connection's credentials) and its cgroup."""

    def __init__(self, sock: socket.socket, cgroups: cgroups.Cgroups, cancellation: Cancellation) -> None:
        fds, started, pid = _started(sock, len(messages.STARTED_FDS))
        self.pidfd, stdout, stderr, calls_pipe, answers = fds
        super().__init__(pid, calls_pipe, answers, stdout, stderr)
        self.cgroup = (
            SampleCgroup(cgroups.version, cgroups.dirs, started.cgroup) if cgroups.version and started.cgroup else None
        )
        self.cancellation = cancellation
        cancellation.watch(self.pidfd)

    def kill(self) -> float:
        cpu = self.read_cpu()
        kill_and_wait(self.pidfd)
        return cpu

    def out_of_memory(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return self.cgroup is not None and self.cgroup.oom_kills() > 0
        return False

    def close(self) -> None:
        super().close()
        self.cancellation.unwatch(self.pidfd)
        os.close(self.pidfd)
