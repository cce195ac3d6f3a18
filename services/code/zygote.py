"""The warm fork server that runs inside the sandbox namespaces (stdlib only, no repo imports).

Started once per worker (by ``sandbox.Sandbox``) as ``python -I -S -c <this source> <fd>``,
where ``fd`` is a listening Unix socket made by the server. Forking a warm interpreter costs a
few milliseconds where a fresh ``python3`` costs over 100 ms (DESIGN 6).

Per connection the zygote forks a *supervisor* (root, trusted): it reads one sample (the code
and its test inputs, never the expected outputs), forks one *test process* per test and
streams back what each produced. A test process drops to the slot's unprivileged uid, limits
itself with rlimits, runs in the sample's private temp dir with a clean environment, and is
killed with everything it started (every process of its uid) at its deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import sys
import time

# Imported once in the zygote so each forked solution finds them warm.
WARM_MODULES = ("bisect", "collections", "functools", "heapq", "itertools", "math", "random", "re", "string", "typing")

PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
RESULT_FD = 3
STDERR_TAIL = 4096


def send_msg(sock: socket.socket, obj: object) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def recv_msg(sock: socket.socket) -> dict:
    (length,) = struct.unpack("!I", recv_exact(sock, 4))
    return json.loads(recv_exact(sock, length))


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(option, value, 0, 0, 0)


def _harness(job: dict, test: object) -> None:
    """Body of a test process: compile, run, report (never returns)."""
    out = os.fdopen(RESULT_FD, "w", closefd=True)
    nonce = job.get("nonce", "")
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)))
    try:
        code = compile(job["code"], "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        out.write(json.dumps({"compile_error": f"{type(exc).__name__}: {exc}"}))
        out.flush()
        os._exit(0)
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    status = 0
    try:
        exec(code, namespace)
        if job["kind"] == "call":
            fn = namespace.get(job["fn_name"])
            if fn is None and "Solution" in namespace:  # LeetCode style
                fn = getattr(namespace["Solution"](), job["fn_name"], None)
            if fn is None:
                raise NameError(f"function {job['fn_name']!r} is not defined")
            result = json.dumps({"result": fn(*test)})
            out.write(result)
        elif job["kind"] == "assert":
            exec(compile(test, "<tests>", "exec"), namespace)
            entry = job.get("entry_point")
            if entry and callable(namespace.get("check")):
                namespace["check"](namespace[entry])
            out.write(json.dumps({"result": nonce}))
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # the model's error is its verdict
        status = 1
        kind = "MemoryError" if isinstance(exc, MemoryError) else type(exc).__name__
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"\n{kind}: {exc}"[:STDERR_TAIL])
    for stream in (sys.stdout, sys.stderr, out):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(status)


def _limit(job: dict) -> None:
    """Resource limits of a test process (set while still root, before dropping the uid)."""
    cpu = int(job["cpu_s"]) + 1
    memory = job["memory_bytes"]
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_DATA, (memory, memory)),
        (resource.RLIMIT_NPROC, (job["nproc"], job["nproc"])),
        (resource.RLIMIT_NOFILE, (job["nofile"], job["nofile"])),
        (resource.RLIMIT_FSIZE, (job["fsize"], job["fsize"])),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_STACK, (64 << 20, 64 << 20)),
    ):
        resource.setrlimit(res, value)


def _start_test(job: dict, test: object, workdir: str) -> tuple[int, dict[int, str]]:
    """Fork one test process; returns its pid and the read ends of its pipes by role."""
    stdin = os.memfd_create("stdin")
    if job["kind"] == "stdin":
        os.write(stdin, str(test).encode())
        os.lseek(stdin, 0, os.SEEK_SET)
    pipes = {role: os.pipe() for role in ("stdout", "stderr", "result")}
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(stdin, 0)
            os.dup2(pipes["stdout"][1], 1)
            os.dup2(pipes["stderr"][1], 2)
            os.dup2(pipes["result"][1], RESULT_FD)
            os.closerange(RESULT_FD + 1, 65536)
            _limit(job)
            os.chdir(workdir)
            os.setgroups([])
            os.setgid(job["gid"])
            os.setuid(job["uid"])
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            os.environ.clear()
            os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            _harness(job, test)
        finally:
            os._exit(70)
    os.close(stdin)
    for _, write_end in pipes.values():
        os.close(write_end)
    return pid, {read_end: role for role, (read_end, _) in pipes.items()}


def _kill_uid(uid: int) -> None:
    """Kill every process of ``uid``: a helper with that uid signals -1 until none is left."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(uid)
            for _ in range(1000):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _clean_up(uid: int) -> None:
    """Leave nothing of a test running.

    This supervisor is the subreaper of everything its tests started, so once it has no child
    left, nothing is left; otherwise every process of the test's uid is killed and reaped.
    """
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            _kill_uid(uid)
            with contextlib.suppress(ChildProcessError):
                while True:
                    os.waitpid(-1, 0)


