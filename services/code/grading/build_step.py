"""A program's build (a graded program in a compiled language, a label's checker): once per
source, held in the compile cache while its runs use it."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator

from services.code.grading.runner import Owner, Runner
from services.code.labels.suites import Suite
from services.code.languages import Program


@contextlib.contextmanager
def built(
    runner: Runner, program: Program, deadline: float, owner: Owner, uid: int | None = None, judge: bool = False
) -> Iterator[str | None]:
    """``program``'s build held in the compile cache (built if it is not there, in the slot
    ``uid`` when the caller holds one, else in one of its own): yields its compile error, or None.

    A ``judge``'s own program (a label's checker or interactor) is bounded by its build's CPU
    limit alone, up to ``deadline``: a busy node stretches its wall time, and its build running
    out of wall would leave every sample of the label without a verdict."""
    builds = runner.builds
    assert builds is not None

    def build_in(slot: int) -> str | None:
        job = runner.job(Suite("stdin", [""], [""]), "", deadline)
        if judge:
            job = dataclasses.replace(job, sample_s=max(job.sample_s, deadline - time.monotonic()))
        job = builds.build_job(program, job, runner.cgroups(), judge)
        runs = runner.sandbox.run(job, slot)
        try:
            return builds.compile_error(next(runs, None))
        finally:
            runs.close()

    def build() -> str | None:
        if uid is not None:
            return build_in(uid)
        with runner.slot(owner, deadline) as slot:
            return build_in(slot)

    with builds.cache.held(program.key, build, deadline - time.monotonic()) as error:
        yield error
