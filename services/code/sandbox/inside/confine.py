# Over 400 lines: one process's confinement (namespaces, seccomp, rlimits, uids), shipped stdlib-only.
"""What confines a sample's processes, and what is left of them afterwards: nothing.

Each sample gets mount, IPC, network, UTS and PID namespaces and a cgroup of its own
(``private_namespaces``, ``SampleCgroup``), made for it ahead of it and never reused. Each
process that runs a program or a label's code is forked by ``spawn``: it drops to an
unprivileged uid of the slot, no groups, no new privileges, rlimits (``limit``), and a seccomp
filter that refuses namespaces (``forbid_shared_kernel_state``); the candidate's process (and a
compiled program's, an interactor's) also refuses new processes, in the same filter. ``clean_up``
kills whatever a test left running.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import resource
import signal
import socket
import struct
import sys
import time
import typing

from services.code.sandbox.inside.messages import Job

PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000,
    0x4000000,
    0x8000000,
    0x20000000,
    0x40000000,
)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 12, 1 << 14, 1 << 18
MNT_DETACH = 2
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
TMP_INODES = 4096
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The clock id of another process's CPU time is made of its pid and this (the kernel's
# ``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)``: the time its threads ran, in nanoseconds).
CPUCLOCK_SCHED = 2
# A program's stack to begin with; it may raise it (the hard limit is unlimited: its address
# space and its sample's memory cgroup bound it).
STACK_BYTES = 64 << 20
M_ARENA_MAX, MALLOC_ARENAS = -8, 2
_LIBC = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    _LIBC.prctl(option, value, 0, 0, 0)


def trim_heap() -> None:
    """Give the C heap's free pages back to the kernel (``malloc_trim``): what compiling and
    importing left free would otherwise stay resident in the zygote, and each fork copies the
    page table entries of every resident page (about 1 MiB less here)."""
    _LIBC.malloc_trim(0)


def own_pid_namespace() -> int:
    """An fd of this process's PID namespace, to come back to after ``fork_into_new_pids``."""
    return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)


def fork_into_new_pids(own: int) -> int:
    """``os.fork``, the child being the init (pid 1) of a new PID namespace, while this
    process stays in ``own`` (``own_pid_namespace``) and forks its children there again. (The
    zygote forks each sample's init itself: no process between them to fork, run and exit.)"""
    _check(_LIBC.unshare(CLONE_NEWPID), "unshare a PID namespace")
    try:
        pid = os.fork()
    except BaseException:
        _back_to_pids(own)
        raise
    if pid:  # the parent (the child is in the new namespace, and cannot leave it)
        _back_to_pids(own)
    return pid


def _back_to_pids(own: int) -> None:
    _check(_LIBC.setns(own, CLONE_NEWPID), "back to the zygote's PID namespace")


