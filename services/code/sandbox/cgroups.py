"""The server's side of the per-sample cgroups: find where this node lets us make them.

A worker makes one directory of its own (``scorer-code-<pid>``) under its own cgroup, per
controller (cgroup v1: ``memory``) or once (cgroup v2, with the
``memory`` and ``pids`` controllers enabled for it); each sample's supervisor makes the
sample's cgroup in it and joins it (``inside.confine.SampleCgroup``), and the zygote
removes it after; a closing worker removes what is left and its own directory, and the master
(after reaping a worker) or a starting worker the directories of workers that are gone without
removing theirs (killed, or stopped while their samples' processes still ran). Where none
can be made (no writable cgroupfs, controllers missing or not delegable, or
``SCORER_CODE_CGROUPS=off``), the sandbox falls back to rlimits (``describe`` says which).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

# The roles a sample's cgroup plays, by the v1 controller that plays each. Memory, and CPU
# (``cpuacct``, where it is mounted and delegable: otherwise the sample's CPU is counted from
# its processes) but no pids: each hierarchy is one more move of the sample's init, and a
# move makes every fork on the node wait for an RCU grace period (a second one right after the
# first costs well under a millisecond: the kernel takes it within the same grace period);
# its tasks are bounded by the rlimit on its uid's instead. v2 counts a cgroup's CPU
# (``cpu.stat``) with no controller.
V1_CONTROLLERS = {"memory": "memory"}
V1_OPTIONAL = {"cpu": "cpuacct"}
V2_CONTROLLERS = ("memory", "pids")
# What counts a sample's CPU, by version (the file of its cgroup), and otherwise.
CPU_COUNTERS = {1: "cpuacct.usage", 2: "cpu.stat"}
# Where the worker's directories appear inside bubblewrap (the host's paths elsewhere).
SANDBOX_ROOT = "/sys/fs/cgroup/scorer"
# A worker's directory is this and its pid.
WORKER_PREFIX = "scorer-code-"
# How long a closing worker waits for its samples' cgroups to empty (its zygote's death kills
# their processes, a moment after it), a starting one for a killed worker's, and how often
# they look.
REMOVE_WAIT_S = 5.0
DEAD_WORKER_WAIT_S = 1.0
REMOVE_RETRY_S = 0.05


@dataclass(frozen=True)
class Cgroups:
    """This worker's cgroup directories by role (``version`` 0: none, and ``reason`` why)."""

    version: int
    dirs: dict[str, str] = field(default_factory=dict)
    reason: str = ""

    def describe(self) -> str:
        """One line for logs and ``/info``: what bounds a sample's memory, tasks and CPU."""
        if not self.version:
            return f"rlimits only, per process (no cgroups: {self.reason}); {self.describe_cpu()}"
        tasks = "tasks" if "pids" in self.dirs else "tasks per uid by rlimit"
        return f"cgroup v{self.version} per sample (memory incl. shared memory; {tasks}); {self.describe_cpu()}"

    def describe_cpu(self) -> str:
        """What counts the CPU of a test's processes (those the kernel reaped itself included)."""
        if "cpu" in self.dirs:
            return f"CPU counted by the sample's cgroup ({CPU_COUNTERS[self.version]})"
        return "CPU counted from the sample's processes (/proc; SIGCHLD is never ignored)"

    def sandbox_dirs(self, isolation: str) -> dict[str, str]:
        """The directories as the sandbox's processes see them."""
        if isolation != "bwrap":
            return dict(self.dirs)
        return {role: f"{SANDBOX_ROOT}/{self._mount_name(path)}" for role, path in self.dirs.items()}

    def bwrap_binds(self) -> list[str]:
        """bwrap arguments that show the worker's directories (once each) under ``SANDBOX_ROOT``."""
        args: list[str] = []
        for path in sorted(set(self.dirs.values())):
            args += ["--bind", path, f"{SANDBOX_ROOT}/{self._mount_name(path)}"]
        return args

    def _mount_name(self, path: str) -> str:
        return next(role for role, dir_ in sorted(self.dirs.items()) if dir_ == path)

    def sweep(self, wait_s: float = 0.0) -> None:
        """Remove the sample cgroups left (empty once their processes died), waiting up to
        ``wait_s`` for the last ones to empty."""
        _remove_children(set(self.dirs.values()), wait_s)

    def remove(self) -> None:
        """Remove the worker's directories once its samples' processes are gone."""
        self.sweep(REMOVE_WAIT_S)
        for path in set(self.dirs.values()):
            with contextlib.suppress(OSError):
                os.rmdir(path)


