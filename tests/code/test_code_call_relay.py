"""Call-based samples, whose init becomes the candidate and whose calls the server relays
itself: the candidate now holds pipes to the server's worker. Each attack is a program graded
through a running server with the isolation tests' limits (``testing.code.ISOLATION_ENV``); a GRPO group of 8
over several rounds where it is about other samples.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterator

import pytest

from services.code.sandbox.inside.relay import CPU_TICK_S, THREADS_PER_READ
from testing.clock import wait_until
from testing.code import GROUP, ISOLATION_ENV, NETWORK_MEETING, ROUNDS, grade
from testing.server import Server, gunicorn_server
from testing.timing import within


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of its own with the isolation tests' limits."""
    with gunicorn_server("code", ISOLATION_ENV, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def called(url: str, codes: list[str], expected: list, inputs: list | None = None) -> dict:
    """``codes`` graded on calls ``f(*args)`` for each of ``inputs`` (one call of no
    arguments by default), wanting ``expected``."""
    inputs = inputs if inputs is not None else [[]] * len(expected)
    return grade(url, codes, {"fn_name": "f", "inputs": inputs, "outputs": expected})


# The isolation tests' stdin program, as a function whose answer is what it printed.
CALLED_MEETING = "def f():\n" + textwrap.indent(NETWORK_MEETING, "    ")
CALLED_MEETING = CALLED_MEETING.replace("print(", "return (")


def test_call_based_samples_graded_at_once_share_no_network(server: Server) -> None:
    for round_ in range(ROUNDS):
        out = called(server.url, [CALLED_MEETING] * GROUP, ["alone"])
        assert out["rewards"] == [1.0] * GROUP, (round_, out)


def test_a_call_based_sample_sees_only_itself_in_proc(server: Server) -> None:
    """Its init is its candidate: ``/proc`` lists that one process, the first of its namespace."""
    code = "import os\ndef f():\n    return sorted(int(n) for n in os.listdir('/proc') if n.isdigit())"
    out = called(server.url, [code] * GROUP, [[1]])
    assert out["rewards"] == [1.0] * GROUP, out


LEFT_BEHIND = """
import os, socket
def f():
    found = sorted(name for name in os.listdir("/tmp") if name.startswith("from-"))
    open(f"/tmp/from-{os.urandom(4).hex()}", "w").write("x")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect("\\0grpo-call-left")
        found.append("a listener")
    except OSError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\\0grpo-call-left")
    server.listen(1)
    return found
"""


def test_nothing_a_call_based_candidate_leaves_reaches_the_next(server: Server) -> None:
    """Files in ``/tmp`` and listeners: a later sample, or the same sample's next candidate
    after one died, starts with none of them."""
    for _ in range(ROUNDS):
        out = called(server.url, [LEFT_BEHIND] * GROUP, [[]])
        assert out["rewards"] == [1.0] * GROUP, out
    dies_after = LEFT_BEHIND.replace("    return found", "    if found:\n        return found\n    os._exit(1)")
    out = called(server.url, [dies_after], [[]] * 3, [[]] * 3)
    assert out["error_types"] == ["runtime_error"], out  # every test died, none found another's


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


LINGERING_SOCKET = """
import os, socket, struct, time
def f():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # never read: fills at once
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    client.setblocking(False)
    for _ in range(20):
        try:
            while True:
                client.send(b"x" * 65536)
        except BlockingIOError:
            time.sleep(0.01)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 3600))
    for fd in (3, 4):
        try:
            socket.send_fds(socket.socket(fileno=os.dup(fd)), [b" "], [client.fileno()])
        except OSError:
            pass
    client.close()
    time.sleep(40)
    return 1
"""


@pytest.mark.timing
def test_a_candidate_cannot_hand_the_server_a_file_to_close(server: Server) -> None:
    """The candidate's calls and answers cross on pipes, which carry no descriptors: a file
    it sent along a socket would be closed by the server's thread, and closing a TCP socket
    set to linger with its data unsent blocks that thread (its request, its slot) for as
    long as the candidate keeps the peer alive. Its test times out as any sleeper's does."""
    (worker,) = server.worker_pids()
    called(server.url, ["def f():\n    return 1"], [1])
    before = _open_fds(worker)
    started = time.monotonic()
    out = called(server.url, [LINGERING_SOCKET] * 2, [1])
    assert out["error_types"] == ["timeout"] * 2, out
    # Blocked at the close, the thread waits the 40 s the candidate keeps the peer.
    assert time.monotonic() - started < min(within(15.0), 30.0), "the server's thread waited on the candidate's socket"
    wait_until(lambda: _open_fds(worker) <= before + 2, "the worker's descriptors given back")


EARLY_ANSWERS = """
import os
os.write(4, b'["loaded"]\\n["result", 1]\\n["result", 1]\\n')
def f(x):
    return x
"""


@pytest.mark.timing
def test_answers_written_ahead_are_the_first_calls_and_no_more(server: Server) -> None:
    """Lines written before a call arrives answer the call already sent (as a program
    returning a constant would: no better than ``return 1``); one more, unasked, ends the
    candidate and fails the next test at once instead of leaving it to wait out the sample's
    time. Test 0: answered 1 early; test 1: the unasked line; test 2: a fresh candidate,
    answered 1 early again."""
    started = time.monotonic()
    out = called(server.url, [EARLY_ANSWERS], [1, 1, 1], [[0], [0], [0]])
    assert out["rewards"] == [2 / 3] and out["error_types"] == ["runtime_error"], out
    # A test left to wait out its wall limit is the failure, however slow the machine.
    wall_s = float(ISOLATION_ENV["SCORER_CODE_TEST_WALL_S"])
    assert time.monotonic() - started < min(within(4.0), wall_s), "the tests after the unasked answer waited"


def test_candidates_dying_on_every_call_cost_no_other_sample_its_verdict(server: Server) -> None:
    """Each death costs a fresh init, forked by the zygote: a group dying on every call of
    its 100 tests has it fork hundreds a second, and an init may be done before the zygote
    takes its pidfd. Every sample, the honest one among them too, gets its own verdict, never
    the infrastructure's (no verdict: the infra score), and no run fails to be re-run (the
    zygote crashed: every sample running then, of every request, failed its run)."""
    dies = "import os\ndef f(x):\n    os._exit(1)"
    honest = "def f(x):\n    return x"
    inputs = [[i] for i in range(100)]
    logged = len(server.log_path.read_text())
    for _ in range(ROUNDS):
        out = called(server.url, [dies] * (GROUP - 1) + [honest], list(range(100)), inputs)
        assert out["error_types"] == ["runtime_error"] * (GROUP - 1) + [None], out
    since = server.log_path.read_text()[logged:]
    assert "sandbox failed a run" not in since, since[-3000:]


def _peak_resident_mib(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) >> 10


def test_a_samples_answers_held_until_it_ends_are_bounded(server: Server) -> None:
    """The server holds a call-based sample's answers until its last test (judging them
    meanwhile would delay its next call, which it can time), each up to
    ``compared_output_bytes`` (1 MiB here): 8 samples x 60 tests x 0.9 MiB would be 430 MiB.
    It holds 4 x ``compared_output_bytes`` per sample at most; the answers past it are
    output limits."""
    (worker,) = server.worker_pids()
    inputs = [[i] for i in range(60)]
    called(server.url, ["def f(x):\n    return 0"] * GROUP, [0] * len(inputs), inputs)
    with open(f"/proc/{worker}/clear_refs", "w") as refs:
        refs.write("5")  # its peak resident memory starts again from now
    before = _peak_resident_mib(worker)
    long_answers = "def f(x):\n    return 'x' * (900 << 10)"
    out = called(server.url, [long_answers] * GROUP, [0] * len(inputs), inputs)
    assert out["error_types"] == ["wrong_answer"] * GROUP, out
    assert _peak_resident_mib(worker) - before < 150, (before, _peak_resident_mib(worker))


def test_a_correct_sample_whose_label_needs_long_answers_passes_within_the_held_bound(server: Server) -> None:
    """The answers held until the sample ends are bounded by what its label's expected outputs
    could need, and never less than 4 x ``compared_output_bytes``: 24 answers of 200 KB (each
    within what is kept, 4.8 MB together) all pass."""
    long_answer = "def f(x):\n    return 'x' * 200_000"
    out = called(server.url, [long_answer], ["x" * 200_000] * 24, [[i] for i in range(24)])
    assert out["rewards"] == [1.0], out["error_types"]


def _io(pid: int) -> dict[str, int]:
    """The kernel's count of what process ``pid`` (all its threads) has read: ``syscr`` read
    calls and ``rchar`` bytes. Counts of the server's work, not timings, so the machine's load
    does not change them."""
    lines = open(f"/proc/{pid}/io").read().splitlines()
    return {key: int(value) for key, value in (line.split(": ") for line in lines)}


def test_a_candidate_flooding_stderr_costs_the_server_no_more_than_its_output_limit(server: Server) -> None:
    """The server's thread reads what the candidate writes on stderr (its tail kept): a
    candidate writing without end for its test's CPU time had the worker read as fast as
    it wrote (gigabytes for 4 samples, which every request's relay shares). A test's stderr
    past ``max_output_bytes`` (1 MiB here) is an output limit, as its stdout."""
    (worker,) = server.worker_pids()
    flood = "import os\ndef f(x):\n    chunk = b'e' * 65536\n    while True:\n        os.write(2, chunk)"
    before = _io(worker)["rchar"]
    out = called(server.url, [flood] * 4, [0], [[0]])
    assert out["error_types"] == ["output_limit"] * 4, out
    # Each sample's 1 MiB limit, a pipe's worth past it, and the request itself.
    assert _io(worker)["rchar"] - before < 4 * (2 << 20) + (1 << 20), _io(worker)["rchar"] - before


SLEEPING = """
import threading, time
threading.stack_size(1 << 16)
def f(x):
    try:
        for _ in range(THREADS):
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    except RuntimeError:
        pass
    time.sleep(60)
"""


def test_a_candidates_idle_threads_cost_the_server_a_bounded_read_per_tick(server: Server) -> None:
    """The server reads the candidate's threads' waits for a CPU each tick (its wall backstop
    leaves them out): 7 samples sleeping in 250 threads each, using no CPU, had the worker
    read 1,750 files every tick. It reads at most ``THREADS_PER_READ`` of them per sample and
    tick, in turn: counted against the same samples sleeping without threads, graded just
    before, the extra read calls stay within that many files (two reads each) per tick."""
    (worker,) = server.worker_pids()
    extra = []
    for threads in (0, 250):
        before, started = _io(worker)["syscr"], time.monotonic()
        out = called(server.url, [SLEEPING.replace("THREADS", str(threads))] * (GROUP - 1), [0], [[0]])
        assert out["error_types"] == ["timeout"] * (GROUP - 1), out
        ticks = (time.monotonic() - started) / CPU_TICK_S + 1
        extra.append(_io(worker)["syscr"] - before)
    bound = (GROUP - 1) * ticks * THREADS_PER_READ * 2 * 2  # twice the reads the bound allows
    assert extra[1] - extra[0] < bound, (extra, bound)


def test_a_call_based_candidate_over_its_memory_is_a_memory_limit(server: Server) -> None:
    """Killed by the kernel at its cgroup's limit: the server reads the kill from the cgroup
    after the candidate (its sample's init) is gone. The next test gets a fresh candidate."""
    code = "def f(x):\n    if x:\n        b = bytearray(600 << 20)\n        b[::4096] = b'x' * len(b[::4096])\n"
    code += "    return x"
    out = called(server.url, [code], [1, 0], [[1], [0]])
    assert out["rewards"] == [0.5] and out["error_types"] == ["memory_limit"], out


def test_a_busy_candidate_is_timed_on_its_cpu_by_the_server(server: Server) -> None:
    """A test that loops is killed past its CPU limit; the next test runs in a fresh candidate
    and passes."""
    code = "def f(x):\n    while x:\n        pass\n    return x"
    out = called(server.url, [code], [1, 0], [[1], [0]])
    assert out["rewards"] == [0.5] and out["error_types"] == ["timeout"], out
