# Over 400 lines: one GRPO group's attacks per round against one running server with its limits.
"""Isolation per sample, tried as a GRPO group would: 8 samples of one prompt per request, over
several rounds, each program trying to reach the others (at once or later) or the node.

Each program prints what it managed; the label expects the output of an isolated one, so a
sample scores 1.0 only when the channel is closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from services.code.sandbox import cgroups
from testing.clock import wait_until
from testing.code import ENV, GROUP, ISOLATION_ENV, NETWORK_MEETING, ROUNDS, grade
from testing.server import Server, gunicorn_server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with gunicorn_server("code", ISOLATION_ENV, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def group(url: str, codes: list[str], expected: str, stdin: str = "") -> dict:
    """One request of ``codes`` (a GRPO group), each graded on one stdin test."""
    label = {"inputs": [stdin], "outputs": [expected]}
    fenced = [f"```python\n{code}\n```" for code in codes]
    body = {"outputs": fenced, "prompts": ["p"] * len(codes), "labels": [label] * len(codes)}
    response = requests.post(url + "/reward/score", json=body, timeout=200)
    assert response.status_code == 200, response.text[:500]
    return json.loads(response.text)


def rounds(url: str, code: str, expected: str) -> None:
    """``ROUNDS`` requests of ``GROUP`` copies of ``code``: every sample must print ``expected``."""
    for round_ in range(ROUNDS):
        out = group(url, [code] * GROUP, expected)
        assert out["rewards"] == [1.0] * GROUP, (round_, out["error_types"])


def test_samples_graded_at_once_share_no_network(server: Server) -> None:
    rounds(server.url, NETWORK_MEETING, "alone")


LOOPBACK = """
import socket
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
client.sendall(b"ping")
print(peer.recv(4).decode())
"""


def test_each_sample_still_has_its_own_loopback(server: Server) -> None:
    assert group(server.url, [LOOPBACK], "ping")["rewards"] == [1.0]


# The kernel's per-uid key store: a key one sample adds, a later one finds (the slot's uid is
# the same), and setperm could open it to every uid.
KEYS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[os.uname().machine]
USER_KEYRING = -4
found = libc.syscall(REQUEST_KEY, b"user", b"grpo-answers", None, 0)
if found >= 0:
    print("found the answers another sample left")
else:
    added = libc.syscall(ADD_KEY, b"user", b"grpo-answers", b"42", 2, USER_KEYRING)
    keyring = libc.syscall(KEYCTL, 0, USER_KEYRING, 0)  # KEYCTL_GET_KEYRING_ID
    print("refused" if added < 0 and keyring < 0 else f"stored key {added} in keyring {keyring}")
"""


def test_the_kernel_key_store_is_refused(server: Server) -> None:
    rounds(server.url, KEYS, "refused")


# Other samples' processes (and their CPU times) in /proc.
PROC = """
import os, time
me = os.getuid()
others = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/status") as status:
            uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration):
        continue
    if uid != me:
        others.add(pid)
time.sleep(0.3)
print("own" if len(others) <= 1 else f"sees {len(others)} other processes")
"""


def test_proc_shows_only_the_samples_own_processes(server: Server) -> None:
    rounds(server.url, PROC, "own")


# Something left for a later sample of the same slot: a process in the background (killed at
# the end today), a file under /tmp or /dev/shm, a POSIX message queue, a SysV segment.
LEFTOVERS = """
import ctypes, os, sys
found = []
for path in ("/tmp/grpo-left", "/dev/shm/grpo-left-shm"):
    if os.path.exists(path):
        found.append(path)
    else:
        with open(path, "w") as f:
            f.write("answers")
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
queue = libc.mq_open(b"/grpo-left", os.O_RDONLY)
if queue >= 0:
    found.append("mqueue")
else:
    libc.mq_open(b"/grpo-left", os.O_CREAT | os.O_RDONLY, 0o600, None)
segment = libc.shmget(0x6770, 4096, 0)
if segment >= 0:
    found.append("sysv")
else:
    libc.shmget(0x6770, 4096, 0o1600)
print("nothing left" if not found else "found " + ", ".join(found))
"""


