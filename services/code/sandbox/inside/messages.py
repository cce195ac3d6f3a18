"""What crosses between the sandbox's processes: typed messages, plain data, pipe numbers.

Server <-> supervisor: one framed JSON message each way per step (a 4-byte length, then the
JSON of a message dataclass tagged with its type): the ``Job`` in (and, for assert tests,
``TrustedTests`` after it, read by the tests' process alone), then one outcome per test and
``Done`` out. Candidate <-> supervisor <-> tests' process: lines of plain data (``to_plain``).
Call-based tests: the sample's init sends ``Started`` (with its candidate's descriptors), then
becomes the candidate, and the server sends the calls and reads the answers itself, on pipes.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import typing
from dataclasses import dataclass, field
from typing import Any

# A stdin program's result pipe (a compile error, before the program runs).
RESULT_FD = 3
# The candidate's process reads calls on fd 3 and answers on fd 4; the tests' process sends
# calls and reports on fd 3, reads answers on fd 4, and its tests once from fd 5.
CALLS_FD, ANSWERS_FD = 3, 4
TESTER_OUT_FD, TESTER_IN_FD, TRUSTED_FD = 3, 4, 5
# The candidate's first line once its code has loaded.
LOADED = b'["loaded"]\n'
# What is kept of a process's stderr (its tail) and of an error's message.
STDERR_TAIL = 4096
# The most a supervisor holds of what it sends before it sends it (``Outbox``).
FLUSH_BYTES = 1 << 20


@dataclass
class Job:
    """One sample to run: its code and test inputs (never the expected outputs), and limits."""

    kind: str  # "stdin", "call", "assert", "build", "check" or "interact"
    code: str
    fn_name: str | None
    tests: list[Any]  # stdin: each test's input; call: each call's arguments; assert: one None per test
    cpu_s: float
    wall_s: float
    sample_s: float
    memory_bytes: int  # the address-space rlimit (RLIM_INFINITY: none, the cgroup bounds it)
    nproc: int
    nofile: int
    fsize: int
    output_bytes: int
    tmp_bytes: int
    keep_bytes: int
    uid: int = 0  # the slot's candidate uid, and its tests' uid: set by the server per run
    gid: int = 0
    test_uid: int = 0
    # The cgroups' version (0: none), and what bounds the sample's cgroup: its memory and its
    # tasks (processes and threads).
    cgroup_version: int = 0
    cgroup_memory_bytes: int = 0
    cgroup_tasks: int = 0
    # The memory limit a stdin test is judged by, as a contest judge does: its processes' peak
    # resident memory, whatever the sample's cgroup (which also holds /tmp and the supervisor)
    # lets through. 0: not judged (builds and checkers).
    judged_memory_bytes: int = 0
    # A program in a language whose runtime reserves no memory ahead (C, C++, Rust): a test it
    # ran out of time in while holding more data memory than this (``VmData``: what it asked
    # for) is over memory, as judges that limit the address space (problemtools) fail it at
    # once: not a timeout a busy node's slow page faults made. 0: not judged so.
    judged_data_bytes: int = 0
    # A compiled language (``compiled_programs``): the command a test (or, for kind "build", the
    # compiler) execs and what it adds to the environment; a build's source file and the cache
    # entry it installs into; a run's cache entry, shown read-only at ``compiled_programs.ARTIFACT_DIR``.
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    source_path: str = ""
    install: str = ""
    artifact: str = ""
    # Kind "check": per test, the files a label's checker reads (input, output, answer).
    checks: list[list[str]] = field(default_factory=list)
    # Python: the import block run before the program, in its namespace (``preludes``).
    prelude: str = ""
    # A ``/run_code`` run (``files``): files placed under /tmp before it (path -> base64), and
    # those fetched after it, up to ``fetch_bytes`` in all.
    files: dict[str, str] = field(default_factory=dict)
    fetch: list[str] = field(default_factory=list)
    fetch_bytes: int = 0
    # Kind "interact" (``interactive_test``): the label's interactor, a build in the compile cache
    # (``interactor_artifact``, its ``interactor_file`` run as ``/proc/self/fd/5``), its
    # command and environment, and its own limits (its wall time: after the program ended).
    interactor_command: list[str] = field(default_factory=list)
    interactor_env: dict[str, str] = field(default_factory=dict)
    interactor_artifact: str = ""
    interactor_file: str = ""
    interactor_cpu_s: float = 0.0
    interactor_wall_s: float = 0.0
    interactor_memory_bytes: int = 0
    interactor_protocol: str = "testlib"  # or "kattis": its arguments, a feedback directory
    interactor_rejections: list[int] = field(default_factory=list)  # exits that end the program


@dataclass
class TrustedTests:
    """An assert label's code, for the tests' process only."""

    tests: list[str]
    setup: str
    entry_point: str | None


@dataclass
class InteractorFiles:
    """An interactive label's tests (each its input and answer), after the ``Job``: read by
    the sample's keeper of them alone (``interactive_test.Keeper``), never by the supervisor, whose
    memory every Python program's process starts as a copy of."""

    tests: list[list[str]]


