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

# Statuses worth another try: the engine is busy, restarting or behind a balancer that says so.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

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
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
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
        """POST ``body`` to ``/v1/chat/completions``; retried on 429/5xx and connection errors
        with backoff while the deadline allows; ``EngineUnavailable`` after."""
        attempt = 0
        while True:
            remaining = expires - time.monotonic()
            if remaining <= 0:
                CALLS.labels(self.service, "deadline").inc()
                raise EngineUnavailable("the judge's engine did not answer within the request's deadline")
            try:
                answer = self.session.post(f"{self.url}/v1/chat/completions", json=body, timeout=remaining)
                problem = f"answered {answer.status_code}: {answer.text[:200]}"
                if answer.status_code == 200:
                    return self._reply(answer)
                retry = answer.status_code in RETRY_STATUSES
            except requests.RequestException as exc:
                problem, retry = f"could not be reached: {type(exc).__name__}", True
            if not retry or attempt >= self.retries:
                CALLS.labels(self.service, "failed").inc()
                raise EngineUnavailable(f"the judge's engine {problem}")
            delay = min(self.backoff_s * 2**attempt, self.backoff_max_s)
            if time.monotonic() + delay >= expires:
                CALLS.labels(self.service, "deadline").inc()
                raise EngineUnavailable(f"the judge's engine {problem}; no time left to retry")
            CALLS.labels(self.service, "retried").inc()
            self.sleep(delay)
            attempt += 1

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