def private_namespaces() -> None:
    """Give this process, a sample's init (``fork_into_new_pids``), namespaces of its own,
    made for it and gone with it.

    Network: only a loopback of its own (no address, abstract socket or port another sample
    sees). IPC: SysV and POSIX queues of its own. Mounts: its own (``private_tmp``), with a
    ``/proc`` that lists only the sample's processes. UTS: its own host name. PID: it is the
    namespace's init, whose exit kills every process left in it.
    """
    _check(_LIBC.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS), "unshare")
    _check(_LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    _check(_LIBC.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


def private_tmp(job: Job) -> None:
    """The sample's writable place: a tmpfs of ``tmp_bytes`` on ``/tmp``, also on ``/dev/shm``,
    owned by its uid; and its IPC namespace's shared memory limited to ``tmp_bytes`` too."""
    _mount_tmp(job)
    _limit_ipc(job)


def _mount_tmp(job: Job) -> None:
    options = f"size={job.tmp_bytes},nr_inodes={TMP_INODES},mode=0700,uid={job.uid},gid={job.gid}".encode()
    _check(_LIBC.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount /tmp")
    if os.path.isdir("/dev/shm"):
        _check(_LIBC.mount(b"/tmp", b"/dev/shm", None, MS_BIND, None), "mount /dev/shm")


def mount_tmpfs(path: str, size: int, uid: int) -> None:
    """A tmpfs of ``size`` bytes on ``path``, ``uid``'s alone."""
    options = f"size={size},nr_inodes=64,mode=0700,uid={uid},gid={uid}".encode()
    _check(_LIBC.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options), f"mount {path}")


def _limit_ipc(job: Job) -> None:
    size = job.tmp_bytes
    for name, value in (("shmmax", size), ("shmall", size // 4096), ("shmmni", 64), ("msgmni", 16)):
        with open(f"/proc/sys/kernel/{name}", "w") as sysctl:
            sysctl.write(str(value))


# What of ``/tmp`` (a directory's status) shows whether a test left anything there: everything a
# program can make or change in a tmpfs begins with a change of its root (an entry made, its
# mode, owner or extended attributes set: ``st_ctime``) or a read of it (``st_atime``).
def tmp_state() -> tuple[int, ...]:
    """The status of ``/tmp`` that ``fresh_tmp`` compares."""
    info = os.stat("/tmp")
    return (info.st_ino, info.st_mode, info.st_uid, info.st_gid, info.st_nlink, info.st_size,
            info.st_atime_ns, info.st_mtime_ns, info.st_ctime_ns)  # fmt: skip


def fresh_tmp(job: Job, pristine: tuple[int, ...]) -> bool:
    """Start a test afresh, as a contest judge does: an IPC namespace of its own (no SysV
    object or POSIX queue of an earlier test), and an empty ``/tmp`` (and ``/dev/shm``) unless
    it is as it was made (``pristine``, its ``tmp_state``): an unmount costs the caller an RCU
    grace period (milliseconds of wall time). Called between tests, once every process of the
    earlier one is gone (``clean_up``); the old tmpfs and namespace go with their last
    reference. Returns whether ``/tmp`` is new."""
    _check(_LIBC.unshare(CLONE_NEWIPC), "unshare an IPC namespace")
    _limit_ipc(job)
    if tmp_state() == pristine:
        return False
    for path in (b"/dev/shm", b"/tmp"):
        if os.path.ismount(path):
            _check(_LIBC.umount2(path, MNT_DETACH), f"unmount {path.decode()}")
    _mount_tmp(job)
    return True


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


# Syscall numbers by ABI (0xFFFFFFFF: the ABI has none).
SYSCALLS = {
    "x86_64": {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
               "add_key": 248, "request_key": 249, "keyctl": 250, "memfd_create": 319, "rt_sigaction": 13},
    "aarch64": {"fork": 0xFFFFFFFF, "vfork": 0xFFFFFFFF, "clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
                "add_key": 217, "request_key": 218, "keyctl": 219, "memfd_create": 279, "rt_sigaction": 134},
}  # fmt: skip
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
CLONE_THREAD, EPERM, ENOSYS = 0x10000, 1, 38
# Every CLONE_NEW* flag of clone.
CLONE_NEW_ANY = 0x7E020000
# Classic BPF instructions of the filters (load word, jump if equal / greater or equal / bits
# set, return) and the filters' verdicts.
BPF_LD, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_ALLOW, SECCOMP_KILL = 0x7FFF0000, 0x80000000
SECCOMP_EPERM, SECCOMP_ENOSYS = 0x50000 | EPERM, 0x50000 | ENOSYS
# Success without the call's effect (an errno of 0).
SECCOMP_PRETEND = 0x50000


def forbid_shared_kernel_state(memfd: bool, new_processes: bool) -> None:
    """A seccomp filter: no ``unshare``, ``setns`` or ``clone`` into new namespaces, no key
    management (``add_key``, ``request_key``, ``keyctl``), and ``memfd_create`` only with
    ``memfd`` (a cgroup counts its pages; no rlimit does); ``clone3`` answers ENOSYS, so
    threads and ``posix_spawn`` fall back to ``clone``. Unprivileged, a user namespace would
    give a program its own mounts (a tmpfs past every limit); the kernel's key store is kept
    per uid, not per namespace, so a key would outlive its sample for the next one.

    And ``SIGCHLD`` keeps its default action: setting it (``rt_sigaction`` with an action)
    succeeds without effect. A parent that ignores it has its exited children reaped by the
    kernel, their CPU time added to no process's (``sample_cpu_seconds`` would lose it); no
    runtime a program starts here needs to handle it (only Python's may fork).

    Without ``new_processes``, also no fork, vfork or clone without ``CLONE_THREAD``: the
    process (a candidate, a compiled program, an interactor) is then the only one its code
    runs in, and its CPU time, threads included, is all in its process CPU clock
    (``cpu_seconds``). One filter, not two: the kernel compiles each filter a process
    installs (its BPF JIT: 0.2-0.5 ms of CPU and a cross-CPU call per filter here)."""
    _install(_kernel_state_filter(memfd, new_processes))


def build_filters() -> None:
    """Build every seccomp filter once, in the zygote: each process forked after only installs
    one (building one costs more than forking a process)."""
    for memfd in (False, True):
        for new_processes in (False, True):
            _kernel_state_filter(memfd, new_processes)


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


@functools.cache
def _kernel_state_filter(memfd: bool, new_processes: bool) -> _Program:
    refused = ("unshare", "setns", "add_key", "request_key", "keyctl") + (() if memfd else ("memfd_create",))
    if not new_processes:
        refused += ("fork", "vfork")
    return _compiled(_refusing(refused, clone_needs_thread=not new_processes))


def _refusing(refused: tuple[str, ...], clone_needs_thread: bool) -> list[tuple[int, int, int, int]]:
    """A filter's BPF program: this ABI only (another is killed), ``refused`` calls answer
    EPERM, ``clone3`` ENOSYS, ``clone`` EPERM with any ``CLONE_NEW*`` flag or, with
    ``clone_needs_thread``, without ``CLONE_THREAD``; ``rt_sigaction`` of ``SIGCHLD`` with an
    action pretends to succeed; all else is allowed."""
    machine = os.uname().machine
    numbers = SYSCALLS[machine]
    ld, jeq, jge, jset, ret = BPF_LD, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET
    checks = [(jeq, numbers[name]) for name in refused]
    # Layout: header (5), the SIGCHLD check (7), one jeq per refused call, clone3, clone, load
    # flags, test flags (once or twice), then the verdicts ALLOW, EPERM, ENOSYS, KILL, PRETEND.
    # Jumps count from the next instruction.
    first_check = 12
    clone3_at = first_check + len(checks)
    allow_at = clone3_at + 4 + clone_needs_thread
    eperm_at, enosys_at, kill_at, pretend_at = allow_at + 1, allow_at + 2, allow_at + 3, allow_at + 4
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH[machine]), (ret, 0, 0, SECCOMP_KILL),
        (ld, 0, 0, 0), (jge, kill_at - 5, 0, X32_SYSCALL_BIT),
        # rt_sigaction(SIGCHLD, act, ...): act (a pointer, two words) not NULL
        (jeq, 0, 6, numbers["rt_sigaction"]), (ld, 0, 0, 16), (jeq, 0, allow_at - 8, signal.SIGCHLD),
        (ld, 0, 0, 24), (jeq, 0, pretend_at - 10, 0), (ld, 0, 0, 28), (jeq, allow_at - 12, pretend_at - 12, 0),
    ]  # fmt: skip
    for at, (code, number) in enumerate(checks, start=first_check):
        program.append((code, eperm_at - at - 1, 0, number))
    program.append((jeq, enosys_at - clone3_at - 1, 0, numbers["clone3"]))
    program.append((jeq, 0, allow_at - clone3_at - 2, numbers["clone"]))
    program.append((ld, 0, 0, 16))  # clone's first argument: its flags
    program.append((jset, eperm_at - clone3_at - 4, 0, CLONE_NEW_ANY))  # set: EPERM
    if clone_needs_thread:
        program.append((jset, 0, 1, CLONE_THREAD))  # set: allow; else EPERM
    program += [(ret, 0, 0, SECCOMP_ALLOW), (ret, 0, 0, SECCOMP_EPERM), (ret, 0, 0, SECCOMP_ENOSYS),
                (ret, 0, 0, SECCOMP_KILL), (ret, 0, 0, SECCOMP_PRETEND)]  # fmt: skip
    return program


def _compiled(program: list[tuple[int, int, int, int]]) -> _Program:
    """A seccomp filter's program (BPF instructions: code, jump if true, jump if false, k) as
    the kernel takes it (the program keeps its instructions alive)."""
    return _Program(len(program), (_Instruction * len(program))(*(_Instruction(*insn) for insn in program)))


def _install(program: _Program) -> None:
    if _LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


# A test process's niceness: its supervisor (which reads its CPU and stops it at its limit) and
# the server run at the node's own. Where the kernel groups each session (autogroup) a program's
# processes share one weight whatever they are; where it does not (RHEL's kernels, or
# ``sched_autogroup_enabled=0``) each process of a fork bomb would weigh as much as its
# supervisor, which then read its CPU seconds too late: 5.9 s of CPU against a 1 s limit.
PROGRAM_NICE = 19


def limit(job: Job, tests: int, new_processes: bool) -> None:
    """Resource limits of a test process running ``tests`` tests (set before dropping root).

    Its OOM score is the highest: if the node runs out of memory, a test dies, not the server;
    its niceness ``PROGRAM_NICE``.
    It cannot make namespaces, nor without ``new_processes`` start processes
    (``forbid_shared_kernel_state``).
    """
    with open("/proc/self/oom_score_adj", "w") as oom:
        oom.write("1000")
    os.setpriority(os.PRIO_PROCESS, 0, PROGRAM_NICE)
    # Threads share malloc's arenas: one of its own would reserve 64 MiB of the address space
    # per thread, and a few threads would exhaust ``memory_bytes`` without using it.
    _LIBC.mallopt(M_ARENA_MAX, MALLOC_ARENAS)
    cpu = int(job.cpu_s * tests) + 1
    memory = job.memory_bytes
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_DATA, (memory, memory)),
        (resource.RLIMIT_NPROC, (job.nproc, job.nproc)),
        (resource.RLIMIT_NOFILE, (job.nofile, job.nofile)),
        (resource.RLIMIT_FSIZE, (job.fsize, job.fsize)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_STACK, (STACK_BYTES, resource.RLIM_INFINITY)),  # the program may raise it
    ):
        resource.setrlimit(res, value)
    forbid_shared_kernel_state(bool(job.cgroup_version), new_processes)