def _run_test(job: dict, test: object, workdir: str, deadline: float) -> dict:
    """Run one test to completion or its deadline; what it printed, how it ended."""
    start = time.monotonic()
    pid, fds = _start_test(job, test, workdir)
    wall_end = min(start + job["wall_s"], deadline)
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": [], "result": []}
    sizes = {"stdout": 0, "stderr": 0, "result": 0}
    caps = {"stdout": job["output_bytes"], "stderr": 1 << 20, "result": job["output_bytes"]}
    over = False
    timed_out = False
    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    while sel.get_map():
        remaining = wall_end - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for key, _ in sel.select(remaining):
            role = fds[key.fd]
            data = os.read(key.fd, 1 << 16)
            if not data:
                sel.unregister(key.fd)
                continue
            sizes[role] += len(data)
            if sizes[role] > caps[role]:
                if role != "stderr":
                    over = True
                continue
            chunks[role].append(data)
        if over:
            break
    sel.close()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    _clean_up(job["uid"])
    for fd in fds:
        os.close(fd)
    cpu = usage.ru_utime + usage.ru_stime
    return {
        "exit": os.waitstatus_to_exitcode(status),
        "timed_out": timed_out or cpu > job["cpu_s"],
        "output_exceeded": over,
        "cpu_s": round(cpu, 4),
        "wall_s": round(time.monotonic() - start, 4),
        "stdout": b"".join(chunks["stdout"]).decode(errors="replace"),
        "stderr": b"".join(chunks["stderr"])[-STDERR_TAIL:].decode(errors="replace"),
        "result": b"".join(chunks["result"]).decode(errors="replace"),
    }


def supervise(conn: socket.socket) -> None:
    """One sample: run its tests in order, stream a result per test, clean up."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    job = recv_msg(conn)
    deadline = time.monotonic() + job["sample_s"]
    workdir = os.path.join(job["tmp_root"], f"run-{os.getpid()}")
    os.mkdir(workdir, 0o700)
    os.chown(workdir, job["uid"], job["gid"])
    try:
        for index, test in enumerate(job["tests"]):
            if time.monotonic() >= deadline:
                send_msg(conn, {"index": index, "skipped": True})
                continue
            result = _run_test(job, test, workdir, deadline)
            result["index"] = index
            send_msg(conn, result)
    finally:
        _clean_up(job["uid"])
        shutil.rmtree(workdir, ignore_errors=True)
    send_msg(conn, {"done": True})


def main() -> None:
    for name in WARM_MODULES:
        __import__(name)
    listener = socket.socket(fileno=int(sys.argv[1]))
    os.makedirs(sys.argv[2], mode=0o711, exist_ok=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    print("zygote ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                supervise(conn)
            except BaseException:  # the server sees the closed connection
                code = 1
            finally:
                os._exit(code)
        conn.close()


if __name__ == "__main__":
    main()
