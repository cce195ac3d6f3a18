"""Interactive tests, in the sandbox: the program and the label's interactor run at once,
joined by two pipes (each one's stdout the other's stdin), each confined apart (stdlib only).

The program runs as a stdin test's does (the slot's uid, the test's limits). The interactor
(testlib's ``interactor``, built like a custom checker) runs as
the slot's second uid, with limits of its own, refused new processes, SIGPIPE ignored (a write
to a program that has gone fails, and its next read ends: a verdict, not a kill). It reads the
test's input and answer from sealed memfds at ``/proc/self/fd/3`` and ``/proc/self/fd/4`` and
runs its build from ``/proc/self/fd/5``: no path the program can open leads to them (another
uid's descriptors), nor are they in the memory of any process the program was forked from.
A *keeper* (root, forked before the first test, ``Keeper``) reads them from the server's
connection itself and hands each test's pair to the supervisor as descriptors.

The program's CPU is the sample's less the interactor's and the keeper's; the interactor's is
its own process's (it cannot fork). Whoever ends first is recorded: the verdict's precedence
is the server's (``services.code.judging.interactor``).
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import fcntl
import os
import select
import selectors
import signal
import socket
import struct
import termios
import time
import typing

from services.code.sandbox.inside import compiled_programs, confine, messages, program
from services.code.sandbox.inside.messages import RESULT_FD, STDERR_TAIL, InteractorFiles, InteractOutcome, Job, Skipped
from services.code.sandbox.inside.relay import CPU_TICK_S
from services.code.sandbox.inside.socket_child import SocketChild

# The interactor's descriptors: the test's input, its answer, its own build, a Kattis
# validator's feedback directory.
INPUT_FD, ANSWER_FD, EXECUTABLE_FD, FEEDBACK_FD = 3, 4, 5, 6
FEEDBACK_DIR = "/tmp/.feedback"
FEEDBACK_BYTES = 1 << 20
# What an interactor may read besides what the program wrote it, beyond its input and answer:
# its runtime's files (a Python interactor's modules). Past that and the program's output
# limit, the program wrote the interactor too much: its output limit, not the judge's failure.
OWN_READS_BYTES = 8 << 20
SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
INDEX = struct.Struct("i")


def interactor_argv(job: Job) -> list[str]:
    """testlib's ``interactor input output answer`` (its output file, for a checker after it,
    unused), or Kattis' ``validator input answer feedback_dir``."""
    files = [f"/proc/self/fd/{INPUT_FD}", f"/proc/self/fd/{ANSWER_FD}"]
    if job.interactor_protocol == "kattis":
        return [*job.interactor_command, *files, f"/proc/self/fd/{FEEDBACK_FD}"]
    return [*job.interactor_command, files[0], os.devnull, files[1]]


def _feedback_dir(job: Job) -> int:
    """A Kattis validator's feedback directory for one test (its judge messages, which this
    judge does not read): a small tmpfs of the interactor's uid on ``FEEDBACK_DIR`` in the
    sample's ``/tmp`` (a mount point the program can neither remove nor replace), as a
    descriptor: the interactor cannot cross the program's ``/tmp`` to it."""
    os.mkdir(FEEDBACK_DIR, 0o700)
    confine.mount_tmpfs(FEEDBACK_DIR, FEEDBACK_BYTES, job.test_uid)
    return os.open(FEEDBACK_DIR, os.O_PATH | os.O_DIRECTORY)


class Keeper(SocketChild):
    """Holds an interactive sample's inputs and answers (root, not dumpable) and hands the
    supervisor each test's as two sealed memfds."""

    def __init__(self, conn: socket.socket) -> None:
        super().__init__(lambda sock: _receive_and_keep(conn, sock))

    def files(self, index: int) -> tuple[int, int]:
        """Test ``index``'s input and answer, as memfds."""
        self.sock.sendall(INDEX.pack(index))
        _, fds, _, _ = socket.recv_fds(self.sock, 1, 2)
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise OSError("the interactor's files are gone")
        return fds[0], fds[1]

    def cpu_s(self) -> float:
        with contextlib.suppress(OSError):
            return confine.cpu_seconds(self.pid)
        return 0.0