def spawn(
    job: Job,
    uid: int,
    fds: dict[int, int],
    cwd: str,
    body: typing.Callable[[], None],
    tests: int,
    new_processes: bool = True,
) -> int:
    """Fork a process that confines itself (``confine_self``) and runs ``body``."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            confine_self(job, uid, fds, cwd, tests, new_processes)
            body()
        finally:
            os._exit(70)
    return pid


def confine_self(job: Job, uid: int, fds: dict[int, int], cwd: str, tests: int, new_processes: bool = True) -> None:
    """Make this process a test process: a session of its own, only ``fds`` kept (its number:
    ours), dropped to ``uid`` with the rlimits of ``tests`` tests, no groups, no new
    privileges, a clean environment; without ``new_processes``, the only process its code
    runs in (``forbid_shared_kernel_state``)."""
    os.setsid()
    high = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 256) for target, source in fds.items()}
    for target, source in high.items():
        os.dup2(source, target)
    os.closerange(max(fds) + 1, 65536)
    limit(job, tests, new_processes)
    os.chdir(cwd)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"})
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def cpu_seconds(pid: int) -> float:
    """CPU time so far of process ``pid`` (a child: its pid is not reused before it is
    reaped) and all its threads: its process CPU clock, which the kernel reads in a few
    microseconds where formatting its ``/proc/<pid>/stat`` takes 15."""
    return time.clock_gettime((~pid << 3) | CPUCLOCK_SCHED)


def kill_uid(uid: int) -> None:
    """Kill every process of ``uid``: a helper with that uid signals -1 until none is left."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(uid)
            for _ in range(1000):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def clean_up(uid: int) -> None:
    """Leave nothing of a test running.

    The sample's init is the parent of every orphan its tests left, so once it has no child
    left, nothing is left; otherwise every process of the test's uid is killed and reaped.
    """
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            kill_uid(uid)
            with contextlib.suppress(ChildProcessError):
                while True:
                    os.waitpid(-1, 0)


