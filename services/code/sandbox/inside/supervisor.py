"""A sample's supervisor: trusted (root), it runs the sample's tests and streams their outcomes.

Stdin tests: one *test process* per test (``run_stdin_test``), each test started afresh
(``fresh_start``). Assert tests (``relay.CallRun``): a *candidate process* runs the code and
answers calls as plain data, forked by a source that never held an outcome
(``CandidateSource``); the tests' code arrives after it was forked, to a *tests' process*
alone. The supervisor times
each test on its process's CPU and wall time, keeps only what comparison needs of what it
printed, and leaves nothing running (``confine.clean_up``). Call-based tests: the init itself
becomes the candidate, and the server relays the calls (``_become_candidate``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import struct
import time
import typing

from services.code.sandbox.inside import (
    compiled_programs,
    confine,
    files,
    interactive_test,
    messages,
    program,
    relay,
    tester,
)
from services.code.sandbox.inside.messages import (
    ANSWERS_FD,
    CALLS_FD,
    RESULT_FD,
    STDERR_TAIL,
    TESTER_IN_FD,
    TESTER_OUT_FD,
    TRUSTED_FD,
    Job,
    Skipped,
    Started,
    StdinOutcome,
)  # fmt: skip
from services.code.sandbox.inside.relay import CPU_TICK_S
from services.code.sandbox.inside.socket_child import SocketChild

# What is kept of the result pipe's lines that are not results (a compile error, garbage).
RESULT_KEEP = 1 << 16


def _start_test(job: Job, start: int, workdir: str) -> tuple[int, dict[int, str]]:
    """Fork the process of stdin test ``start``; returns its pid and the read ends of its pipes by role."""
    stdin = os.memfd_create("stdin")
    os.write(stdin, str(job.tests[start]).encode())
    os.lseek(stdin, 0, os.SEEK_SET)
    pipes = {role: os.pipe() for role in ("stdout", "stderr", "result")}
    fds = {0: stdin, 1: pipes["stdout"][1], 2: pipes["stderr"][1], RESULT_FD: pipes["result"][1]}
    body = compiled_programs.body(job) if job.command else lambda: program.run_stdin_program(job.code, job.prelude)
    pid = confine.spawn(
        job, job.uid, fds, workdir, body, tests=1, new_processes=compiled_programs.may_start_processes(job)
    )
    os.close(stdin)
    for _, write_end in pipes.values():
        os.close(write_end)
    return pid, {read_end: role for role, (read_end, _) in pipes.items()}


class CandidateSource(SocketChild):
    """Assert tests: forks the sample's candidates from a process that holds no outcome.

    A candidate is a copy of the process that forks it: forked by the supervisor after a
    candidate died, it would hold (in live or freed memory) the outcomes of the tests so far,
    which it could read and answer from. So the supervisor forks this source before the first
    test, and the source forks each candidate (through a process that exits at once, so that
    the candidate is the supervisor's child: its init's) and sends back its pid and the
    supervisor's ends of its pipes."""

    def __init__(self, job: Job, workdir: str) -> None:
        super().__init__(lambda sock: _serve_candidates(job, workdir, sock))

    def start(self) -> tuple[int, list[int]]:
        """A new candidate: its pid and the ends of its calls, answers, stdout and stderr pipes."""
        self.sock.sendall(b".")
        data, fds, _, _ = socket.recv_fds(self.sock, PID_BYTES, len(SOURCE_FDS))
        if len(data) != PID_BYTES or len(fds) != len(SOURCE_FDS):
            for fd in fds:
                os.close(fd)
            raise OSError("the candidates' source is gone")
        return struct.unpack("i", data)[0], fds


# What the source sends per candidate: its pid, then the supervisor's ends of its pipes.
PID_BYTES = struct.calcsize("i")
SOURCE_FDS = ("calls", "answers", "stdout", "stderr")


