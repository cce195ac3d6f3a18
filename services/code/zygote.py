"""The warm fork server that runs inside the sandbox namespaces (stdlib only, no repo imports).

Started once per worker (by ``sandbox.Sandbox``) as ``python -I -S -c <this source> <fd>``,
where ``fd`` is a listening Unix socket made by the server. Forking a warm interpreter costs a
few milliseconds where a fresh ``python3`` costs over 100 ms (docs/ARCHITECTURE.md §8).

Per connection the zygote forks a *supervisor* (root, trusted): it reads one sample (the code
and its test inputs, never the expected outputs) and streams back what each test produced.
Stdin tests: one *test process* per test. Call-based and assert tests: a *candidate process*
runs the code and answers calls as plain data (``CallRun``); assert tests' code arrives after
it was forked, to a *tests' process* alone. Processes that run the code drop to the slot's
unprivileged uid, limit themselves with rlimits, run in the sample's ``/tmp`` with a clean
environment, and are killed with everything they started (every process of the uid). Each
supervisor first takes a mount and an IPC namespace of its own: a size-limited tmpfs on
``/tmp`` and ``/dev/shm`` and bounded SysV IPC, all gone with the sample's last process.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import ctypes
import fcntl
import gc
import importlib
import io
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
import types
import typing

# Imported once in the zygote so each forked solution finds them warm.
WARM_MODULES = ("bisect", "collections", "functools", "heapq", "itertools", "math", "random", "re", "string")

PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 1 << 12, 1 << 14, 1 << 18
TMP_INODES = 4096
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
RESULT_FD = 3
STDERR_TAIL = 4096
# What is kept of the result pipe's lines that are not results (a compile error, garbage).
RESULT_KEEP = 1 << 16
# The candidate's process reads calls on fd 3 and answers on fd 4; the tests' process sends
# calls and reports on fd 3, reads answers on fd 4, and its tests once from fd 5.
CALLS_FD, ANSWERS_FD = 3, 4
TESTER_OUT_FD, TESTER_IN_FD, TRUSTED_FD = 3, 4, 5
LOADED = b'["loaded"]\n'
# How often the candidate's CPU time is read while a test runs; a tests' process gets this
# much more wall time than a test to report after its candidate was stopped.
CPU_TICK_S = 0.05
TESTER_GRACE_S = 2.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def _private_tmp(job: dict) -> None:
    """Give this supervisor (and so its sample) its own ``/tmp`` and SysV IPC.

    A tmpfs of ``tmp_bytes`` on ``/tmp``, also mounted on ``/dev/shm``, owned by the sample's
    uid: the only place it can write, bounded, and gone with the sample's last process, like
    its IPC namespace, whose shared memory is limited to ``tmp_bytes`` too.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    size = job["tmp_bytes"]
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    options = f"size={size},nr_inodes={TMP_INODES},mode=0700,uid={job['uid']},gid={job['gid']}".encode()
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount /tmp")
    if os.path.isdir("/dev/shm"):
        check(libc.mount(b"/tmp", b"/dev/shm", None, MS_BIND, None), "mount /dev/shm")
    for name, value in (("shmmax", size), ("shmall", size // 4096), ("shmmni", 64), ("msgmni", 16)):
        with open(f"/proc/sys/kernel/{name}", "w") as sysctl:
            sysctl.write(str(value))


def _line(out: typing.TextIO, obj: dict) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _fresh_std_streams() -> None:
    """New ``sys.stdin``/``stdout``/``stderr`` over fds 0-2 (the ones this body was given), which
    stay open if the candidate closes the objects."""
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)))