def test_nothing_a_sample_leaves_reaches_a_later_one(server: Server) -> None:
    rounds(server.url, LEFTOVERS, "nothing left")


# Marks on /tmp itself, no file made: its mode and its times.
MARKS_ON_TMP = """
import os
info = os.stat("/tmp")
print("nothing left" if info.st_mode & 0o777 == 0o700 and int(info.st_mtime) != 12345 else "found marks")
os.chmod("/tmp", 0o750)
os.utime("/tmp", (12345, 12345))
"""


@pytest.mark.parametrize("code", [LEFTOVERS, MARKS_ON_TMP], ids=["files and IPC", "marks on /tmp"])
def test_nothing_a_test_leaves_reaches_the_samples_next_test(server: Server, code: str) -> None:
    """A contest judge starts every test afresh: a too-slow program saving partial work in
    /tmp (or SysV, a POSIX queue) for its next tests would spread its work over them."""
    label = {"inputs": [""] * 4, "outputs": ["nothing left"] * 4}
    body = {"outputs": [f"```python\n{code}\n```"], "prompts": ["p"], "labels": [label]}
    out = requests.post(server.url + "/reward/score", json=body, timeout=200).json()
    assert out["rewards"] == [1.0], out["error_types"]


# -- resources, enforced by the kernel per sample ---------------------------------------------
def stdin_verdict(url: str, code: str, expected: str) -> tuple[float, str | None]:
    out = group(url, [code], expected)
    return out["rewards"][0], out["error_types"][0]


# Shared memory no rlimit counts: memfd pages are neither address space nor the sample's tmpfs.
MEMFD_HOG = """
import os
held = []
try:
    while len(held) < 48:
        fd = os.memfd_create("hog")
        for _ in range(2):
            os.write(fd, b"x" * (8 << 20))
        held.append(fd)
except OSError:
    pass
print("held" if len(held) == 48 else "bounded")
"""


def test_memfd_counts_toward_the_samples_memory(server: Server) -> None:
    assert stdin_verdict(server.url, MEMFD_HOG, "held")[0] == 0.0


THREADS = """
import threading
together = threading.Barrier(16)
def work():
    together.wait()
    sum(range(200_000))
threads = [threading.Thread(target=work) for _ in range(16)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("ok")
"""

STACK = """
import resource, sys, threading
resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
sys.setrecursionlimit(10 ** 6)
threading.stack_size(64 << 20)
def depth(n):
    return 0 if n == 0 else 1 + depth(n - 1)
result = []
thread = threading.Thread(target=lambda: result.append(depth(50_000)))
thread.start()
thread.join()
print("ok" if result == [50_000] else "failed")
"""


@pytest.mark.parametrize("code", [THREADS, STACK], ids=["16 running threads", "an unlimited stack"])
def test_common_idioms_run(server: Server, code: str) -> None:
    assert stdin_verdict(server.url, code, "ok") == (1.0, None)


# test_cpu_s is 1 s: four processes of 0.6 s each use 2.4 s together.
FORKED_CPU = """
import os, time
def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        spin(0.6)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print("done")
"""


def test_a_stdin_programs_processes_share_its_cpu_limit(tmp_path) -> None:
    env = {**ENV, "SCORER_CODE_TEST_WALL_S": "60", "SCORER_CODE_SAMPLE_WALL_S": "60"}  # only CPU time decides
    with gunicorn_server("code", env, log_dir=tmp_path) as srv:
        assert stdin_verdict(srv.url, FORKED_CPU, "done") == (0.0, "timeout")


# Busy loops left running (never waited for) while the program ends at once.
BUSY_LOOPS = """
import os
for _ in range(16):
    if os.fork() == 0:
        while True:
            pass
print("done")
"""


