"""One scorer in one worker: background setup, readiness, and the path from items to results."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from common import metrics
from common.batching import DynamicBatcher
from common.devices import choose_device
from common.errors import NotReady, Overloaded
from common.scorer import Scorer

log = logging.getLogger(__name__)


class ScorerRuntime:
    """Loads the model off the request path and runs items through the batcher.

    ``setup`` runs in a background thread so that ``/health`` answers at once and ``/ready``
    says 503 (with the reason) until the model is loaded and warm.
    """

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        core = scorer.core
        self.device = choose_device(core.device)
        self.max_batch = core.max_batch or scorer.max_batch
        self.max_wait_ms = core.max_wait_ms if core.max_wait_ms is not None else scorer.max_wait_ms
        self.batcher: DynamicBatcher | None = None
        if scorer.batched:
            self.batcher = DynamicBatcher(
                scorer.score,
                max_batch=self.max_batch,
                max_wait_ms=self.max_wait_ms,
                max_queue=max(core.max_queue, self.max_batch),
                on_batch=self._record_batch,
                name=f"{scorer.name}-inference",
            )
        self._ready = threading.Event()
        self._done = threading.Event()
        self.setup_error: str | None = None

    def start(self) -> None:
        threading.Thread(target=self._setup, name=f"{self.scorer.name}-setup", daemon=True).start()

    def _setup(self) -> None:
        started = time.perf_counter()
        try:
            self.scorer.setup(self.device)
            if self.batcher is not None:
                self.batcher.start()
        except Exception as exc:
            self.setup_error = f"{type(exc).__name__}: {exc}"
            log.error("%s scorer failed to start, not ready: %s", self.scorer.name, self.setup_error)
        else:
            self._ready.set()
            metrics.READY.labels(self.scorer.name).set(1)
            log.info("%s scorer ready on %s in %.1fs", self.scorer.name, self.device, time.perf_counter() - started)
        finally:
            self._done.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self) -> None:
        """Block a request while the model loads (bounded), then 503 with the reason."""
        self._done.wait(self.scorer.core.ready_wait_s)
        if not self._ready.is_set():
            raise NotReady(self.setup_error or "model is still loading; retry shortly")

    def run(self, items: Sequence[Any]) -> list[Any]:
        """Score ``items``, batched with other requests' items when the scorer is batched."""
        if not items:
            return []
        if self.batcher is None:
            return list(self.scorer.score(items))
        timeout = self.scorer.core.request_timeout_s
        deadline = time.monotonic() + timeout
        futures = self.batcher.submit(items)
        metrics.QUEUE_DEPTH.labels(self.scorer.name).set(self.batcher.depth)
        try:
            return [future.result(timeout=max(0.0, deadline - time.monotonic())) for future in futures]
        except FutureTimeout:
            for future in futures:
                future.cancel()
            raise Overloaded(f"no result within {timeout:.0f}s; the model is saturated, retry later") from None

    def _record_batch(self, size: int, seconds: float) -> None:
        name = self.scorer.name
        metrics.BATCH_SIZE.labels(name).observe(size)
        metrics.BATCH_SECONDS.labels(name).observe(seconds)
        metrics.ITEMS.labels(name).inc(size)
        if self.batcher is not None:
            metrics.QUEUE_DEPTH.labels(name).set(self.batcher.depth)
