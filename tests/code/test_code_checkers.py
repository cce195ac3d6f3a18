"""Checkers and scoring modes per label (issue 19): built-in modes, custom testlib and Python
checkers run in a sandbox of their own, judge failures, subtasks; the compile cache's bounds."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from common.limits.errors import Unprocessable
from services.code.grading.grader import Grader, Sample
from services.code.judging.checkers import Checker, custom_verdict, parse_checker
from services.code.judging.comparison import output_matches
from services.code.labels.suites import Suite
from services.code.sandbox import compile_cache
from services.code.sandbox.compile_cache import Builds, CompileCache, Limits, Unremembered
from services.code.sandbox.host import SandboxFailure
from services.code.settings import CodeSettings
from testing.clock import wait_until
from testing.code import LANGUAGES_ENV, grade_programs
from testing.server import Server, gunicorn_server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    env = {**LANGUAGES_ENV, "SCORER_CODE_FLOAT_TOLERANCE": str(TOLERANCE)}
    with gunicorn_server("code", env, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


# The server's float_tolerance (the default comparison's): wide, so that any integer within
# it that compares as a real shows.
TOLERANCE = 1e-3
FLOAT = Checker("float", 1e-6, 1e-6)


@pytest.mark.parametrize(
    ("mode", "got", "want", "ok"),
    [
        ("tokens", "1  2\r\n3 \n\n", "1 2 3", True),
        ("tokens", "1 2", "1 2 3", False),
        ("lines", "a b  \r\nc\r\n\r\n", "a b\nc", True),
        ("lines", "a  b\nc", "a b\nc", False),
        ("exact", "a\r\nb\n", "a\nb\n", True),
        ("exact", "a\nb", "a\nb\n", False),
        ("yes_no", "YES\nno", "yes NO", True),
        ("yes_no", "yes", "no", False),
        ("float", "-0.0", "0", True),  # a real on either side: both read as doubles
        ("float", "2.000000000", "2", True),
        ("float", "2.0000021", "2", False),
        ("float", "-0.0", "0.0", True),
        ("float", "1.0000009", "1.0", True),
        ("float", "1.0000021", "1.0", False),
        ("float", "1000000.9", "1000000.0", True),  # relative 1e-6
        ("float", "nan", "nan", True),  # nan and inf as C reads them, as DOMjudge's float comparison
        ("float", "nan", "NaN", True),
        ("float", "1.5", "nan", False),
        ("float", "inf", "Infinity", True),
        ("float", "-inf", "inf", False),
        ("float", "1e999", "1e400", True),  # the same infinity
        ("float", "-1e999", "1e400", False),
        ("float", "50000000000000001", "50000000000000000", False),  # two integers: exact
        ("float", "5e16", "50000000000000000", True),
        ("float", "1_0.0", "10.0", False),  # Python's float() takes underscores; a judge does not
        ("float", "x 1.0", "x 1.0000001", True),
    ],
)
def test_built_in_modes(mode: str, got: str, want: str, ok: bool) -> None:
    checker = FLOAT if mode == "float" else Checker(mode)
    assert output_matches(mode, got, want, checker.abs_tol, checker.rel_tol) is ok


def test_custom_exit_codes() -> None:
    assert custom_verdict(0, False, "") == ("passed", 1.0)
    assert custom_verdict(1, False, "wrong answer") == ("wrong_answer", 0.0)
    assert custom_verdict(2, False, "") == ("wrong_answer", 0.0)
    assert custom_verdict(7, False, "points 0.25 half of it") == ("wrong_answer", 0.25)
    for failure in ((3, False, "FAIL"), (0, True, ""), (7, False, "no number"), (7, False, "2.0"), (-11, False, "")):
        assert custom_verdict(*failure) is None
    assert parse_checker({"mode": "float", "abs": 1e-3}).abs_tol == 1e-3


def test_kattis_validators_exit_codes() -> None:
    assert parse_checker({"program": "pass", "language": "python", "protocol": "kattis"}).protocol == "kattis"
    with pytest.raises(Unprocessable, match="'protocol' is one of"):
        parse_checker({"program": "pass", "language": "python", "protocol": "icpc"})
    assert custom_verdict(42, False, "", "kattis") == ("passed", 1.0)
    assert custom_verdict(43, False, "", "kattis") == ("wrong_answer", 0.0)
    for failure in ((0, False, ""), (1, False, ""), (42, True, "")):
        assert custom_verdict(*failure, "kattis") is None


SUM_ANY = (
    '#include "testlib.h"\nint main(int argc,char*argv[]){registerTestlibCmd(argc,argv);'
    'long long n=inf.readLong();long long a=ouf.readLong(-1000000000LL,1000000000LL,"a");'
    'long long b=ouf.readLong(-1000000000LL,1000000000LL,"b");ouf.seekEof();'
    'if(a+b!=n)quitf(_wa,"%lld+%lld is not %lld",a,b,n);'
    'if(ans.readLong()<0)quitf(_fail,"bad answer file");quitf(_ok,"ok");}'
)
PARTIAL_PY = """
import sys
got = open(sys.argv[2]).read().split()
want = open(sys.argv[3]).read().split()
right = sum(g == w for g, w in zip(got, want))
if right == len(want):
    sys.exit(0)