def _compile_or_exit(job: dict, out: typing.TextIO, report: typing.Callable[[str], object]) -> types.CodeType:
    """The candidate's code compiled; a compile error is written to ``out`` as ``report(message)``
    and ends the process."""
    try:
        return compile(job["code"], "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        _line(out, report(f"{type(exc).__name__}: {exc}"))
        os._exit(0)


# -- plain data: what crosses between the candidate's process and the tests ----------------
# JSON, with the containers JSON lacks tagged as one-key objects: {"t": [...]} a tuple,
# {"s": [...]} a set, {"f": [...]} a frozenset, {"d": [[key, value], ...]} a dict, {"b": hex}
# bytes. Decoding builds fresh builtin objects, so nothing the candidate defined survives it.
SCALARS = (type(None), bool, int, float, str)
UNTAG = {"t": tuple, "s": set, "f": frozenset, "d": dict, "b": bytes.fromhex}


def to_plain(value: object) -> object:
    """``value`` as JSON-ready plain data; a ``TypeError`` for anything else (exact types only)."""
    kind = type(value)
    if kind in SCALARS:
        return value
    if kind is list:
        return [to_plain(item) for item in value]
    if kind is tuple:
        return {"t": [to_plain(item) for item in value]}
    if kind is dict:
        return {"d": [[to_plain(k), to_plain(v)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {"s" if kind is set else "f": [to_plain(item) for item in value]}
    if kind is bytes:
        return {"b": value.hex()}
    raise TypeError(f"a {kind.__name__} is not plain data")


def _untag(obj: dict) -> object:
    if len(obj) != 1:
        raise ValueError("not plain data")
    ((tag, items),) = obj.items()
    if tag not in UNTAG or not isinstance(items, str if tag == "b" else list):
        raise ValueError("not plain data")
    return UNTAG[tag](items)


def from_plain(text: str | bytes) -> object:
    """Plain data back from its JSON text (a ``ValueError`` or ``TypeError`` if it is not)."""
    return json.loads(text, object_hook=_untag)


# -- the candidate's process: the graded code, answering calls as plain data ---------------
# x86-64 and arm64 syscall numbers; new processes are refused, threads are not.
SECCOMP_ARCH = {"x86_64": (0xC000003E, 56, 57, 58), "aarch64": (0xC00000B7, 220, 0xFFFFFFFF, 0xFFFFFFFF)}
CLONE3, CLONE_THREAD, EPERM, ENOSYS = 435, 0x10000, 1, 38
# Classic BPF instructions of the filters (load word, jump if equal / greater or equal / bits
# set, return) and the filters' verdicts.
BPF_LD, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_ALLOW, SECCOMP_KILL = 0x7FFF0000, 0x80000000
SECCOMP_EPERM, SECCOMP_ENOSYS = 0x50000 | EPERM, 0x50000 | ENOSYS


def _forbid_new_processes() -> None:
    """A seccomp filter: no fork, vfork or clone without ``CLONE_THREAD`` (``clone3`` answers
    ENOSYS, so threads fall back to ``clone``). The candidate's process is then the only one
    its code runs in, and its CPU time, threads included, is all in ``/proc/<pid>/stat``."""
    arch, clone, fork, vfork = SECCOMP_ARCH[os.uname().machine]
    ld, jeq, jge, jset, ret = BPF_LD, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET
    allow, kill = SECCOMP_ALLOW, SECCOMP_KILL
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill),  # another ABI (i386) is killed
        (ld, 0, 0, 0), (jge, 9, 0, 0x40000000),  # x32 numbers: killed
        (jeq, 7, 0, CLONE3), (jeq, 5, 0, fork), (jeq, 4, 0, vfork), (jeq, 0, 2, clone),
        (ld, 0, 0, 16), (jset, 0, 1, CLONE_THREAD),
        (ret, 0, 0, allow), (ret, 0, 0, SECCOMP_EPERM), (ret, 0, 0, SECCOMP_ENOSYS), (ret, 0, 0, kill),
    ]  # fmt: skip

    _seccomp(program)


# Namespace syscalls by ABI: unshare, setns; and every CLONE_NEW* flag of clone.
NAMESPACE_CALLS = {"x86_64": (272, 308), "aarch64": (97, 268)}
CLONE_NEW_ANY = 0x7E020000


def _forbid_namespaces() -> None:
    """A seccomp filter: no ``unshare``, ``setns`` or ``clone`` into new namespaces
    (``clone3`` answers ENOSYS, so threads and ``posix_spawn`` fall back to ``clone``).
    Unprivileged, a user namespace would give a program its own mounts: a tmpfs beyond
    ``tmp_bytes`` and beyond its rlimits."""
    arch, clone, _, _ = SECCOMP_ARCH[os.uname().machine]
    unshare, setns = NAMESPACE_CALLS[os.uname().machine]
    ld, jeq, jge, jset, ret = BPF_LD, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET
    allow, kill, eperm, enosys = SECCOMP_ALLOW, SECCOMP_KILL, SECCOMP_EPERM, SECCOMP_ENOSYS
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill),  # another ABI (i386) is killed
        (ld, 0, 0, 0), (jge, 9, 0, 0x40000000),  # x32 numbers: killed
        (jeq, 6, 0, unshare), (jeq, 5, 0, setns), (jeq, 5, 0, CLONE3), (jeq, 0, 2, clone),
        (ld, 0, 0, 16), (jset, 1, 0, CLONE_NEW_ANY),
        (ret, 0, 0, allow), (ret, 0, 0, eperm), (ret, 0, 0, enosys), (ret, 0, 0, kill),
    ]  # fmt: skip
    _seccomp(program)


