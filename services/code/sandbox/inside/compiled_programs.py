"""Programs in compiled languages, in the sandbox: their build and their runs (stdlib only).

A *build* job (``kind == "build"``) runs its compiler as one stdin test of the sample: the
slot's uid, the sample's namespaces, cgroup and rlimits, its own CPU, wall and output limits.
The compiler may start processes (its cgroup's task limit bounds them); it reads the source
from the sample's ``/tmp`` and writes there. When it succeeds, this (trusted) supervisor
copies what it wrote, regular files only and bounded, into the service's compile cache
(``job.install``), where no program can write. A *run* job's supervisor mounts that entry
read-only at ``ARTIFACT_DIR`` in the sample's ``/tmp`` (``mount_artifact``) and each test
execs the program there, refused new processes as a Python candidate is.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import time
import typing

from services.code.sandbox.inside import messages
from services.code.sandbox.inside.messages import RESULT_FD, Job, Skipped, StdinOutcome

# Where a sample's build is shown to its tests, read-only (in the sample's /tmp, mounted by its
# supervisor over a root-owned directory: the program can neither change nor replace it).
ARTIFACT_DIR = "/tmp/.judge"
# Where a build's compiler leaves what it built (all of it goes into the cache entry).
OUTPUT_DIR = "/tmp/out"
# What a custom checker reads: the test's input, the program's output, the answer.
CHECK_FILES = ("/tmp/check/input", "/tmp/check/output", "/tmp/check/answer")
# A Kattis output validator's feedback directory (its judge messages, which this judge does
# not read): the checker's own.
FEEDBACK_DIR = "/tmp/check/feedback"
# The most a build may leave in the cache: bytes and files (Java writes a file per class).
INSTALL_BYTES = 64 << 20
INSTALL_FILES = 1024
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REMOUNT = 1, 2, 4, 1 << 12, 1 << 5
_LIBC = ctypes.CDLL(None, use_errno=True)


def mount_artifact(job: Job) -> None:
    """Show the job's build (a cache entry) read-only at ``ARTIFACT_DIR``, in the sample's own
    mount namespace (after ``confine.private_namespaces``)."""
    if not job.artifact:
        return
    os.mkdir(ARTIFACT_DIR, 0o755)
    target = ARTIFACT_DIR.encode()
    _mount(job.artifact.encode(), target, MS_BIND, "bind the build")
    _mount(b"none", target, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "make the build read-only")


def _mount(source: bytes, target: bytes, flags: int, what: str) -> None:
    if _LIBC.mount(source, target, None, flags, None) != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def may_start_processes(job: Job) -> bool:
    """Whether a test process of ``job`` may start processes: a compiled program (not its
    compiler) may start threads but no process; a Python program may fork."""
    return not job.command or job.kind == "build"


def body(job: Job) -> typing.Callable[[], None]:
    """What a test process of a compiled program (or a build's compiler) runs: it execs the
    job's command, with no fd but its stdin, stdout and stderr (started by ``confine.spawn``
    with ``may_start_processes``)."""

    def run() -> None:
        os.close(RESULT_FD)
        os.environ.update(job.env)
        try:
            os.execve(job.command[0], job.command, dict(os.environ))
        except OSError as exc:
            os.write(2, f"cannot run {job.command[0]}: {exc}".encode())
        os._exit(127)

    return run


class _Held:
    """Stands for the server's connection: keeps the outcome a test sends."""

    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


def build(job: Job, conn: typing.Any, run_test: typing.Callable[[typing.Any], int]) -> None:
    """Compile the job's source (``run_test`` runs the compiler as stdin test 0, sending its
    outcome on the connection it gets) and install what it built; send the outcome, whose
    ``result`` holds the compile error when there is one."""
    uid = job.uid
    for directory in (os.path.dirname(job.source_path), OUTPUT_DIR):
        os.makedirs(directory, 0o700, exist_ok=True)
        os.chown(directory, uid, uid)
    fd = os.open(job.source_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "w", encoding="utf-8", errors="surrogatepass") as file:
        file.write(job.code)
    os.chown(job.source_path, uid, uid)
    held = _Held()
    run_test(held)
    outcome = StdinOutcome(**_fields(held.data))
    failed = outcome.timed_out or outcome.output_exceeded or outcome.exit != 0 or outcome.over_memory
    if failed:
        why = next((w for w, hit in (("time", outcome.timed_out), ("output", outcome.output_exceeded),
                                      ("memory", outcome.over_memory)) if hit), "")  # fmt: skip
        message = (f"the compiler exceeded its {why} limit\n" if why else "") + (outcome.stdout + outcome.stderr)
        outcome.result = json.dumps({"compile_error": message[-8192:]})
    else:
        try:
            install(OUTPUT_DIR, job.install)
        except OSError as exc:
            outcome.result = json.dumps({"compile_error": f"the build's output was refused: {exc}"})
    messages.send(conn, outcome)


def check(job: Job, conn: typing.Any, deadline: float, run_test: typing.Callable[[int], int]) -> None:
    """A label's checker on each test (``job.checks``): its three files written here (root's,
    read-only to the checker), then ``run_test`` runs it and sends its outcome."""
    directory = os.path.dirname(CHECK_FILES[0])
    os.mkdir(directory, 0o755)
    os.mkdir(FEEDBACK_DIR, 0o700)
    os.chown(FEEDBACK_DIR, job.uid, job.uid)
    for index, contents in enumerate(job.checks):
        if time.monotonic() >= deadline:
            messages.send(conn, Skipped(index))
            continue
        for path, text in zip(CHECK_FILES, contents, strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with open(fd, "w", encoding="utf-8", errors="surrogatepass") as file:
                file.write(text)
        run_test(index)


def _fields(data: bytes) -> dict[str, typing.Any]:
    fields = json.loads(data[4:])
    fields.pop("type")
    return fields


def install(source: str, target: str) -> None:
    """Copy the regular files and directories under ``source`` (written by the compiler's uid:
    no link is followed) to ``target``, atomically, root-owned and read-only to others."""
    if os.path.isdir(target):
        return  # built meanwhile by another sample: the same source, the same build
    partial = f"{target}.part-{os.getpid()}"
    os.mkdir(partial, 0o755)
    totals = [0, 0]
    try:
        _copy_tree(source, partial, totals)
        os.rename(partial, target)
    except BaseException:
        _remove_tree(partial)
        if os.path.isdir(target):  # another sample's build of it won the race
            return
        raise


def _copy_tree(source: str, target: str, totals: list[int]) -> None:
    with os.scandir(source) as entries:
        for entry in entries:
            totals[1] += 1
            if totals[1] > INSTALL_FILES:
                raise OSError(f"more than {INSTALL_FILES} files")
            path, into = entry.path, os.path.join(target, entry.name)
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(into, 0o755)
                _copy_tree(path, into, totals)
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    continue
                totals[0] += info.st_size
                if totals[0] > INSTALL_BYTES:
                    raise OSError(f"more than {INSTALL_BYTES >> 20} MiB")
                out = os.open(into, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
                try:
                    while chunk := os.read(fd, 1 << 20):
                        os.write(out, chunk)
                finally:
                    os.close(out)
            finally:
                os.close(fd)


def _remove_tree(path: str) -> None:
    if not os.path.isdir(path):
        return
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(entry.path)
            else:
                os.unlink(entry.path)
    os.rmdir(path)
