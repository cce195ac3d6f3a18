"""Problem packages as labels (``{"problem": NAME}``): Kattis problemtools' layout read from the
node's problems directory, its custom output validator judging as Kattis runs it (42/43, a
feedback directory, the output on stdin), an interactive package's validator as interactor;
a package is validated on load and a label cannot name anything outside the directory."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from common.limits.errors import Unprocessable
from services.code.judging import checkers, kattis_default
from services.code.labels.problem_packages import Problems, default_validator
from testing import problems
from testing.server import Server, gunicorn_server

ENV = {
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    "SCORER_CODE_ADMISSION": "off",
    "SCORER_CODE_TEST_CPU_S": "1",
    "SCORER_CODE_TEST_WALL_S": "3",
    "SCORER_CODE_SAMPLE_WALL_S": "40",
    "SCORER_CODE_MEMORY_MB": "256",
    "SCORER_CODE_COMPILE_CPU_S": "15",
    "SCORER_CODE_COMPILE_WALL_S": "30",
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("problems")
    problems.anysum(directory)
    for ident in ("problemtools/guess", "problemtools/hello", "rmrc2018/qaly"):
        problems.from_corpus(directory, ident)
    problems.from_corpus(directory, "problemtools/guess", "2025-09")
    lenient = problems.anysum(directory, "lenient")
    problems.write(lenient, {"output_validators/sum/validate.py": "raise SystemExit(0)\n"})
    return directory


@pytest.fixture(scope="module")
def server(root: Path, tmp_path_factory) -> Iterator[Server]:
    env = {**ENV, "SCORER_CODE_PROBLEMS_DIR": str(root)}
    with gunicorn_server("code", env, threads=32, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def post(url: str, programs: list[tuple[str, str]], label: object) -> requests.Response:
    fenced = [f"```{tag}\n{code}\n```\n" for tag, code in programs]
    body = {"outputs": fenced, "prompts": ["p"] * len(fenced), "labels": [label] * len(fenced)}
    return requests.post(url + "/reward/score", json=body, timeout=600)


def verdicts(url: str, programs: dict[str, tuple[str, str]], label: object) -> dict[str, tuple[str | None, float]]:
    response = post(url, list(programs.values()), label)
    assert response.status_code == 200, response.text[:500]
    got = response.json()
    return {name: (got["error_types"][i], got["rewards"][i]) for i, name in enumerate(programs)}


SUM_PROGRAMS = {
    # Answers other than the package's own (its .ans says "N 0").
    "python, 1 and N-1 or N and 0": ("python", "n = int(input())\nprint(*((1, n - 1) if n else (0, 0)))"),
    "cpp, half and the rest": ("cpp", "#include <cstdio>\nint main(){long n;scanf(\"%ld\",&n);"
                                      "printf(\"%ld %ld\\n\",n/2,n-n/2);}"),
    "python, one more": ("python", "n = int(input())\nprint(n, 1)"),
    "python, one number": ("python", "print(input())"),
    "python, negative": ("python", "n = int(input())\nprint(n + 1, -1)"),
    "cpp, too slow": ("cpp", "int main(){volatile unsigned long x=0;for(;;)x++;}"),
    "python, crashes": ("python", "raise SystemExit(3)"),
}  # fmt: skip


def test_custom_output_validator_judges_any_valid_answer(server: Server) -> None:
    got = verdicts(server.url, SUM_PROGRAMS, {"problem": "anysum"})
    assert got == {
        "python, 1 and N-1 or N and 0": (None, 1.0),
        "cpp, half and the rest": (None, 1.0),
        "python, one more": ("wrong_answer", 0.0),
        "python, one number": ("wrong_answer", 0.0),
        "python, negative": ("wrong_answer", 0.0),
        "cpp, too slow": ("timeout", 0.0),
        "python, crashes": ("runtime_error", 0.0),
    }


def test_what_a_program_prints_is_the_validators_to_judge(server: Server) -> None:
    """Bytes that are no text, a flood, and the answers' file the validator reads (which the
    program's sandbox does not hold): a wrong answer each, never a judge failure."""
    programs = {
        "bytes": ("python", "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe 1\\n')"),
        "flood": ("python", "import sys\nsys.stdout.write('1 ' * (1 << 23))"),
        "reads the answer": ("python", "print(open('/tmp/check/answer').read())"),
    }
    got = verdicts(server.url, programs, {"problem": "anysum"})
    assert got["bytes"] == ("wrong_answer", 0.0)
    assert got["flood"][0] in ("wrong_answer", "output_limit") and got["flood"][1] == 0.0
    assert got["reads the answer"] == ("runtime_error", 0.0)