def test_another_requests_busy_loops_do_not_time_out_a_correct_program(server: Server) -> None:
    hogs = threading.Thread(target=group, args=(server.url, [BUSY_LOOPS] * 2, "done"))
    hogs.start()
    time.sleep(0.3)
    assert stdin_verdict(server.url, NEEDS_HALF_A_SECOND, "ok") == (1.0, None)
    hogs.join()


# A correct program needing 0.5 s of CPU (test_cpu_s is 1 s, test_wall_s 5 s), 31 copies in
# one request: on few cores they wait for CPU, and waiting is not their own time.
NEEDS_HALF_A_SECOND = """
import time
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
print("ok")
"""


def test_a_program_slowed_by_others_is_not_timed_out(server: Server) -> None:
    out = group(server.url, [NEEDS_HALF_A_SECOND] * 31, "ok")
    assert out["rewards"] == [1.0] * 31, out["error_types"]


def test_info_says_which_resource_limits_are_in_force(server: Server) -> None:
    model = requests.get(server.url + "/info", timeout=10).json()["model"]
    assert model["resource_limits"].startswith(("cgroup v1 per sample", "cgroup v2 per sample", "rlimits only"))
    assert model["parallel"] >= 8


def test_without_cgroups_the_fallback_still_bounds_shared_memory(tmp_path) -> None:
    """Forced by the setting: rlimits only, and memfd_create (which no rlimit counts) refused."""
    with gunicorn_server("code", {**ENV, "SCORER_CODE_CGROUPS": "off"}, log_dir=tmp_path) as srv:
        model = requests.get(srv.url + "/info", timeout=10).json()["model"]
        assert model["resource_limits"].startswith("rlimits only, per process (no cgroups: SCORER_CODE_CGROUPS=off);")
        assert stdin_verdict(srv.url, MEMFD_HOG, "held")[0] == 0.0
        assert stdin_verdict(srv.url, STACK, "ok") == (1.0, None)
        assert group(srv.url, [NETWORK_MEETING] * 4, "alone")["rewards"] == [1.0] * 4
        # Call-based samples (their init the candidate): a test past the memory limit, then one that passes.
        hog = "def f(x):\n    if x:\n        b = bytearray(600 << 20)\n        b[::4096] = b'x' * len(b[::4096])\n"
        out = grade(srv.url, [hog + "    return x"], {"fn_name": "f", "inputs": [[1], [0]], "outputs": [1, 0]})
        assert out["rewards"] == [0.5] and out["error_types"] == ["memory_limit"], out


# A call-based solution that works in a thread (deep recursion's usual idiom), needing 0.5 s of
# CPU; the caller's thread waits in ``join`` and so never waits for a CPU.
THREADED_CALL = """
import threading, time
def f():
    found = []
    def work():
        end = time.process_time() + 0.5
        while time.process_time() < end:
            pass
        found.append("ok")
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    return found[0]
"""


PLAIN_CALL = """
import time
def f():
    end = time.process_time() + 0.5
    while time.process_time() < end:
        pass
    return "ok"
"""


@pytest.mark.parametrize("code", [PLAIN_CALL, THREADED_CALL], ids=["plain", "in a thread"])
def test_a_call_based_program_slowed_by_others_is_not_timed_out(tmp_path, code: str) -> None:
    """31 copies on 2 cores each take seconds of wall time for 0.5 s of CPU: the wall backstop
    (1 s here) must leave out the waits of the thread doing the work, not only the first one's,
    and the time its candidate took to start (a prepared init, under this load)."""
    env = {**ENV, "SCORER_CODE_TEST_WALL_S": "1", "SCORER_CODE_SAMPLE_WALL_S": "60"}
    with gunicorn_server("code", env, threads=64, log_dir=tmp_path) as srv:
        label = {"fn_name": "f", "inputs": [[]], "outputs": ["ok"]}
        fenced = [f"```python\n{code}\n```"] * 31
        body = {"outputs": fenced, "prompts": ["p"] * 31, "labels": [label] * 31}
        out = requests.post(srv.url + "/reward/score", json=body, timeout=200).json()
        assert out["rewards"] == [1.0] * 31, out["error_types"]


