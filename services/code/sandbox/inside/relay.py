# Over 400 lines: one relay (calls, CPU clock, a candidate killed and restarted), one test's state.
"""A sample's call-based or assert tests, relayed and timed by a trusted process.

The candidate's code runs in a process of its own (the slot's uid, no child processes) that
answers calls as plain data (``program.serve_calls``). Call-based: the *server* relays them
(``CallRun`` with ``host``'s candidates, each a sample's init that became its candidate):
it sends each test's call and keeps the answer, compared in the service. Assert: the sample's
*supervisor* relays them (candidates it forks, ``supervisor``): the label's tests run in a
*tests' process* under a second uid; each call of the candidate it makes passes through here,
and only its report says whether a test passed. Each test has ``cpu_s`` of the candidate's
CPU (its process CPU clock, read here) and ``wall_s`` of its own (time it waited for a CPU
others held does not count); a candidate that dies or overruns is killed, the test fails,
and the next test gets a fresh candidate process.

Shipped into the sandbox for the supervisor; the server imports the same module for the
call-based tests it relays itself (``host``).
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import selectors
import signal
import time
import typing

from services.code.sandbox.inside import confine
from services.code.sandbox.inside.messages import LOADED, STDERR_TAIL, CallOutcome, Job, Outcome, Skipped, to_plain

# How often the candidate's CPU time is read while a test runs; a tests' process gets this
# much more wall time than a test to report after its candidate was stopped.
CPU_TICK_S = 0.05
TESTER_GRACE_S = 2.0
# The most of a candidate's threads whose waits for a CPU are read at one tick (the others at
# the next ticks, in turn).
THREADS_PER_READ = 16


class Candidate(abc.ABC):
    """A running candidate's process as its relay sees it: where calls go and answers, stdout
    and stderr come from, and its CPU clock and time waiting for a CPU (``pid`` as the relay
    sees it). How it starts is its subclass's, and so how it stops."""

    def __init__(self, pid: int, calls: int, answers: int, stdout: int, stderr: int) -> None:
        self.pid, self.calls, self.answers, self.stdout, self.stderr = pid, calls, answers, stdout, stderr
        try:
            self.schedstat = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)
        except OSError:  # it has already ended
            self.schedstat = -1
        self.loaded = False
        self.pending = bytearray()
        self.cpu = self.delay = 0.0
        self.stdout_bytes = 0

    def read_cpu(self) -> float:
        """Its CPU time so far (its last reading once it has ended)."""
        with contextlib.suppress(OSError):
            self.cpu = confine.cpu_seconds(self.pid)
        return self.cpu

    def read_delay(self) -> float:
        """Its time waiting for a CPU so far (its last reading once it has ended)."""
        if self.schedstat >= 0:
            self.delay = confine.run_delay(self.schedstat) or self.delay
        return self.delay

    @abc.abstractmethod
    def kill(self) -> float:
        """Kill it and wait until it is gone; its CPU time in all."""

    @abc.abstractmethod
    def out_of_memory(self) -> bool:
        """Whether the kernel killed it at its memory limit (asked once it is gone)."""

    def close(self) -> None:
        """Close what is left of it here (its descriptors)."""
        for fd in (self.calls, self.answers, self.stdout, self.stderr, self.schedstat):
            if fd >= 0:
                os.close(fd)


# What starts a candidate's process (another after one died).
CandidateStarter = typing.Callable[[], Candidate]