def _receive_and_keep(conn: socket.socket, sock: socket.socket) -> None:
    confine.prctl(confine.PR_SET_DUMPABLE, 0)
    files = messages.recv(conn)
    if not isinstance(files, InteractorFiles):
        raise ValueError(f"a {type(files).__name__} where InteractorFiles was expected")
    _keep(files, sock)


def _keep(files: InteractorFiles, sock: socket.socket) -> None:
    while len(asked := sock.recv(INDEX.size)) == INDEX.size:
        test_input, answer = files.tests[INDEX.unpack(asked)[0]]
        fds = [_sealed("input", test_input), _sealed("answer", answer)]
        socket.send_fds(sock, [b"."], fds)
        for fd in fds:
            os.close(fd)


def _sealed(name: str, text: str) -> int:
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
    data = memoryview(text.encode(errors="surrogatepass"))
    while data:
        data = data[os.write(fd, data) :]
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_tests(
    job: Job,
    conn: typing.Any,
    deadline: float,
    cgroup: confine.SampleCgroup | None,
    fresh_start: typing.Callable[[tuple[int, ...]], tuple[int, ...]],
    raw: socket.socket,
) -> None:
    """The sample's interactive tests in order (``fresh_start`` between two), an outcome each
    on ``conn``; the keeper reads the tests from ``raw``, the server's connection."""
    keeper = Keeper(raw)
    try:
        pristine = confine.tmp_state()
        for index in range(len(job.tests)):
            if time.monotonic() >= deadline:
                messages.send(conn, Skipped(index))
                continue
            if index:
                pristine = fresh_start(pristine)
            messages.send(conn, _run_test(job, index, keeper, deadline, cgroup))
    finally:
        keeper.close()


class _Process:
    """One side of a test: its pid, a pidfd (readable once it exits), what ended it, and a
    copy of each end of its pipes it holds until its end is seen (``let_pipes_go``); the
    interactor's: the most it may read (``reads_allowed``)."""

    def __init__(self, pid: int, stdin: int, stdout: int, reads_allowed: int = 0) -> None:
        self.pid = pid
        self.reads_allowed = reads_allowed
        self.pidfd = os.pidfd_open(pid)
        self.stdin: int | None = stdin
        self.stdout: int | None = stdout
        self.status: int | None = None
        self.cpu_s = 0.0
        self.peak_bytes = 0
        self.stopped = False
        self.ended = 0.0

    def read_cpu(self) -> float:
        if self.status is None:
            with contextlib.suppress(OSError):
                self.cpu_s = confine.cpu_seconds(self.pid)
        return self.cpu_s

    def read_bytes(self) -> int:
        """What it has read so far, from any file (``rchar``; 0 once it has gone)."""
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{self.pid}/io", "rb") as io:
            for line in io:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
        return 0

    def pipes_shared(self) -> bool:
        """Whether a process but this one still holds the other end of one of its pipes (once
        the other side's copies are let go: what the other side left running)."""
        assert self.stdin is not None and self.stdout is not None
        poll = select.poll()
        poll.register(self.stdin, 0)  # a hang-up and an error are reported unasked
        poll.register(self.stdout, 0)
        events = dict(poll.poll(0))
        return not (events.get(self.stdin, 0) & select.POLLHUP and events.get(self.stdout, 0) & select.POLLERR)

    def unread(self) -> bool:
        """Whether its stdin holds what the other side wrote and it has not read."""
        if self.stdin is None:
            return False
        count = array.array("i", [0])
        fcntl.ioctl(self.stdin, termios.FIONREAD, count)
        return count[0] > 0

    def let_pipes_go(self) -> None:
        """Close the copies of its pipes' ends, once its end has been seen: only then does the
        other side read the end of what it wrote, or fail to write to it. So a side's end
        that follows from the other's is always seen after it, never at the same time."""
        for fd in (self.stdin, self.stdout):
            if fd is not None:
                os.close(fd)
        self.stdin = self.stdout = None

    def stop(self, at_limit: bool = True) -> None:
        """Kill it: at its limits (``stopped``), or once its verdict is known."""
        self.stopped = self.stopped or at_limit
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def reap(self) -> None:
        _, status, usage = os.wait4(self.pid, 0)
        self.status = os.waitstatus_to_exitcode(status)
        self.cpu_s = usage.ru_utime + usage.ru_stime
        self.peak_bytes = usage.ru_maxrss << 10
        self.ended = time.monotonic()
        os.close(self.pidfd)