@dataclass
class StdinOutcome:
    """What a stdin test's process did (stdout kept up to the job's ``keep_bytes``)."""

    index: int
    exit: int
    timed_out: bool
    output_exceeded: bool
    stdout_truncated: bool
    cpu_s: float
    wall_s: float
    stdout: str
    stderr: str
    result: str  # what the harness reported before the program ran (a compile error)
    # The kernel killed a process of it at the sample's memory limit, or its peak resident
    # memory went over the job's: a judge's limit is the program's alone.
    over_memory: bool = False


@dataclass
class InteractOutcome:
    """What an interactive test's program and interactor did: the program's exit, limits and
    stderr's tail as a stdin test's; the interactor's exit, the start of its report (stderr),
    whether it was stopped at its limits, and whether it ended before the program."""

    index: int
    exit: int
    timed_out: bool
    over_memory: bool
    cpu_s: float
    wall_s: float
    stderr: str
    result: str  # a Python program's compile error
    interactor_exit: int
    interactor_stopped: bool
    interactor_report: str
    interactor_first: bool
    interactor_cpu_s: float
    output_exceeded: bool = False  # what the program wrote to the interactor passed its output limit


@dataclass
class CallOutcome:
    """A call-based test's answer line, or an assert test's report; ``failure`` when neither came."""

    index: int
    failure: str | None  # "timeout", "died", "memory_limit", "compile_error", "output_exceeded", "tester"
    cpu_s: float
    stderr: str
    answer: str | None = None
    report: dict[str, Any] | None = None


@dataclass
class Started:
    """A sample's init's first message: its cgroup's name ("" without cgroups). A call-based
    one's comes with ``STARTED_FDS`` (``supervisor.become_candidate``); any other's with a
    pidfd of itself alone, which the server kills it by if its request is cancelled."""

    cgroup: str


# What comes with ``Started`` (``send_with_fds``), in order: a pidfd of the candidate's
# process (it cannot be confused with a later process of the same pid), the read ends of its
# stdout and stderr, the write end of its calls' pipe and the read end of its answers'.
STARTED_FDS = ("pidfd", "stdout", "stderr", "calls", "answers")


@dataclass
class Skipped:
    """A test the sample's deadline left no time for."""

    index: int


@dataclass
class Fetched:
    """The files a job asked to fetch that were there (path -> base64), before ``Done``."""

    files: dict[str, str]


@dataclass
class Done:
    """The sample's last message."""


Outcome = StdinOutcome | CallOutcome | InteractOutcome | Skipped
MESSAGES = {
    kind.__name__: kind
    for kind in (
        Job, TrustedTests, InteractorFiles, StdinOutcome, CallOutcome, InteractOutcome, Started, Skipped, Fetched, Done
    )
}  # fmt: skip


def _framed(message: object) -> bytes:
    data = json.dumps({"type": type(message).__name__, **vars(message)}).encode()
    return struct.pack("!I", len(data)) + data


def send(sock: socket.socket | Outbox, message: object) -> None:
    """Send one message (a dataclass above), framed."""
    sock.sendall(_framed(message))


def send_with_fds(sock: socket.socket, message: object, fds: list[int]) -> None:
    """Send one small message with ``fds`` (``recv_with_fds``), the sender's credentials
    (its pid as the receiver sees it) with them."""
    data = _framed(message)
    if socket.send_fds(sock, [data], fds) != len(data):
        raise OSError("a message with descriptors was cut short")


def recv_with_fds(sock: socket.socket, count: int) -> tuple[Any, list[int], int, bytes]:
    """The next message, sent by ``send_with_fds`` with ``count`` descriptors to a socket with
    ``SO_PASSCRED`` set: the message, the descriptors, the sender's pid, and what followed it
    in the same read. ``EOFError`` or ``ValueError`` if that is not what came."""
    credentials = struct.calcsize("iII")
    data, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(count * 4) + socket.CMSG_SPACE(credentials))
    fds: list[int] = []
    pid = 0
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
        elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("iII", payload[:credentials])[0]
    try:
        if not data:
            raise EOFError("the connection closed before a message")
        if len(data) < 4 or len(fds) != count or pid <= 0:
            raise ValueError("not a message with its descriptors and credentials")
        (length,) = struct.unpack("!I", data[:4])
        if len(data) < 4 + length:
            raise ValueError("a message with descriptors came in parts")
        return _decoded(data[4 : 4 + length]), fds, pid, data[4 + length :]
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


