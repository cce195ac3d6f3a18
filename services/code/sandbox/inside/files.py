"""A ``/run_code`` run's files (stdlib only): placed in the sample's ``/tmp`` before its test,
fetched from it after.

Paths are relative to ``/tmp``, the test's working directory, as SandboxFusion's are to its
run's directory. The supervisor (root) places them before any program runs, owned by the
slot's uid, and reads the fetched ones after the sample's processes are gone, opening each
component without following a link (the program may have made any of them one) and taking
regular files only, up to the job's ``fetch_bytes`` in all.
"""

from __future__ import annotations

import binascii
import os
import stat

from services.code.sandbox.inside.compiled_programs import ARTIFACT_DIR
from services.code.sandbox.inside.messages import Fetched, Job

ROOT = "/tmp"
# The longest file name Linux file systems take (NAME_MAX).
MAX_FILE_NAME_BYTES = 255
# The build's directory in the sample's /tmp is the server's.
RESERVED = os.path.basename(ARTIFACT_DIR)
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def components(path: str) -> list[str] | None:
    """``path``'s components under ``/tmp``, or None when it is not a plain relative path there
    (a name longer than a file's may be included: the file could not be made)."""
    pieces = [piece for piece in path.split("/") if piece not in ("", ".")]
    if path.startswith("/") or "\0" in path or not pieces or ".." in pieces or pieces[0] == RESERVED:
        return None
    if any(len(piece.encode(errors="surrogatepass")) > MAX_FILE_NAME_BYTES for piece in pieces):
        return None
    return pieces


def place(job: Job) -> None:
    """Write the job's files (base64) under ``/tmp``, its directories made on the way, all the
    slot's uid's. Raises ``OSError`` or ``ValueError``."""
    for path, encoded in job.files.items():
        pieces = components(path)
        if pieces is None:
            raise ValueError(f"not a path under {ROOT}: {path[:100]!r}")
        data = binascii.a2b_base64(encoded, strict_mode=True)
        directory = _directory(pieces[:-1], job)
        try:
            fd = os.open(pieces[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=directory)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchown(fd, job.uid, job.gid)
            finally:
                os.close(fd)
        finally:
            os.close(directory)


def _directory(pieces: list[str], job: Job) -> int:
    """A descriptor of the directory ``pieces`` under ``/tmp``, made (the uid's) where missing."""
    fd = os.open(ROOT, _DIRECTORY)
    for piece in pieces:
        try:
            os.mkdir(piece, 0o755, dir_fd=fd)
            os.chown(piece, job.uid, job.gid, dir_fd=fd, follow_symlinks=False)
        except FileExistsError:
            pass
        try:
            inner = os.open(piece, _DIRECTORY, dir_fd=fd)
        finally:
            os.close(fd)
        fd = inner
    return fd


def fetch(job: Job) -> Fetched:
    """The job's ``fetch`` files that are regular files, base64, while their bytes fit in
    ``fetch_bytes``; the others (missing, not regular, a link on the way, past the limit) left out."""
    found: dict[str, str] = {}
    left = job.fetch_bytes
    for path in job.fetch:
        pieces = components(path)
        data = None if pieces is None else _read(pieces, left)
        if data is not None:
            left -= len(data)
            found[path] = binascii.b2a_base64(data, newline=False).decode()
    return Fetched(found)


def _read(pieces: list[str], most: int) -> bytes | None:
    try:
        directory = os.open(ROOT, _DIRECTORY)
        for piece in pieces[:-1]:
            try:
                inner = os.open(piece, _DIRECTORY, dir_fd=directory)
            finally:
                os.close(directory)
            directory = inner
        try:
            fd = os.open(pieces[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        finally:
            os.close(directory)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > most:
            return None
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, most + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > most:
                return None
        return b"".join(chunks)
    finally:
        os.close(fd)