def _start(job: Job, index: int, keeper: Keeper) -> tuple[_Process, _Process, dict[int, str]]:
    """Fork the interactor and the program of test ``index``, joined by two pipes; returns
    them (the program first) and the read ends of their stderr (and the program's result pipe) by role."""
    test_input, answer = keeper.files(index)
    if job.interactor_protocol == "kattis":
        feedback = _feedback_dir(job)  # before the program starts: it owns /tmp
    executable = os.open(os.path.join(job.interactor_artifact, job.interactor_file), os.O_RDONLY)
    to_program, to_interactor = os.pipe(), os.pipe()
    pipes = {role: os.pipe() for role in ("program", "interactor", "result")}
    # The interactor first: a program that took every task the sample's cgroup allows the
    # moment it started would leave none to start it (a sandbox failure: no verdict).
    own = dataclasses.replace(job, cpu_s=job.interactor_cpu_s, memory_bytes=job.interactor_memory_bytes)
    fds = {0: to_interactor[0], 1: to_program[1], 2: pipes["interactor"][1], INPUT_FD: test_input,
           ANSWER_FD: answer, EXECUTABLE_FD: executable}  # fmt: skip
    if job.interactor_protocol == "kattis":
        fds[FEEDBACK_FD] = feedback
    interactor = confine.spawn(own, job.test_uid, fds, "/", _interactor_body(job), tests=1, new_processes=False)
    if job.interactor_protocol == "kattis":
        os.close(feedback)
    fds = {0: to_program[0], 1: to_interactor[1], 2: pipes["program"][1], RESULT_FD: pipes["result"][1]}
    body = compiled_programs.body(job) if job.command else lambda: program.run_stdin_program(job.code, job.prelude)
    graded = confine.spawn(
        job, job.uid, fds, "/tmp", body, tests=1, new_processes=compiled_programs.may_start_processes(job)
    )
    own_files = os.fstat(test_input).st_size + os.fstat(answer).st_size + OWN_READS_BYTES
    sides = (
        _Process(graded, os.dup(to_program[0]), os.dup(to_interactor[1])),
        _Process(interactor, os.dup(to_interactor[0]), os.dup(to_program[1]), job.output_bytes + own_files),
    )
    for fd in (test_input, answer, executable, *to_program, *to_interactor, *(w for _, w in pipes.values())):
        os.close(fd)
    return *sides, {r: role for role, (r, _) in pipes.items()}


def _interactor_body(job: Job) -> typing.Callable[[], None]:
    def run() -> None:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        argv = interactor_argv(job)
        try:
            os.execve(argv[0], argv, {**os.environ, **job.interactor_env})
        except OSError as exc:
            os.write(2, f"cannot run the interactor: {exc}".encode())
        os._exit(127)

    return run


