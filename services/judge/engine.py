"""The OpenAI-compatible engine client: bounded concurrency, retries inside the deadline, and
the engine's token usage in ``/metrics``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_client import Counter
from requests.adapters import HTTPAdapter

from common.errors import Overloaded
from common.retry import GaveUp, Retryable, RetryPolicy, call_before

TOKENS = Counter("scorer_judge_tokens_total", "Engine tokens the judge's calls used", ["service", "kind"])
CALLS = Counter("scorer_judge_calls_total", "Chat completions sent to the engine", ["service", "outcome"])


class EngineUnavailable(Overloaded):
    """The engine did not answer within the request's deadline, retries included (503)."""


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int


class EngineClient:
    """Chat completions against one engine, at most ``concurrency`` in flight per worker."""

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
    ) -> None:
        self.url = url.rstrip("/")
        self.service = service
        self.policy = RetryPolicy(retries, backoff_s, backoff_max=backoff_max_s)
        self.sleep = sleep
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=concurrency))
        self.session.mount("https://", HTTPAdapter(pool_connections=1, pool_maxsize=concurrency))
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix=f"{service}-engine")

    def models(self, timeout: float) -> list[str]:
        """The model names the engine serves (its ``/v1/models``)."""
        answer = self.session.get(f"{self.url}/v1/models", timeout=timeout)
        answer.raise_for_status()
        return [model["id"] for model in answer.json()["data"]]

    def wait_until_up(self, seconds: float, need_models: bool) -> list[str]:
        """The engine's model names once it answers, trying for ``seconds``; the last error
        after. An engine whose ``/v1/models`` fails (transformers serve offline scans the hub
        cache) is up when its ``/health`` answers, unless the model's name must come from it."""
        end = time.monotonic() + seconds
        while True:
            try:
                return self.models(timeout=5.0)
            except (requests.RequestException, KeyError, ValueError):
                with contextlib.suppress(requests.RequestException):
                    if not need_models and self.session.get(f"{self.url}/health", timeout=5.0).ok:
                        return []
                if time.monotonic() >= end:
                    raise
                self.sleep(1.0)

    def submit(self, body: dict[str, Any], expires: float) -> Future[Reply]:
        """One chat completion, queued behind the worker's cap; it gives up at ``expires``
        (``time.monotonic()``)."""
        return self.pool.submit(self.complete, body, expires)

    def complete(self, body: dict[str, Any], expires: float) -> Reply:
        """POST ``body`` to ``/v1/chat/completions``, retried by the clients' one policy
        (``common.retry``: 408, 429, 5xx and connection errors, with backoff) while the deadline
        allows; ``EngineUnavailable`` after."""

        def attempt(remaining: float) -> Reply:
            try:
                answer = self.session.post(f"{self.url}/v1/chat/completions", json=body, timeout=remaining)
            except requests.RequestException as exc:
                raise Retryable(type(exc).__name__, f"could not be reached: {type(exc).__name__}") from None
            if answer.status_code != 200:
                raise Retryable(str(answer.status_code), f"answered {answer.status_code}: {answer.text[:200]}")
            return self._reply(answer)

        try:
            return call_before(attempt, self.policy, expires, sleep=self.sleep, observe=self._count)
        except GaveUp as exc:
            self._count("deadline" if exc.reason == "deadline" else "failed")
            raise EngineUnavailable(f"the judge's engine {exc.problem}") from None

    def _count(self, outcome: str) -> None:
        CALLS.labels(self.service, outcome).inc()

    def _reply(self, response: requests.Response) -> Reply:
        """A 200's chat completion; one that is not is the engine's fault, not retried."""
        try:
            answer = response.json()
            text = answer["choices"][0]["message"]["content"] or ""
            usage = answer.get("usage") or {}
            prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            CALLS.labels(self.service, "failed").inc()
            raise EngineUnavailable(f"the judge's engine answered no chat completion ({type(exc).__name__})") from None
        if not isinstance(text, str):
            raise EngineUnavailable("the judge's engine answered a non-text message")
        CALLS.labels(self.service, "ok").inc()
        TOKENS.labels(self.service, "prompt").inc(prompt)
        TOKENS.labels(self.service, "completion").inc(completion)
        return Reply(text, prompt, completion)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.session.close()
