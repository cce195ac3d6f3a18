"""Usable CPUs (common/configuration/cpus.py): a process pinned to fewer CPUs than the machine has sizes its
decode slots and the code verifier's run slots by the CPUs it may run on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def pinned_to_one_cpu(code: str) -> str:
    """What ``code`` prints in a fresh interpreter pinned to one of this process's CPUs."""
    pin = f"import os; os.sched_setaffinity(0, {{{min(os.sched_getaffinity(0))}}})\n"
    result = subprocess.run(
        [sys.executable, "-c", pin + code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return result.stdout.strip()


needs_two = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one"
)


@needs_two
def test_a_pinned_process_counts_the_cpus_it_may_run_on() -> None:
    assert os.cpu_count() >= 2
    assert pinned_to_one_cpu("from common.configuration.cpus import usable_cpus; print(usable_cpus())") == "1"


@needs_two
def test_decode_slots_default_to_the_usable_cpus() -> None:
    code = (
        "from common.pipeline.runtime import RequestLimits; from common.configuration.settings import CoreSettings\n"
        "print(RequestLimits(CoreSettings())._decoding._free)"
    )
    assert pinned_to_one_cpu(code) == "1"