def _run_test(
    job: Job, index: int, keeper: Keeper, deadline: float, cgroup: confine.SampleCgroup | None
) -> InteractOutcome:
    """Test ``index``: both sides run until both have ended, the program within the test's CPU
    and wall limits (its own time, as a stdin test's) and its output limit (what the
    interactor read of it), the interactor within its CPU limit and ``interactor_wall_s`` of
    its own time after the program ended (while both wait on each other, the program's wall
    limit ends the test, as a judge's idleness limit, unless the interactor left unread what
    the program sent: its stall); a program the interactor rejected is not waited for. When
    the program's process ends, every process it left ends with it: none holds its pipes
    open, so the interactor reads the end of the conversation at once."""
    cpu_before, keeper_before = confine.programs_cpu(cgroup), keeper.cpu_s()
    oom_before = cgroup.oom_kills() if cgroup else 0
    program, interactor, readers = _start(job, index, keeper)
    started = time.monotonic()
    kept = {role: bytearray() for role in readers.values()}
    sel = selectors.DefaultSelector()
    for fd in (*readers, program.pidfd, interactor.pidfd):
        sel.register(fd, selectors.EVENT_READ)
    first = ""
    cpu_read = started
    waited = 0.0
    over = False
    while program.status is None or interactor.status is None:
        now = time.monotonic()
        remaining = min(job.wall_s - (now - started), deadline - now)
        if remaining <= 0 and now < deadline:  # past the wall backstop: its own time only
            waited = max(waited, confine.sample_run_delay())
            remaining = min(job.wall_s - (now - started - waited), deadline - now)
        if now - cpu_read >= CPU_TICK_S:
            cpu_read = now
            waited = max(waited, confine.sample_run_delay())
            others = interactor.read_cpu() + keeper.cpu_s() - keeper_before
            if program.status is None and confine.programs_cpu(cgroup) - cpu_before - others > job.cpu_s:
                program.stop()
            if program.status is None and interactor.read_bytes() > interactor.reads_allowed:
                over, first = True, first or "program"
                program.stop(at_limit=False)
                interactor.stop(at_limit=False)
            if interactor.status is None and interactor.read_cpu() > job.interactor_cpu_s:
                interactor.stop()
        if program.status is None and remaining <= 0 and not program.stopped:
            if not first and interactor.unread() and not program.unread():
                # Past the program's wall time, the interactor has not read what it was sent
                # while the program read all it got: the interactor's stall, not the program's.
                first = "interactor"
                interactor.stop()
                program.stop(at_limit=False)
            else:
                program.stop()
        if (
            interactor.status is None
            and program.status is not None
            and now - program.ended - waited > job.interactor_wall_s
        ):
            interactor.stop()
        if now >= deadline + CPU_TICK_S:  # both stopped: nothing more to wait for but their end
            program.stop()
            interactor.stop()
        events = [key.fd for key, _ in sel.select(max(0.0, min(remaining, CPU_TICK_S)))]
        ended = [side for side in (program, interactor) if side.pidfd in events and side.status is None]
        for side in ended:
            sel.unregister(side.pidfd)
            side.reap()
            side.let_pipes_go()
            if side is program and interactor.status is None and interactor.pipes_shared():
                confine.kill_uid(job.uid)  # what the program left holds its pipes: it ends too
        if ended and not first:
            first = "program" if program in ended else "interactor"  # two at once: both on their own
            if first == "interactor" and interactor.status in job.interactor_rejections and program.status is None:
                program.stop(at_limit=False)
        for fd in events:
            if fd not in readers:
                continue
            role = readers[fd]
            data = os.read(fd, 1 << 16)
            if not data:
                sel.unregister(fd)
            elif role == "program":
                kept[role] = (kept[role] + data)[-STDERR_TAIL:]
            else:
                kept[role] += data[: STDERR_TAIL - len(kept[role])]
    sel.close()
    for fd in readers:
        os.close(fd)
    _clean_up(job)
    cpu = confine.programs_cpu(cgroup) - cpu_before - interactor.cpu_s - (keeper.cpu_s() - keeper_before)
    program_cpu = max(cpu, program.cpu_s)
    assert program.status is not None and interactor.status is not None
    killed = program.status == -signal.SIGKILL
    return InteractOutcome(
        index=index,
        exit=program.status,
        timed_out=program.stopped or program.status == -signal.SIGXCPU or program_cpu > job.cpu_s,
        over_memory=(killed and cgroup is not None and cgroup.oom_kills() > oom_before and not program.stopped)
        or 0 < job.judged_memory_bytes < program.peak_bytes,
        cpu_s=round(program_cpu, 4),
        wall_s=round(time.monotonic() - started, 4),
        stderr=kept["program"].decode(errors="replace"),
        result=kept["result"].decode(errors="replace"),
        interactor_exit=interactor.status,
        interactor_stopped=interactor.stopped,
        interactor_report=kept["interactor"].decode(errors="replace"),
        interactor_first=first == "interactor",
        interactor_cpu_s=round(interactor.cpu_s, 4),
        output_exceeded=over,
    )  # fmt: skip


def _clean_up(job: Job) -> None:
    """Leave nothing of the test running: both sides are reaped; what the program left (a
    Python program may fork) is killed, and every zombie reaped but the keeper (still running)."""
    for uid in (job.uid, job.test_uid):
        confine.kill_uid(uid)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