def programs_cpu(cgroup: SampleCgroup | None) -> float:
    """CPU time so far of every process the sample had but its supervisor: its cgroup's count
    where it keeps one (one file read however many processes), otherwise its processes' own
    (``sample_cpu_seconds``, which no kernel-reaped child escapes: see
    ``forbid_shared_kernel_state``)."""
    counted = cgroup.programs_cpu_seconds() if cgroup is not None else None
    return sample_cpu_seconds() if counted is None else counted


def sample_cpu_seconds() -> float:
    """CPU time of every process of this sample but its init (the caller), threads included:
    what its live processes used (and the children they reaped), plus what the init's reaped
    children used. The sample's PID namespace holds its processes alone, and its init is the
    parent of every orphan, so nothing is counted twice or lost."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    ticks = 0
    me = str(os.getpid())
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == me:
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return reaped.ru_utime + reaped.ru_stime + ticks / CLOCK_TICKS


def sample_run_delay() -> float:
    """The longest a live thread of this sample (but its init's) has waited for a CPU while
    runnable: the time others' load took from a program of several processes or threads (one
    waiting on its starved children or threads waits for its own reasons). Per thread: a
    process's own ``schedstat`` is its first thread's, which in the JVM only waits for the
    thread running ``main``."""
    me = str(os.getpid())
    return max((threads_run_delay(name) for name in os.listdir("/proc") if name.isdigit() and name != me), default=0.0)


def threads_run_delay(pid: int | str, but_first: bool = False, most: int = 0, turn: int = 0) -> float:
    """The longest a live thread of process ``pid`` (``but_first``: but its first) has waited
    for a CPU while runnable, from each thread's ``schedstat``; of ``most`` of its threads
    only (0: all), the ``turn``-th such group in turn."""
    longest = 0.0
    with contextlib.suppress(OSError):
        tasks = [task for task in os.listdir(f"/proc/{pid}/task") if not (but_first and task == str(pid))]
        if 0 < most < len(tasks):
            start = turn * most % len(tasks)
            tasks = (tasks + tasks)[start : start + most]
        for task in tasks:
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{pid}/task/{task}/schedstat", "rb") as stat,
            ):
                longest = max(longest, int(stat.read().split()[1]) / 1e9)
    return longest


def run_delay(schedstat: int) -> float:
    """Seconds a process has waited for a CPU while runnable, from its ``/proc/<pid>/schedstat``
    (open): time others' load took from it, not its own."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(os.pread(schedstat, 256, 0).split()[1]) / 1e9
    return 0.0


