"""SandboxFusion's ``/run_code``: its request, its answer, and one run through the grader.

Field names, statuses and language names follow bytedance/SandboxFusion at commit 469de08
(``sandbox/server/sandbox_api.py``: ``RunCodeRequest``, ``RunCodeResponse``, ``RunStatus``;
``sandbox/runners/types.py``: ``CommandRunResult``, ``CommandRunStatus``, ``Language``), as
verl's client reads them (volcengine/verl at b178a3c,
``verl/utils/reward_score/sandbox_fusion/utils.py``). What differs is bounded by the node: a
client's timeouts and memory never exceed the server's limits (``RunLimits``).
"""

from __future__ import annotations

import binascii
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.limits.errors import Unprocessable, quote
from common.pipeline.scorer import Scored
from services.code.grading.grader import Grader
from services.code.grading.trials import RunCall, RunLimits, Trial
from services.code.languages import LANGUAGES, SANDBOX_FUSION_NAMES
from services.code.sandbox.compile_cache import Unremembered
from services.code.sandbox.inside.files import components
from services.code.sandbox.inside.messages import StdinOutcome
from services.code.settings import CodeSettings

# SandboxFusion's other names: a run it would make and this node cannot is its ``SandboxError``.
NOT_SERVED = (
    "go_test", "php", "csharp", "bash", "typescript", "sql", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala",
    "julia", "pytest", "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
)  # fmt: skip
# SandboxFusion's default compile and run timeouts (``RunCodeRequest``).
DEFAULT_TIMEOUT_S = 10.0
# What a process killed at a limit reports as its return code (SIGKILL, negated as Python does).
KILLED = -9
# verl reads an answer for ``compile_timeout + run_timeout + CLIENT_SLACK_S`` seconds
# (``call_sandbox_api``); the node answers ``ANSWER_MARGIN_S`` before that, a 504 it retries
# when the run could not be made in time, never silence past it.
CLIENT_SLACK_S = 10.0
ANSWER_MARGIN_S = 2.0


@dataclass(frozen=True)
class RunCode:
    """One ``/run_code`` request, validated: ``language`` is ours ("" for a name SandboxFusion
    knows and this node does not serve), ``asked`` the client's; ``client`` (``common.limits.clients``)
    whose turn at the run slots its run takes, as the client's graded samples do; ``answer_s``,
    how long after its arrival its client still reads the answer."""

    code: str
    asked: str
    language: str
    stdin: str
    limits: RunLimits
    client: str = ""
    answer_s: float = 2 * DEFAULT_TIMEOUT_S + CLIENT_SLACK_S - ANSWER_MARGIN_S


def parse(payload: dict[str, Any], settings: CodeSettings, client: str = "") -> RunCode:
    """The request of ``client`` (its address), or ``Unprocessable`` (SandboxFusion's FastAPI
    answers 422 too)."""
    code, asked, stdin = payload.get("code"), payload.get("language"), payload.get("stdin")
    if not isinstance(code, str):
        raise Unprocessable("'code' must be a string")
    if not isinstance(asked, str) or (asked not in SANDBOX_FUSION_NAMES and asked not in NOT_SERVED):
        raise Unprocessable(
            f"unknown language {quote(asked)}: SandboxFusion's names are "
            + ", ".join((*SANDBOX_FUSION_NAMES, *NOT_SERVED))
        )
    if stdin is not None and not isinstance(stdin, str):
        raise Unprocessable("'stdin' must be a string or null")
    for text in (code, stdin or ""):
        if len(text) > settings.max_text_chars:
            raise Unprocessable(f"a text of {len(text)} characters; the limit is {settings.max_text_chars}")
    if stdin is not None and not _unicode(stdin):
        raise Unprocessable("'stdin' holds a lone surrogate: it is no Unicode text a program could read")
    if payload.get("args"):
        raise Unprocessable("'args' (pytest's) is not served by this node: only an empty list is accepted")
    run_s = _seconds(payload, "run_timeout")
    compile_s = _seconds(payload, "compile_timeout")  # builds are shared: the server's compile limits apply
    memory = payload.get("memory_limit_MB", -1)
    if isinstance(memory, bool) or not isinstance(memory, int) or (memory <= 0 and memory != -1):
        raise Unprocessable(f"'memory_limit_MB' must be a positive integer or -1, not {quote(memory)}")
    memory_mb = settings.memory_mb if memory == -1 else min(memory, settings.memory_mb)
    files, fetch = _files(payload.get("files") or {}, settings), _fetch(payload.get("fetch_files") or [], settings)
    limits = RunLimits(cpu_s=run_s, wall_s=run_s, memory_mb=memory_mb, files=files, fetch=fetch)
    answer_s = compile_s + run_s + CLIENT_SLACK_S - ANSWER_MARGIN_S
    return RunCode(code, asked, SANDBOX_FUSION_NAMES.get(asked, ""), stdin or "", limits, client, answer_s)


def _files(given: object, settings: CodeSettings) -> dict[str, str]:
    """``files``: path -> base64 (a null content is skipped, as SandboxFusion does), at most
    ``run_code_files`` of them and ``run_code_file_bytes`` decoded in all, each a plain path
    under the run's directory that no other names as a directory."""
    if not isinstance(given, dict):
        raise Unprocessable("'files' must be an object of path -> base64 content")
    files = {path: data for path, data in given.items() if data is not None}
    if len(files) > settings.run_code_files:
        raise Unprocessable(f"{len(files)} files; the limit is {settings.run_code_files} (run_code_files)")
    total, placed = 0, set()
    for path, data in files.items():
        if not isinstance(data, str):
            raise Unprocessable(f"the content of file {quote(path)} must be base64 text or null")
        pieces = _path(path)
        try:
            total += len(binascii.a2b_base64(data, strict_mode=True))
        except binascii.Error:
            raise Unprocessable(f"the content of file {quote(path)} is not base64") from None
        if total > settings.run_code_file_bytes:
            raise Unprocessable(f"files of more than {settings.run_code_file_bytes} bytes (run_code_file_bytes)")
        placed.add(pieces)
    if len(placed) < len(files) or any(path[:end] in placed for path in placed for end in range(1, len(path))):
        raise Unprocessable("two files name the same path, or one names another's directory")
    return files


