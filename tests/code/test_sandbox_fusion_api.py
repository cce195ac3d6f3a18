"""SandboxFusion's ``/run_code`` request and answer, in-process: what the client may ask for is
capped by the node, and a run stopped at a limit is never a ``Success``."""

from __future__ import annotations

import pytest

from common.limits.errors import Unprocessable
from services.code.grading.trials import Trial
from services.code.protocols.sandbox_fusion import api
from services.code.sandbox.compile_cache import Unremembered
from services.code.sandbox.inside.messages import StdinOutcome
from services.code.settings import CodeSettings

pytestmark = pytest.mark.unit

SETTINGS = CodeSettings(memory_mb=256, test_cpu_s=2, test_wall_s=4)


def outcome(**fields: object) -> StdinOutcome:
    base = {"index": 0, "exit": 0, "timed_out": False, "output_exceeded": False, "stdout_truncated": False,
            "cpu_s": 0.01, "wall_s": 0.02, "stdout": "3\n", "stderr": "", "result": ""}  # fmt: skip
    return StdinOutcome(**{**base, **fields})  # type: ignore[arg-type]


def test_the_client_can_lower_the_limits_and_never_raise_them() -> None:
    asked = api.parse({"code": "x", "language": "python", "run_timeout": 3600, "memory_limit_MB": 1 << 20}, SETTINGS)
    assert asked.limits.memory_mb == 256 and asked.limits.cpu_s == 3600  # the grader caps time per language
    lower = api.parse({"code": "x", "language": "cpp", "run_timeout": 0.5, "memory_limit_MB": 64}, SETTINGS)
    assert (lower.limits.memory_mb, lower.limits.cpu_s, lower.language) == (64, 0.5, "cpp")
    assert api.parse({"code": "x", "language": "python"}, SETTINGS).limits.memory_mb == 256  # -1: the node's


@pytest.mark.parametrize(("asked", "ours"), [("python", "python"), ("nodejs", "javascript"), ("php", "")])
def test_sandbox_fusion_names_map_onto_ours(asked: str, ours: str) -> None:
    assert api.parse({"code": "x", "language": asked}, SETTINGS).language == ours


def test_a_language_sandbox_fusion_does_not_know_is_refused() -> None:
    with pytest.raises(Unprocessable, match="c\\+\\+"):
        api.parse({"code": "x", "language": "c++"}, SETTINGS)


@pytest.mark.parametrize(
    ("run", "status", "return_code"),
    [
        (outcome(), "Success", 0),
        (outcome(exit=1), "Failed", 1),
        (outcome(exit=-11), "Failed", -11),
        (outcome(over_memory=True), "Failed", api.KILLED),  # peak memory over the limit, exited 0
        (outcome(output_exceeded=True), "Failed", api.KILLED),
        (outcome(exit=-9, over_memory=True), "Failed", -9),
        (outcome(timed_out=True, exit=-9), "Failed", None),
        (outcome(result='{"compile_error": "SyntaxError: invalid syntax"}'), "Failed", 1),
    ],
)
def test_a_run_stopped_at_a_limit_is_never_success(run: StdinOutcome, status: str, return_code: int | None) -> None:
    answer = api.answer(Trial(None, None, run))
    assert answer["status"] == status and answer["run_result"]["return_code"] == return_code, answer
    assert answer["compile_result"] is None
    if run.over_memory or run.output_exceeded:
        assert "limit was exceeded" in answer["run_result"]["stderr"]


def test_a_compile_error_and_a_build_out_of_time() -> None:
    failed = api.answer(Trial("main.cpp:1: error: expected ';'", 0.4, None))
    assert failed["status"] == "Failed" and failed["run_result"] is None
    assert failed["compile_result"]["status"] == "Finished" and failed["compile_result"]["return_code"] == 1
    slow = api.answer(Trial(Unremembered("the compiler exceeded its time limit"), 30.0, None))
    assert slow["compile_result"]["status"] == "TimeLimitExceeded" and slow["compile_result"]["return_code"] is None
    built = api.answer(Trial(None, 0.0, outcome(), {"out.txt": "eA=="}))
    assert built["status"] == "Success" and built["compile_result"]["return_code"] == 0
    assert built["files"] == {"out.txt": "eA=="}
