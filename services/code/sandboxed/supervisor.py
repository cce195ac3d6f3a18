"""A sample's supervisor: trusted (root), it runs the sample's tests and streams their outcomes.

Stdin tests: one *test process* per test (``run_stdin_test``). Call-based and assert tests
(``CallRun``): a *candidate process* runs the code and answers calls as plain data; assert
tests' code arrives after it was forked, to a *tests' process* alone. The supervisor times
each test on its process's CPU and wall time, keeps only what comparison needs of what it
printed, and leaves nothing running (``confine.clean_up``).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import time
import typing

from services.code.sandboxed import compiled, confine, harness, wire
from services.code.sandboxed.wire import (
    ANSWERS_FD,
    CALLS_FD,
    LOADED,
    RESULT_FD,
    STDERR_TAIL,
    TESTER_IN_FD,
    TESTER_OUT_FD,
    TRUSTED_FD,
    CallOutcome,
    Job,
    Skipped,
    StdinOutcome,
    to_plain,
)  # fmt: skip

# What is kept of the result pipe's lines that are not results (a compile error, garbage).
RESULT_KEEP = 1 << 16
# How often the candidate's CPU time is read while a test runs; a tests' process gets this
# much more wall time than a test to report after its candidate was stopped.
CPU_TICK_S = 0.05
TESTER_GRACE_S = 2.0


def _start_test(job: Job, start: int, workdir: str) -> tuple[int, dict[int, str]]:
    """Fork the process of stdin test ``start``; returns its pid and the read ends of its pipes by role."""
    stdin = os.memfd_create("stdin")
    os.write(stdin, str(job.tests[start]).encode())
    os.lseek(stdin, 0, os.SEEK_SET)
    pipes = {role: os.pipe() for role in ("stdout", "stderr", "result")}
    fds = {0: stdin, 1: pipes["stdout"][1], 2: pipes["stderr"][1], RESULT_FD: pipes["result"][1]}
    body = compiled.body(job) if job.command else lambda: harness.run_stdin_program(job.code)
    pid = confine.spawn(job, job.uid, fds, workdir, body, tests=1)
    os.close(stdin)
    for _, write_end in pipes.values():
        os.close(write_end)
    return pid, {read_end: role for role, (read_end, _) in pipes.items()}


class CallRun:
    """One sample's call-based or assert tests, relayed and timed by this (trusted) supervisor.

    The candidate's code runs in a process of its own (the slot's uid, no child processes)
    that answers calls as plain data. Call-based: this supervisor sends each test's call and
    streams the answer back, to be compared in the service. Assert: the label's tests run in
    a *tests' process* under a second uid; each call of the candidate it makes passes through
    here, and only its report says whether a test passed. Each test has ``cpu_s`` of the
    candidate's CPU (measured here, from ``/proc``) and ``wall_s`` of its own (time it waited
    for a CPU others held does not count); a candidate that dies or overruns is killed, the
    test fails, and the next test gets a fresh candidate process.
    """

    def __init__(
        self, job: Job, conn: wire.Outbox, workdir: str, deadline: float, cgroup: confine.SampleCgroup | None
    ) -> None:
        self.job, self.conn, self.workdir, self.deadline, self.cgroup = job, conn, workdir, deadline, cgroup
        self.total = len(job.tests)
        self.index = 0
        self.sel = selectors.DefaultSelector()
        self.outbox: dict[int, bytearray] = {}
        self.candidate: dict | None = None
        self.waiting: str | None = None  # who waits for the candidate's answer: "driver" or "tester"
        self.tester: dict | None = None
        self._new_window()

    def _new_window(self, cpu: float = 0.0, delay: float = 0.0) -> None:
        """Test ``index`` starts now, with the candidate's CPU time at ``cpu`` and its time
        waiting for a CPU at ``delay``."""
        self.started = self.cpu_read = time.monotonic()
        self.cpu_before, self.delay_before = cpu, delay
        self.failure: str | None = None
        self.stderr = bytearray()

    # -- processes -------------------------------------------------------------------------
    def _start_candidate(self) -> None:
        job = self.job
        calls, answers = os.pipe(), os.pipe()
        out, err = os.pipe(), os.pipe()
        null = os.open("/dev/null", os.O_RDONLY)

        def body() -> None:
            confine.forbid_new_processes()
            harness.serve_calls(job.code)

        fds = {0: null, 1: out[1], 2: err[1], CALLS_FD: calls[0], ANSWERS_FD: answers[1]}
        pid = confine.spawn(job, job.uid, fds, self.workdir, body, tests=len(job.tests))
        for fd in (null, calls[0], answers[1], out[1], err[1]):
            os.close(fd)
        os.set_blocking(calls[1], False)
        self.candidate = {"pid": pid, "calls": calls[1], "answers": answers[0], "loaded": False,
                          "pending": bytearray(), "cpu": 0.0, "delay": 0.0, "stdout_bytes": 0,
                          "schedstat": os.open(f"/proc/{pid}/schedstat", os.O_RDONLY),
                          "oom_kills": self.cgroup.oom_kills() if self.cgroup else 0}  # fmt: skip
        for fd, role in ((answers[0], "answers"), (out[0], "stdout"), (err[0], "stderr")):
            os.set_blocking(fd, False)
            self.candidate[role] = fd
            self.sel.register(fd, selectors.EVENT_READ, role)

    def _candidate_cpu(self) -> float:
        """The running candidate's CPU time so far (its last reading if it just ended)."""
        if self.candidate is None:
            return 0.0
        with contextlib.suppress(OSError):
            self.candidate["cpu"] = confine.cpu_seconds(self.candidate["pid"])
        return self.candidate["cpu"]

    def _candidate_delay(self) -> float:
        """The running candidate's time waiting for a CPU so far (its last reading if it ended)."""
        if self.candidate is None:
            return 0.0
        self.candidate["delay"] = confine.run_delay(self.candidate["schedstat"]) or self.candidate["delay"]
        return self.candidate["delay"]

    def _stop_candidate(self, failure: str | None) -> None:
        """Kill and reap the candidate's process; a call it left unanswered fails."""
        cand = self.candidate
        if cand is None:
            return
        delay = self._candidate_delay()
        self.candidate = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cand["pid"], signal.SIGKILL)
        _, _, usage = os.wait4(cand["pid"], 0)
        self.cpu_before -= usage.ru_utime + usage.ru_stime  # its times stay in this window
        self.delay_before -= delay
        if failure == "died" and self.cgroup is not None and self.cgroup.oom_kills() > cand["oom_kills"]:
            failure = "memory_limit"
        for role in ("answers", "stdout", "stderr"):
            with contextlib.suppress(KeyError):
                self.sel.unregister(cand[role])
            os.close(cand[role])
        self._drop_outbox(cand["calls"])
        os.close(cand["calls"])
        os.close(cand["schedstat"])
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
            confine.prctl(confine.PR_SET_DUMPABLE, 0)
            with socket.socket(fileno=TRUSTED_FD) as source:
                trusted = wire.recv(source)
            harness.run_tests(trusted)

        fds = {0: null, 1: null, 2: null, TESTER_OUT_FD: requests[1], TESTER_IN_FD: answers[0]}
        fds[TRUSTED_FD] = conn.sock.fileno()
        pid = confine.spawn(job, job.test_uid, fds, "/", body, tests=len(job.tests))
        for fd in (null, requests[1], answers[0]):
            os.close(fd)
        os.set_blocking(answers[1], False)
        os.set_blocking(requests[0], False)
        self.tester = {"pid": pid, "out": requests[0], "in": answers[1], "pending": bytearray()}
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
        if cpu - self.cpu_before > self.job.cpu_s:
            self.failure = "timeout"
        stderr = self.stderr[-STDERR_TAIL:].decode(errors="replace")
        outcome = CallOutcome(self.index, self.failure, round(cpu - self.cpu_before, 3), stderr, **found)
        wire.send(self.conn, outcome)
        self.index += 1
        self.waiting = None
        self._new_window(cpu, self._candidate_delay())

    def _call_test(self) -> None:
        """Call-based: send the call of test ``index``."""
        args = to_plain(self.job.tests[self.index])
        self._call(json.dumps(["call", self.job.fn_name, args, {"d": []}]).encode() + b"\n", "driver")

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
            for line in _complete_lines(self.tester["pending"], data):
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
            if cand["stdout_bytes"] > self.job.output_bytes:
                self._stop_candidate("output_exceeded")
        else:
            lines = _complete_lines(cand["pending"], data)
            if len(cand["pending"]) > self.job.keep_bytes:  # longer than any answer that could match
                self._stop_candidate("output_exceeded")
                return
            for line in lines:
                if self.candidate is cand:
                    self._on_answer(line)

    def _check_budget(self) -> None:
        """Kill a candidate past its test's CPU or own wall time (read every ``CPU_TICK_S``); a
        tests' process stuck past it too."""
        now = time.monotonic()
        over_cpu = False
        if self.candidate is not None and now - self.cpu_read >= CPU_TICK_S:
            self.cpu_read = now
            over_cpu = self._candidate_cpu() - self.cpu_before > self.job.cpu_s
        wall = now - self.started
        if wall > self.job.wall_s:  # past it only if the candidate's waits for a CPU do not explain it
            wall -= self._candidate_delay() - self.delay_before
        if self.candidate is not None and (wall > self.job.wall_s or over_cpu):
            self._stop_candidate("timeout")
        if self.tester is not None and wall > self.job.wall_s + TESTER_GRACE_S:
            self._stop_tester()
            self.failure = self.failure or "timeout"
            self._fail_rest()

    def run(self) -> None:
        """Until every test is settled (or the sample's deadline: the rest are skipped)."""
        if self.job.kind == "assert":
            self._start_tester()
        while self.index < self.total:
            if self.job.kind == "call" and self.waiting is None:
                self._call_test()
            if time.monotonic() >= self.deadline:
                while self.index < self.total:
                    wire.send(self.conn, Skipped(self.index))
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


