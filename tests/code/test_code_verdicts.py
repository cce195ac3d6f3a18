"""Verdicts measured on public contest problems: each submission of the verdict corpus
(``testing/corpus/verdicts.py``: Kattis problem packages of Kattis/problemtools and the ICPC
Rocky Mountain Regional archives, C, C++, Java, Go, Rust, JavaScript and Python) graded by the
running server with its package's tests, output validation and limits must get the verdict
its authors filed it under (accepted, wrong_answer, time_limit_exceeded, run_time_error).

A fast slice runs by default (about a minute). The whole corpus (127 submissions, 12 of them
of the interactive ``guess``, about 12 minutes on 2 loaded cores) runs only when asked for: ``pytest -m corpus
tests/code/test_code_verdicts.py`` or ``SCORER_TEST_CORPUS=1``. Submissions that disagree
today for a known cause are listed with it (``verdicts.KNOWN_DISAGREEMENTS``): in the slice
as ``xfail(strict=True)``, so that a fix turns them into an XPASS failure, to be unmarked.
"""

from __future__ import annotations

import pytest

from services.code import languages
from testing.corpus import verdicts

ITEMS = {item.id: item for item in verdicts.load()}

# One server (1 s, 1024 MiB) and a second (1 s, 512 MiB): every language installed by run.sh
# but Rust accepted, each rejecting verdict.
SLICE = [
    "problemtools/different/accepted/different.c",
    "problemtools/different/accepted/different.cc",
    "problemtools/different/accepted/Different.java",
    "problemtools/different/accepted/different.go",
    "problemtools/different/accepted/different.js",
    "problemtools/different/accepted/different_py3.py",
    "problemtools/different/wrong_answer/different_int.cc",
    "problemtools/different/wrong_answer/different_no_abs.cc",
    "problemtools/different/time_limit_exceeded/different_linear_search.cc",
    "problemtools/hello/accepted/hello.java",
    "problemtools/hello/wrong_answer/hello.cc",
    # (problemtools/hello/run_time_error/memory_limit.cc is machine-dependent: verdicts.MACHINE_DEPENDENT.)
    # Interactive: accepted; rejected by the validator first, then crashed; crashed after the
    # validator accepted.
    "problemtools/guess/accepted/guess.cc",
    "problemtools/guess/wrong_answer/GuessCrash.java",
    "problemtools/guess/run_time_error/guess_rte_after_correct.cc",
    "rmrc2022/sunandmoon/accepted/sunandmoon-zf.py",
    "rmrc2022/sunandmoon/accepted/sunandmoon_xiaowuc1.cpp",
]


def installed(language: str) -> bool:
    """Python runs in the service's own interpreter; the others need their toolchain."""
    return language == languages.PYTHON or not languages.missing_tools(
        languages.LANGUAGES[language], languages.tool_paths()
    )


@pytest.fixture(scope="module")
def slice_verdicts(tmp_path_factory) -> dict[str, tuple[float, str | None]]:
    return verdicts.judge([ITEMS[ident] for ident in SLICE], tmp_path_factory.mktemp("logs"))


def _param(ident: str) -> object:
    if ident in verdicts.KNOWN_DISAGREEMENTS:
        return pytest.param(ident, marks=pytest.mark.xfail(strict=True, reason=verdicts.KNOWN_DISAGREEMENTS[ident]))
    return ident


@pytest.mark.parametrize("ident", [_param(ident) for ident in SLICE])
def test_submission_gets_the_verdict_it_is_filed_under(slice_verdicts: dict, ident: str) -> None:
    item = ITEMS[ident]
    assert verdicts.agrees(item, *slice_verdicts[ident]), (item.expected, slice_verdicts[ident])


@pytest.mark.corpus
def test_full_corpus_agrees_but_for_known_causes(tmp_path) -> None:
    """Every submission graded; a disagreement must be a known one (with its cause), and a
    known one that now agrees must leave the list. Deselected unless asked for
    (tests/conftest.py)."""
    missing = sorted({item.language for item in ITEMS.values() if not installed(item.language)})
    items = {
        ident: item
        for ident, item in ITEMS.items()
        if ident not in verdicts.MACHINE_DEPENDENT and item.language not in missing
    }
    found = verdicts.judge(list(items.values()), tmp_path)
    new, fixed = [], []
    for ident, item in items.items():
        agree = verdicts.agrees(item, *found[ident])
        if not agree and ident not in verdicts.KNOWN_DISAGREEMENTS:
            new.append(f"{ident}: filed under {item.expected}, ours {found[ident]}")
        if agree and ident in verdicts.KNOWN_DISAGREEMENTS:
            fixed.append(ident)
    assert new == [], "disagreements without a known cause"
    assert fixed == [], "known disagreements that now agree: remove them from verdicts.KNOWN_DISAGREEMENTS"
    assert missing == [], "toolchains not installed, their submissions not graded (bash run.sh code installs them)"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("flags", "checker"),
    [
        ("", "yes_no"),
        ("case_sensitive", "tokens"),
        ("float_tolerance 1e-6", {"mode": "float", "abs": 1e-6, "rel": 1e-6}),
        ("float_absolute_tolerance 1e-3", {"mode": "float", "abs": 1e-3, "rel": 0.0}),
        ("float_relative_tolerance 1e-5 float_absolute_tolerance 1e-4", {"mode": "float", "abs": 1e-4, "rel": 1e-5}),
    ],
)
def test_kattis_validator_flags_map_onto_a_checker(flags: str, checker: object) -> None:
    """Kattis's default validator: tokens, case-insensitive unless case_sensitive; numbers
    within either tolerance when one is set."""
    assert verdicts.checker({"id": "p", "validation": "default", "validator_flags": flags}) == checker


@pytest.mark.unit
def test_every_problem_may_be_shipped_and_names_its_origin() -> None:
    for problem in verdicts.problems():
        assert problem["license"] in ("cc by-sa", "public domain"), problem["id"]
        assert problem["repository"] and len(problem["commit"]) == 40 and problem["tests"], problem["id"]
        assert problem["source"] or problem["author"] or problem["rights_owner"], problem["id"]
