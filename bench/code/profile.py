"""Where a sample's CPU goes through HTTP: by process role, by stage, and what its isolation
costs in the kernel (root, Linux ``perf``).

    .venv/bin/python -m bench.code.profile [--seconds 4] [--label "assert, one check()"] [--functions 40]

Runs the code service under gunicorn and keeps it busy with ``bench.code.bench``'s 64
coin_change samples (one per request, all at once, again and again; call-based labels unless
``--label`` names another of the bench's styles), while ``perf record -a
-g`` samples every CPU's stack for ``--seconds`` (``cpu-clock``, 4 kHz: each sample is 0.25
ms of a CPU). Each stack is given to a role by the process that ran it, found from the fork
tree perf recorded: the client (this process), the server's worker, the zygote, a sample's
init (for call-based tests it becomes the candidate), a process it forked, the kernel's own
threads. Isolation: the CPU under the kernel functions that make and tear down a sample's
namespaces and cgroup, wherever they ran (the exiting init, the kernel's workers). Stages: per
role, the CPU under what forks, tears down, faults pages in, compiles seccomp filters, moves
calls and answers, or runs Python. ``--functions N``: per role, the N functions most often on
its stacks. Figures are milliseconds of CPU per sample graded while recording.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.code.bench import CLIENTS, ENV, SOLUTIONS, assert_labels, samples  # noqa: E402
from testing.server import gunicorn_server  # noqa: E402

FREQUENCY = 4000
# Kernel functions by the isolation step they do (a stack counts once for each step it is in).
ISOLATION = {
    "network namespace: made": ("copy_net_ns",),
    "network namespace: torn down (kernel workers)": ("cleanup_net",),
    "mount, IPC, UTS namespaces: made": ("copy_mnt_ns", "copy_ipcs", "copy_utsname"),
    "namespaces: released at the init's exit": ("free_nsproxy", "exit_task_namespaces"),
    "PID namespace: made and emptied": ("copy_pid_ns", "zap_pid_ns_processes"),
    "private /tmp and /proc mounted": ("path_mount",),
    "cgroup: made, joined, removed": ("cgroup_mkdir", "__cgroup_procs_write", "cgroup_rmdir", "cgroup1_procs_write"),
    "cgroup: freed (kernel workers)": ("css_free_rwork_fn", "css_killed_work_fn", "css_release_work_fn"),
}
# What else a test's processes spend their CPU on, by the functions under it: per role.
STAGES = {
    "fork (the address space copied)": ("dup_mmap",),
    "exit (the address space torn down)": ("exit_mmap",),
    "page faults (copy-on-write mostly)": ("asm_exc_page_fault",),
    "seccomp filters compiled (BPF JIT)": ("bpf_prog_create_from_user",),
    "namespaces made (unshare)": ("create_new_namespaces",),
    "pipes and sockets (calls, answers, messages)": (
        "pipe_read", "pipe_write", "unix_stream_sendmsg", "unix_stream_recvmsg", "unix_stream_read_generic",
    ),
    "rlimits, uids, session (confinement)": (
        "__x64_sys_prlimit64", "__sys_setuid", "ksys_setsid", "__x64_sys_setgroups",
    ),
    "Python (the interpreter's own loop)": ("_PyEval_EvalFrameDefault",),
}  # fmt: skip
STAGE_ROLES = ("sample's init", "its children", "zygote", "server worker")
# The label styles ``bench.code.bench`` grades.
LABELS = {"call-based": {}, **assert_labels()}
HEADER = re.compile(r"^\s*(\d+)\s*$")
FRAME = re.compile(r"^\s+[0-9a-f]+ (\S+)")
FORK = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")


def load(url: str, label: dict, stop: threading.Event, done: list[float]) -> None:
    """64 samples at once, one per request (``bench.code.bench``'s client), each with
    ``label``, until ``stop``; each answer's time in ``done``."""

    def one(name: str) -> None:
        body = {"outputs": [f"```python\n{SOLUTIONS[name]}```"], "prompts": ["p"], "labels": [label]}
        CLIENTS[os.environ.get("BENCH_CODE_CLIENT", "http.client")](url, body)
        done.append(time.monotonic())

    with ThreadPoolExecutor(64) as pool:
        while not stop.is_set():
            list(pool.map(one, samples(64)))


def roles(script: str, client: int) -> dict[int, str]:
    """Each process's role, from the fork events of ``perf script``."""
    parent: dict[int, int] = {}
    for line in script.splitlines():
        found = FORK.search(line)
        if found and found.group(1) == found.group(2):
            parent[int(found.group(1))] = int(found.group(3))

    def chain(pid: int) -> list[int]:
        up = [pid]
        while up[-1] in parent and parent[up[-1]] != up[-1] and len(up) < 40:
            up.append(parent[up[-1]])
        return up

    named: dict[int, str] = {}
    for pid in parent:
        up = chain(pid)
        if 2 in up[1:]:
            named[pid] = "kernel threads"
        elif pid == client:
            named[pid] = "client (this process)"
        elif client in up:
            depth = up.index(client)  # 1: the gunicorn master, 2: its worker, then bwrap's two, the zygote...
            named[pid] = {1: "gunicorn master", 2: "server worker"}.get(depth, "")
            if depth > 2:
                below = up[: depth - 2][::-1]  # from the worker's child down to pid
                names = ["sandbox launcher", "sandbox launcher", "zygote", "sample's init", "its children"]
                named[pid] = names[min(len(below) - 1, len(names) - 1)]
    return named


def stacks(script: str) -> Iterator[tuple[int, set[str]]]:
    """Each sampled stack of ``perf script -F pid,ip,sym``: its pid and the functions in it."""
    pid, symbols = None, set()
    for line in script.splitlines():
        header, frame = HEADER.match(line), FRAME.match(line)
        if header:
            if pid is not None:
                yield pid, symbols
            pid, symbols = int(header.group(1)), set()
        elif frame and pid is not None:
            symbols.add(frame.group(1).split("+")[0])
    if pid is not None:
        yield pid, symbols


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--label", choices=list(LABELS), default="call-based", help="the label style graded")
    parser.add_argument("--functions", type=int, default=0, help="per role, the functions most often on its stacks")
    args = parser.parse_args()
    # The grader's throughput past what admission would take on (services/code/README.md#admission).
    env = {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan", "SCORER_CODE_ENV": ENV, "SCORER_CODE_ADMISSION": "off"}
    with gunicorn_server("code", env, threads=256) as server, tempfile.TemporaryDirectory() as tmp:
        stop, done = threading.Event(), []
        loader = threading.Thread(target=load, args=(server.url + "/reward/score", LABELS[args.label], stop, done))
        loader.start()
        time.sleep(3)  # warm
        data = f"{tmp}/perf.data"
        began = time.monotonic()
        subprocess.run(
            ["perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", str(FREQUENCY), "-o", data,
             "--", "sleep", str(args.seconds)], check=True, capture_output=True,
        )  # fmt: skip
        ended = time.monotonic()
        stop.set()
        loader.join()
        script = subprocess.run(
            ["perf", "script", "-i", data, "--show-task-events", "-F", "pid,ip,sym"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    graded = sum(began <= at <= ended for at in done)
    named = roles(script, client=os.getpid())
    by_role: collections.Counter[str] = collections.Counter()
    by_step: collections.Counter[str] = collections.Counter()
    by_function: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    by_stage: collections.Counter[tuple[str, str]] = collections.Counter()
    for pid, symbols in stacks(script):
        if pid == 0:
            continue  # idle
        role = named.get(pid) or "other"
        by_role[role] += 1
        by_function[role].update(symbols)
        for step, functions in ISOLATION.items():
            if symbols & set(functions):
                by_step[step] += 1
        for stage, functions in STAGES.items():
            if symbols & set(functions):
                by_stage[role, stage] += 1
    rate = graded / (ended - began)  # perf records ``--seconds`` of this span
    per_sample = 1000 / FREQUENCY / max(rate * args.seconds, 1)
    total = sum(by_role.values())
    print(f"{args.label}: {graded} samples graded in {ended - began:.1f} s ({rate:.1f}/s); CPU per sample:")
    print("| role | ms per sample | share |\n|---|---|---|")
    for role, count in by_role.most_common():
        print(f"| {role} | {count * per_sample:.2f} | {100 * count / total:.1f}% |")
    print(f"| all | {total * per_sample:.2f} | 100% |")
    print("\n| isolation step | ms per sample |\n|---|---|")
    for step in ISOLATION:
        print(f"| {step} | {by_step[step] * per_sample:.3f} |")
    print(f"\n| stage (ms per sample, a stack in each stage it is under) | {' | '.join(STAGE_ROLES)} |")
    print(f"|---|{'---|' * len(STAGE_ROLES)}")
    for stage in STAGES:
        print(f"| {stage} | {' | '.join(f'{by_stage[role, stage] * per_sample:.3f}' for role in STAGE_ROLES)} |")
    for role in by_role:
        if args.functions and role != "other":
            print(f"\n{role}: the functions on most of its stacks (ms per sample, on the stack)")
            for function, on in by_function[role].most_common(args.functions):
                print(f"  {on * per_sample:7.3f}  {function}")


if __name__ == "__main__":
    main()