def _seccomp(program: list[tuple[int, int, int, int]]) -> None:
    """Install a seccomp filter (BPF instructions: code, jump if true, jump if false, k)."""

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*(Filter(*insn) for insn in program))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program), filters)), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


def _describe(namespace: dict, names: list) -> dict:
    """What the candidate's namespace holds under ``names``: callables, modules, plain values."""
    found: dict = {}
    for name in names:
        if not isinstance(name, str) or name not in namespace:
            continue
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            found[name] = ["module", value.__name__]
        elif callable(value):
            found[name] = ["callable"]
        else:
            with contextlib.suppress(Exception):
                to_plain(value)
                found[name] = ["value", value]
    return found


def _resolve(namespace: dict, name: str, instances: dict) -> typing.Callable:
    """The candidate's function ``name``, or that method of a LeetCode-style ``Solution``."""
    if callable(namespace.get(name)):
        return namespace[name]
    if "Solution" in namespace:
        if "Solution" not in instances:
            instances["Solution"] = namespace["Solution"]()
        method = getattr(instances["Solution"], name, None)
        if callable(method):
            return method
    raise NameError(f"function {name!r} is not defined")


def _serve_calls(job: dict) -> None:
    """Body of the candidate's process: run the code, then answer each call from fd 3 on fd 4.

    A call is a line ``["call", name, args, kwargs]`` or ``["describe", names]`` in plain data.
    First line out: ``["loaded"]`` or ``["compile_error", message]``; then one per call:
    ``["result", value]`` or ``["error", exception type, message]``. Everything here is the
    candidate's to tamper with: it decides only what it answers.
    """
    calls = os.fdopen(CALLS_FD, "rb", buffering=1 << 16)
    out = os.fdopen(ANSWERS_FD, "w", closefd=True)
    _fresh_std_streams()
    code = _compile_or_exit(job, out, lambda message: ["compile_error", message])
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
        out.write(LOADED.decode())
        out.flush()
        instances: dict = {}
        for request in calls:
            try:
                verb, *call = from_plain(request)
                if verb == "describe":
                    result = _describe(namespace, call[0])
                else:
                    name, args, kwargs = call
                    result = _resolve(namespace, name, instances)(*args, **kwargs)
                text = json.dumps(["result", to_plain(result)])
            except BaseException as exc:  # the candidate's error is this call's answer
                text = json.dumps(["error", type(exc).__name__, str(exc)[:STDERR_TAIL]])
            out.write(text + "\n")
            out.flush()
    except BaseException as exc:  # its code failed to load (or left): every later call fails
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"\n{type(exc).__name__}: {exc}"[:STDERR_TAIL])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(1)


# -- the tests' process: the label's trusted code, calling the candidate through proxies -----
# Exceptions a candidate's error may be re-raised as in the tests (by name); any other is a
# CandidateError. StopIteration and its kin never are: raised into a test's loop they would
# end it early, unchecked.
RAISABLE = (
    "ArithmeticError", "AssertionError", "AttributeError", "IndexError", "KeyError", "LookupError", "MemoryError",
    "NameError", "NotImplementedError", "OverflowError", "RecursionError", "RuntimeError", "TypeError",
    "UnboundLocalError", "ValueError", "ZeroDivisionError",
)  # fmt: skip


class CandidateError(Exception):
    """A call of the candidate failed: it raised, died, ran out of time or returned non-data."""


