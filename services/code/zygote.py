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
import gc
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
import typing

# Imported once in the zygote so each forked solution finds them warm.
WARM_MODULES = ("bisect", "collections", "functools", "heapq", "itertools", "math", "random", "re", "string")

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


def _line(out: typing.TextIO, obj: dict) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _call_tests(job: dict, namespace: dict, start: int, out: typing.TextIO) -> None:
    """Call-based tests from ``start`` on, in this one process, a result line each.

    ``ITIMER_PROF`` is re-armed per call, so a call past its CPU time is killed by SIGPROF.
    """
    fn = namespace.get(job["fn_name"])
    if fn is None and "Solution" in namespace:  # LeetCode style
        fn = getattr(namespace["Solution"](), job["fn_name"], None)
    if fn is None:
        raise NameError(f"function {job['fn_name']!r} is not defined")
    _line(out, {"loaded": True})
    for index in range(start, len(job["tests"])):
        signal.setitimer(signal.ITIMER_PROF, job["cpu_s"])
        try:
            line = {"index": index, "result": fn(*job["tests"][index])}
            text = json.dumps(line)
        except BaseException as exc:  # the model's error is this test's verdict
            text = json.dumps({"index": index, "error": f"{type(exc).__name__}: {exc}"[:STDERR_TAIL]})
        signal.setitimer(signal.ITIMER_PROF, 0)
        out.write(text + "\n")
        out.flush()


def _harness(job: dict, start: int) -> None:
    """Body of a test process: compile, run test ``start`` (call-based: all from it), report."""
    out = os.fdopen(RESULT_FD, "w", closefd=True)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)))
    try:
        code = compile(job["code"], "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        _line(out, {"compile_error": f"{type(exc).__name__}: {exc}"})
        os._exit(0)
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    status = 0
    try:
        exec(code, namespace)
        if job["kind"] == "call":
            _call_tests(job, namespace, start, out)
        elif job["kind"] == "assert":
            exec(compile(job["tests"][start], "<tests>", "exec"), namespace)
            entry = job.get("entry_point")
            if entry and callable(namespace.get("check")):
                namespace["check"](namespace[entry])
            _line(out, {"index": start, "result": job["nonce"]})
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # the model's error is its verdict
        status = 1
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"\n{type(exc).__name__}: {exc}"[:STDERR_TAIL])
    for stream in (sys.stdout, sys.stderr, out):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(status)


def _limit(job: dict, tests: int) -> None:
    """Resource limits of a test process running ``tests`` tests (set before dropping root)."""
    cpu = int(job["cpu_s"] * tests) + 1
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


def _start_test(job: dict, start: int, workdir: str) -> tuple[int, dict[int, str]]:
    """Fork one test process; returns its pid and the read ends of its pipes by role."""
    stdin = os.memfd_create("stdin")
    if job["kind"] == "stdin":
        os.write(stdin, str(job["tests"][start]).encode())
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
            _limit(job, len(job["tests"]) - start if job["kind"] == "call" else 1)
            os.chdir(workdir)
            os.setgroups([])
            os.setgid(job["gid"])
            os.setuid(job["uid"])
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            os.environ.clear()
            os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            _harness(job, start)
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


def _run_process(job: dict, start: int, workdir: str, deadline: float, conn: socket.socket) -> int:
    """Run one test process from test ``start``, send a result per test it settled, and
    return the index of the first test still to run.

    Each test gets ``wall_s`` from the previous one's result; call-based tests all run in
    this process until one fails to come back.
    """
    pid, fds = _start_test(job, start, workdir)
    progress = started = time.monotonic()
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": [], "result": []}
    sizes = {"stdout": 0, "stderr": 0, "result": 0}
    caps = {"stdout": job["output_bytes"], "stderr": 1 << 20, "result": job["output_bytes"]}
    pending = b""
    current = start
    loaded = False
    over = timed_out = False
    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    while sel.get_map() and not over:
        remaining = min(progress + job["wall_s"], deadline) - time.monotonic()
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
                over = over or role != "stderr"
                continue
            if role != "result":
                chunks[role].append(data)
                continue
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                try:
                    message = json.loads(line)
                except ValueError:  # the solution wrote to the result pipe itself
                    message = None
                if not isinstance(message, dict):
                    chunks["result"].append(line)
                elif message.get("index") == current:
                    send_msg(conn, _settled(current, line))
                    current += 1
                    progress = time.monotonic()
                elif message.get("loaded"):
                    loaded = True
                else:
                    chunks["result"].append(line)
    sel.close()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    _clean_up(job["uid"])
    for fd in fds:
        os.close(fd)
    if current > start and job["kind"] != "stdin":
        return current
    exit_code = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    over_cpu = exit_code in (-signal.SIGXCPU, -signal.SIGPROF) or (job["kind"] != "call" and cpu > job["cpu_s"])
    ended = {
        "exit": exit_code,
        "timed_out": timed_out or over_cpu,
        "output_exceeded": over,
        "cpu_s": round(cpu, 4),
        "wall_s": round(time.monotonic() - started, 4),
        "stdout": b"".join(chunks["stdout"]).decode(errors="replace"),
        "stderr": b"".join(chunks["stderr"])[-STDERR_TAIL:].decode(errors="replace"),
        "result": b"".join(chunks["result"]).decode(errors="replace"),
    }
    # A call-based process that died before its function was found failed for every test.
    last = len(job["tests"]) if job["kind"] == "call" and not loaded else current + 1
    for index in range(current, last):
        send_msg(conn, {**ended, "index": index})
    return last


def _settled(index: int, line: bytes) -> dict:
    """A test its process reported itself (a call's result, or an assert run's nonce)."""
    return {"index": index, "exit": 0, "timed_out": False, "output_exceeded": False, "stdout": "", "stderr": "",
            "result": line.decode(errors="replace")}  # fmt: skip


def supervise(conn: socket.socket) -> None:
    """One sample: run its tests in order, stream a result per test, clean up."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    job = recv_msg(conn)
    deadline = time.monotonic() + job["sample_s"]
    workdir = os.path.join(job["tmp_root"], f"run-{os.getpid()}")
    os.mkdir(workdir, 0o700)
    os.chown(workdir, job["uid"], job["gid"])
    try:
        index = 0
        while index < len(job["tests"]):
            if time.monotonic() >= deadline:
                send_msg(conn, {"index": index, "skipped": True})
                index += 1
                continue
            index = _run_process(job, index, workdir, deadline, conn)
    finally:
        _clean_up(job["uid"])
        shutil.rmtree(workdir, ignore_errors=True)
    send_msg(conn, {"done": True})


def main() -> None:
    for name in WARM_MODULES:
        __import__(name)
    gc.freeze()  # forked children then copy fewer pages when their collector runs
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
