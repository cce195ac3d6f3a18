"""What confines a sample's processes, and what is left of them afterwards: nothing.

Each sample's supervisor takes a mount and an IPC namespace of its own (``private_tmp``). Each
process that runs a program or a label's code is forked by ``spawn``: it drops to an
unprivileged uid of the slot, no groups, no new privileges, rlimits (``limit``), and a seccomp
filter that refuses namespaces (``forbid_namespaces``); the candidate's process also refuses
new processes (``forbid_new_processes``). ``clean_up`` kills whatever a test left running.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import resource
import signal
import sys
import typing

from services.code.sandboxed.wire import Job

PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 1 << 12, 1 << 14, 1 << 18
TMP_INODES = 4096
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(option, value, 0, 0, 0)


def private_tmp(job: Job) -> None:
    """Give this supervisor (and so its sample) its own ``/tmp`` and SysV IPC.

    A tmpfs of ``tmp_bytes`` on ``/tmp``, also mounted on ``/dev/shm``, owned by the sample's
    uid: the only place it can write, bounded, and gone with the sample's last process, like
    its IPC namespace, whose shared memory is limited to ``tmp_bytes`` too.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    size = job.tmp_bytes
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    options = f"size={size},nr_inodes={TMP_INODES},mode=0700,uid={job.uid},gid={job.gid}".encode()
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount /tmp")
    if os.path.isdir("/dev/shm"):
        check(libc.mount(b"/tmp", b"/dev/shm", None, MS_BIND, None), "mount /dev/shm")
    for name, value in (("shmmax", size), ("shmall", size // 4096), ("shmmni", 64), ("msgmni", 16)):
        with open(f"/proc/sys/kernel/{name}", "w") as sysctl:
            sysctl.write(str(value))


# x86-64 and arm64 syscall numbers; new processes are refused, threads are not.
SECCOMP_ARCH = {"x86_64": (0xC000003E, 56, 57, 58), "aarch64": (0xC00000B7, 220, 0xFFFFFFFF, 0xFFFFFFFF)}
CLONE3, CLONE_THREAD, EPERM, ENOSYS = 435, 0x10000, 1, 38
# Classic BPF instructions of the filters (load word, jump if equal / greater or equal / bits
# set, return) and the filters' verdicts.
BPF_LD, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_ALLOW, SECCOMP_KILL = 0x7FFF0000, 0x80000000
SECCOMP_EPERM, SECCOMP_ENOSYS = 0x50000 | EPERM, 0x50000 | ENOSYS


def forbid_new_processes() -> None:
    """A seccomp filter: no fork, vfork or clone without ``CLONE_THREAD`` (``clone3`` answers
    ENOSYS, so threads fall back to ``clone``). The candidate's process is then the only one
    its code runs in, and its CPU time, threads included, is all in ``/proc/<pid>/stat``."""
    arch, clone, fork, vfork = SECCOMP_ARCH[os.uname().machine]
    ld, jeq, jge, jset, ret = BPF_LD, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET
    allow, kill = SECCOMP_ALLOW, SECCOMP_KILL
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill),  # another ABI (i386) is killed
        (ld, 0, 0, 0), (jge, 9, 0, 0x40000000),  # x32 numbers: killed
        (jeq, 7, 0, CLONE3), (jeq, 5, 0, fork), (jeq, 4, 0, vfork), (jeq, 0, 2, clone),
        (ld, 0, 0, 16), (jset, 0, 1, CLONE_THREAD),
        (ret, 0, 0, allow), (ret, 0, 0, SECCOMP_EPERM), (ret, 0, 0, SECCOMP_ENOSYS), (ret, 0, 0, kill),
    ]  # fmt: skip

    _seccomp(program)


# Namespace syscalls by ABI: unshare, setns; and every CLONE_NEW* flag of clone.
NAMESPACE_CALLS = {"x86_64": (272, 308), "aarch64": (97, 268)}
CLONE_NEW_ANY = 0x7E020000


def forbid_namespaces() -> None:
    """A seccomp filter: no ``unshare``, ``setns`` or ``clone`` into new namespaces
    (``clone3`` answers ENOSYS, so threads and ``posix_spawn`` fall back to ``clone``).
    Unprivileged, a user namespace would give a program its own mounts: a tmpfs beyond
    ``tmp_bytes`` and beyond its rlimits."""
    arch, clone, _, _ = SECCOMP_ARCH[os.uname().machine]
    unshare, setns = NAMESPACE_CALLS[os.uname().machine]
    ld, jeq, jge, jset, ret = BPF_LD, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET
    allow, kill, eperm, enosys = SECCOMP_ALLOW, SECCOMP_KILL, SECCOMP_EPERM, SECCOMP_ENOSYS
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill),  # another ABI (i386) is killed
        (ld, 0, 0, 0), (jge, 9, 0, 0x40000000),  # x32 numbers: killed
        (jeq, 6, 0, unshare), (jeq, 5, 0, setns), (jeq, 5, 0, CLONE3), (jeq, 0, 2, clone),
        (ld, 0, 0, 16), (jset, 1, 0, CLONE_NEW_ANY),
        (ret, 0, 0, allow), (ret, 0, 0, eperm), (ret, 0, 0, enosys), (ret, 0, 0, kill),
    ]  # fmt: skip
    _seccomp(program)


def _seccomp(program: list[tuple[int, int, int, int]]) -> None:
    """Install a seccomp filter (BPF instructions: code, jump if true, jump if false, k)."""

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*(Filter(*insn) for insn in program))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program), filters)), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


def limit(job: Job, tests: int) -> None:
    """Resource limits of a test process running ``tests`` tests (set before dropping root).

    Its OOM score is the highest: if the node runs out of memory, a test dies, not the server.
    It cannot make namespaces (``forbid_namespaces``).
    """
    with open("/proc/self/oom_score_adj", "w") as oom:
        oom.write("1000")
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
        (resource.RLIMIT_STACK, (64 << 20, 64 << 20)),
    ):
        resource.setrlimit(res, value)
    forbid_namespaces()


def spawn(job: Job, uid: int, fds: dict[int, int], cwd: str, body: typing.Callable[[], None], tests: int) -> int:
    """Fork a process that keeps only ``fds`` (its number: ours), drops to ``uid`` with the
    rlimits of ``tests`` tests, no groups and no new privileges, and runs ``body``."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            high = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 256) for target, source in fds.items()}
            for target, source in high.items():
                os.dup2(source, target)
            os.closerange(max(fds) + 1, 65536)
            limit(job, tests)
            os.chdir(cwd)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            prctl(PR_SET_NO_NEW_PRIVS, 1)
            os.environ.clear()
            os.environ.update({"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"})
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            body()
        finally:
            os._exit(70)
    return pid


def cpu_seconds(stat: int) -> float:
    """CPU time so far of a process and all its threads, from its ``/proc/<pid>/stat`` (open)."""
    fields = os.pread(stat, 1024, 0).rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


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

    This supervisor is the subreaper of everything its tests started, so once it has no child
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