def _remove_children(parents: set[str], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        left = False
        for parent in parents:
            with contextlib.suppress(FileNotFoundError):
                for child in Path(parent).iterdir():
                    if child.is_dir():
                        try:
                            child.rmdir()
                        except FileNotFoundError:
                            pass
                        except OSError:
                            left = True
        if not left or time.monotonic() >= deadline:
            return
        time.sleep(REMOVE_RETRY_S)


def _sweep_dead_workers(parent: str) -> None:
    """Remove the directories of this parent's workers that are gone without removing them
    (killed), and their samples' cgroups: nothing else would."""
    for path in Path(parent).glob(f"{WORKER_PREFIX}*"):
        pid = path.name.removeprefix(WORKER_PREFIX)
        if not pid.isdigit() or Path("/proc", pid).exists():
            continue
        _remove_children({str(path)}, DEAD_WORKER_WAIT_S)
        with contextlib.suppress(OSError):
            path.rmdir()


def sweep_dead_workers() -> None:
    """Remove the directories of this process's workers that are gone, in every hierarchy a
    worker makes one in: the master calls it after each worker exits (gunicorn's ``child_exit``),
    since a worker killed, or one whose samples' processes outlived its own removal, leaves them."""
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError):
        return
    for controller in sorted({*V1_CONTROLLERS.values(), *V1_OPTIONAL.values(), ""}):
        if controller in mounts and controller in own:
            _sweep_dead_workers(mounts[controller] + own[controller])


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under ``""`` its v2 path."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _mounts() -> dict[str, str]:
    """Mount point of each cgroup v1 controller, and under ``""`` of the v2 hierarchy (roots only)."""
    found: dict[str, str] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        root, mount_point = fields[3], fields[4]
        fstype, options = fields[-3], fields[-1]
        if root != "/":
            continue
        if fstype == "cgroup2":
            found.setdefault("", mount_point)
        elif fstype == "cgroup":
            for option in options.split(","):
                found.setdefault(option, mount_point)
    return found


def _make(parent: str, name: str) -> str:
    path = os.path.join(parent, name)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)
    os.chmod(path, 0o700)  # root's alone: no sandbox uid reads another sample's counters
    return path


def _probe(dirs: dict[str, str], files: dict[str, str]) -> None:
    """Make a sample cgroup in each directory, set a limit there, remove it (``OSError`` if not)."""
    for role, path in dirs.items():
        probe = os.path.join(path, "probe")
        os.mkdir(probe)
        try:
            if role in files:
                Path(probe, files[role]).write_text(str(1 << 30))
        finally:
            os.rmdir(probe)


def _optional(role: str, parent: str, name: str) -> dict[str, str]:
    """``{role: directory}`` where this worker can make samples' cgroups under ``parent``;
    ``{}`` where it cannot (the role is then played otherwise)."""
    try:
        _sweep_dead_workers(parent)
        path = _make(parent, name)
    except OSError:
        return {}
    try:
        _probe({role: path}, {})
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return {}
    return {role: path}


def setup(wanted: str) -> Cgroups:
    """This worker's cgroup directories, or the fallback with its reason."""
    if wanted == "off":
        return Cgroups(0, reason="SCORER_CODE_CGROUPS=off")
    name = f"{WORKER_PREFIX}{os.getpid()}"
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError) as exc:
        return Cgroups(0, reason=f"cannot read this process's cgroups: {exc}")
    made: dict[str, str] = {}
    try:
        if all(controller in mounts and controller in own for controller in V1_CONTROLLERS.values()):
            for role, controller in V1_CONTROLLERS.items():
                _sweep_dead_workers(mounts[controller] + own[controller])
                made[role] = _make(mounts[controller] + own[controller], name)
            _probe(made, {"memory": "memory.limit_in_bytes"})
            for role, controller in V1_OPTIONAL.items():
                if controller in mounts and controller in own:
                    made.update(_optional(role, mounts[controller] + own[controller], name))
            return Cgroups(1, made)
        if "" in mounts and "" in own:
            base = mounts[""] + own[""]
            available = Path(base, "cgroup.controllers").read_text().split()
            missing = [c for c in V2_CONTROLLERS if c not in available]
            if missing:
                return Cgroups(0, reason=f"cgroup v2 without the {', '.join(missing)} controller here")
            enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
            Path(base, "cgroup.subtree_control").write_text(enable)  # fails where this cgroup holds processes
            _sweep_dead_workers(base)
            path = _make(base, name)
            Path(path, "cgroup.subtree_control").write_text(enable)
            made = {"memory": path, "pids": path, "cpu": path}
            _probe({"memory": path}, {"memory": "memory.max"})
            return Cgroups(2, made)
    except OSError as exc:
        Cgroups(1, made).remove()
        return Cgroups(0, reason=f"cannot make cgroups here ({exc.strerror or exc}: {getattr(exc, 'filename', '')})")
    return Cgroups(0, reason="no cgroup v1 memory controller nor cgroup v2 here")
