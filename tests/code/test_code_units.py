"""Unit tests of the code verifier's pure parts: extraction, label formats, comparison, the
grading rules (re-run, masking) with a fake sandbox, and the refusals at startup."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter, OrderedDict, namedtuple

import pytest

from common.config import ConfigError
from common.errors import Unprocessable
from common.settings import CoreSettings
from services.code import environments
from services.code.cgroups import Cgroups
from services.code.extract import extract_code, response_from_query
from services.code.grader import Grader, Sample
from services.code.labels import Suite, parse_label, result_matches, stdout_matches
from services.code.sandbox import FairSlots, SandboxFailure
from services.code.sandboxed.confine import SampleCgroup
from services.code.sandboxed.wire import StdinOutcome, from_plain, to_plain
from services.code.scorer import CodeScorer
from services.code.settings import CodeSettings

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


def test_comparison_is_on_data() -> None:
    assert stdout_matches("1 2  \n3\n\n", "1 2\n3")
    assert not stdout_matches("1 2\n", "1 2\n3")
    assert stdout_matches("0.3333334\n", "0.3333333", tolerance=1e-6)
    assert not stdout_matches("0.3333334\n", "0.3333333")
    assert result_matches([1, [2, 3]], [1, [2, 3]]) and result_matches(5, [5])
    assert not result_matches(True, 1) and not result_matches("1", 1) and not result_matches([1], [1, 2])


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
    for bad in ({"test": "assert f(1"}, {"test": "assert f(1)", "setup": "def ("}, {"test": "x", "setup": 3}):
        with pytest.raises(Unprocessable):
            parse_label(bad)


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

    def run(self, job, uid, trusted=None, held_bytes=0):
        with self._lock:
            self.calls[job.code] += 1
            calls = self.calls[job.code]
        if (self.programs is None or job.code in self.programs) and calls <= self.failures:
            raise SandboxFailure("worker died")
        for index in range(len(job.tests)):
            yield StdinOutcome(index, 0, False, False, False, 0.0, 0.0, stdout="ok", stderr="", result="")


SUITE = Suite("stdin", ["", ""], ["ok", "ok"])


def test_slots_keep_one_from_a_request_and_go_round_robin() -> None:
    slots = FairSlots(range(8))
    big, small, other = object(), object(), object()
    assert [slots.acquire(big, 0) for _ in range(7)] == [0, 1, 2, 3, 4, 5, 6]
    assert slots.acquire(big, 0.01) is None  # the last slot is kept for another request
    assert slots.acquire(small, 0) == 7
    granted: dict[str, int | None] = {}
    waiters = [
        threading.Thread(target=lambda name=name, owner=owner: granted.update({name: slots.acquire(owner, 5)}))
        for name, owner in (("big", big), ("other", other))
    ]
    for waiter in waiters:
        waiter.start()
        time.sleep(0.05)  # in this order
    slots.release(big, 0)  # big waits first and holds one: it may take it back
    slots.release(small, 7)  # then the other request
    for waiter in waiters:
        waiter.join()
    assert granted == {"big": 0, "other": 7}
    pair = FairSlots(range(2))  # too few to keep one back
    assert pair.acquire(big, 0) is not None and pair.acquire(big, 0) is not None


def test_infrastructure_failure_is_rerun_once_then_masked(caplog) -> None:
    settings = CodeSettings(infra_failure_score="nan", retry_pause_s=0.01)
    once = FailingSandbox(failures=1)
    assert Grader(settings, once, 150.0).grade([Sample("x", SUITE)])[0].score == 1.0 and once.calls["x"] == 2
    twice = FailingSandbox(failures=2)
    with caplog.at_level(logging.WARNING):
        verdict = Grader(settings, twice, 150.0).grade([Sample("x", SUITE)])[0]
    assert verdict.status == "sandbox_error" and verdict.score is None and twice.calls["x"] == 2
    assert "without a verdict" in caplog.text


def test_more_than_5_of_100_masked_is_a_warning(caplog) -> None:
    programs = [f"print({i})" for i in range(94)]
    # 12 runs fail once and pass on their re-run; only the 6 samples without a prompt stay masked.
    failing = FailingSandbox(failures=1, programs=set(programs[:12]))
    grader = Grader(CodeSettings(infra_failure_score="zero", retry_pause_s=0.01), failing, 150.0)
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
        CodeScorer(CoreSettings(service="code"))
    monkeypatch.setenv("SCORER_CODE_ALLOW_WEAK_SANDBOX", "none")
    assert CodeScorer(CoreSettings(service="code")).isolation == "none"


def test_nan_and_zero(monkeypatch) -> None:
    from services.code.grader import Verdict

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
        def run(self, job, uid, trusted=None, held_bytes=0):
            jobs.append(job)
            return super().run(job, uid, trusted, held_bytes)

    settings = CodeSettings(infra_failure_score="zero", test_cpu_s=2, test_wall_s=4, sample_wall_s=30,
                            time_scales="python=2+0.5")  # fmt: skip
    grader = Grader(settings, Recording(0), 150.0)
    assert grader.grade([Sample("x", SUITE)])[0].score == 1.0
    assert (jobs[0].cpu_s, jobs[0].wall_s, jobs[0].sample_s) == (4.5, 8.5, 61.0)
    assert grader.time_limits()["python"] == {"cpu_s": 4.5, "wall_s": 8.5}
    assert grader.time_limits()["c"] == {"cpu_s": 2, "wall_s": 4}


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
