"""The OpenAI-compatible engine client: each call bounded by its request's deadline and in bytes
(``exchange``), retried inside the deadline, its answer checked whole (anything but a chat
completion is the engine's fault: 503 naming it, on a pickle body too; an engine that does not
answer in time is the node's overload: 503, on a pickle body flow_grpo's retried 500); the
worker's calls sent ``concurrency`` at a time, taken fairly between clients and requests
(``calls``); what the calls and an occasional probe show of the engine for ``/ready``; the
engine's token usage in ``/metrics``."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, NoReturn

from prometheus_client import Counter

from common.limits.errors import Overloaded, ScorerError
from common.sdk.retry import GaveUp, Retryable, RetryPolicy, call_before
from services.judge.calls import FairQueue
from services.judge.exchange import Answered, Connections, Unreachable
from services.judge.prompts import MAX_REPLY_CHARS

TOKENS = Counter("scorer_judge_tokens_total", "Engine tokens the judge's calls used", ["service", "kind"])
CALLS = Counter("scorer_judge_calls_total", "Chat completions sent to the engine", ["service", "outcome"])

# The bytes of an engine's answer read at most. The longest reply the rules read (65,536
# characters) fits however JSON escapes it (at most 12 bytes a character: a surrogate pair's
# two \uXXXX), with room for the completion's other fields; past it, the sample's parse failure.
MAX_ANSWER_BYTES = 2**20
# A token count beyond it is no engine's: a Prometheus counter cannot add it exactly.
MAX_TOKENS = 2**53
# How long a probe of the engine (its /v1/models or /health) may take.
PROBE_TIMEOUT_S = 5.0


class EngineUnavailable(Overloaded):
    """The engine did not answer within the request's deadline, retries included (503; on a
    pickle body flow_grpo's 500, which it retries: an engine restarting or busy answers later)."""


class EngineFault(ScorerError):
    """The engine answered what no retry mends: something that is no chat completion, or a
    refusal it would repeat (a 4xx but 408 and 429: a wrong model name, key or request). 503
    naming the engine, on a pickle body too: a fault flow_grpo stops at, where it would retry
    a 500 a thousand times."""

    status = 503


