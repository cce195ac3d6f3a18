"""Settings of the code verifier; each is ``SCORER_CODE_<FIELD>`` in the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from common.cpus import usable_cpus


@dataclass(frozen=True)
class CodeSettings:
    # What a sample left without a verdict scores: "nan" (for OpenRLHF's dynamic filtering,
    # which drops the prompt group) or "zero". No default on purpose: see preflight.INFRA_HELP.
    infra_failure_score: Literal["nan", "zero"] | None = None
    # The environment (services/code/environments) that grades samples whose label is empty.
    env: str = ""
    # Runs executing at once (one request: one less); a request waits for a slot without holding one.
    # 0: SLOTS_PER_CORE per core, as many as the memory holds, at least MIN_PARALLEL (``parallel``).
    max_parallel: int = 0
    # Deprecated, kept one release: the request's deadline is the core's SCORER_REQUEST_TIMEOUT_S
    # (from the request's arrival) for every service; this sets it when that is unset.
    request_timeout_s: float | None = None
    # Pause before the one re-run of a run the infrastructure failed.
    retry_pause_s: float = 1.0
    # "fraction" of tests passed, or "all" (1 only when every test passes).
    scoring: Literal["fraction", "all"] = "fraction"
    # Per test: CPU seconds, and wall seconds of its own (catches sleeping; time spent waiting for
    # a CPU others hold does not count); per sample: wall seconds.
    test_cpu_s: float = 4.0
    test_wall_s: float = 10.0
    # Per language, its share of those two test limits (``languages.time_scales``): items
    # LANGUAGE=FACTOR[+SECONDS], a test of that language getting the limit x FACTOR + SECONDS;
    # a language not named gets them as they are. The defaults pay for what a runtime spends
    # before and around the program (bench/code/startup.py measures it).
    time_scales: str = "java=2+0.5 javascript=2+0.5"
    sample_wall_s: float = 60.0
    # Which requests a worker takes on (services/code/admission.py): "limits", only those whose
    # samples all run every test at their full limits before the deadline, beside the work
    # already admitted (the rest: 503 before any work, 413 for one that could never fit), a test
    # the deadline cuts short anyway getting no verdict; "off", every request, a test the
    # deadline cuts short being the program's timeout (it may have spent that time itself).
    admission: Literal["limits", "off"] = "limits"
    # Limits of each test process.
    memory_mb: int = 1024
    # Tasks (processes and threads) per sample with cgroups (v2: its pids limit; v1: the rlimit
    # on its slot's uid); without cgroups, that rlimit is max_processes (it counts threads too).
    max_threads: int = 256
    max_processes: int = 16
    max_open_files: int = 64
    max_file_bytes: int = 16 << 20
    max_output_bytes: int = 16 << 20
    # Of a stdin test's stdout or a call's answer, the most kept for comparison (longer: a
    # wrong answer, or a call's output over the limit). The same for every sample, so nothing
    # a program reads depends on the expected outputs; a label whose expected output needs
    # more (over half of it on stdin, a quarter as a call's JSON) is an invalid label.
    compared_output_bytes: int = 4 << 20
    # A compiled language's build (services/code/languages.py): CPU seconds (all its processes:
    # what ends compile bombs) and wall seconds (a backstop for a blocked build: one that
    # overruns either is a compile error not remembered), memory, its /tmp; the compile cache's
    # size on disk (least recently used builds go first).
    compile_cpu_s: float = 10.0
    compile_wall_s: float = 60.0
    compile_memory_mb: int = 2048
    compile_tmp_mb: int = 256
    compile_cache_mb: int = 1024
    # Size of each sample's own /tmp (also its /dev/shm) and the most SysV shared memory it holds.
    tmp_mb: int = 64
    # SandboxFusion's /run_code (services/code/sandbox_fusion): the most files a request may
    # place in its run's /tmp or fetch from it, and their bytes in all, each way.
    run_code_files: int = 16
    run_code_file_bytes: int = 8 << 20
    # Relative/absolute tolerance for numbers in stdout and call results; 0 compares exactly.
    float_tolerance: float = 0.0
    # The import block run before a Python program whose label names none (``preludes``):
    # "auto" (per test format: call-based LeetCode's, "lcb"; stdin and assert none), "none",
    # "apps" / "taco" or "lcb".
    prelude: Literal["auto", "none", "apps", "taco", "lcb"] = "auto"
    # Packages graded programs may import beyond the standard library: pip requirements,
    # separated by spaces or commas, installed by run.sh into .sandbox-packages/ (see packages.py).
    sandbox_packages: str = "numpy==2.4.6 sortedcontainers==2.4.0"
    # Isolation: "auto" takes the strongest the host offers (bwrap > unshare > none).
    sandbox: Literal["auto", "bwrap", "unshare", "none"] = "auto"
    # A cgroup per sample (memory incl. shared memory; tasks with v2) where the node lets us
    # make them ("auto"), or rlimits only ("off").
    cgroups: Literal["auto", "off"] = "auto"
    # Name of a weaker isolation than bwrap that the operator accepts ("unshare" or "none").
    allow_weak_sandbox: str = ""
    # Test processes run as uids from here on, one per slot (and per worker).
    uid_base: int = 61000
    # Request caps (docs/ARCHITECTURE.md §5.2); above them the request is answered 422.
    max_samples: int = 1024
    max_text_chars: int = 2_000_000
    max_request_chars: int = 64_000_000
    # A label's Python code (an assert label's setup and tests together): past it, 413. It is
    # compiled in helper processes (a MB takes seconds and ~250 MB), never on a request's thread.
    max_label_code_chars: int = 1_000_000
    # What the worker keeps of label code it compiled (digests and verdicts, so a GRPO group's
    # label compiles once): at most this many MB, least recently used first out.
    label_cache_mb: int = 32
    # Values (dict keys included) of an OpenRLHF JSON body, counted before it is parsed (413 ->
    # 422): room for labels of call-based tests whose arguments are long lists (a label at the
    # 2,000,000-character cap written as a list of small numbers is ~1 M values); 4 M values
    # cost ~300 MB and ~2 s to build.
    max_json_values: int = 4_000_000

    @property
    def parallel(self) -> int:
        """Runs at once: ``max_parallel``, or when 0 ``SLOTS_PER_CORE`` per core this process may
        use, no more than the node's memory holds at one sample's cgroup limit each (so a
        sample's own limit, not the node's OOM killer, stops a hog), and at least
        ``MIN_PARALLEL`` (so that one slot can be kept from any single request).

        Several per core, because a call-based sample spends much of its time waiting on pipes
        (candidate, supervisor, tests' process take turns), and more runs than cores cannot
        time out a correct program: limits count CPU time and a process's own wall time.
        """
        if self.max_parallel:
            return self.max_parallel
        cores = usable_cpus()
        sample_bytes = (self.memory_mb + self.tmp_mb + SUPERVISOR_MB) << 20
        memory_holds = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // sample_bytes
        return max(MIN_PARALLEL, min(SLOTS_PER_CORE * cores, memory_holds))


MIN_PARALLEL = 8
SLOTS_PER_CORE = 4
# What a sample's cgroup allows its supervisor beyond the program's memory and /tmp.
SUPERVISOR_MB = 64