def _bound_names(tree: ast.AST) -> set:
    """Every name the trusted code binds anywhere (assigned, defined, imported, a parameter)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return bound


class Candidate:
    """The tests' side of the calls: a request line out on fd 3, its answer in on fd 4."""

    def __init__(self) -> None:
        self.out = os.fdopen(TESTER_OUT_FD, "wb", buffering=0)
        self.answers = os.fdopen(TESTER_IN_FD, "rb", buffering=1 << 16)

    def ask(self, request: list) -> object:
        """Send a call, wait for its answer: the value, rebuilt here; or an exception raised."""
        self.out.write(b"C" + json.dumps(to_plain(request)).encode() + b"\n")
        line = self.answers.readline()
        try:
            answer = from_plain(line)
        except (ValueError, TypeError, RecursionError, MemoryError):
            answer = None
        if not isinstance(answer, list) or not answer:
            raise CandidateError("the candidate answered something that is not plain data")
        if answer[0] == "result" and len(answer) == 2:
            return answer[1]
        error = str(answer[1]) if answer[0] == "error" and len(answer) > 1 else "CandidateError"
        exception = getattr(builtins, error) if error in RAISABLE else CandidateError
        raise exception(f"{error} in the candidate: {answer[2:]}"[:STDERR_TAIL])

    def proxy(self, name: str) -> typing.Callable:
        def call(*args: object, **kwargs: object) -> object:
            return self.ask(["call", name, list(args), kwargs])

        call.__name__ = call.__qualname__ = name
        return call

    def report(self, index: int, error: str | None) -> None:
        report = {"index": index, "passed": True} if error is None else {"index": index, "error": error}
        self.out.write(b"R" + json.dumps(report).encode() + b"\n")


def _candidate_names(candidate: Candidate, namespace: dict, free: set) -> None:
    """Bind the names the tests take from the candidate: its callables as proxies, its stdlib
    modules imported here, its plain values as copies. Nothing the trusted code binds itself."""
    found = candidate.ask(["describe", sorted(free)])
    if not isinstance(found, dict):
        raise CandidateError("the candidate described its names in something that is not plain data")
    for name, (kind, *value) in ((n, v) for n, v in found.items() if n in free and isinstance(v, list) and v):
        if kind == "callable":
            namespace[name] = candidate.proxy(name)
        elif kind == "module" and value == [name] and name in sys.stdlib_module_names:  # its own `import name`
            namespace[name] = importlib.import_module(name)
        elif kind == "value" and value:
            namespace[name] = value[0]


def _run_tests(trusted: dict) -> None:
    """Body of the tests' process: the label's setup and tests, a report line per test.

    Runs as a uid of its own, so the candidate's process can neither signal, trace nor read
    it; its reports go to the supervisor on a pipe only it holds.
    """
    candidate = Candidate()
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    entry = trusted["entry_point"]
    try:
        setup = ast.parse(trusted["setup"], "<setup>")
        tests = [ast.parse(test, "<tests>") for test in trusted["tests"]]
        exec(compile(setup, "<setup>", "exec"), namespace)
        loads = {node.id for tree in (setup, *tests) for node in ast.walk(tree) if isinstance(node, ast.Name)}
        bound = set().union(*map(_bound_names, (setup, *tests)), dir(builtins), namespace)
        free = (loads - bound) | ({entry} if entry else set())
        _candidate_names(candidate, namespace, free)
        if entry:  # always the candidate's, never a stub the setup (a prompt) defined
            namespace[entry] = candidate.proxy(entry)
    except BaseException as exc:  # the candidate failed to load, or the label's setup failed
        for index in range(len(trusted["tests"])):
            candidate.report(index, type(exc).__name__)
        return
    for index in range(len(tests)):
        error = None
        try:
            namespace.pop("check", None)
            exec(compile(tests[index], "<tests>", "exec"), namespace)
            if entry and callable(namespace.get("check")):
                namespace["check"](namespace[entry])
        except BaseException as exc:  # the test's verdict
            error = type(exc).__name__
        candidate.report(index, error)


def _harness(job: dict) -> None:
    """Body of a stdin test process: compile (a compile error is the one thing reported on
    fd 3, which is closed before the program runs: nothing it writes counts but its stdout), run."""
    out = os.fdopen(RESULT_FD, "w", closefd=True)
    _fresh_std_streams()
    code = _compile_or_exit(job, out, lambda message: {"compile_error": message})
    out.close()
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    status = 0
    try:
        exec(code, namespace)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # the model's error is its verdict
        status = 1
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"\n{type(exc).__name__}: {exc}"[:STDERR_TAIL])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(status)