def test_a_validator_exiting_as_testlib_accepts_is_no_verdict(server: Server) -> None:
    """Kattis' accepted is 42: a validator that exits 0 judged nothing (NaN, never 1)."""
    got = verdicts(server.url, {"right": ("python", "print(0, int(input()))")}, {"problem": "lenient"})
    assert got["right"][0] == "judge_failure" and got["right"][1] != got["right"][1]


def test_a_program_right_on_some_tests_scores_their_fraction(server: Server) -> None:
    """Of the 4 tests (N = 10, 0, 7, 1000000), only N = 0 is answered right."""
    got = verdicts(server.url, {"zero": ("python", "print(0, 0)")}, {"problem": "anysum"})
    assert got == {"zero": ("wrong_answer", 0.25)}


@pytest.mark.parametrize("package", ["guess", "guess-2025-09"])
def test_problemtools_interactive_guess_package(server: Server, package: str) -> None:
    """problemtools' own submissions of its interactive example, each its filed verdict (the
    score is the fraction of tests passed: full for the accepted one alone), its package in
    the legacy format (``validation: custom interactive``) and in the current one (``type:
    [pass-fail, interactive]``, as BAPCtools writes its ``guess``)."""
    filed = {"accepted/guess.cc": (None, True), "wrong_answer/guess_0.cc": ("wrong_answer", False),
             "run_time_error/guess_rte.c": ("runtime_error", False)}  # fmt: skip
    submissions = {s["path"]: s for s in problems.corpus_row("problemtools/guess")["submissions"]}
    programs = {path: (submissions[path]["language"], submissions[path]["code"]) for path in filed}
    got = verdicts(server.url, programs, {"problem": package})
    assert {path: (status, score == 1.0) for path, (status, score) in got.items()} == filed


def test_problemtools_hello_package_default_validation(server: Server) -> None:
    """Kattis' default validator: tokens, case-insensitive; problemtools' own submissions."""
    submissions = {s["path"]: s for s in problems.corpus_row("problemtools/hello")["submissions"]}
    programs = {path: (submissions[path]["language"], submissions[path]["code"])
                for path in ("accepted/hello.py", "accepted/hello.cc", "wrong_answer/hello.cc")}  # fmt: skip
    programs["shouts, spaced"] = ("python", "print('HELLO', '  WORLD!')")
    programs["no bang"] = ("python", "print('Hello World')")
    got = verdicts(server.url, programs, {"problem": "hello"})
    assert got == {
        "accepted/hello.py": (None, 1.0),
        "accepted/hello.cc": (None, 1.0),
        "wrong_answer/hello.cc": ("wrong_answer", 0.0),
        "shouts, spaced": (None, 1.0),
        "no bang": ("wrong_answer", 0.0),
    }


def test_rocky_mountain_qaly_package_float_tolerance(server: Server) -> None:
    """Its authors' accepted submissions, within float_absolute_tolerance 1e-3 of the answers."""
    submissions = {s["path"]: s for s in problems.corpus_row("rmrc2018/qaly")["submissions"]}
    programs = {path: (submissions[path]["language"], submissions[path]["code"])
                for path in ("accepted/qaly-db.cc", "accepted/qaly-zf.py")}  # fmt: skip
    programs["zero"] = ("python", "print(0)")
    got = verdicts(server.url, programs, {"problem": "qaly"})
    assert got == {
        "accepted/qaly-db.cc": (None, 1.0),
        "accepted/qaly-zf.py": (None, 1.0),
        "zero": ("wrong_answer", 0.0),
    }


@pytest.mark.parametrize(
    "label, why",
    [
        ({"problem": "nosuch"}, "no problem 'nosuch'"),
        ({"problem": "../anysum"}, "a problem's name"),
        ({"problem": "anysum/.."}, "a problem's name"),
        ({"problem": ["anysum"]}, "a problem's name"),
        ({"problem": "anysum", "checker": "tokens"}, "{'problem': NAME}"),
        ('{"problem": "anysum", "language": "cobol"}', "unknown language"),
    ],
)
def test_a_label_naming_no_package_is_refused(server: Server, label: object, why: str) -> None:
    response = post(server.url, [("python", "print(0, 0)")], label)
    assert response.status_code == 422 and why in response.text, response.text[:300]