class CallRun:
    """One sample's call-based or assert tests (``job``), each outcome to ``emit``;
    ``start_candidate`` starts a candidate's process (one at first, another after one died)."""

    def __init__(
        self, job: Job, emit: typing.Callable[[Outcome], None], deadline: float, start_candidate: CandidateStarter
    ) -> None:
        self.job, self.emit, self.deadline, self.start_candidate = job, emit, deadline, start_candidate
        self.total = len(job.tests)
        self.index = 0
        self.sel = selectors.DefaultSelector()
        self.outbox: dict[int, bytearray] = {}
        self.candidate: Candidate | None = None
        self.waiting: str | None = None  # who waits for the candidate's answer: "driver" or "tester"
        self.tester: dict | None = None
        self.threads_read = 0  # readings of the candidate's threads' waits (``_threads_delay``)
        self._new_window()

    def _new_window(self, cpu: float = 0.0, delay: float = 0.0) -> None:
        """Test ``index`` starts now, with the candidate's CPU time at ``cpu`` and its time
        waiting for a CPU at ``delay``."""
        self.started = self.cpu_read = time.monotonic()
        self.cpu_before, self.delay_before = cpu, delay
        self.threads_waited = 0.0  # the longest wait of another thread of it seen in this test
        self.failure: str | None = None
        self.stderr = bytearray()
        self.stderr_bytes = 0

    # -- processes -------------------------------------------------------------------------
    def _start_candidate(self) -> None:
        began = time.monotonic()
        cand = self.candidate = self.start_candidate()
        # Its start (waiting for a prepared init, what it used before its code loaded) counts
        # for no test.
        self.started += time.monotonic() - began
        self.cpu_before += cand.read_cpu()
        self.delay_before += cand.read_delay()
        for fd in (cand.calls, cand.answers, cand.stdout, cand.stderr):
            os.set_blocking(fd, False)
        for fd, role in ((cand.answers, "answers"), (cand.stdout, "stdout"), (cand.stderr, "stderr")):
            self.sel.register(fd, selectors.EVENT_READ, role)

    def _candidate_cpu(self) -> float:
        return 0.0 if self.candidate is None else self.candidate.read_cpu()

    def _candidate_delay(self) -> float:
        return 0.0 if self.candidate is None else self.candidate.read_delay()

    def _threads_delay(self) -> float:
        """The longest wait for a CPU of a live thread of the candidate but its first (one
        doing the work while the first waits in ``join``), since that thread began: read at
        the test's ticks, it may count waits of a thread's earlier tests, which errs toward
        the program. At most ``THREADS_PER_READ`` threads are read at once, in turn: a
        candidate's idle threads cost it nothing and this thread a file each."""
        if self.candidate is None:
            return 0.0
        self.threads_read += 1
        return confine.threads_run_delay(self.candidate.pid, True, THREADS_PER_READ, self.threads_read)

    def _stop_candidate(self, failure: str | None) -> None:
        """Kill the candidate's process; a call it left unanswered fails."""
        cand = self.candidate
        if cand is None:
            return
        delay = cand.read_delay()
        self.candidate = None
        self.cpu_before -= cand.kill()  # its times stay in this window
        self.delay_before -= delay
        if failure == "died" and cand.out_of_memory():
            failure = "memory_limit"
        for fd in (cand.answers, cand.stdout, cand.stderr):
            with contextlib.suppress(KeyError):
                self.sel.unregister(fd)
        self._drop_outbox(cand.calls)
        cand.close()
        self.failure = self.failure or failure
        if not cand.loaded:  # it never got to answer: every test still to run fails alike
            self._fail_rest()
        elif self.waiting == "driver":
            self._settle()
        elif self.waiting == "tester":
            self.waiting = None
            self._send_tester(json.dumps(["failed", self.failure]).encode() + b"\n")

    def start_tester(self, pid: int, requests: int, answers: int) -> None:
        """Assert tests: the tests' process ``pid`` (this process's child) sends calls and
        reports on ``requests`` and reads answers on ``answers``."""
        os.set_blocking(answers, False)
        os.set_blocking(requests, False)
        self.tester = {"pid": pid, "out": requests, "in": answers, "pending": bytearray()}
        self.sel.register(requests, selectors.EVENT_READ, "tester")

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
        if self.failure is not None:  # this test already failed: its calls fail at once
            if who == "driver":
                self._settle()
            else:
                self._send_tester(json.dumps(["failed", self.failure]).encode() + b"\n")
            return
        if self.candidate is None:
            self._start_candidate()
        assert self.candidate is not None
        self.waiting = who
        self._queue(self.candidate.calls, request)

    # -- tests -----------------------------------------------------------------------------
    def _settle(self, **found: object) -> None:
        """Emit test ``index``'s outcome (a timeout if it used more CPU than its share, even
        between two readings) and open the next test's window."""
        cpu = self._candidate_cpu()
        if cpu - self.cpu_before > self.job.cpu_s:
            self.failure = "timeout"
        stderr = self.stderr[-STDERR_TAIL:].decode(errors="replace")
        self.emit(CallOutcome(self.index, self.failure, round(cpu - self.cpu_before, 3), stderr, **found))
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
        assert cand is not None
        if not cand.loaded:
            cand.loaded = line + b"\n" == LOADED
            if not cand.loaded:
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
            assert self.tester is not None
            if not data:  # the tests' process is gone: what it did not report failed
                self._stop_tester()
                self.failure = self.failure or "tester"
                self._fail_rest()
                return
            for line in _complete_lines(self.tester["pending"], data):
                if self.tester is not None:
                    self._on_tester_line(line)
            return
        assert cand is not None
        if not data:
            if role == "answers":
                self._stop_candidate("died")
            else:
                self.sel.unregister(fd)
        elif role == "stderr":  # its tail kept; a test's past ``output_bytes``: a flood this thread would read
            self.stderr = (self.stderr + data)[-STDERR_TAIL:]
            self.stderr_bytes += len(data)
            if self.stderr_bytes > self.job.output_bytes:
                self._stop_candidate("output_exceeded")
        elif role == "stdout":
            cand.stdout_bytes += len(data)
            if cand.stdout_bytes > self.job.output_bytes:
                self._stop_candidate("output_exceeded")
        else:
            lines = _complete_lines(cand.pending, data)
            if len(cand.pending) > self.job.keep_bytes:  # longer than any answer that could match
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
            self.threads_waited = max(self.threads_waited, self._threads_delay())  # it may end before the answer
        wall = now - self.started
        if wall > self.job.wall_s:  # past it only if the candidate's waits for a CPU do not explain it
            wall -= max(self._candidate_delay() - self.delay_before, self.threads_waited, self._threads_delay())
        if self.candidate is not None and (wall > self.job.wall_s or over_cpu):
            self._stop_candidate("timeout")
        if self.tester is not None and wall > self.job.wall_s + TESTER_GRACE_S:
            self._stop_tester()
            self.failure = self.failure or "timeout"
            self._fail_rest()

    def run(self) -> None:
        """Until every test is settled (or the sample's deadline: the rest are skipped)."""
        while self.index < self.total:
            if self.job.kind == "call" and self.waiting is None:
                self._call_test()
            if time.monotonic() >= self.deadline:
                while self.index < self.total:
                    self.emit(Skipped(self.index))
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
        """Kill both processes (and reap the tests' process)."""
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


def run_calls(
    job: Job, emit: typing.Callable[[Outcome], None], deadline: float, start_candidate: CandidateStarter,
    start_tester: typing.Callable[[CallRun], None] | None = None,
) -> None:  # fmt: skip
    """Run ``job``'s tests (``CallRun``), ``start_tester`` first (assert tests)."""
    run = CallRun(job, emit, deadline, start_candidate)
    try:
        if start_tester is not None:
            start_tester(run)
        run.run()
    finally:
        run.close()
