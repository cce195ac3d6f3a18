"""A stdin test's CPU limit holds for all its processes together, however they end and however
many there are, with the sample's cgroup counting their CPU and without cgroups."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from testing.server import Server, gunicorn_server

# Only CPU time decides: the wall limits leave a loaded machine room (more than admission at
# full limits would take on in a request's deadline: it is tested in test_code_admission).
ENV = {
    "SCORER_CODE_ADMISSION": "off",
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    "SCORER_CODE_TEST_CPU_S": "1",
    "SCORER_CODE_TEST_WALL_S": "60",
    "SCORER_CODE_SAMPLE_WALL_S": "120",
    "SCORER_CODE_MEMORY_MB": "256",
}
# Launched with the zygote's bundle (services.code.sandbox.inside.LOADER): the zygote, its samples'
# inits and their processes, and the bwrap around them.
ZYGOTE_MARK = b"-I\x00-S\x00-c\x00import os, sys"


@pytest.fixture(scope="module", params=["auto", "off"], ids=["cgroups", "no cgroups"])
def server(request, tmp_path_factory) -> Iterator[Server]:
    env = {**ENV, "SCORER_CODE_CGROUPS": request.param}
    with gunicorn_server("code", env, threads=8, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def verdict(url: str, code: str, tests: int = 1) -> tuple[float, str | None]:
    label = {"inputs": [""] * tests, "outputs": ["done"] * tests}
    body = {"outputs": [f"```python\n{code}\n```"], "prompts": ["p"], "labels": [label]}
    out = requests.post(url + "/reward/score", json=body, timeout=300).json()
    return out["rewards"][0], out["error_types"][0]


# 0.7 s of CPU in the program's own process, 0.6 s in 15 short children (each shorter than
# the supervisor's reading interval) that the kernel reaps itself: 1.3 s against 1 s.
REAPED_BY_THE_KERNEL = """
import os, signal, time
def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
spin(0.7)
for _ in range(15):
    done, told = os.pipe()
    if os.fork() == 0:
        spin(0.04)
        os._exit(0)
    os.close(told)
    os.read(done, 1)
    os.close(done)
print("done")
"""

SAME_WORK_IN_ONE_PROCESS = """
import time
end = time.process_time() + 1.3
while time.process_time() < end:
    pass
print("done")
"""


@pytest.mark.parametrize("code", [REAPED_BY_THE_KERNEL, SAME_WORK_IN_ONE_PROCESS], ids=["in children", "alone"])
def test_the_cpu_of_children_the_kernel_reaps_counts(server: Server, code: str) -> None:
    assert verdict(server.url, code) == (0.0, "timeout")


# Honest: children it waits for, their CPU under the limit, SIGCHLD set as some programs do.
WAITS_FOR_ITS_CHILDREN = """
import os, signal
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print("done")
"""


def test_a_program_setting_sigchld_and_waiting_for_its_children_passes(server: Server) -> None:
    assert verdict(server.url, WAITS_FOR_ITS_CHILDREN) == (1.0, None)


# Call-based: the first call starts a thread that works between the calls (1.5 s of CPU);
# the second call returns what it found, its own CPU next to none.
WORKS_BETWEEN_CALLS = """
import threading, time
found = []
def work():
    end = time.thread_time() + 1.5
    while time.thread_time() < end:
        pass
    found.append(1)
def f(x):
    if x == 0:
        threading.Thread(target=work, daemon=True).start()
        return 0
    while not found:
        time.sleep(0.01)
    return found[0]
"""


def test_cpu_a_thread_burns_between_two_calls_counts_toward_a_test(server: Server) -> None:
    """LeetCode's semantics (one process for the sample's calls, its globals kept), but no CPU
    outside every test's count."""
    label = {"fn_name": "f", "inputs": [[0], [1]], "outputs": [0, 1]}
    body = {"outputs": [f"```python\n{WORKS_BETWEEN_CALLS}\n```"], "prompts": ["p"], "labels": [label]}
    out = requests.post(server.url + "/reward/score", json=body, timeout=300).json()
    assert (out["rewards"], out["error_types"]) == ([0.5], ["timeout"]), out


def test_info_says_what_counts_the_cpu(server: Server) -> None:
    limits = requests.get(server.url + "/info", timeout=10).json()["model"]["resource_limits"]
    if limits.startswith("rlimits only"):
        assert limits.endswith("CPU counted from the sample's processes (/proc; SIGCHLD is never ignored)")
    else:
        assert limits.endswith(("CPU counted by the sample's cgroup (cpuacct.usage)", "(cpu.stat)")), limits


FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def zygote_reaped_cpu(worker: int) -> float:
    """CPU seconds of every process this worker's zygote has reaped (its samples' inits, and
    through them everything their samples ran): the most ``cutime + cstime`` among the
    worker's descendants launched with the zygote's bundle (the zygote's own is the most)."""

    def stat(pid: int | str) -> list[bytes]:
        return Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()

    most = 0.0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if ZYGOTE_MARK not in (proc / "cmdline").read_bytes():
                continue
            ancestor = int(proc.name)
            while ancestor > 1 and ancestor != worker:
                ancestor = int(stat(ancestor)[1])
            if ancestor == worker:
                fields = stat(proc.name)
                most = max(most, (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError, IndexError):
            continue
    return most


def test_a_fork_bomb_uses_at_most_one_and_a_half_times_its_limit(server: Server) -> None:
    """Its supervisor, starved by its processes, read their CPU too late: 4.6 s of CPU against
    a 1 s limit. The bound: 1.5 x the limit + 0.5 s (its supervisor's CPU included here)."""
    (worker,) = server.worker_pids()
    before = zygote_reaped_cpu(worker)
    assert verdict(server.url, FORK_BOMB) == (0.0, "timeout")
    deadline = time.monotonic() + 30
    used = zygote_reaped_cpu(worker) - before
    while time.monotonic() < deadline:  # until its init is reaped, and a while after
        time.sleep(1.0)
        now = zygote_reaped_cpu(worker) - before
        if now == used > 0:
            break
        used = now
    assert 1.0 <= used <= 1.5 * 1.0 + 0.5, used


def test_a_program_runs_below_its_supervisor_and_the_server_in_priority(server: Server) -> None:
    """Niced (``PROGRAM_NICE``): where the kernel does not group each session's processes
    (autogroup off, RHEL's kernels), a fork bomb's processes weighed each as much as the
    supervisor that stops it, which read its CPU too late (5.9 s against a 1 s limit here)."""
    probe = "import os\nprint('done' if os.getpriority(os.PRIO_PROCESS, 0) == 19 else 'not niced')"
    assert verdict(server.url, probe) == (1.0, None)
