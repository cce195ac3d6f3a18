"""Programs in compiled languages: built once per distinct source, then run by every test.

``CompileCache`` is the service's directory of builds, keyed by language, flags and the
source's hash (``languages.Language.key``): root's, mode 0700, outside every sample's
writable space. A build installs its entry there (``inside.compiled_programs.install``); a run's
supervisor shows its one entry read-only to the program, which never sees the others. The
identical programs of a GRPO group wait for one build (single flight) and share it, its
compile error too; a compile error is remembered for later samples, unless the build ran out
of time. The cache is bounded (``max_bytes``): the least recently used
entries no run holds are removed.

``Builds`` runs the build of a sample (a job of kind ``build`` in a slot of its own, with the
compile limits) and hands the grader what to run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from services.code import languages
from services.code.languages import Language, Program
from services.code.sandbox.host import SandboxFailure
from services.code.sandbox.inside.compiled_programs import CHECK_FILES, FEEDBACK_DIR
from services.code.sandbox.inside.messages import Job, StdinOutcome

log = logging.getLogger(__name__)

# Where the cache appears inside bubblewrap (the host's path elsewhere).
SANDBOX_VIEW = "/judge-cache"
# Compile errors remembered (the start of their messages), besides the builds on disk.
MAX_ERRORS = 4096
MAX_ERROR_CHARS = 1024
# What is kept of a compiler's stdout for its message, and the most it may print.
COMPILER_KEEP_BYTES = 64 << 10
COMPILER_OUTPUT_BYTES = 1 << 20
# Without cgroups, the tasks (processes and threads) a build's uid may have: rustc and javac
# start threads, gcc processes (with cgroups, the sample's task limit decides).
BUILD_TASKS = 128


class _Flight:
    """One build under way; those waiting for it share its compile error, even one the cache
    does not remember (``Unremembered``)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: str | None = None