class Outbox:
    """The supervisor's side of its connection: what it sends is held and goes out together
    (at ``flush``, or once ``FLUSH_BYTES`` are held). A sample's outcomes then cost the
    supervisor and the server one write, one read and one wake-up together instead of one
    each: the server needs them only when the sample is done (a run that fails is re-run
    whole)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.held = bytearray()

    def sendall(self, data: bytes) -> None:
        self.held += data
        if len(self.held) >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.held:
            self.sock.sendall(self.held)
            self.held.clear()


def _read_exact(source: socket.socket | typing.BinaryIO, n: int) -> bytes:
    if not isinstance(source, socket.socket):  # a buffered reader: a short read is the end
        data = source.read(n)
        if len(data) < n:
            raise EOFError("the connection closed before the end of a message")
        return data
    buf = bytearray()
    while len(buf) < n:
        chunk = source.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the connection closed before the end of a message")
        buf += chunk
    return bytes(buf)


def recv(source: socket.socket | typing.BinaryIO) -> Any:
    """The next message; ``EOFError`` at a closed connection, ``ValueError`` if it is not one.

    From a socket, exactly the message is read (what follows is another reader's: the tests'
    process reads its ``TrustedTests`` after the supervisor's ``Job``); from a buffered
    reader (the server's, ``socket.makefile``), many messages cost one read.
    """
    (length,) = struct.unpack("!I", _read_exact(source, 4))
    return _decoded(_read_exact(source, length))


def _decoded(data: bytes) -> Any:
    fields = json.loads(data)
    kind = MESSAGES.get(fields.pop("type", None)) if isinstance(fields, dict) else None
    if kind is None:
        raise ValueError("not a sandbox message")
    try:
        return kind(**fields)
    except TypeError as exc:
        raise ValueError(f"a malformed {kind.__name__}: {exc}") from exc


# -- plain data: what crosses between the candidate's process and the tests ----------------
# JSON, with the containers JSON lacks tagged as one-key objects: {"t": [...]} a tuple,
# {"s": [...]} a set, {"f": [...]} a frozenset, {"d": [[key, value], ...]} a dict, {"b": hex}
# bytes, {"i": hex} an integer past ``DECIMAL_DIGITS`` (hexadecimal converts in linear time,
# decimal in quadratic), {"c": [real, imag]} a complex, {"y": name} a builtin type (MBPP
# passes ``int``). Decoding builds fresh builtin objects, so nothing the candidate defined
# survives it.
SCALARS = (type(None), bool, int, float, str)
TYPES = {kind.__name__: kind for kind in (bool, bytes, complex, dict, float, frozenset, int, list, set, str, tuple)}
UNTAG = {
    "t": tuple, "s": set, "f": frozenset, "d": dict, "b": bytes.fromhex, "i": lambda text: int(text, 16),
    "c": lambda parts: complex(*_numbers(parts, 2)), "y": TYPES.__getitem__,
}  # fmt: skip
STRING_TAGS = ("b", "i", "y")
# The longest decimal integer decoded (CPython's default limit); longer ones cross as hex.
DECIMAL_DIGITS = 4300
HEX_FROM_BITS = 3 * DECIMAL_DIGITS  # under 10 ** DECIMAL_DIGITS


def to_plain(value: object) -> object:
    """``value`` as JSON-ready plain data; a ``TypeError`` for anything else.

    Subclasses of the builtin types (``Counter``, ``defaultdict``, ``OrderedDict``, a
    ``namedtuple``, an ``IntEnum``) and numpy's scalars and arrays become their plain values,
    as CPython's ``==`` would compare them: whatever they override never crosses.
    """
    if value is None or type(value) is bool:
        return value
    if isinstance(value, int):
        number = int.__int__(value)
        return {"i": format(number, "x")} if number.bit_length() > HEX_FROM_BITS else number
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [to_plain(item) for item in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [to_plain(item) for item in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[to_plain(k), to_plain(v)] for k, v in dict.items(value)]}
    if isinstance(value, (set, frozenset)):
        return {"f" if isinstance(value, frozenset) else "s": [to_plain(item) for item in value]}
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    if isinstance(value, type) and TYPES.get(value.__name__) is value:
        return {"y": value.__name__}
    if type(value).__module__ == "numpy" and callable(getattr(value, "tolist", None)):
        return to_plain(value.tolist())  # type: ignore[attr-defined]  # numpy: its Python values
    raise TypeError(f"a {type(value).__name__} is not plain data")


def _numbers(items: list, count: int) -> list[float]:
    if len(items) != count or not all(type(item) in (int, float) for item in items):
        raise ValueError("not plain data")
    return [float(item) for item in items]


def _untag(obj: dict) -> object:
    if len(obj) != 1:
        raise ValueError("not plain data")
    ((tag, items),) = obj.items()
    if tag not in UNTAG or not isinstance(items, str if tag in STRING_TAGS else list):
        raise ValueError("not plain data")
    try:
        return UNTAG[tag](items)
    except KeyError:  # not a type that crosses
        raise ValueError("not plain data") from None


def _decimal(text: str) -> int:
    if len(text.lstrip("-")) > DECIMAL_DIGITS:
        raise ValueError("a decimal integer too long to convert (longer ones cross as hex)")
    return int(text)


def from_plain(text: str | bytes) -> object:
    """Plain data back from its JSON text (a ``ValueError`` or ``TypeError`` if it is not)."""
    return json.loads(text, object_hook=_untag, parse_int=_decimal)