@dataclass(frozen=True)
class Reply:
    """A chat completion's text and token counts; ``problem`` when it was too long to read (the
    sample's parse failure)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    problem: str | None = None


class EngineHealth:
    """Whether the engine answers, from what the calls show and, when they have shown nothing
    for ``probe_s``, one probe in the background: ``/ready`` never waits on the engine, and
    however often it asks, the engine sees a probe per ``probe_s`` at most."""

    def __init__(
        self, probe: Callable[[], object], probe_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._probe = probe
        self.probe_s = probe_s
        self._clock = clock
        self._problem: str | None = None
        self._shown = clock()
        self._probing = False
        self._lock = threading.Lock()

    def answered(self) -> None:
        with self._lock:
            self._problem, self._shown = None, self._clock()

    def unreachable(self, problem: str) -> None:
        with self._lock:
            self._problem, self._shown = problem, self._clock()

    def problem(self) -> str | None:
        """Why the engine is down (None: it answered when last seen); a probe starts when that is stale."""
        with self._lock:
            start = not self._probing and self._clock() - self._shown >= self.probe_s
            self._probing = self._probing or start
            problem = self._problem
        if start:
            threading.Thread(target=self._run_probe, name="judge-engine-probe", daemon=True).start()
        return problem

    def _run_probe(self) -> None:
        try:
            self._probe()
        except Exception as exc:  # whatever the probe met, the engine did not answer it
            self.unreachable(f"the judge's engine did not answer a probe: {exc}")
        else:
            self.answered()
        finally:
            with self._lock:
                self._probing = False


class EngineClient:
    """Chat completions against one engine, at most ``concurrency`` in flight per worker, at most
    ``max_queued`` waiting."""

    def __init__(
        self,
        url: str,
        service: str,
        concurrency: int,
        retries: int,
        backoff_s: float,
        backoff_max_s: float,
        api_key: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_queued: int = 4096,
        probe_s: float = 10.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.service = service
        self.policy = RetryPolicy(retries, backoff_s, backoff_max=backoff_max_s)
        self.sleep = sleep
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.connections = Connections(self.url)
        self.queue = FairQueue(concurrency, max_queued)
        self.health = EngineHealth(self.probe, probe_s)
        for number in range(concurrency):
            threading.Thread(target=self._send, name=f"{service}-engine-{number}", daemon=True).start()

    def _get(self, path: str) -> Answered:
        expires = time.monotonic() + PROBE_TIMEOUT_S
        return self.connections.exchange("GET", path, None, self.headers, expires, MAX_ANSWER_BYTES, keep=False)

    def probe(self) -> list[str] | None:
        """The model names the engine's ``/v1/models`` lists; None when only its ``/health``
        answers (transformers serve offline scans the hub cache for its models, and fails);
        an error naming what failed when neither does."""
        try:
            answer = self._get("/v1/models")
            if answer.status == 200:
                return [model["id"] for model in json.loads(answer.body)["data"]]
        except (Unreachable, OSError, http.client.HTTPException, KeyError, TypeError, ValueError):
            pass
        answer = self._get("/health")
        if answer.status != 200:
            raise ValueError(f"its /health answered {answer.status}")
        return None

    def wait_until_up(self, seconds: float, need_models: bool) -> list[str]:
        """The engine's model names once it answers, trying for ``seconds``; the last error
        after. An engine whose ``/v1/models`` fails is up when its ``/health`` answers, unless
        the model's name must come from it."""
        end = time.monotonic() + seconds
        while True:
            try:
                models = self.probe()
                if models is not None or not need_models:
                    return models or []
                raise ValueError("its /v1/models lists no models")
            except Exception:
                if time.monotonic() >= end:
                    raise
                self.sleep(1.0)

    def replies(self, bodies: list[dict[str, Any]], expires: float, client: str) -> list[Reply]:
        """The chat completions of one request's ``bodies``, in order, queued for ``client``
        (``common.limits.clients``) and answered by ``expires``: the first failure fails them all
        (503), and the calls not yet sent are dropped."""
        queued = self.queue.add(client, bodies, expires)
        try:
            return [future.result(timeout=max(0.0, expires - time.monotonic())) for future in queued.futures]
        except FutureTimeout:
            CALLS.labels(self.service, "deadline").inc()
            raise EngineUnavailable(
                "the judge's engine did not answer the request's calls within its deadline; retry later"
            ) from None
        finally:
            self.queue.withdraw(queued)

    def _send(self) -> None:
        """A sender: calls by turn, each answered or failed on its future."""
        while (call := self.queue.take()) is not None:
            started = time.monotonic()
            answered = False
            try:
                reply = self.complete(call.body, call.expires)
                answered = True
            except Exception as exc:  # the request sees it; the sender lives on
                call.future.set_exception(exc)
            else:
                call.future.set_result(reply)
            finally:
                self.queue.done(time.monotonic() - started if answered else None)

    def complete(self, body: dict[str, Any], expires: float) -> Reply:
        """POST ``body`` to ``/v1/chat/completions``, retried by the clients' one policy
        (``common.sdk.retry``: 408, 429, 5xx and connection errors, with backoff) while the deadline
        allows; ``EngineUnavailable`` after; ``EngineFault`` at once for a 200 that is no chat
        completion or a status the policy does not retry."""
        data = json.dumps(body).encode()

        def attempt(remaining: float) -> Answered:
            try:
                answer = self.connections.exchange(
                    "POST", "/v1/chat/completions", data, self.headers, expires, MAX_ANSWER_BYTES, keep=True
                )
            except Unreachable as exc:
                self.health.unreachable(f"the judge's engine at {self.url} {exc}")
                raise Retryable("Unreachable", str(exc)) from None
            except (OSError, http.client.HTTPException) as exc:
                raise Retryable(type(exc).__name__, f"did not answer: {type(exc).__name__}") from None
            self.health.answered()
            if answer.status != 200:
                problem = f"answered {answer.status}: {answer.body[:200].decode(errors='replace')}"
                if not self.policy.retried(str(answer.status)):
                    self._count("failed")
                    raise EngineFault(f"the judge's engine refused the call: it {problem}")
                raise Retryable(str(answer.status), problem)
            return answer

        try:
            answer = call_before(attempt, self.policy, expires, sleep=self.sleep, observe=self._count)
        except GaveUp as exc:
            self._count("deadline" if exc.reason == "deadline" else "failed")
            raise EngineUnavailable(f"the judge's engine {exc.problem}") from None
        if answer.over:
            self._count("ok")
            problem = (
                f"the engine's answer is over {MAX_ANSWER_BYTES} bytes (a reply over {MAX_REPLY_CHARS} characters)"
            )
            return Reply("", 0, 0, problem)
        return self._reply(answer.body)

    def _count(self, outcome: str) -> None:
        CALLS.labels(self.service, outcome).inc()

    def _reply(self, data: bytes) -> Reply:
        """A 200's chat completion; one that is not is the engine's fault, not retried."""
        try:
            answer = json.loads(data, parse_constant=_not_a_number)
        except RecursionError:
            self._malformed("JSON nested too deep")
        except ValueError as exc:
            self._malformed(f"no JSON: {exc}")
        choices = answer.get("choices") if isinstance(answer, dict) else None
        message = (
            choices[0].get("message")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict)
            else None
        )
        if not isinstance(message, dict):
            self._malformed("no choices[0].message")
        text = message.get("content")
        if not isinstance(text, (str, type(None))):
            self._malformed(f"a message content of type {type(text).__name__}")
        usage = answer.get("usage")
        usage = {} if usage is None else usage
        if not isinstance(usage, dict):
            self._malformed(f"usage of type {type(usage).__name__}")
        counts = [usage.get(kind) or 0 for kind in ("prompt_tokens", "completion_tokens")]
        for count in counts:
            if type(count) is not int or not 0 <= count < MAX_TOKENS:
                self._malformed(f"a token count of {str(count)[:40]}")
        self._count("ok")
        TOKENS.labels(self.service, "prompt").inc(counts[0])
        TOKENS.labels(self.service, "completion").inc(counts[1])
        return Reply(text or "", counts[0], counts[1])

    def _malformed(self, what: str) -> NoReturn:
        self._count("failed")
        raise EngineFault(f"the judge's engine answered no chat completion: {what}")

    def close(self) -> None:
        self.queue.close()


def _not_a_number(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not JSON")
