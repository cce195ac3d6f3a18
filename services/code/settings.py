"""Settings of the code verifier; each is ``SCORER_CODE_<FIELD>`` in the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from common.configuration.config import setting
from common.configuration.cpus import usable_cpus
from services.code.languages import DEFAULT_TIME_SCALES, time_scales


@dataclass(frozen=True)
class CodeSettings:
    # "nan" is for OpenRLHF's dynamic filtering, which drops the prompt group. No default on
    # purpose: see preflight.INFRA_HELP.
    infra_failure_score: Literal["nan", "zero"] | None = setting(
        None, "what a sample left without a verdict scores: `nan` or `zero`", flag=True, shown_default="none: required"
    )
    env: str = setting(
        "", "the environment (`services/code/environments`) that grades samples whose label is empty", flag=True
    )
    # Runs executing at once (one request: one less); a request waits for a slot without holding one.
    # 0: SLOTS_PER_CORE per core, as many as the memory holds, at least MIN_PARALLEL (``parallel``).
    max_parallel: int = setting(
        0,
        "runs at once (one request: one less); 0: 4 per core, no more than the memory holds at `MEMORY_MB + TMP_MB` "
        "+ 64 MiB each, at least 8",
    )
    # Deprecated, kept one release: the request's deadline is the core's SCORER_REQUEST_TIMEOUT_S
    # (from the request's arrival) for every service; this sets it when that is unset.
    request_timeout_s: float | None = setting(
        None,
        "deprecated (kept one release): sets `SCORER_REQUEST_TIMEOUT_S`, the deadline of every request from its "
        "arrival, when that is unset",
    )
    retry_pause_s: float = setting(1.0, "pause before the one re-run of an infrastructure failure")
    scoring: Literal["fraction", "all"] = setting(
        "fraction",
        "`fraction` of tests passed, or `all` (1 only when every test passes; every test runs either way); a label's "
        "`scoring` wins",
    )
    # Per test: CPU seconds, and wall seconds of its own (catches sleeping; time spent waiting for
    # a CPU others hold does not count); per sample: wall seconds.
    test_cpu_s: float = setting(4.0, "CPU seconds per test")
    test_wall_s: float = setting(
        10.0, "a test's own wall seconds (time spent waiting for a CPU others hold does not count)"
    )
    # Per language, its share of those two test limits (``languages.time_scales``): items
    # LANGUAGE=FACTOR[+SECONDS], a test of that language getting the limit x FACTOR + SECONDS;
    # a language not named gets them as they are. The default: each language's record's
    # ``time_scale``.
    time_scales: str = setting(
        DEFAULT_TIME_SCALES,
        "per language, its tests' two limits x FACTOR + SECONDS, its sample's wall time x FACTOR + SECONDS per test "
        "(`LANGUAGE=FACTOR[+SECONDS]`, by any alias, separated by spaces or commas; a language not named keeps them)",
        check=time_scales,
    )
    sample_wall_s: float = setting(60.0, "wall seconds per sample")
    # Kattis problem packages labels name (services/code/labels/problem_packages.py), each read on first use.
    problems_dir: str = setting(
        "", "directory of the Kattis problem packages labels name (`problem`), each read once; empty: none"
    )
    # Which requests a worker takes on (services/code/scheduling/admission.py): "measured", those whose
    # samples the node can grade before the deadline at the rate it measures, each sample at no
    # less than its guaranteed share (a quiet node: its full limits), a sample cut by the deadline
    # within its share getting no verdict (the rest: 503 with Retry-After before any work); "off",
    # every request at full limits, a test the deadline cuts short being the program's timeout.
    admission: Literal["measured", "off"] = setting(
        "measured",
        "`measured`: take on the requests the node can grade before their deadline at the rate it measures, each "
        "sample planned no less than 1.5x its measured cost and 1.5 s (its full limits when the node has room; else "
        "503 with `Retry-After` before any work); `off`: every request, at full limits",
    )
    # Limits of each test process.
    memory_mb: int = setting(
        1024, "address space per test process; with cgroups, the sample's memory is `MEMORY_MB + TMP_MB` (+64 MiB)"
    )
    # Tasks (processes and threads) per sample with cgroups (v2: its pids limit; v1: the rlimit
    # on its slot's uid); without cgroups, that rlimit is max_processes (it counts threads too).
    max_threads: int = setting(
        256, "tasks (processes and threads) per sample, with cgroups (v2: its `pids` limit; v1: the rlimit on its uid)"
    )
    max_processes: int = setting(16, "tasks per uid without cgroups (an rlimit that counts threads too)")
    max_open_files: int = setting(64, "open files per process")
    max_file_bytes: int = setting(16 << 20, "size of a file a test process writes")
    max_output_bytes: int = setting(16 << 20, "size of a test process's stdout")
    # Of a stdin test's stdout or a call's answer, the most kept for comparison (longer: a
    # wrong answer, or a call's output over the limit). The same for every sample, so nothing
    # a program reads depends on the expected outputs; a label whose expected output needs
    # more (over half of it on stdin, a quarter as a call's JSON) is an invalid label.
    compared_output_bytes: int = setting(
        4 << 20, "of a stdin test's stdout or a call's answer, the most kept for comparison"
    )
    # A compiled language's build (services/code/languages.py): CPU seconds (all its processes:
    # what ends compile bombs) and wall seconds (a backstop for a blocked build: one that
    # overruns either is a compile error not remembered), memory, its /tmp; the compile cache's
    # size on disk (least recently used builds go first).
    compile_cpu_s: float = setting(10.0, "a build's CPU seconds (all its processes)")
    compile_wall_s: float = setting(60.0, "a build's wall seconds")
    compile_memory_mb: int = setting(2048, "a build's memory")
    compile_tmp_mb: int = setting(256, "a build's `/tmp`")
    compile_cache_mb: int = setting(1024, "the compile cache on disk (least recently used builds go first)")
    tmp_mb: int = setting(64, "each sample's `/tmp` (also `/dev/shm`) and its SysV shared memory")
    # SandboxFusion's /run_code (services/code/sandbox_fusion): the most files a request may
    # place in its run's /tmp or fetch from it, and their bytes in all, each way.
    run_code_files: int = setting(
        16, "`/run_code`: the most `files` a request places in its run's `/tmp`, and the most `fetch_files`"
    )
    run_code_file_bytes: int = setting(
        8 << 20,
        "`/run_code`: the bytes of the `files` placed (decoded, in all; more: 422) and of those fetched (in all; "
        "files past it are left out)",
    )
    float_tolerance: float = setting(
        0.0,
        "absolute and relative tolerance of the `default` comparison and of call results when either number is a "
        "real; two integers compare exactly (0: exact)",
    )
    # The import block run before a Python program whose label names none (``preludes``):
    # "auto" (per test format: call-based LeetCode's, "lcb"; stdin and assert none), "none",
    # "apps" / "taco" or "lcb".
    prelude: Literal["auto", "none", "apps", "taco", "lcb"] = setting(
        "auto",
        "the import block run before a Python program whose label names none: `auto` (call-based `lcb`, stdin and "
        "assert `none`), `none`, `apps`, `taco` or `lcb`",
    )
    # Packages graded programs may import beyond the standard library: pip requirements,
    # separated by spaces or commas, installed by run.sh into .sandbox-packages/ (see packages.py).
    sandbox_packages: str = setting(
        "numpy==2.4.6 sortedcontainers==2.4.0",
        "pip requirements programs may import (`run.sh` installs them into `.sandbox-packages/`)",
    )
    sandbox: Literal["auto", "bwrap", "unshare", "none"] = setting(
        "auto", "isolation: `auto` (the strongest the host offers), `bwrap`, `unshare` or `none`"
    )
    # A cgroup per sample (memory incl. shared memory; tasks with v2) where the node lets us
    # make them ("auto"), or rlimits only ("off").
    cgroups: Literal["auto", "off"] = setting(
        "auto", "a cgroup per sample where the node allows (`auto`); `off`: rlimits only"
    )
    allow_weak_sandbox: str = setting(
        "", "name of a weaker isolation than bwrap the operator accepts (`unshare` or `none`)"
    )
    # Test processes run as uids from here on, one per slot (and per worker).
    uid_base: int = setting(61000, "first sandbox uid (2 per slot)")
    # Request caps (docs/ARCHITECTURE.md §5.2); above them the request is answered 422.
    max_samples: int = setting(1024, "samples per request (422 beyond)")
    max_text_chars: int = setting(
        2_000_000, "characters of a sample's text or label (a label sent as a dict counts as its JSON; 422 beyond)"
    )
    max_request_chars: int = setting(64_000_000, "characters of a request's texts and labels together (422 beyond)")
    # A label's Python code (an assert label's setup and tests together): past it, 413. It is
    # compiled in helper processes (a MB takes seconds and ~250 MB), never on a request's thread.
    max_label_code_chars: int = setting(
        1_000_000, "an assert label's code (`setup` and `test` together); past it, 413 (OpenRLHF's route: 422)"
    )
    # What the worker keeps of label code it compiled (digests and verdicts, so a GRPO group's
    # label compiles once): at most this many MB, least recently used first out.
    label_cache_mb: int = setting(
        32,
        "what a worker keeps of label code it compiled: a digest and the verdict of each, least recently used first "
        "out",
    )
    # Values (dict keys included) of an OpenRLHF JSON body, counted before it is parsed (413 ->
    # 422): room for labels of call-based tests whose arguments are long lists (a label at the
    # 2,000,000-character cap written as a list of small numbers is ~1 M values); 4 M values
    # cost ~300 MB and ~2 s to build.
    max_json_values: int = setting(
        4_000_000,
        "values (keys included) of an OpenRLHF body, counted before it is parsed (422); a label sent as a JSON "
        "string is one",
    )

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