def _limit(job: dict, tests: int) -> None:
    """Resource limits of a test process running ``tests`` tests (set before dropping root).

    Its OOM score is the highest: if the node runs out of memory, a test dies, not the server.
    It cannot make namespaces (``_forbid_namespaces``).
    """
    with open("/proc/self/oom_score_adj", "w") as oom:
        oom.write("1000")
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
    _forbid_namespaces()


def _start_test(job: dict, start: int, workdir: str) -> tuple[int, dict[int, str]]:
    """Fork the process of stdin test ``start``; returns its pid and the read ends of its pipes by role."""
    stdin = os.memfd_create("stdin")
    os.write(stdin, str(job["tests"][start]).encode())
    os.lseek(stdin, 0, os.SEEK_SET)
    pipes = {role: os.pipe() for role in ("stdout", "stderr", "result")}
    fds = {0: stdin, 1: pipes["stdout"][1], 2: pipes["stderr"][1], RESULT_FD: pipes["result"][1]}
    pid = _spawn(job, job["uid"], fds, workdir, lambda: _harness(job), tests=1)
    os.close(stdin)
    for _, write_end in pipes.values():
        os.close(write_end)
    return pid, {read_end: role for role, (read_end, _) in pipes.items()}


def _spawn(job: dict, uid: int, fds: dict[int, int], cwd: str, body: typing.Callable[[], None], tests: int) -> int:
    """Fork a process that keeps only ``fds`` (its number: ours), drops to ``uid`` with the
    rlimits of ``tests`` tests, no groups and no new privileges, and runs ``body``."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            high = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 256) for target, source in fds.items()}
            for target, source in high.items():
                os.dup2(source, target)
            os.closerange(max(fds) + 1, 65536)
            _limit(job, tests)
            os.chdir(cwd)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            os.environ.clear()
            os.environ.update({"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"})
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            body()
        finally:
            os._exit(70)
    return pid


def _cpu_seconds(stat: int) -> float:
    """CPU time so far of a process and all its threads, from its ``/proc/<pid>/stat`` (open)."""
    fields = os.pread(stat, 1024, 0).rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CallRun:
    """One sample's call-based or assert tests, relayed and timed by this (trusted) supervisor.

    The candidate's code runs in a process of its own (the slot's uid, no child processes)
    that answers calls as plain data. Call-based: this supervisor sends each test's call and
    streams the answer back, to be compared in the service. Assert: the label's tests run in
    a *tests' process* under a second uid; each call of the candidate it makes passes through
    here, and only its report says whether a test passed. Each test has ``cpu_s`` of the
    candidate's CPU (measured here, from ``/proc``) and ``wall_s``; a candidate that dies or
    overruns is killed, the test fails, and the next test gets a fresh candidate process.
    """

    def __init__(self, job: dict, conn: socket.socket, workdir: str, deadline: float) -> None:
        self.job, self.conn, self.workdir, self.deadline = job, conn, workdir, deadline
        self.total = len(job["tests"])
        self.index = 0
        self.sel = selectors.DefaultSelector()
        self.outbox: dict[int, bytearray] = {}
        self.candidate: dict | None = None
        self.waiting: str | None = None  # who waits for the candidate's answer: "driver" or "tester"
        self.tester: dict | None = None
        self._new_window()

    def _new_window(self, cpu: float = 0.0) -> None:
        """Test ``index`` starts now, with the candidate's CPU time at ``cpu``."""
        self.started = self.cpu_read = time.monotonic()
        self.cpu_before = cpu
        self.failure: str | None = None
        self.stderr = bytearray()

    # -- processes -------------------------------------------------------------------------
    def _start_candidate(self) -> None:
        job = self.job
        calls, answers = os.pipe(), os.pipe()
        out, err = os.pipe(), os.pipe()
        null = os.open("/dev/null", os.O_RDONLY)

        def body() -> None:
            _forbid_new_processes()
            _serve_calls(job)

        fds = {0: null, 1: out[1], 2: err[1], CALLS_FD: calls[0], ANSWERS_FD: answers[1]}
        pid = _spawn(job, job["uid"], fds, self.workdir, body, tests=len(job["tests"]))
        for fd in (null, calls[0], answers[1], out[1], err[1]):
            os.close(fd)
        os.set_blocking(calls[1], False)
        self.candidate = {"pid": pid, "calls": calls[1], "answers": answers[0], "loaded": False, "pending": b"",
                          "cpu": 0.0, "stdout_bytes": 0, "stat": os.open(f"/proc/{pid}/stat", os.O_RDONLY)}  # fmt: skip
        for fd, role in ((answers[0], "answers"), (out[0], "stdout"), (err[0], "stderr")):
            os.set_blocking(fd, False)
            self.candidate[role] = fd
            self.sel.register(fd, selectors.EVENT_READ, role)

    def _candidate_cpu(self) -> float:
        """The running candidate's CPU time so far (its last reading if it just ended)."""
        if self.candidate is None:
            return 0.0
        with contextlib.suppress(OSError, ValueError, IndexError):
            self.candidate["cpu"] = _cpu_seconds(self.candidate["stat"])
        return self.candidate["cpu"]

    def _stop_candidate(self, failure: str | None) -> None:
        """Kill and reap the candidate's process; a call it left unanswered fails."""
        cand = self.candidate
        if cand is None:
            return
        self.candidate = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cand["pid"], signal.SIGKILL)
        _, _, usage = os.wait4(cand["pid"], 0)
        self.cpu_before -= usage.ru_utime + usage.ru_stime  # its time stays in this window
        for role in ("answers", "stdout", "stderr"):
            with contextlib.suppress(KeyError):
                self.sel.unregister(cand[role])
            os.close(cand[role])
        self._drop_outbox(cand["calls"])
        os.close(cand["calls"])
        os.close(cand["stat"])
        self.failure = self.failure or failure
        if not cand["loaded"]:  # it never got to answer: every test still to run fails alike
            self._fail_rest()
        elif self.waiting == "driver":
            self._settle()
        elif self.waiting == "tester":
            self.waiting = None
            self._send_tester(json.dumps(["failed", self.failure]).encode() + b"\n")

    def _start_tester(self) -> None:
        job, conn = self.job, self.conn
        requests, answers = os.pipe(), os.pipe()
        null = os.open("/dev/null", os.O_RDWR)

        def body() -> None:
            _prctl(PR_SET_DUMPABLE, 0)
            with socket.socket(fileno=TRUSTED_FD) as source:
                trusted = recv_msg(source)
            _run_tests(trusted)

        fds = {0: null, 1: null, 2: null, TESTER_OUT_FD: requests[1], TESTER_IN_FD: answers[0]}
        fds[TRUSTED_FD] = conn.fileno()
        pid = _spawn(job, job["test_uid"], fds, "/", body, tests=len(job["tests"]))
        for fd in (null, requests[1], answers[0]):
            os.close(fd)
        os.set_blocking(answers[1], False)
        os.set_blocking(requests[0], False)
        self.tester = {"pid": pid, "out": requests[0], "in": answers[1], "pending": b""}
        self.sel.register(requests[0], selectors.EVENT_READ, "tester")

    def _stop_tester(self) -> None:
        tester, self.tester = self.tester, None
        if tester is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tester["pid"], signal.SIGKILL)
        os.waitpid(tester["pid"], 0)
        self.sel.unregister(tester["out"])
        os.close(tester["out"])
        self._drop_outbox(tester["in"])
        os.close(tester["in"])

    # -- pipes -----------------------------------------------------------------------------
    def _queue(self, fd: int, data: bytes) -> None:
        """Write ``data`` to ``fd`` (non-blocking); what does not fit now waits its turn."""
        if fd not in self.outbox:
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                pass
            except OSError:  # the reader is gone; its end is handled where it is read
                return
            if not data:
                return
            self.outbox[fd] = bytearray()
            self.sel.register(fd, selectors.EVENT_WRITE, "write")
        self.outbox[fd] += data

    def _drop_outbox(self, fd: int) -> None:
        if self.outbox.pop(fd, None) is not None:
            self.sel.unregister(fd)

    def _flush(self, fd: int) -> None:
        try:
            written = os.write(fd, self.outbox[fd][: 1 << 16])
        except BlockingIOError:
            return
        except OSError:  # the reader is gone; its end is handled where it is read
            written = len(self.outbox[fd])
        del self.outbox[fd][:written]
        if not self.outbox[fd]:
            self._drop_outbox(fd)

    def _send_tester(self, line: bytes) -> None:
        if self.tester is not None:
            self._queue(self.tester["in"], line)

    def _call(self, request: bytes, who: str) -> None:
        """Send a call to the candidate (started if none is running)."""
        if self.failure is not None:  # this test already failed: its later calls fail at once
            self._send_tester(json.dumps(["failed", self.failure]).encode() + b"\n")
            return
        if self.candidate is None:
            self._start_candidate()
        self.waiting = who
        self._queue(self.candidate["calls"], request)

    # -- tests -----------------------------------------------------------------------------
    def _settle(self, **found: object) -> None:
        """Send test ``index``'s outcome (a timeout if it used more CPU than its share, even
        between two readings) and open the next test's window."""
        cpu = self._candidate_cpu()
        if cpu - self.cpu_before > self.job["cpu_s"]:
            self.failure = "timeout"
        message = {"index": self.index, "failure": self.failure, "cpu_s": round(cpu - self.cpu_before, 3),
                   "stderr": self.stderr[-STDERR_TAIL:].decode(errors="replace"), **found}  # fmt: skip
        send_msg(self.conn, message)
        self.index += 1
        self.waiting = None
        self._new_window(cpu)

    def _call_test(self) -> None:
        """Call-based: send the call of test ``index``."""
        args = to_plain(self.job["tests"][self.index])
        self._call(json.dumps(["call", self.job["fn_name"], args, {"d": []}]).encode() + b"\n", "driver")

    def _fail_rest(self) -> None:
        """Every test still to run fails with this one's failure."""
        failure = self.failure or "died"
        while self.index < self.total:
            self.failure = failure
            self._settle()
        self.waiting = None

    def _on_answer(self, line: bytes) -> None:
        cand = self.candidate
        if not cand["loaded"]:
            cand["loaded"] = line + b"\n" == LOADED
            if not cand["loaded"]:
                self._stop_candidate("compile_error" if line.startswith(b'["compile_error"') else "died")
            return
        if self.waiting is None:  # an answer nobody asked for
            self._stop_candidate("died")
        elif self.waiting == "driver":
            self._settle(answer=line.decode(errors="replace"))
        else:
            self.waiting = None
            self._send_tester(line + b"\n")

    def _on_tester_line(self, line: bytes) -> None:
        if line[:1] == b"C":
            self._call(line[1:] + b"\n", "tester")
        elif line[:1] == b"R":
            report = json.loads(line[1:])
            if report.get("index") == self.index:
                self._settle(report=report)

    def _read(self, fd: int, role: str) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        cand = self.candidate
        if role == "tester":
            if not data:  # the tests' process is gone: what it did not report failed
                self._stop_tester()
                self.failure = self.failure or "tester"
                self._fail_rest()
                return
            *lines, self.tester["pending"] = (self.tester["pending"] + data).split(b"\n")
            for line in lines:
                if self.tester is not None:
                    self._on_tester_line(line)
        elif not data:
            if role == "answers":
                self._stop_candidate("died")
            else:
                self.sel.unregister(fd)
        elif role == "stderr":
            self.stderr = (self.stderr + data)[-STDERR_TAIL:]
        elif role == "stdout":
            cand["stdout_bytes"] += len(data)
            if cand["stdout_bytes"] > self.job["output_bytes"]:
                self._stop_candidate("output_exceeded")
        else:
            *lines, rest = (cand["pending"] + data).split(b"\n")
            if len(rest) > self.job["keep_bytes"]:  # longer than any answer that could match
                self._stop_candidate("output_exceeded")
                return
            cand["pending"] = rest
            for line in lines:
                if self.candidate is cand:
                    self._on_answer(line)

    def _check_budget(self) -> None:
        """Kill a candidate past its test's CPU or wall time (its CPU time is read every
        ``CPU_TICK_S``); a tests' process stuck past it too."""
        now = time.monotonic()
        wall = now - self.started
        over_cpu = False
        if self.candidate is not None and now - self.cpu_read >= CPU_TICK_S:
            self.cpu_read = now
            over_cpu = self._candidate_cpu() - self.cpu_before > self.job["cpu_s"]
        if self.candidate is not None and (wall > self.job["wall_s"] or over_cpu):
            self._stop_candidate("timeout")
        if self.tester is not None and wall > self.job["wall_s"] + TESTER_GRACE_S:
            self._stop_tester()
            self.failure = self.failure or "timeout"
            self._fail_rest()

    def run(self) -> None:
        """Until every test is settled (or the sample's deadline: the rest are skipped)."""
        if self.job["kind"] == "assert":
            self._start_tester()
        while self.index < self.total:
            if self.job["kind"] == "call" and self.waiting is None:
                self._call_test()
            if time.monotonic() >= self.deadline:
                while self.index < self.total:
                    send_msg(self.conn, {"index": self.index, "skipped": True})
                    self.index += 1
                return
            for key, _ in self.sel.select(CPU_TICK_S):
                if self.sel.get_map().get(key.fd) is not key:  # closed (its number maybe reused) meanwhile
                    continue
                if key.data == "write":
                    self._flush(key.fd)
                else:
                    self._read(key.fd, key.data)
                if self.index >= self.total:
                    break
            self._check_budget()

    def close(self) -> None:
        """Kill and reap both processes (the supervisor's clean-up then finds none of theirs)."""
        self._stop_tester()
        self.waiting = None
        self.index = self.total
        self._stop_candidate(None)
        self.sel.close()


