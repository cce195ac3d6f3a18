"""What starting a stdin test afresh costs the supervisor (``confine.fresh_tmp``): a new IPC
namespace per test, and a new ``/tmp`` when the earlier test left a mark on it. Run as root
(it takes a mount and an IPC namespace of its own, as a sample's init does), in-process:

    python -m bench.code.fresh_start [--tests 300]

Prints the CPU and wall time per fresh start after tests that left ``/tmp`` as it was made
and after tests that wrote a file there.
"""

from __future__ import annotations

import argparse
import os
import time

from services.code.sandbox.inside import confine
from services.code.sandbox.inside.messages import Job

UID = 61999  # not used by a running server's slots (uid_base 61000 and up, 2 per slot)


def measure(tests: int) -> None:
    """In a mount and IPC namespace of this process's own (a child's)."""
    confine._check(confine._LIBC.unshare(confine.CLONE_NEWNS | confine.CLONE_NEWIPC), "unshare")
    confine._check(confine._LIBC.mount(b"none", b"/", None, confine.MS_REC | confine.MS_PRIVATE, None), "private")
    job = Job("stdin", "", None, [], 1.0, 1.0, 1.0, 1 << 30, 16, 64, 1 << 20, 1 << 20, 64 << 20, 1 << 20, UID, UID)
    confine.private_tmp(job)
    for writes in (False, True):
        pristine = confine.tmp_state()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(tests):
            if writes:
                with open("/tmp/partial-work", "wb") as file:
                    file.write(b"x" * 65536)
            if confine.fresh_tmp(job, pristine):
                pristine = confine.tmp_state()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = "a test that wrote in /tmp" if writes else "a test that left /tmp as it was"
        print(f"after {after}: {1e3 * cpu / tests:.3f} ms CPU, {1e3 * wall / tests:.3f} ms wall per test")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tests", type=int, default=300)
    args = parser.parse_args()
    pid = os.fork()
    if pid == 0:
        try:
            measure(args.tests)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