def test_a_server_without_a_problems_dir_refuses_problem_labels(tmp_path) -> None:
    with gunicorn_server("code", ENV, log_dir=tmp_path) as srv:
        response = post(srv.url, [("python", "print(0, 0)")], {"problem": "anysum"})
    assert response.status_code == 422 and "SCORER_CODE_PROBLEMS_DIR" in response.text


@pytest.mark.unit
def test_a_symlink_out_of_the_directory_is_no_problem(tmp_path: Path) -> None:
    outside = problems.anysum(tmp_path / "outside")
    (tmp_path / "root").mkdir()
    os.symlink(outside, tmp_path / "root" / "linked")
    with pytest.raises(Unprocessable, match="no problem 'linked'"):
        Problems(str(tmp_path / "root")).suite("linked")


def _broken(tmp_path: Path, change: dict[str, str | None]) -> str:
    package = problems.anysum(tmp_path)
    for name, text in change.items():
        if text is None:
            (package / name).unlink()
        else:
            problems.write(package, {name: text})
    with pytest.raises(Unprocessable) as raised:
        Problems(str(tmp_path)).suite("anysum")
    return str(raised.value)


@pytest.mark.unit
@pytest.mark.parametrize(
    "change, why",
    [
        ({"data/secret/02.ans": None}, "data/secret/02.in has no .ans"),
        ({"problem.yaml": "validation: custom\nvalidator_flags: case_sensitive\n"}, "validator_flags"),
        ({"problem.yaml": "validation: custom score\n"}, "validation 'custom score'"),
        ({"problem.yaml": "validation: default\nvalidator_flags: space_change_sensitive\n"}, "validator_flags"),
        ({"problem.yaml": "validation: default\nvalidator_flags: float_tolerance\n"}, "validator_flags"),
        ({"problem.yaml": "validation: default\nvalidator_flags: float_tolerance x\n"}, "needs a finite number"),
        ({"problem.yaml": "[unclosed\n"}, "problem.yaml does not read"),
        ({"problem.yaml": None}, "problem.yaml is missing"),
        ({"output_validators/sum/other.py": "pass\n"}, "one C++ or Python source"),
        ({"output_validators/sum/validate.py": None}, "one C++ or Python source"),
        ({"problem.yaml": "problem_format_version: 2025-09\ntype: [interactive, multi-pass]\n"}, "type multi-pass"),
        ({"problem.yaml": "problem_format_version: 2023-07-draft\ntype: scoring\n"}, "type scoring"),
        ({"problem.yaml": "problem_format_version: 2025-09\ntype: submit-answer\n"}, "type submit-answer"),
        ({"problem.yaml": "type: [pass-fail, 3]\n"}, "type is"),
        ({"problem.yaml": "type: []\n"}, "type is"),
        ({"problem.yaml": "problem_format_version: 2025-09\nvalidation: custom\n"}, "'validation'"),
        (
            {
                "problem.yaml": "problem_format_version: 2025-09\n",
                "data/secret/test_group.yaml": "output_validator_args: x\n",
            },
            "data/secret/test_group.yaml",
        ),
    ],
)
def test_an_invalid_package_is_refused_naming_what_is_wrong(tmp_path: Path, change: dict, why: str) -> None:
    assert why in _broken(tmp_path, change)


@pytest.mark.unit
@pytest.mark.parametrize(
    "config, validator, judge",
    [
        ("problem_format_version: 2025-09\n", True, "custom"),
        ("problem_format_version: 2023-07-draft\ntype: pass-fail\n", True, "custom"),
        ("problem_format_version: 2025-09\ntype: interactive\n", True, "interactor"),
        ("problem_format_version: 2025-09\ntype: [pass-fail]\n", False, checkers.KATTIS_DEFAULT),
        ("problem_format_version: legacy\nvalidation: custom interactive\n", True, "interactor"),
        ("validation: custom\n", True, "custom"),
    ],
)  # fmt: skip
def test_the_current_format_reads_its_type(tmp_path: Path, config: str, validator: bool, judge: str) -> None:
    """2023-07 and later: ``type`` says interactive, a custom output validator is there or not;
    the legacy ``validation`` goes on as it was."""
    package = problems.write(problems.anysum(tmp_path), {"problem.yaml": config})
    if not validator:
        shutil.rmtree(package / "output_validators")
    suite = Problems(str(tmp_path)).suite("anysum")
    assert ("interactor" if suite.interactor else suite.checker.mode) == judge


