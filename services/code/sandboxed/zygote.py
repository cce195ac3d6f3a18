"""The warm fork server that runs inside the sandbox's namespaces (stdlib only).

Started once per worker (by ``sandbox.Sandbox``) as ``python -I -S -c <the package's bundle>
<fd> <cgroups> <packages>``, where ``fd`` is a listening Unix socket made by the server,
``cgroups`` the JSON of its cgroups, and ``packages`` the directory of the packages programs
may import ("" for none). Forking a warm interpreter costs a few milliseconds where a fresh
``python3`` costs over 100 ms (docs/ARCHITECTURE.md §8). It keeps ``SPARES`` supervisors
forked ahead, each with a sample's namespaces and cgroup made
(``supervisor.prepare_and_supervise``), waiting for the next connection: one sample each.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import time

from services.code.sandboxed.supervisor import prepare_and_supervise

# Supervisors kept prepared (namespaces and cgroup made) for the next samples, and the pause
# after one that failed to prepare.
SPARES = 4
FAILED_SPARE_PAUSE_S = 0.5
# Imported once in the zygote so each forked solution finds them warm.
WARM_MODULES = ("bisect", "collections", "functools", "heapq", "itertools", "math", "random", "re", "string")


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[3]:
        sys.path.append(sys.argv[3])  # after the standard library, which it cannot shadow
    sys.set_int_max_str_digits(0)  # the server's jobs hold the integers its labels may (scorer.INT_MAX_DIGITS)
    for name in WARM_MODULES:
        __import__(name)
    gc.freeze()  # forked children then copy fewer pages when their collector runs
    listener = socket.socket(fileno=int(sys.argv[1]))
    cgroups = json.loads(sys.argv[2])
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    print("zygote ready", flush=True)
    spares: set[int] = set()  # each prepared supervisor's pipe: a byte when it took a connection
    while True:
        while len(spares) < SPARES:
            spares.add(_fork_spare(listener, cgroups, spares))
        ready, _, _ = select.select(list(spares), [], [])
        for fd in ready:
            took = os.read(fd, 1)
            os.close(fd)
            spares.discard(fd)
            if took != b".":  # it failed to prepare: not at once again
                time.sleep(FAILED_SPARE_PAUSE_S)


def _fork_spare(listener: socket.socket, cgroups: dict, spares: set[int]) -> int:
    """Fork a supervisor that prepares a sample's namespaces and cgroup, then takes the next
    connection; returns the read end of its pipe."""
    accepted_read, accepted_write = os.pipe()
    if os.fork() == 0:
        code = 1
        try:
            os.close(accepted_read)
            for fd in spares:
                os.close(fd)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            prepare_and_supervise(listener, accepted_write, cgroups)
            code = 0
        except BaseException:  # the server sees the closed connection
            pass
        finally:
            os._exit(code)
    os.close(accepted_write)
    return accepted_read