def _complete_lines(pending: bytearray, data: bytes) -> list[bytes]:
    """The lines ``data`` completes after ``pending``, which keeps what follows the last
    newline. Only ``data`` is scanned and ``pending`` copied once per completion, so reading
    a long line costs its length, not its length times its reads."""
    end = data.rfind(b"\n")
    if end < 0:
        pending += data
        return []
    lines = (bytes(pending) + data[:end]).split(b"\n")
    pending[:] = data[end + 1 :]
    return lines


def _run_calls(job: Job, conn: wire.Outbox, workdir: str, deadline: float, cgroup: confine.SampleCgroup | None) -> None:
    run = CallRun(job, conn, workdir, deadline, cgroup)
    try:
        run.run()
    finally:
        run.close()


def run_stdin_test(
    job: Job, start: int, workdir: str, deadline: float, conn: typing.Any, cgroup: confine.SampleCgroup | None
) -> int:
    """Run stdin test ``start`` in a process of its own, send what it produced, and return
    the index of the next test.

    Its processes together get ``cpu_s`` (read every ``CPU_TICK_S``) and ``wall_s`` of their
    own time (the longest time one of their threads waited for a CPU others held does not
    count, read as often: a thread's wait still counts after it ended).
    """
    cpu_before = confine.sample_cpu_seconds()
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
            over_cpu = confine.sample_cpu_seconds() - cpu_before > job.cpu_s
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
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)  # its peak resident memory among its processes
    confine.clean_up(job.uid)
    for fd in fds:
        os.close(fd)
    exit_code = os.waitstatus_to_exitcode(status)
    oom_killed = cgroup is not None and cgroup.oom_kills() > oom_before
    cpu = confine.sample_cpu_seconds() - cpu_before
    ended = StdinOutcome(
        index=start,
        exit=exit_code,
        timed_out=timed_out or exit_code == -signal.SIGXCPU or cpu > job.cpu_s,
        output_exceeded=over,
        stdout_truncated=sizes["stdout"] > keep["stdout"],
        cpu_s=round(cpu, 4),
        wall_s=round(time.monotonic() - started, 4),
        stdout=kept["stdout"].decode(errors="replace"),
        stderr=kept["stderr"].decode(errors="replace"),
        result=kept["result"].decode(errors="replace"),
        over_memory=oom_killed or 0 < job.judged_memory_bytes < usage.ru_maxrss << 10,
    )
    wire.send(conn, ended)
    return start + 1