def _worker_dirs(pid: int) -> list[Path]:
    """Where a worker started by this process makes its cgroup directories (under this
    process's cgroup, as ``cgroups.setup`` does)."""
    mounts, own = cgroups._mounts(), cgroups._own_paths()
    return [
        Path(mounts[c] + own[c], f"{cgroups.WORKER_PREFIX}{pid}")
        for c in ("memory", "cpuacct", "")
        if c in mounts and c in own
    ]


def _gone(paths: list[Path]) -> None:
    wait_until(
        lambda: not any(path.exists() for path in paths), f"{[str(path) for path in paths]} removed", pause_s=0.1
    )


def test_a_stopped_or_killed_worker_leaves_no_cgroup_behind(tmp_path) -> None:
    """Each stopped server left its prepared samples' cgroups behind (273 under one cgroup in a
    session of tests), and a killed worker its whole directory: a closing worker now removes
    its own once its samples' processes are gone, and a starting one a killed worker's."""
    label = {"fn_name": "f", "inputs": [[1]], "outputs": [1]}
    with gunicorn_server("code", ENV, log_dir=tmp_path) as srv:
        if requests.get(srv.url + "/info", timeout=10).json()["model"]["resource_limits"].startswith("rlimits"):
            pytest.skip("no cgroups on this node")
        (killed,) = srv.worker_pids()
        assert grade(srv.url, ["def f(x):\n    return x"] * 4, label)["rewards"] == [1.0] * 4
        made = [path for path in _worker_dirs(killed) if path.exists()]
        assert made and any(path.iterdir() for path in made)  # its samples' cgroups, prepared
        os.kill(killed, signal.SIGKILL)
        _gone(made)  # removed by the next worker's start
        srv.wait_ready()
        (worker,) = srv.worker_pids()
        assert grade(srv.url, ["def f(x):\n    return x"] * 4, label)["rewards"] == [1.0] * 4
        made = [path for path in _worker_dirs(worker) if path.exists()]
        assert made
    _gone(made)


def test_a_worker_cut_off_by_the_grace_period_leaves_no_cgroup_behind(tmp_path) -> None:
    """A stop whose grace period ends while a sample runs kills the worker before it can remove
    its directories (its clean-up runs at exit): the master removes them once it has reaped it."""
    label = {"fn_name": "f", "inputs": [[1]], "outputs": [1]}
    env = {**ENV, "SCORER_GRACEFUL_TIMEOUT": "1"}
    with gunicorn_server("code", env, log_dir=tmp_path) as srv:
        if requests.get(srv.url + "/info", timeout=10).json()["model"]["resource_limits"].startswith("rlimits"):
            pytest.skip("no cgroups on this node")
        (worker,) = srv.worker_pids()
        assert grade(srv.url, ["def f(x):\n    return x"], label)["rewards"] == [1.0]
        made = [path for path in _worker_dirs(worker) if path.exists()]
        assert made
        slow = "def f(x):\n    while True:\n        pass"
        in_flight = threading.Thread(target=lambda: _ignore_errors(grade, srv.url, [slow], label), daemon=True)
        in_flight.start()
        wait_until(lambda: any(any(path.iterdir()) for path in made), "the slow sample running", pause_s=0.05)
        srv.process.send_signal(signal.SIGTERM)
        srv.process.wait(60)
    _gone(made)


def _ignore_errors(call, *args) -> None:
    # The server stopped under it: the test looks at what it left, not at the answer.
    with contextlib.suppress(requests.RequestException, AssertionError, ValueError):
        call(*args)
