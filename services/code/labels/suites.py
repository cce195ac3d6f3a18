"""Test formats carried by ``labels`` (docs/ARCHITECTURE.md §5.2) and the comparison of outputs.

A ``Suite`` splits a label into what enters the sandbox (``tests``: stdin texts, call
arguments or assert code) and what never does (``expected``). Comparison runs here, in the
service, on plain data: the sandbox reports stdout text or a call's answer as plain data, so
an object with a forged ``__eq__`` cannot pass. Assert code runs in the sandbox's tests'
process, apart from the candidate's (see ``inside.relay``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.limits.errors import Unprocessable
from services.code.judging import interactor
from services.code.judging.checkers import DEFAULT as DEFAULT_CHECKER
from services.code.judging.checkers import Checker, parse_checker
from services.code.languages import language_of
from services.code.preludes import PRELUDES


@dataclass(frozen=True)
class Suite:
    """The tests of one sample. ``kind`` is ``stdin``, ``call`` or ``assert``."""

    kind: str
    tests: list[Any]
    expected: list[Any]
    fn_name: str = ""
    entry_point: str = ""
    # Assert tests: trusted code run before them in the tests' process (HumanEval's prompt,
    # MBPP's test_setup_code), so helpers the tests call are not the candidate's.
    setup: str = ""
    # Why the label cannot test anything (its samples score 0 as ``invalid_label``), or "".
    invalid: str = ""
    # The language the label asks programs to be graded in (``languages``), or "" (the
    # request's, else the fenced block's tag, else Python).
    language: str = ""
    # How a stdin test's output is checked (``judging.checkers``), and how the tests make the score:
    # "" (the server's ``scoring``), "fraction", "all" or "subtasks" (``subtasks``: groups of
    # test indices with points, IOI style).
    checker: Checker = DEFAULT_CHECKER
    scoring: str = ""
    # The import block run before a Python program (``preludes.PRELUDES``), or "" (the server's).
    prelude: str = ""
    subtasks: tuple[Subtask, ...] = ()
    # Interactive stdin tests (``judging.interactor``): the label's interactor, its tests' answers
    # in ``expected`` (read by the interactor alone).
    interactor: Checker | None = None


@dataclass(frozen=True)
class Subtask:
    """A group of tests (indices) that scores its points only when every one of them passes."""

    points: float
    tests: tuple[int, ...]


def _text(value: Any, what: str) -> str:
    """A stdin/stdout text; APPS sometimes stores one as a list of lines. Its bytes are its
    UTF-8 encoding, which a lone surrogate (JSON's ``"\\ud800"``) has none of."""
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        value = "\n".join(value)
    if not isinstance(value, str):
        raise Unprocessable(f"labels: every {what} must be a string")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise Unprocessable(f"labels: an {what} holds a lone surrogate, which no bytes encode") from None
    return value


def _pairs(inputs: Any, outputs: Any) -> tuple[list[Any], list[Any]]:
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise Unprocessable("labels: 'inputs' and 'outputs' must be lists of the same length")
    if not inputs:
        raise Unprocessable("labels: the sample has no tests")
    return inputs, outputs


NO_ENTRY_POINT = "its test defines check(candidate) but no 'entry_point' names the function to check"


def label_code_of(suite: Suite) -> list[str]:
    """An assert label's Python code (its setup and tests): what must compile before it runs."""
    return [code for code in (suite.setup, *suite.tests) if code] if suite.kind == "assert" else []


def with_checked_code(suite: Suite, defines_check: Callable[[str], bool]) -> Suite:
    """An assert ``suite`` whose code compiled, invalid when a test defines ``check`` (HumanEval's
    form) and no ``entry_point`` names what it checks."""
    if suite.kind != "assert" or suite.entry_point or suite.invalid or not any(map(defines_check, suite.tests)):
        return suite
    return dataclasses.replace(suite, invalid=NO_ENTRY_POINT)


def parse_label(label: Any, problems: Callable[[Any], Suite] | None = None) -> Suite | str:
    """Turn a label (dict or JSON string) into a ``Suite``, or the name of the environment it
    asks for (``""`` for an empty label: the server's own environment); ``problem_packages`` gives the
    tests of a problem package a label names (``services.code.labels.problem_packages``)."""
    if isinstance(label, str):
        if not label.strip():
            return ""
        try:
            label = json.loads(label)
        except ValueError:
            raise Unprocessable("labels: a string label must be JSON") from None
    if label is None or label == {}:
        return ""
    if not isinstance(label, dict):
        raise Unprocessable("labels: each label must be a dict or a JSON string of one")
    if "problem" in label:
        if set(label) - {"problem", "language"}:
            raise Unprocessable("labels: a problem's label is {'problem': NAME} (and its 'language')")
        if problems is None:
            raise Unprocessable("labels: this server holds no problem packages (SCORER_CODE_PROBLEMS_DIR)")
        suite = problems(label["problem"])
        return _with_language(suite, label["language"]) if "language" in label else suite
    if JUDGING.intersection(label):
        parsed = parse_label({key: value for key, value in label.items() if key not in JUDGING})
        return _with_judging(parsed, label) if isinstance(parsed, Suite) else parsed
    if "interactor" in label:
        declared, inputs, answers = interactor.parse(label)
        return Suite("stdin", inputs, answers, interactor=declared)
    if "input_output" in label:  # APPS/TACO keep the tests as a nested JSON string
        nested = label["input_output"]
        if not isinstance(nested, (str, dict)) or not nested:
            raise Unprocessable("labels: 'input_output' must be a JSON string or a dict of tests")
        return parse_label(nested)
    if "test" in label:
        test = label["test"]
        tests = [test] if isinstance(test, str) else test
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise Unprocessable("labels: 'test' must be code with asserts (or a list of such)")
        entry = label.get("entry_point") or ""
        setup = label.get("setup") or ""
        if not isinstance(entry, str) or not isinstance(setup, str):
            raise Unprocessable("labels: 'entry_point' and 'setup' must be strings")
        return Suite("assert", tests, [None] * len(tests), entry_point=entry, setup=setup)
    if "tests" in label:
        cases = label["tests"]
        if not isinstance(cases, list) or not all(
            isinstance(c, dict) and {"input", "output"} <= c.keys() for c in cases
        ):
            raise Unprocessable("labels: 'tests' must be a list of {'input': str, 'output': str}")
        inputs, outputs = _pairs([c["input"] for c in cases], [c["output"] for c in cases])
        return Suite("stdin", [_text(i, "input") for i in inputs], [_text(o, "output") for o in outputs])
    if "inputs" in label or "outputs" in label:
        inputs, outputs = _pairs(label.get("inputs"), label.get("outputs"))
        fn_name = label.get("fn_name")
        if fn_name:
            if not isinstance(fn_name, str) or not all(isinstance(args, list) for args in inputs):
                raise Unprocessable("labels: call-based tests need 'fn_name' and a list of arguments per input")
            return Suite("call", inputs, outputs, fn_name=fn_name)
        return Suite("stdin", [_text(i, "input") for i in inputs], [_text(o, "output") for o in outputs])
    if set(label) == {"environment"}:
        if not isinstance(label["environment"], str):
            raise Unprocessable("labels: 'environment' must be a name")
        return label["environment"]
    raise Unprocessable(
        "labels: unknown test format; use {'inputs','outputs'}, {'tests': [...]}, "
        "{'fn_name','inputs','outputs'}, {'test','entry_point'} or {'interactor','tests'}"
    )


# Label fields that say how a suite is judged rather than what it tests.
JUDGING = frozenset(("language", "checker", "scoring", "subtasks", "prelude"))
SCORINGS = ("fraction", "all", "subtasks")


def _with_judging(suite: Suite, label: dict[str, Any]) -> Suite:
    """``suite`` with the label's language, checker, scoring and prelude."""
    language = _with_language(suite, label["language"]).language if "language" in label else suite.language
    checker = parse_checker(label["checker"]) if "checker" in label else DEFAULT_CHECKER
    if checker != DEFAULT_CHECKER and (suite.kind != "stdin" or suite.interactor is not None):
        raise Unprocessable("labels: a 'checker' applies to stdin/stdout tests only (an interactor judges its own)")
    scoring = label.get("scoring", "")
    if scoring and scoring not in SCORINGS:
        raise Unprocessable(f"labels: 'scoring' is one of {', '.join(SCORINGS)}")
    subtasks = _subtasks(label.get("subtasks"), len(suite.tests)) if scoring == "subtasks" else ()
    prelude = label.get("prelude", "")
    if prelude and not (isinstance(prelude, str) and prelude in PRELUDES):
        raise Unprocessable(f"labels: 'prelude' is one of {', '.join(PRELUDES)}")
    return dataclasses.replace(
        suite, language=language, checker=checker, scoring=scoring, subtasks=subtasks, prelude=prelude
    )


def _with_language(suite: Suite, name: Any) -> Suite:
    language = language_of(name) or ""
    if not language:
        raise Unprocessable(f"labels: unknown language {str(name)[:40]!r}")
    return dataclasses.replace(suite, language=language)


def _subtasks(groups: Any, total: int) -> tuple[Subtask, ...]:
    if not isinstance(groups, list) or not groups:
        raise Unprocessable("labels: 'subtasks' must be a list of {'points': number, 'tests': [index, ...]}")
    parsed = []
    for group in groups:
        points, tests = (group.get("points"), group.get("tests")) if isinstance(group, dict) else (None, None)
        if not isinstance(points, (int, float)) or isinstance(points, bool) or not 0 <= points < 1e9:
            raise Unprocessable("labels: each subtask needs 'points', a number from 0")
        if (
            not isinstance(tests, list)
            or not tests
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < total for i in tests)
        ):
            raise Unprocessable(f"labels: each subtask needs 'tests', indices of the {total} tests")
        parsed.append(Subtask(float(points), tuple(tests)))
    if not sum(group.points for group in parsed) > 0:
        raise Unprocessable("labels: the subtasks' points must add up to more than 0")
    return tuple(parsed)