sys.stderr.write(f"points {right / len(want)}\\n")
sys.exit(7)
"""


def test_built_in_checkers_against_the_server(server: Server) -> None:
    cases = [
        ({"inputs": [""], "outputs": ["1 2\n"], "checker": "tokens"}, "print('1', '2', end='\\r\\n')", 1.0),
        ({"inputs": [""], "outputs": ["a\nb\n"], "checker": "lines"}, "print('a  \\r\\nb   ')", 1.0),
        ({"inputs": [""], "outputs": ["0.000000"], "checker": "float"}, "print(-0.0)", 1.0),
        ({"inputs": [""], "outputs": ["nan"], "checker": "float"}, "print(float('nan'))", 1.0),
        ({"inputs": [""], "outputs": ["3.1415926"], "checker": "float"}, "print(3.1415931)", 1.0),
        ({"inputs": [""], "outputs": ["3.1415926"], "checker": "float"}, "print(3.1416)", 0.0),
        ({"inputs": [""], "outputs": ["50000000000000000"], "checker": "float"}, "print(50000000000000001)", 0.0),
        ({"inputs": [""], "outputs": ["YES"], "checker": "yes_no"}, "print('yes')", 1.0),
        ({"inputs": [""], "outputs": ["YES"], "checker": "yes_no"}, "print('no')", 0.0),
        ({"inputs": [""], "outputs": ["a b"], "checker": "exact"}, "print('a b ')", 0.0),
    ]
    for label, code, reward in cases:
        out = grade_programs(server.url, [("python", code)], label)
        assert out["rewards"] == [reward], (label, code, out["error_types"])


def test_a_real_answers_an_integer_as_a_double_in_the_float_checker(server: Server) -> None:
    label = {"inputs": ["", ""], "outputs": ["2\n", "2 3\n"], "checker": "float"}
    programs = [("cpp", '#include <cstdio>\nint main(){printf("%.9f\\n", 2.0);}'), ("python", "print(2.0000001)")]
    out = grade_programs(server.url, programs, label)
    assert out["rewards"] == [0.5, 0.5], out  # the second test wants two numbers
    assert grade_programs(server.url, [("python", "print('2.01')")], label)["rewards"] == [0.0]


def test_the_servers_tolerance_compares_two_integers_exactly(server: Server) -> None:
    stdin = {"inputs": [""], "outputs": ["123456789\n"]}
    programs = [("python", "print(123456702)"), ("python", "print(123456789.0000001)"), ("python", "print(123456789)")]
    assert grade_programs(server.url, programs, stdin)["rewards"] == [0.0, 1.0, 1.0]
    calls = {"fn_name": "f", "inputs": [[]], "outputs": [[123456789, 0.3]]}
    programs = [("python", f"def f():\n    return [{value}, 0.1 + 0.2]") for value in ("123456702", "123456789")]
    assert grade_programs(server.url, programs, calls)["rewards"] == [0.0, 1.0]


def test_a_testlib_checker_accepts_any_valid_answer(server: Server) -> None:
    label = {
        "tests": [{"input": "3\n", "output": "1 2\n"}, {"input": "10\n", "output": "5 5\n"}],
        "checker": {"program": SUM_ANY, "language": "cpp"},
    }
    programs = [
        ("python", "n = int(input())\nprint(n - 1, 1)"),  # not the answer file's pair, still right
        ("cpp", '#include <cstdio>\nint main(){long long n;scanf("%lld",&n);printf("%lld 0\\n",n);}'),
        ("python", "n = int(input())\nprint(n, 1)"),  # wrong
        ("python", "print('1e999999 \\x00 -nan', 'x' * 100000)"),  # hostile output: wrong, not a judge failure
        # The answer file and the checker are nowhere the program can reach.
        ("python", "import os\nn = int(input())\nprint(n - 1 if os.path.exists('/tmp/check') else n, 0)"),
    ]
    out = grade_programs(server.url, programs, label)
    assert out["rewards"] == [1.0, 1.0, 0.0, 0.0, 1.0], out["error_types"]
    assert out["error_types"][2:4] == ["wrong_answer", "wrong_answer"]


def test_a_python_checker_gives_partial_points(server: Server) -> None:
    label = {"inputs": [""], "outputs": ["1 2 3 4"], "checker": {"program": PARTIAL_PY, "language": "python"}}
    out = grade_programs(server.url, [("python", "print(1, 2, 0, 0)"), ("python", "print(1, 2, 3, 4)")], label)
    assert out["rewards"] == [0.5, 1.0], out["error_types"]


@pytest.mark.parametrize(
    "checker",
    [
        "import sys\nsys.exit(3)",  # testlib's judge failure
        "raise SystemExit(-1)",
        "while True:\n    pass",  # hangs
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",  # floods
        "def broken(:\n",  # does not build
    ],
)
def test_a_failing_checker_leaves_no_verdict(server: Server, checker: str) -> None:
    label = {"inputs": [""], "outputs": ["1"], "checker": {"program": checker, "language": "python"}}
    out = grade_programs(server.url, [("python", "print(1)")], label)
    assert out["error_types"] == ["judge_failure"] and out["rewards"][0] != out["rewards"][0]  # NaN


# A partial checker that echoes what the program printed after the points it gives (as a
# checker may quote the output it judges).
ACCEPT_PY = "import sys\nsys.exit(0)"
ECHOING_PY = "import sys\nsys.stderr.write('0 you printed: ' + open(sys.argv[2]).read())\nsys.exit(7)"


def test_a_checkers_points_come_from_the_start_of_its_report(server: Server) -> None:
    """testlib's points lead its report; a report longer than what is kept of a stream must
    not let the program's own text, quoted by the checker, take their place."""
    label = {"inputs": [""], "outputs": ["x"], "checker": {"program": ECHOING_PY, "language": "python"}}
    forged = "print(' ' * 8000 + '1')"  # quoted last: its '1' would lead the report's tail
    out = grade_programs(server.url, [("python", forged), ("python", "print('short')")], label)
    assert out["rewards"] == [0.0, 0.0], out["error_types"]