@pytest.mark.unit
@pytest.mark.parametrize(
    "flags, case_sensitive, abs_tol, rel_tol",
    [
        ("", False, -1.0, -1.0),
        ("case_sensitive", True, -1.0, -1.0),
        ("float_tolerance 1e-6", False, 1e-6, 1e-6),
        ("float_absolute_tolerance 0.5 case_sensitive", True, 0.5, -1.0),
        ("float_relative_tolerance 1e-4", False, -1.0, 1e-4),
    ],
)
def test_default_validation_reads_its_flags(tmp_path: Path, flags: str, case_sensitive: bool, abs_tol, rel_tol) -> None:
    problems.write(problems.anysum(tmp_path), {"problem.yaml": f"validation: default\nvalidator_flags: '{flags}'\n"})
    checker = Problems(str(tmp_path)).suite("anysum").checker
    assert (checker.mode, checker.case_sensitive, checker.abs_tol, checker.rel_tol) == (
        "kattis",
        case_sensitive,
        abs_tol,
        rel_tol,
    )


# Kattis' default validator, case by case (answer, output, flags, accepted).
KATTIS_DEFAULT = [
    ("Hello World!\n", "hello   world!", "", True),
    ("Hello World!\n", "hello world!", "case_sensitive", False),
    ("1 2\n", "1\u00a02", "", False),  # a no-break space is no C whitespace
    ("Stra\u00dfe", "STRA\u00dfE", "", True),  # ASCII letters fold, others are bytes
    ("k", "\u212a", "", False),  # the Kelvin sign is no K to strcasecmp
    ("1 2", "1 2 3", "", False),
    ("1 2", "1", "", False),
    ("", "", "", True),
    ("3.0", "3", "", False),  # no tolerance: text
    ("3.0", "3", "float_tolerance 1e-9", True),
    ("100", "100.00001", "float_relative_tolerance 1e-6", True),
    ("100", "100.001", "float_relative_tolerance 1e-6", False),
    ("0", "0.4", "float_absolute_tolerance 0.5", True),
    ("0", "0.4", "float_relative_tolerance 0.5", False),
    ("16", "0x10", "float_tolerance 1e-9", True),  # strtod reads hexadecimal
    ("10", "1_0", "float_tolerance 1e-9", False),  # Python's float() would take it
    ("1.5", "nan", "float_tolerance 1e-9", False),
    ("1.5", "1.5x", "float_tolerance 1e-9", False),
    ("inf", "INF", "float_tolerance 1e-9", True),  # no finite double: compared as text
    ("1e999", "1E999", "float_tolerance 1e-9", True),
    ("word", "WORD", "float_tolerance 1e-9", True),
    ("50000000000000001", "50000000000000000", "float_tolerance 1e-9", True),  # integers as doubles
]


@pytest.mark.unit
@pytest.mark.parametrize("want, got, flags, accepted", KATTIS_DEFAULT)
def test_kattis_default_validator(want: str, got: str, flags: str, accepted: bool) -> None:
    checker = default_validator(flags, "p")
    assert kattis_default.matches(got, want, checker.case_sensitive, checker.abs_tol, checker.rel_tol) is accepted


@pytest.mark.unit
def test_a_package_is_read_once(tmp_path: Path) -> None:
    package = problems.anysum(tmp_path)
    loaded = Problems(str(tmp_path))
    suite = loaded.suite("anysum")
    (package / "data" / "sample" / "1.in").write_text("11\n")
    assert loaded.suite("anysum") is suite
    assert suite.tests == ["10\n", "0\n", "7\n", "1000000\n"]
    assert (suite.checker.mode, suite.checker.protocol, suite.checker.language) == ("custom", "kattis", "python")


@pytest.mark.unit
def test_a_cpp_validators_headers_take_the_place_of_their_include(tmp_path: Path) -> None:
    problems.from_corpus(tmp_path, "problemtools/guess")
    package = tmp_path / "guess" / "output_validator" / "validator"
    source = (package / "validate.cc").read_text()
    (package / "validate.h").write_text("// the header\n")
    (package / "validate.cc").write_text('#include "validate.h"\n' + source)
    interactor = Problems(str(tmp_path)).suite("guess").interactor
    assert interactor is not None and interactor.protocol == "kattis"
    assert interactor.program == "// the header\n\n" + source