def _serve_candidates(job: Job, workdir: str, sock: socket.socket) -> None:
    """The body of the candidates' source (``CandidateSource``): a candidate per byte read."""
    while sock.recv(1):
        calls_pipe, answers, out, err, told = os.pipe(), os.pipe(), os.pipe(), os.pipe(), os.pipe()
        null = os.open("/dev/null", os.O_RDONLY)
        middle = os.fork()
        if middle == 0:
            try:
                fds = {0: null, 1: out[1], 2: err[1], CALLS_FD: calls_pipe[0], ANSWERS_FD: answers[1]}
                body = _candidate_body(job)
                pid = confine.spawn(job, job.uid, fds, workdir, body, len(job.tests), new_processes=False)
                os.write(told[1], struct.pack("i", pid))
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
        packed = os.read(told[0], PID_BYTES)
        theirs = [calls_pipe[1], answers[0], out[0], err[0]]
        if len(packed) == PID_BYTES:
            socket.send_fds(sock, [packed], theirs)
        for fd in (null, calls_pipe[0], answers[1], out[1], err[1], *told, *theirs):
            os.close(fd)


def _candidate_body(job: Job) -> typing.Callable[[], None]:
    """What a candidate's process runs: the code, answering calls (no new process: ``spawn``'s filter)."""

    def body() -> None:
        program.serve_calls(job.code, job.prelude)

    return body


class ForkedCandidate(relay.Candidate):
    """Assert tests: a candidate's process from the sample's ``CandidateSource`` (the slot's
    uid, no child processes), a child of this supervisor."""

    def __init__(self, source: CandidateSource, cgroup: confine.SampleCgroup | None) -> None:
        pid, (calls_end, answers, stdout, stderr) = source.start()
        super().__init__(pid, calls_end, answers, stdout, stderr)
        self.cgroup = cgroup
        self.oom_kills = cgroup.oom_kills() if cgroup else 0

    def kill(self) -> float:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        _, _, usage = os.wait4(self.pid, 0)
        return usage.ru_utime + usage.ru_stime

    def out_of_memory(self) -> bool:
        return self.cgroup is not None and self.cgroup.oom_kills() > self.oom_kills


def _start_tester(job: Job, conn: messages.Outbox, run: relay.CallRun) -> None:
    """Assert tests: fork the tests' process (the slot's second uid), which reads the label's
    code from the connection itself."""
    requests, answers = os.pipe(), os.pipe()
    null = os.open("/dev/null", os.O_RDWR)

    def body() -> None:
        confine.prctl(confine.PR_SET_DUMPABLE, 0)
        with socket.socket(fileno=TRUSTED_FD) as source:
            trusted = messages.recv(source)
        tester.run_tests(trusted)

    fds = {0: null, 1: null, 2: null, TESTER_OUT_FD: requests[1], TESTER_IN_FD: answers[0]}
    fds[TRUSTED_FD] = conn.sock.fileno()
    pid = confine.spawn(job, job.test_uid, fds, "/", body, tests=len(job.tests))
    for fd in (null, requests[1], answers[0]):
        os.close(fd)
    run.start_tester(pid, requests[0], answers[1])


def _become_candidate(job: Job, conn: socket.socket, cgroup: confine.SampleCgroup | None) -> typing.NoReturn:
    """Call-based tests: this init becomes the sample's candidate, and the server sends the
    calls and times the answers itself (``relay.CallRun``): no process of ours to relay them,
    fork and exit per sample. It sends ``Started`` with a pidfd of itself and the server's
    ends of its pipes (``STARTED_FDS``), closes the connection, then drops to the slot's uid
    (no child processes) and answers calls on the pipes. Pipes, not the connection: a file
    the candidate sent along a socket would be closed by the server's thread (a TCP socket
    set to linger blocks that close until its data is sent)."""
    out, err, calls_pipe, answers = os.pipe(), os.pipe(), os.pipe(), os.pipe()
    servers_ends = [os.pidfd_open(os.getpid()), out[0], err[0], calls_pipe[1], answers[0]]
    messages.send_with_fds(conn, Started(cgroup.name if cgroup else ""), servers_ends)
    conn.close()
    for fd in servers_ends:
        os.close(fd)
    null = os.open("/dev/null", os.O_RDONLY)
    fds = {0: null, 1: out[1], 2: err[1], CALLS_FD: calls_pipe[0], ANSWERS_FD: answers[1]}
    try:
        confine.confine_self(job, job.uid, fds, "/tmp", len(job.tests), new_processes=False)
        program.serve_calls(job.code, job.prelude)
    finally:
        os._exit(70)


