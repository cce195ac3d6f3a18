"""One deadline per request for every service: the code verifier grades by the core's
deadline (SCORER_REQUEST_TIMEOUT_S, from the request's arrival), not a clock of its own; its
old setting still sets it, with a warning, for one release."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testing.code import ENV, grade
from testing.server import gunicorn_server
from testing.timing import within

# The machine's time factor stretches the samples and the deadline alike: a slower machine
# leaves the first sample more time to start, in the same proportions.
SLEEP_S, DEADLINE_S = within(2.5), within(4.0)
SLOW = f"import time\ntime.sleep({SLEEP_S})\nprint(input())"


@pytest.mark.timing
@pytest.mark.parametrize("variable", ["SCORER_REQUEST_TIMEOUT_S", "SCORER_CODE_REQUEST_TIMEOUT_S"])
def test_samples_are_graded_by_the_requests_deadline(variable: str, tmp_path: Path) -> None:
    """One run at a time, three samples of 2.5 s each, a 4 s deadline (on a quiet machine): the
    first passes, the second is cut at the deadline, the third never gets a slot, and the answer
    comes then."""
    wall = str(within(10.0))
    env = {**ENV, "SCORER_CODE_MAX_PARALLEL": "1", "SCORER_CODE_TEST_WALL_S": wall, variable: str(DEADLINE_S)}
    with gunicorn_server("code", env, threads=8, log_dir=tmp_path) as server:
        started = time.monotonic()
        out = grade(server.url, [SLOW] * 3, {"inputs": ["7"], "outputs": ["7"]})
        elapsed = time.monotonic() - started
        deprecated = "SCORER_CODE_REQUEST_TIMEOUT_S is deprecated" in server.logs()
    assert out["rewards"][0] == 1.0, out
    assert out["error_types"][1] == "timeout" and out["rewards"][1] == 0.0, out
    assert out["error_types"][2] == "sandbox_error" and out["rewards"][2] != out["rewards"][2], out
    assert elapsed < within(7.5), f"answered after {elapsed:.1f} s, past the {DEADLINE_S} s deadline and the run"
    assert deprecated == (variable == "SCORER_CODE_REQUEST_TIMEOUT_S")


# Answers the first test at once, then spends each later test's wall limit (4 s) sleeping.
FIRST_THEN_SLEEP = "import time\nif input() != '0':\n    time.sleep(100)\nprint(0)"


@pytest.mark.timing
def test_a_program_that_spends_its_time_leaves_its_checker_time_and_a_slot(tmp_path: Path) -> None:
    """With a checker in the label, a program whose tests sleep to their wall limit until the
    request deadline still gets the checker's verdict on what it answered (1 of 12 tests):
    the checker's time and slot are kept before the program runs, never a NaN it chose."""
    env = {**ENV, "SCORER_CODE_TEST_WALL_S": "4", "SCORER_CODE_SAMPLE_WALL_S": "120", "SCORER_REQUEST_TIMEOUT_S": "30"}
    checker = {"program": "import sys\nsys.exit(0 if open(sys.argv[2]).read().strip() == '0' else 1)",
               "language": "python"}  # fmt: skip
    label = {"inputs": [str(i) for i in range(12)], "outputs": ["0"] * 12, "checker": checker}
    with gunicorn_server("code", env, threads=8, log_dir=tmp_path) as server:
        started = time.monotonic()
        out = grade(server.url, [FIRST_THEN_SLEEP], label)
        elapsed = time.monotonic() - started
    assert out["error_types"] == ["timeout"] and out["rewards"] == [1 / 12], out
    assert elapsed < 30 + within(2.0), f"answered after {elapsed:.1f} s, past the 30 s deadline"
