"""The warm fork server that runs inside the sandbox's namespaces (stdlib only).

Started once per worker (by ``host.Sandbox``) as ``python -I -S -c <the package's LOADER>
<fd> <cgroups> <packages> <spares> <preludes>``, the package's bundle on its stdin, where ``fd``
is a listening Unix socket made by the server, ``cgroups`` the JSON of its cgroups,
``packages`` the directory of the packages programs may import ("" for none), ``spares`` how
many inits to keep prepared and ``preludes`` the JSON list of the preludes to prepare
(``program.prepare_preludes``). Forking a warm interpreter costs a few milliseconds where a fresh
``python3`` costs over 100 ms (docs/ARCHITECTURE.md §8). It keeps ``spares`` samples' inits
forked ahead, each the first process of a PID
namespace of its own, with its other namespaces and its cgroup made
(``supervisor.prepare_and_supervise``), waiting for the next connection: one sample each. It
removes each sample's cgroup a while after its init has exited.
"""

from __future__ import annotations

import gc
import json
import os
import select
import socket
import sys
import time

from services.code.sandbox.inside import confine, program
from services.code.sandbox.inside.supervisor import prepare_and_supervise

# The pause after an init that failed to prepare.
FAILED_SPARE_PAUSE_S = 0.5
# A sample's cgroup is removed this long after its init exited (the server reads a call-based
# sample's OOM kills from it then), tried again every REMOVE_RETRY_S until the kernel lets it
# go, for REMOVE_TRIES tries at most (then the next zygote's start sweeps it).
REMOVE_GRACE_S = 1.0
REMOVE_RETRY_S = 0.01
REMOVE_TRIES = 1000
# Imported once in the zygote so each forked solution finds them warm (the `lcb` prelude's too).
WARM_MODULES = (
    "bisect", "collections", "copy", "datetime", "functools", "heapq", "io", "itertools", "json", "math", "operator",
    "random", "re", "statistics", "string", "typing",
)  # fmt: skip


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[3]:
        sys.path.append(sys.argv[3])  # after the standard library, which it cannot shadow
    sys.set_int_max_str_digits(0)  # the server's jobs hold the integers its labels may (scorer.INT_MAX_DIGITS)
    for name in WARM_MODULES:
        __import__(name)
    program.prepare_preludes(json.loads(sys.argv[5]))
    confine.build_filters()
    gc.collect()
    confine.trim_heap()
    gc.freeze()  # forked children then copy fewer pages when their collector runs
    listener = socket.socket(fileno=int(sys.argv[1]))
    cgroups = json.loads(sys.argv[2])
    spares_wanted = int(sys.argv[4])
    own_pids = confine.own_pid_namespace()
    print("zygote ready", flush=True)
    # Prepared inits by their pipe (a byte when one took a connection or failed to prepare),
    # every live init's cgroup by its pidfd (readable once it exited, then reaped), and the cgroups to
    # remove with the time to try next and the tries so far.
    spares: dict[int, int] = {}
    alive: dict[int, confine.SampleCgroup | None] = {}
    leftover: dict[confine.SampleCgroup, tuple[float, int]] = {}
    while True:
        while len(spares) < spares_wanted:
            pipe, pidfd, cgroup = _fork_init(listener, cgroups, own_pids, [*spares, *alive])
            spares[pipe], alive[pidfd] = pidfd, cgroup
        now = time.monotonic()
        timeout = max(0.0, min(when for when, _ in leftover.values()) - now) if leftover else None
        ready, _, _ = select.select([*spares, *alive], [], [], timeout)
        failed = False
        for fd in ready:
            if fd in spares:  # taken (".") or failed ("!", or gone)
                failed = failed or os.read(fd, 1) != b"."
                del spares[fd]
                os.close(fd)
            elif fd in alive:
                cgroup = alive.pop(fd)
                os.waitid(os.P_PIDFD, fd, os.WEXITED)
                os.close(fd)
                if cgroup is not None:
                    leftover[cgroup] = (time.monotonic() + REMOVE_GRACE_S, 0)
        now = time.monotonic()
        for cgroup, (when, tries) in list(leftover.items()):
            if when > now:
                continue
            if cgroup.remove() or tries >= REMOVE_TRIES:
                del leftover[cgroup]
            else:
                leftover[cgroup] = (now + REMOVE_RETRY_S, tries + 1)
        if failed:
            time.sleep(FAILED_SPARE_PAUSE_S)


def _fork_init(
    listener: socket.socket, cgroups: dict, own_pids: int, fds: list[int]
) -> tuple[int, int, confine.SampleCgroup | None]:
    """Fork the init of the next sample (pid 1 of a new PID namespace, in a new cgroup), which
    prepares the rest and takes the next connection; returns the read end of its pipe, its
    pidfd and its cgroup. ``fds``: the zygote's other inits' pipes and pidfds, which it closes.
    The zygote reaps its inits itself (``waitid`` on the pidfd): an init may be done before
    its pidfd is taken, and its pid must stay its own until then."""
    cgroup = confine.SampleCgroup(cgroups["version"], cgroups["dirs"]) if cgroups["dirs"] else None
    accepted_read, accepted_write = os.pipe()
    pid = confine.fork_into_new_pids(own_pids)
    if pid == 0:
        code = 1
        try:
            for fd in (accepted_read, own_pids, *fds):
                os.close(fd)
            prepare_and_supervise(listener, accepted_write, cgroup)
            code = 0
        except BaseException:  # the server sees the closed connection
            pass
        finally:
            os._exit(code)
    os.close(accepted_write)
    return accepted_read, os.pidfd_open(pid), cgroup
