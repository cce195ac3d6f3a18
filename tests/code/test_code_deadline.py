"""One deadline per request for every service: the code verifier grades by the core's
deadline (SCORER_REQUEST_TIMEOUT_S, from the request's arrival), not a clock of its own; its
old setting still sets it, with a warning, for one release."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.code.test_code_server import ENV, grade
from tests.server import gunicorn_server

SLOW = "import time\ntime.sleep(2.5)\nprint(input())"


@pytest.mark.parametrize("variable", ["SCORER_REQUEST_TIMEOUT_S", "SCORER_CODE_REQUEST_TIMEOUT_S"])
def test_samples_are_graded_by_the_requests_deadline(variable: str, tmp_path: Path) -> None:
    """One run at a time, three samples of 2.5 s each, a 4 s deadline: the first passes, the
    second is cut at the deadline, the third never gets a slot, and the answer comes then."""
    env = {**ENV, "SCORER_CODE_MAX_PARALLEL": "1", "SCORER_CODE_TEST_WALL_S": "10", variable: "4"}
    with gunicorn_server("code", env, threads=8, log_dir=tmp_path) as server:
        started = time.monotonic()
        out = grade(server.url, [SLOW] * 3, {"inputs": ["7"], "outputs": ["7"]})
        elapsed = time.monotonic() - started
        deprecated = "SCORER_CODE_REQUEST_TIMEOUT_S is deprecated" in server.logs()
    assert out["rewards"][0] == 1.0, out
    assert out["error_types"][1] == "timeout" and out["rewards"][1] == 0.0, out
    assert out["error_types"][2] == "sandbox_error" and out["rewards"][2] != out["rewards"][2], out
    assert elapsed < 7.5, f"answered after {elapsed:.1f} s, past the 4 s deadline and the run in flight"
    assert deprecated == (variable == "SCORER_CODE_REQUEST_TIMEOUT_S")