def _fetch(given: object, settings: CodeSettings) -> tuple[str, ...]:
    if not isinstance(given, list):
        raise Unprocessable("'fetch_files' must be a list of paths")
    if len(given) > settings.run_code_files:
        raise Unprocessable(f"{len(given)} files to fetch; the limit is {settings.run_code_files} (run_code_files)")
    for path in given:
        _path(path)
    return tuple(dict.fromkeys(given))


def _unicode(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (JSON may carry lone surrogates, which do not)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _path(path: object) -> tuple[str, ...]:
    """A file path's components under the run's directory, or ``Unprocessable``."""
    pieces = components(path) if isinstance(path, str) and _unicode(path) else None
    if pieces is None:
        raise Unprocessable(f"file path {quote(path)} must be relative text, without '..', names of at most 255 bytes")
    return tuple(pieces)


def _seconds(payload: dict[str, Any], name: str) -> float:
    value = payload.get(name, DEFAULT_TIMEOUT_S)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise Unprocessable(f"'{name}' must be a positive number of seconds, not {quote(value)}")
    return float(value)


def run(grader: Grader, request: RunCode, deadline: float, gone: Callable[[], bool]) -> dict[str, Any]:
    """The answer to ``request``: its run within its limits, by ``deadline`` (the request's,
    and no later than its client reads), in its client's turn at the slots. Raises
    ``SandboxFailure`` when the sandbox could not make the run (no slot in time, the sandbox
    failed, the run could not have its limits in time), ``Cancelled`` once ``gone()``."""
    if not request.language:
        return sandbox_error(
            f"language {request.asked!r} is not served by this node (served: {', '.join(SANDBOX_FUSION_NAMES)})"
        )
    language = LANGUAGES.get(request.language)
    if language is not None and (grader.builds is None or grader.builds.missing(language)):
        return sandbox_error(f"the {request.asked} toolchain is not installed on this node")
    call = RunCall(request.code, request.language, request.stdin, request.limits, deadline, request.client)
    trial = grader.run_once(call, gone)
    return answer(trial)


def answer(trial: Trial) -> dict[str, Any]:
    """``RunCodeResponse`` of one trial: ``Success`` when every command finished with 0,
    ``Failed`` otherwise (a compile error, a non-zero exit, a limit), as ``parse_run_status``."""
    compile_result = None
    if trial.compile_s is not None:
        error = trial.compile_error
        compile_result = command_result(
            "TimeLimitExceeded" if isinstance(error, Unremembered) else "Finished",
            trial.compile_s, None if isinstance(error, Unremembered) else int(error is not None), "", error or "",
        )  # fmt: skip
    run_result = None if trial.run is None else _run_result(trial.run)
    results = [r for r in (compile_result, run_result) if r is not None]
    ok = all(r["status"] == "Finished" and r["return_code"] == 0 for r in results) and run_result is not None
    return _response("Success" if ok else "Failed", "", compile_result, run_result, trial.files)


def _run_result(run: StdinOutcome) -> dict[str, Any]:
    """A run's ``CommandRunResult``: a limit the program went over is named at the end of its
    stderr, and a program stopped at one never reports 0."""
    if run.timed_out:
        return command_result("TimeLimitExceeded", run.wall_s, None, run.stdout, run.stderr)
    syntax = _python_compile_error(run)
    if syntax is not None:  # CPython itself exits 1 with it on stderr
        return command_result("Finished", run.wall_s, 1, run.stdout, run.stderr + syntax)
    limit = "memory" if run.over_memory else "output" if run.output_exceeded else ""
    code = run.exit if run.exit or not limit else KILLED
    stderr = run.stderr + (f"\n[sandbox] the {limit} limit was exceeded\n" if limit else "")
    return command_result("Finished", run.wall_s, code, run.stdout, stderr)


def _python_compile_error(run: StdinOutcome) -> str | None:
    """The compile error a Python run reported before its program ran, or None."""
    try:
        reported = json.loads(run.result) if run.result else {}
    except ValueError:
        return None
    return str(reported["compile_error"]) if isinstance(reported, dict) and "compile_error" in reported else None


def command_result(
    status: str, seconds: float | None, return_code: int | None, stdout: str, stderr: str
) -> dict[str, Any]:
    return {"status": status, "execution_time": seconds, "return_code": return_code, "stdout": stdout,
            "stderr": stderr}  # fmt: skip


def sandbox_error(message: str) -> dict[str, Any]:
    """SandboxFusion's answer for a run it could not make."""
    return _response("SandboxError", message, None, None)


def _response(
    status: str,
    message: str,
    compile_result: dict[str, Any] | None,
    run_result: dict[str, Any] | None,
    files: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {"status": status, "message": message, "compile_result": compile_result, "run_result": run_result,
            "executor_pod_name": None, "files": files or {}}  # fmt: skip


class Ran(Scored):
    """A ``/run_code`` answer where the core's request path expects a result (it scores nothing)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(math.nan)
        self.answer = answer