def test_outputs_kept_for_a_checker_are_bounded_per_sample(server: Server) -> None:
    """A custom checker judges after the program's runs: what they printed waits in the server
    and goes to the checker's sandbox as one job. A program printing near the kept limit on
    every test of a long label must not grow that without bound (the server's memory, the
    checker's supervisor killed: no verdict instead of its 0): past a per-sample total its
    tests are ``output_limit``."""
    kept = min(int(LANGUAGES_ENV["SCORER_CODE_MAX_OUTPUT_BYTES"]), 4 << 20)
    tests = 48
    label = {"inputs": [""] * tests, "outputs": ["1"] * tests, "checker": {"program": ACCEPT_PY, "language": "python"}}
    flood = f"import sys\nsys.stdout.write('\\0' * {kept - 16})"  # JSON writes each NUL as six bytes
    out = grade_programs(server.url, [("python", flood), ("python", "print(1)")], label)
    assert out["error_types"] == ["output_limit", None] and out["rewards"][0] < 1.0, out


def test_subtasks_score_a_group_only_when_all_its_tests_pass(server: Server) -> None:
    label = {
        "inputs": ["1", "2", "3", "4"],
        "outputs": ["1", "2", "3", "4"],
        "scoring": "subtasks",
        "subtasks": [{"points": 30, "tests": [0, 1]}, {"points": 70, "tests": [2, 3]}],
    }
    programs = [("python", "print(input())"), ("python", "n = input()\nprint(n if n in '12' else 0)"),
                ("python", "n = input()\nprint(n if n != '1' else 0)")]  # fmt: skip
    out = grade_programs(server.url, programs, label)
    assert out["rewards"] == [1.0, 0.3, 0.7], out
    all_label = {**label, "scoring": "all"}
    del all_label["subtasks"]
    assert grade_programs(server.url, programs, all_label)["rewards"] == [1.0, 0.0, 0.0]