def run_stdin_test(
    job: Job, start: int, workdir: str, deadline: float, conn: typing.Any, cgroup: confine.SampleCgroup | None
) -> int:
    """Run stdin test ``start`` in a process of its own, send what it produced, and return
    the index of the next test.

    Its processes together get ``cpu_s`` (read every ``CPU_TICK_S``) and ``wall_s`` of their
    own time (the longest time one of their threads waited for a CPU others held does not
    count, read as often: a thread's wait still counts after it ended).
    """
    cpu_before = confine.programs_cpu(cgroup)
    oom_before = cgroup.oom_kills() if cgroup else 0
    pid, fds = _start_test(job, start, workdir)
    started = time.monotonic()
    # Kept: stdout up to ``keep_bytes`` (what comparison needs), the tail of stderr (a
    # checker's: its start), the start of the result pipe (a compile error); counted:
    # everything, up to the caps.
    kept = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray()}
    # A checker's report is kept from its start, where testlib writes its points: its tail
    # may be the program's output the checker quoted.
    keep = {"stdout": job.keep_bytes, "result": RESULT_KEEP, "stderr": STDERR_TAIL}
    sizes = {"stdout": 0, "stderr": 0, "result": 0}
    caps = {"stdout": job.output_bytes, "stderr": 1 << 62, "result": job.output_bytes}
    over = timed_out = False
    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    cpu_read = started
    waited = 0.0  # the longest wait for a CPU of any of its threads, those that ended included
    while sel.get_map() and not over:
        now = time.monotonic()
        remaining = min(job.wall_s - (now - started), deadline - now)
        if remaining <= 0 and now < deadline:  # past the wall backstop: its own time only
            waited = max(waited, confine.sample_run_delay())
            remaining = min(job.wall_s - (now - started - waited), deadline - now)
        over_cpu = False
        if now - cpu_read >= CPU_TICK_S:
            cpu_read = now
            over_cpu = confine.programs_cpu(cgroup) - cpu_before > job.cpu_s
            waited = max(waited, confine.sample_run_delay())
        if remaining <= 0 or over_cpu:
            timed_out = True
            break
        for key, _ in sel.select(min(remaining, CPU_TICK_S)):
            role = fds[key.fd]
            data = os.read(key.fd, 1 << 16)
            if not data:
                sel.unregister(key.fd)
                continue
            sizes[role] += len(data)
            if sizes[role] > caps[role]:
                over = over or role != "stderr"
                continue
            if role == "stderr" and job.kind != "check":
                kept["stderr"] = (kept["stderr"] + data)[-STDERR_TAIL:]
            else:
                kept[role] += data[: keep[role] - len(kept[role])]
    sel.close()
    asked_too_much = timed_out and 0 < job.judged_data_bytes < _data_bytes(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)  # its peak resident memory among its processes
    confine.clean_up(job.uid)
    for fd in fds:
        os.close(fd)
    exit_code = os.waitstatus_to_exitcode(status)
    oom_killed = cgroup is not None and cgroup.oom_kills() > oom_before
    cpu = confine.programs_cpu(cgroup) - cpu_before
    ended = StdinOutcome(
        index=start,
        exit=exit_code,
        timed_out=not asked_too_much and (timed_out or exit_code == -signal.SIGXCPU or cpu > job.cpu_s),
        output_exceeded=over,
        stdout_truncated=sizes["stdout"] > keep["stdout"],
        cpu_s=round(cpu, 4),
        wall_s=round(time.monotonic() - started, 4),
        stdout=kept["stdout"].decode(errors="replace"),
        stderr=kept["stderr"].decode(errors="replace"),
        result=kept["result"].decode(errors="replace"),
        over_memory=asked_too_much or oom_killed or 0 < job.judged_memory_bytes < usage.ru_maxrss << 10,
    )
    messages.send(conn, ended)
    return start + 1