def _run_calls(job: dict, conn: socket.socket, workdir: str, deadline: float) -> None:
    run = CallRun(job, conn, workdir, deadline)
    try:
        run.run()
    finally:
        run.close()


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
    """Run stdin test ``start`` in a process of its own, send what it produced, and return
    the index of the next test."""
    pid, fds = _start_test(job, start, workdir)
    started = time.monotonic()
    # Kept: stdout up to ``keep_bytes`` (what comparison needs), the tail of stderr, the
    # start of the result pipe (a compile error); counted: everything, up to the caps.
    kept = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray()}
    keep = {"stdout": job["keep_bytes"], "result": RESULT_KEEP}
    sizes = {"stdout": 0, "stderr": 0, "result": 0}
    caps = {"stdout": job["output_bytes"], "stderr": 1 << 62, "result": job["output_bytes"]}
    over = timed_out = False
    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    while sel.get_map() and not over:
        remaining = min(started + job["wall_s"], deadline) - time.monotonic()
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
            if role == "stderr":
                kept["stderr"] = (kept["stderr"] + data)[-STDERR_TAIL:]
            else:
                kept[role] += data[: keep[role] - len(kept[role])]
    sel.close()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    _clean_up(job["uid"])
    for fd in fds:
        os.close(fd)
    exit_code = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    ended = {
        "index": start,
        "exit": exit_code,
        "timed_out": timed_out or exit_code == -signal.SIGXCPU or cpu > job["cpu_s"],
        "output_exceeded": over,
        "stdout_truncated": sizes["stdout"] > keep["stdout"],
        "cpu_s": round(cpu, 4),
        "wall_s": round(time.monotonic() - started, 4),
        "stdout": kept["stdout"].decode(errors="replace"),
        "stderr": kept["stderr"].decode(errors="replace"),
        "result": kept["result"].decode(errors="replace"),
    }
    send_msg(conn, ended)
    return start + 1


def supervise(conn: socket.socket) -> None:
    """One sample: run its tests in order, stream a result per test, clean up."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    job = recv_msg(conn)
    deadline = time.monotonic() + job["sample_s"]
    _private_tmp(job)
    workdir = "/tmp"
    try:
        if job["kind"] != "stdin":
            _run_calls(job, conn, workdir, deadline)
        else:
            index = 0
            while index < len(job["tests"]):
                if time.monotonic() >= deadline:
                    send_msg(conn, {"index": index, "skipped": True})
                    index += 1
                    continue
                index = _run_process(job, index, workdir, deadline, conn)
    finally:
        _clean_up(job["uid"])
    send_msg(conn, {"done": True})


def main() -> None:
    for name in WARM_MODULES:
        __import__(name)
    gc.freeze()  # forked children then copy fewer pages when their collector runs
    listener = socket.socket(fileno=int(sys.argv[1]))
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
