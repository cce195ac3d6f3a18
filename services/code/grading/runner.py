"""What every sandboxed run needs, whatever it runs (a sample's tests, a label's checker, a
build, a ``/run_code`` program): its job's limits, scaled for its language, and a run slot
lent to its request by the request's deadline."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from services.code.labels.suites import Suite
from services.code.languages import CHECKER_LANGUAGES, LANGUAGES, PYTHON, TimeScale, time_scales
from services.code.preludes import prelude
from services.code.sandbox.compile_cache import Builds
from services.code.sandbox.host import Sandbox, SandboxFailure
from services.code.sandbox.inside.messages import Fetched, Job, Outcome
from services.code.settings import SUPERVISOR_MB, CodeSettings

# Whom a run slot is lent to: a client (``common.limits.clients``) and one of its requests (``FairSlots``).
Owner = tuple[str, object]
# A sample's cgroup holds its supervisor (the sample's init) too: these tasks (it, a clean-up
# helper, the tests' process) besides the program's, and ``SUPERVISOR_MB`` of memory.
SUPERVISOR_TASKS = 4


class Runner:
    """The server's limits and sandbox, shared by every step of a sample and by trial runs;
    ``builds`` is ``None`` on a server that builds no programs."""

    def __init__(self, settings: CodeSettings, sandbox: Sandbox, builds: Builds | None) -> None:
        self.settings = settings
        self.sandbox = sandbox
        self.builds = builds
        self.time_scales = time_scales(settings.time_scales)

    def job(self, suite: Suite, code: str, deadline: float, language: str = PYTHON, plan_s: float = math.inf) -> Job:
        """What the sandbox gets to run ``code`` in ``language`` against ``suite`` (never the
        expected outputs), each test's time limits scaled for its language, the sample's own
        time no more than ``plan_s`` (``admission``) and ``deadline``."""
        s = self.settings
        scale = self.scale(language)
        sample_s = min(self.own_sample_s(suite, language), plan_s)
        cgroups = self.sandbox.cgroups
        return Job(
            kind=suite.kind, code=code, fn_name=suite.fn_name, prelude=prelude(suite.prelude or s.prelude, suite.kind),
            # Assert tests hold the expected values: they go to the tests' process only (``modes.Judged.prepared``).
            tests=[None] * len(suite.tests) if suite.kind == "assert" else list(suite.tests),
            cpu_s=scale.of(s.test_cpu_s), wall_s=scale.of(s.test_wall_s),
            sample_s=max(0.1, min(sample_s, deadline - time.monotonic())),
            memory_bytes=s.memory_mb << 20, judged_memory_bytes=s.memory_mb << 20, nofile=s.max_open_files,
            # The rlimit counts a uid's threads too: with a cgroup, the cgroup's task limit decides.
            nproc=s.max_threads if cgroups.version else s.max_processes,
            fsize=s.max_file_bytes, output_bytes=s.max_output_bytes, tmp_bytes=s.tmp_mb << 20,
            # The same for every sample: nothing the program can read depends on its answers.
            keep_bytes=self.kept_bytes(),
            cgroup_version=cgroups.version,
            cgroup_memory_bytes=(s.memory_mb + s.tmp_mb + SUPERVISOR_MB) << 20,
            cgroup_tasks=s.max_threads + SUPERVISOR_TASKS,
        )  # fmt: skip

    def own_sample_s(self, suite: Suite, language: str) -> float:
        """The sample's own wall time: it scales too, its seconds once per test (each pays a start)."""
        scale = self.scale(language)
        return self.settings.sample_wall_s * scale.factor + scale.offset_s * len(suite.tests)

    def kept_bytes(self) -> int:
        """How much of a stdin test's stdout or a call's answer is kept for comparison."""
        return min(self.settings.compared_output_bytes, self.settings.max_output_bytes)

    def time_limits(self) -> dict[str, dict[str, float]]:
        """Per language graded programs may be written in, each test's CPU and wall limits."""
        names = [PYTHON, *(name for name in LANGUAGES if name not in CHECKER_LANGUAGES.values())]
        s = self.settings
        return {name: {"cpu_s": self.scale(name).of(s.test_cpu_s), "wall_s": self.scale(name).of(s.test_wall_s)}
                for name in names}  # fmt: skip

    def scale(self, language: str) -> TimeScale:
        return self.time_scales.get(language, TimeScale())

    def cgroups(self) -> bool:
        return bool(self.sandbox.cgroups.version)

    @contextlib.contextmanager
    def slot(self, owner: Owner, deadline: float) -> Iterator[int]:
        """A run slot lent to ``owner``, taken before ``deadline``; else ``SandboxFailure``."""
        with self.sandbox.slot(owner, deadline - time.monotonic()) as uid:
            if uid is None or time.monotonic() >= deadline:
                raise SandboxFailure("no run slot came free before the request deadline")
            yield uid

    def run_all(self, job: Job, owner: Owner, deadline: float) -> list[Outcome | Fetched]:
        """Everything ``job`` reported, run in a slot of its own."""
        with self.slot(owner, deadline) as uid:
            return list(self.sandbox.run(job, uid))