# The files of a sample's cgroup by version: the memory limit, the task limit, the OOM kill
# count (a line of the file), the CPU time of every task it ever held (v1: nanoseconds; v2:
# microseconds, a line of the file).
CGROUP_FILES = {
    1: {"memory": "memory.limit_in_bytes", "pids": "pids.max", "events": "memory.oom_control", "cpu": "cpuacct.usage"},
    2: {"memory": "memory.max", "pids": "pids.max", "events": "memory.events", "cpu": "cpu.stat"},
}


class SampleCgroup:
    """A sample's cgroup, made for it before it arrives and removed after its last process.

    Bounds the sample as a whole: its memory, shared memory (tmpfs, memfd, SysV) included,
    and its tasks (processes and threads). The sample's init makes it and joins it (once per
    hierarchy) as it prepares, before the sample arrives: moving a process between cgroups
    waits for an RCU grace period (milliseconds), so the sample's processes are born in it
    instead of joining it. The zygote, which named it, removes it once the init has exited
    (a while after: the server reads a call-based sample's OOM kills when its init is gone).
    """

    def __init__(self, version: int, parents: dict[str, str], name: str = "") -> None:
        """Where the next sample's cgroup goes (its init makes it: ``make_and_join``), or
        where the one called ``name`` is (under the parents as the caller sees them)."""
        self.version, self.files = version, CGROUP_FILES[version]
        self.name = name or f"sample-{os.getpid()}-{time.monotonic_ns()}"
        self.dirs = {role: os.path.join(parent, self.name) for role, parent in parents.items()}
        self._cpu_fd = -1

    def set_limits(self, job: Job) -> None:
        self._write(self.dirs["memory"], self.files["memory"], job.cgroup_memory_bytes)
        if "pids" in self.dirs:
            self._write(self.dirs["pids"], self.files["pids"], job.cgroup_tasks)
        if self.version == 2:
            with contextlib.suppress(FileNotFoundError):  # no swap for a sample
                self._write(self.dirs["memory"], "memory.swap.max", 0)

    @staticmethod
    def _write(directory: str, name: str, value: int) -> None:
        with open(os.path.join(directory, name), "w") as file:
            file.write(str(value))

    def make_and_join(self) -> None:
        """Make the cgroup and put this process (and so what it forks from now on) in it."""
        for path in dict.fromkeys(self.dirs.values()):
            os.mkdir(path)
            self._write(path, "cgroup.procs", 0)

    def oom_kills(self) -> int:
        """How many of the sample's processes the kernel killed at its memory limit so far."""
        with open(os.path.join(self.dirs["memory"], self.files["events"])) as file:
            return int(_field(file.read(), "oom_kill") or 0)

    def programs_cpu_seconds(self) -> float | None:
        """CPU time of every task the sample's cgroup ever held but this process (its init):
        processes the kernel reaped itself (their parent ignored ``SIGCHLD``) included. One file
        read, however many processes: ``None`` where the cgroup does not count CPU."""
        if "cpu" not in self.dirs:
            return None
        fd = self._cpu_fd
        if fd < 0:
            fd = self._cpu_fd = os.open(os.path.join(self.dirs["cpu"], self.files["cpu"]), os.O_RDONLY)
        text = os.pread(fd, 4096, 0)
        total = int(text) / 1e9 if self.version == 1 else int(_field(text.decode(), "usage_usec") or 0) / 1e6
        return total - time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)

    def remove(self) -> bool:
        """Remove the cgroup; ``False`` while the kernel still counts a process of it (its
        processes are gone: it may take a moment to see it)."""
        for path in dict.fromkeys(self.dirs.values()):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                return False
        return True


def _field(text: str, key: str) -> str | None:
    """The value of line ``key value`` in a cgroup file."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return value
    return None