def _data_bytes(pid: int) -> int:
    """The data memory process ``pid`` holds (``VmData``: its heap and the like, touched or
    not); 0 once it has gone."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmData:"):
                return int(line.split()[1]) << 10
    return 0


def fresh_start(job: Job, pristine: tuple[int, ...]) -> tuple[int, ...]:
    """The sample's writable state as it was before its first stdin test: an empty ``/tmp``
    (its build shown there again) and IPC namespace (``confine.fresh_tmp``), given the state of
    ``/tmp`` as it was made (``pristine``); returns that state now. What one isolated run needs
    between two (nothing of an earlier test's survives: its processes are gone)."""
    if confine.fresh_tmp(job, pristine):
        compiled_programs.mount_artifact(job)
        return confine.tmp_state()
    return pristine


def prepare_and_supervise(listener: socket.socket, accepted: int, cgroup: confine.SampleCgroup | None) -> None:
    """As a sample's init (pid 1 of a PID namespace of its own, forked by the zygote): join
    the sample's cgroup (``None`` without cgroups) and make its other namespaces, then take
    the next connection (and say so on ``accepted``: another is prepared meanwhile) and
    ``supervise`` it.

    What cannot be prepared fails the next connection at once (it is closed unanswered).
    """
    try:
        if cgroup is not None:
            cgroup.make_and_join()
        confine.private_namespaces()
    except BaseException:
        conn, _ = listener.accept()
        os.write(accepted, b"!")  # a failure: the zygote pauses before the next one
        raise
    conn, _ = listener.accept()
    listener.close()
    os.write(accepted, b".")
    os.close(accepted)
    supervise(conn, cgroup)


def supervise(conn: socket.socket, cgroup: confine.SampleCgroup | None) -> None:
    """One sample, as its init (pid 1 of its PID namespace): its tests in order, a result
    streamed per test; when it exits, the kernel kills whatever is left in the namespace."""
    job = messages.recv(conn)
    if not isinstance(job, Job):
        raise ValueError(f"a {type(job).__name__} where a Job was expected")
    deadline = time.monotonic() + job.sample_s
    if job.kind != "call":  # the server may kill this init (so the sample) by it, never another process
        pidfd = os.pidfd_open(os.getpid())
        messages.send_with_fds(conn, Started(cgroup.name if cgroup else ""), [pidfd])
        os.close(pidfd)
    if cgroup is not None:
        cgroup.set_limits(job)
    confine.private_tmp(job)
    compiled_programs.mount_artifact(job)
    files.place(job)
    if job.kind == "call":
        _become_candidate(job, conn, cgroup)
    outbox = messages.Outbox(conn)
    try:
        _run_sample(job, outbox, deadline, cgroup, conn)
    finally:
        outbox.flush()


def _run_sample(
    job: Job, conn: messages.Outbox, deadline: float, cgroup: confine.SampleCgroup | None, raw: socket.socket
) -> None:
    """The sample's tests, as its init (pid 1 of its PID namespace, so every orphan's parent);
    ``raw`` is the server's connection (``conn`` holds what is sent on it)."""
    workdir = "/tmp"
    try:
        if job.kind == "build":
            compiled_programs.build(job, conn, lambda held: run_stdin_test(job, 0, workdir, deadline, held, cgroup))
        elif job.kind == "check":
            compiled_programs.check(
                job, conn, deadline, lambda index: run_stdin_test(job, index, workdir, deadline, conn, cgroup)
            )
        elif job.kind == "interact":
            interactive_test.run_tests(job, conn, deadline, cgroup, lambda pristine: fresh_start(job, pristine), raw)
        elif job.kind == "assert":
            source = CandidateSource(job, workdir)
            try:
                relay.run_calls(
                    job, lambda outcome: messages.send(conn, outcome), deadline,
                    lambda: ForkedCandidate(source, cgroup), lambda run: _start_tester(job, conn, run),
                )  # fmt: skip
            finally:
                source.close()
        else:
            index = 0
            pristine = confine.tmp_state()
            while index < len(job.tests):
                if time.monotonic() >= deadline:
                    messages.send(conn, Skipped(index))
                    index += 1
                    continue
                if index:
                    pristine = fresh_start(job, pristine)
                index = run_stdin_test(job, index, workdir, deadline, conn, cgroup)
    finally:
        confine.clean_up(job.uid)
    if job.fetch:
        messages.send(conn, files.fetch(job))
    messages.send(conn, messages.Done())