def prepare_and_supervise(listener: socket.socket, accepted: int, cgroup: confine.SampleCgroup | None) -> None:
    """As a sample's init (pid 1 of a PID namespace of its own, forked by the zygote): join
    the sample's cgroup (``None`` without cgroups) and make its other namespaces, then take
    the next connection (and say so on ``accepted``, held open until this process exits:
    another is prepared meanwhile) and ``supervise`` it.

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
    supervise(conn, cgroup)


def supervise(conn: socket.socket, cgroup: confine.SampleCgroup | None) -> None:
    """One sample, as its init (pid 1 of its PID namespace): its tests in order, a result
    streamed per test; when it exits, the kernel kills whatever is left in the namespace."""
    job = wire.recv(conn)
    if not isinstance(job, Job):
        raise ValueError(f"a {type(job).__name__} where a Job was expected")
    deadline = time.monotonic() + job.sample_s
    if cgroup is not None:
        cgroup.set_limits(job)
    confine.private_tmp(job)
    compiled.mount_artifact(job)
    outbox = wire.Outbox(conn)
    try:
        _run_sample(job, outbox, deadline, cgroup)
    finally:
        outbox.flush()


def _run_sample(job: Job, conn: wire.Outbox, deadline: float, cgroup: confine.SampleCgroup | None) -> None:
    """The sample's tests, as its init (pid 1 of its PID namespace, so every orphan's parent)."""
    workdir = "/tmp"
    try:
        if job.kind == "build":
            compiled.build(job, conn, lambda held: run_stdin_test(job, 0, workdir, deadline, held, cgroup))
        elif job.kind == "check":
            compiled.check(
                job, conn, deadline, lambda index: run_stdin_test(job, index, workdir, deadline, conn, cgroup)
            )
        elif job.kind != "stdin":
            _run_calls(job, conn, workdir, deadline, cgroup)
        else:
            index = 0
            while index < len(job.tests):
                if time.monotonic() >= deadline:
                    wire.send(conn, Skipped(index))
                    index += 1
                    continue
                index = run_stdin_test(job, index, workdir, deadline, conn, cgroup)
    finally:
        confine.clean_up(job.uid)
    wire.send(conn, wire.Done())
