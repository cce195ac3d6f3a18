"""The CPUs this process may run on: its affinity mask (``taskset``, a container's cpuset), not
the machine's core count, which over-counts on a node shared by pinned jobs."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """How many CPUs this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where
    the platform keeps no affinity mask), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