class CompileCache:
    """Builds on disk by key (bounded, least recently used first out), compile errors in memory."""

    def __init__(self, max_bytes: int, isolation: str) -> None:
        self.max_bytes = max_bytes
        self.root = tempfile.mkdtemp(prefix="code-compile-cache-")
        os.chmod(self.root, 0o700)
        self.view = SANDBOX_VIEW if isolation == "bwrap" else self.root
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, int] = OrderedDict()  # key -> bytes, least recent first
        self._errors: OrderedDict[str, str] = OrderedDict()
        self._building: dict[str, _Flight] = {}
        self._users: dict[str, int] = {}
        self.counters = {"builds": 0, "hits": 0, "compile_errors": 0, "evicted": 0}

    def entry(self, key: str) -> str:
        """Entry ``key`` as the sandbox sees it."""
        return os.path.join(self.view, key)

    def bytes_held(self) -> int:
        with self._lock:
            return sum(self._entries.values())

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self.counters, "entries": len(self._entries), "bytes": sum(self._entries.values())}

    @contextmanager
    def held(self, key: str, build: Callable[[], str | None], timeout: float) -> Iterator[str | None]:
        """Entry ``key``, built by ``build`` (which answers a compile error, or None) unless it
        is cached or being built; yields the compile error or None, holding the entry (no
        eviction) meanwhile. A ``SandboxFailure`` of ``build`` is not remembered."""
        error = self._acquire(key, build, timeout)
        try:
            yield error
        finally:
            if error is None:
                with self._lock:
                    self._users[key] -= 1
                    if not self._users[key]:
                        del self._users[key]

    def _acquire(self, key: str, build: Callable[[], str | None], timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    self._users[key] = self._users.get(key, 0) + 1
                    self.counters["hits"] += 1
                    return None
                if key in self._errors:
                    self._errors.move_to_end(key)
                    self.counters["hits"] += 1
                    return self._errors[key]
                running = self._building.get(key)
                if running is None:
                    running = self._building[key] = _Flight()
                    break
            if not running.done.wait(max(0.0, deadline - time.monotonic())):
                raise SandboxFailure("a build of this source did not finish before the request deadline")
            if running.error is not None:  # not remembered, but what this very build answered
                with self._lock:
                    self.counters["hits"] += 1
                return running.error
        try:
            error = build()
            running.error = error
            with self._lock:
                self.counters["builds"] += 1
                if error is not None:
                    self.counters["compile_errors"] += 1
                    if not isinstance(error, Unremembered):
                        self._errors[key] = error[:MAX_ERROR_CHARS]
                    while len(self._errors) > MAX_ERRORS:
                        self._errors.popitem(last=False)
                    return error
                host = os.path.join(self.root, key)
                if not os.path.isdir(host):
                    raise SandboxFailure("a build succeeded but its cache entry is missing")
                self._entries[key] = _size(host)
                self._users[key] = self._users.get(key, 0) + 1
                self._evict()
                return None
        finally:
            with self._lock:
                del self._building[key]
            running.done.set()

    def _evict(self) -> None:
        """Drop least recently used entries no run holds until the cache fits (lock held)."""
        total = sum(self._entries.values())
        for key in list(self._entries):
            if total <= self.max_bytes:
                return
            if self._users.get(key):
                continue
            total -= self._entries.pop(key)
            self.counters["evicted"] += 1
            shutil.rmtree(os.path.join(self.root, key), ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _size(path: str) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        total += sum(os.lstat(os.path.join(directory, name)).st_size for name in files)
    return total


@dataclasses.dataclass(frozen=True)
class Limits:
    """A build's limits (compile_* settings)."""

    cpu_s: float
    wall_s: float
    memory_mb: int
    tmp_mb: int


class Builds:
    """Builds samples' programs through the sandbox, once per key (``CompileCache``)."""

    def __init__(self, cache: CompileCache, limits: Limits) -> None:
        self.cache = cache
        self.limits = limits
        self.tools = languages.tool_paths()
        self.versions = languages.tool_versions(self.tools)

    def availability(self) -> dict[str, str]:
        """Per language: "available", or what is missing."""
        found = {name: languages.missing_tools(lang, self.tools) for name, lang in languages.LANGUAGES.items()}
        return {name: f"missing: {', '.join(missing)}" if missing else "available" for name, missing in found.items()}

    def toolchains(self) -> dict[str, dict[str, object]]:
        """Per language, its compiler's version and its build and run commands."""
        return languages.describe(self.tools, self.versions)

    def missing(self, language: Language) -> list[str]:
        return languages.missing_tools(language, self.tools)

    def program(self, language: Language, source: str, memory_mb: int) -> Program:
        return languages.program(language, source, self.tools, self.versions, memory_mb)

    def build_job(self, program: Program, job: Job, cgroups: bool, judge: bool = False) -> Job:
        """``job`` (a stdin job of the sample) turned into the build of ``program``; a
        ``judge``'s own program has the job's whole time as its wall limit (its CPU limit
        bounds it)."""
        lim = self.limits
        supervisor = job.cgroup_memory_bytes - job.tmp_bytes - job.memory_bytes  # the supervisor's share
        return dataclasses.replace(
            job, kind="build", code=program.source, tests=[""], cpu_s=lim.cpu_s,
            wall_s=job.sample_s if judge else lim.wall_s,
            nproc=max(job.nproc, BUILD_TASKS),
            memory_bytes=resource.RLIM_INFINITY if cgroups else lim.memory_mb << 20, judged_memory_bytes=0,
            output_bytes=COMPILER_OUTPUT_BYTES, keep_bytes=COMPILER_KEEP_BYTES, tmp_bytes=lim.tmp_mb << 20,
            cgroup_memory_bytes=supervisor + ((lim.memory_mb + lim.tmp_mb) << 20),
            command=program.build, env=program.env, source_path=program.source_path,
            install=self.cache.entry(program.key), artifact="",
        )  # fmt: skip

    def run_job(self, program: Program, job: Job, cgroups: bool) -> Job:
        """``job`` turned into runs of ``program``'s build: the memory limit is the sample's
        cgroup (a runtime's address space reservations do not count), else the address space
        (its language's ``address_space_extra`` beyond it)."""
        extra = program.language.address_space_extra
        return dataclasses.replace(
            job,
            command=program.run,
            env=program.env,
            artifact=self.cache.entry(program.key),
            judged_data_bytes=0 if extra else job.judged_memory_bytes,
            memory_bytes=resource.RLIM_INFINITY if cgroups else job.memory_bytes + extra,
        )

    def check_job(
        self, program: Program, job: Job, files: list[list[str]], cgroups: bool, protocol: str = "testlib"
    ) -> Job:
        """``job`` (one stdin test per check) turned into runs of the checker ``program``, each on
        the files of its entry of ``files`` (input, output, answer): testlib's ``checker input
        output answer``, or Kattis' ``validator input answer feedback_dir < output``."""
        run = self.run_job(program, job, cgroups)
        if protocol == "kattis":
            source, _, answer = CHECK_FILES
            return dataclasses.replace(
                run, kind="check", checks=[[test, "", want] for test, _, want in files],
                tests=[got for _, got, _ in files], command=[*program.run, source, answer, FEEDBACK_DIR],
                judged_memory_bytes=0,
            )  # fmt: skip
        return dataclasses.replace(
            run, kind="check", checks=files, command=[*program.run, *CHECK_FILES], judged_memory_bytes=0
        )

    @staticmethod
    def compile_error(outcome: object) -> str | None:
        """The compile error a build's outcome reports, or None when it built."""
        if not isinstance(outcome, StdinOutcome):
            raise SandboxFailure("the build was cut off by the request deadline")
        try:
            reported = json.loads(outcome.result) if outcome.result else {}
        except ValueError:
            reported = {}
        if isinstance(reported, dict) and "compile_error" in reported:
            message = str(reported["compile_error"])
            return Unremembered(message) if outcome.timed_out else message
        return None


class Unremembered(str):
    """A compile error the cache does not keep: the build ran out of time, which the node's
    load may have caused (the next sample of that source builds again)."""