class _CountedWaits(threading.Event):
    """An event that counts the threads that began to wait on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0
        self._counting = threading.Lock()

    def wait(self, timeout: float | None = None) -> bool:
        with self._counting:
            self.waits += 1
        return super().wait(timeout)


def test_the_compile_cache_is_bounded_and_builds_once(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Least recently used entries go first, never one a run holds; one build per key however
    many wait for it; a compile error is remembered; a failed build is not."""
    flights: list[compile_cache._Flight] = []

    class CountedFlight(compile_cache._Flight):
        def __init__(self) -> None:
            super().__init__()
            self.done = _CountedWaits()
            flights.append(self)

    monkeypatch.setattr(compile_cache, "_Flight", CountedFlight)
    cache = CompileCache(max_bytes=2500, isolation="none")
    built: list[str] = []

    def build(key: str, size: int = 1000):
        def run() -> None:
            built.append(key)
            os.mkdir(os.path.join(cache.root, key))
            with open(os.path.join(cache.root, key, "prog"), "wb") as file:
                file.write(b"x" * size)

        return run

    try:
        barrier = threading.Barrier(8)

        def user() -> None:
            barrier.wait()
            with cache.held("a", lambda: build("a")() or None, 10) as error:
                assert error is None

        threads = [threading.Thread(target=user) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert built == ["a"] and cache.stats()["builds"] == 1
        with cache.held("b", lambda: build("b")() or None, 10), cache.held("c", lambda: build("c")() or None, 10):
            # 3000 bytes over 2500: "a" (least recent, held by no run) goes, "b" and "c" are held
            assert not os.path.exists(os.path.join(cache.root, "a"))
            with cache.held("d", lambda: build("d")() or None, 10):
                assert os.path.isdir(os.path.join(cache.root, "b")) and os.path.isdir(os.path.join(cache.root, "c"))
        with cache.held("e", lambda: "syntax error", 10) as error, cache.held("e", lambda: "again", 10) as again:
            assert error == again == "syntax error"
        # A build that ran out of time (maybe the node's load) is not remembered.
        with (
            cache.held("g", lambda: Unremembered("slow"), 10) as error,
            cache.held("g", lambda: build("g")() or None, 10) as again,
        ):
            assert error == "slow" and again is None

        # ... but the samples already waiting for that very build share its outcome.
        started, finish, got = threading.Event(), threading.Event(), []

        def slow() -> str:
            started.set()
            finish.wait(10)
            return Unremembered("slow")

        def waiter(build_h) -> None:
            with cache.held("h", build_h, 10) as error:
                got.append(error)

        builder = threading.Thread(target=waiter, args=(slow,))
        builder.start()
        started.wait(10)
        waiting = [threading.Thread(target=waiter, args=(lambda: build("h")() or None,)) for _ in range(3)]
        for thread in waiting:
            thread.start()
        wait_until(lambda: flights[-1].done.waits == 3, "the three samples waiting for the build")
        finish.set()
        for thread in (builder, *waiting):
            thread.join()
        assert got == ["slow"] * 4 and "h" not in built
        with cache.held("h", lambda: build("h")() or None, 10) as error:
            assert error is None and built[-1] == "h"

        def failing() -> None:
            raise SandboxFailure("zygote gone")

        with pytest.raises(SandboxFailure), cache.held("f", failing, 10):
            pass
        with cache.held("f", lambda: build("f")() or None, 10) as error:
            assert error is None
    finally:
        cache.close()


def test_a_missing_toolchain_is_a_clear_verdict_without_a_score() -> None:
    """No toolchain: the sample gets ``language_unavailable`` (no verdict), never an error."""
    cache = CompileCache(1 << 20, isolation="none")
    try:
        builds = Builds(cache, Limits(1, 1, 64, 64))
        builds.tools = {}  # as on a node without any toolchain
        assert builds.availability()["rust"] == "missing: rustc, gcc"
        grader = Grader(CodeSettings(infra_failure_score="nan"), sandbox=None, timeout_s=150.0, builds=builds)  # type: ignore[arg-type]
        verdict = grader.grade([Sample("fn main(){}", Suite("stdin", [""], [""]), "rust")])[0]
        assert (verdict.status, verdict.score) == ("language_unavailable", None)
    finally:
        cache.close()
