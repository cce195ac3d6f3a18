"""The scorer contract: a model server reduced to ``setup``, ``prepare`` and ``score``.

``common`` turns a scorer into an HTTP service (``common.app.create_app``): it decodes the
wire format, calls ``prepare`` on the request thread, gathers the items of concurrent requests
into batches for ``score`` on one inference thread, and encodes the answer. A scorer owns only
its model and its rule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from common import metrics
from common.batching import BatchedCall, DynamicBatcher
from common.settings import CoreSettings


@dataclass
class Scored:
    """A score with per-sample extras; each extras key becomes a per-sample list in the answer.

    ``score(batch)`` may return plain floats or ``Scored`` values.
    """

    score: float
    extras: dict[str, Any] = field(default_factory=dict)


# What a scorer answers for one item.
Result: TypeAlias = float | Scored


class Scorer(ABC):
    """Base class of every scorer: ``setup``, ``prepare``, and one of ``score`` / ``score_request``.

    ``score(batch)`` is the model call over items gathered from concurrent requests; the
    runtime batches it. A scorer whose pipeline has several model calls with per-item work
    between them implements ``score_request(items)`` instead and batches each model call itself
    (``batched_stage``). Class attributes give the batching defaults beside the model, as LitServe
    does; the ``SCORER_MAX_BATCH`` / ``SCORER_MAX_WAIT_MS`` settings override them.
    """

    name: ClassVar[str]
    max_batch: ClassVar[int] = 16
    max_wait_ms: ClassVar[float] = 5.0

    def __init__(self, core: CoreSettings) -> None:
        """Read the scorer's own settings; raise ``ConfigError`` here for a bad setting, so
        the service refuses to start. Keep it cheap: loading belongs in ``setup``."""
        if (type(self).score is not Scorer.score) == self.batches_own_stages():
            raise TypeError(f"{type(self).__name__}: implement exactly one of score(batch) and score_request(items)")
        self.core = core

    @abstractmethod
    def setup(self, device: str) -> None:
        """Load weights once and warm up. Runs in the worker, off the request path.

        Raise ``common.config.ConfigError`` with a message naming the setting to fix when
        something the model needs is missing.
        """

    @abstractmethod
    def prepare(self, payload: dict[str, Any]) -> list[Any]:
        """Validate a parsed request body and turn it into items, one per sample.

        Runs on the request thread, so expensive per-item work (image decoding,
        preprocessing) belongs here, in parallel, not in ``score``. Raise
        ``common.errors.Unprocessable`` / ``PayloadTooLarge`` for bad input.
        """

    def score(self, batch: Sequence[Any]) -> Sequence[Result]:
        """Score a batch of items gathered from one or many requests, one result per item, in
        order. Runs on the worker's inference thread, one batch at a time."""
        raise NotImplementedError

    def score_request(self, items: Sequence[Any]) -> Sequence[Result]:
        """Score one request's items on its request thread, one result per item, in order; for
        scorers that batch their model calls stage by stage (``batched_stage``) rather than as
        one ``score`` call."""
        raise NotImplementedError

    @classmethod
    def batches_own_stages(cls) -> bool:
        """True when the scorer implements ``score_request`` (and batches its own stages)."""
        return cls.score_request is not Scorer.score_request

    def batch_settings(self) -> tuple[int, float]:
        """The batch size and wait of a batched call: ``SCORER_MAX_BATCH`` / ``SCORER_MAX_WAIT_MS``
        when set, else the class's defaults."""
        return (
            self.core.max_batch or self.max_batch,
            self.core.max_wait_ms if self.core.max_wait_ms is not None else self.max_wait_ms,
        )

    def batched_stage(
        self,
        fn: Callable[[Sequence[Any]], Sequence[Any]],
        stage: str,
        max_batch: int | None = None,
    ) -> BatchedCall:
        """Wrap a model call so that concurrent request threads share its invocations; at most
        ``max_batch`` items per call (default: ``SCORER_MAX_BATCH``, else the class's).

        The runtime wraps ``score`` this way. A scorer whose pipeline has several model calls
        with per-item work between them (OCR: detection, box post-processing, recognition)
        implements ``score_request`` and wraps each model call instead, so the work between them
        runs on the request threads, in parallel. Call from ``setup``.
        """
        default_size, wait = self.batch_settings()
        size = max_batch or default_size  # a stage's own size (its own setting) comes first

        def record(count: int, seconds: float) -> None:
            metrics.BATCH_SIZE.labels(self.name, stage).observe(count)
            metrics.BATCH_SECONDS.labels(self.name, stage).observe(seconds)

        batcher = DynamicBatcher(fn, size, wait, max(self.core.max_queue, size), record, f"{self.name}-{stage}")
        return BatchedCall(batcher, self.core.request_timeout_s)

    def info(self) -> dict[str, Any]:
        """Model description for ``GET /info``."""
        return {}
