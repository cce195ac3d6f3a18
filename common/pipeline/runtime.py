"""One scorer in one worker: background setup, readiness, and the path from items to results;
and the limits of a worker's request work (``RequestLimits``), whatever scorers it serves."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from common.configuration.config import env_name
from common.configuration.cpus import usable_cpus
from common.configuration.devices import choose_device
from common.configuration.settings import CoreSettings
from common.limits.budget import WorkBudget
from common.limits.deadlines import Deadline, current_deadline
from common.limits.errors import NotReady, SetupFailed
from common.limits.slots import OrderedSlots
from common.pipeline import metrics
from common.pipeline.batching import BatchedCall
from common.pipeline.memory import Reclaimer
from common.pipeline.scorer import Result, Samples, Scorer

log = logging.getLogger(__name__)


def serving_deadline(core: CoreSettings) -> Deadline:
    """The deadline of the request being served (outside a request: the timeout from now)."""
    return current_deadline() or Deadline(core.request_timeout_s)


class ScorerRuntime:
    """Loads the model off the request path and runs items through the batcher.

    ``setup`` runs in a background thread so that ``/health`` answers at once and ``/ready``
    says 503 (with the reason) until the model is loaded and warm.
    """

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        self.device = choose_device(scorer.core.device)
        self.max_batch, self.max_wait_ms = scorer.batch_settings()
        # ``score`` behind its batcher, made in setup; a scorer that batches its own stages has none.
        self._batched_score: BatchedCall | None = None
        self._ready = threading.Event()
        self._done = threading.Event()
        self.setup_error: str | None = None

    def start(self) -> None:
        threading.Thread(target=self._setup, name=f"{self.scorer.name}-setup", daemon=True).start()

    def _setup(self) -> None:
        started = time.perf_counter()
        try:
            self.scorer.setup(self.device)
            if not self.scorer.batches_own_stages():
                self._batched_score = self.scorer.batched_stage(self.scorer.score, "score")
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

    def batching(self) -> dict[str, Any]:
        """How its items are batched, for ``/info``: a scorer that scores requests itself batches
        its own stages (see its model info)."""
        max_queue = self.scorer.core.max_queue
        if self.scorer.batches_own_stages():
            return {"stages": True, "max_queue": max_queue}
        return {"max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms, "max_queue": max_queue}

    def wait_setup(self) -> None:
        """Block until setup has come to a verdict (``ready``, or ``setup_error``)."""
        self._done.wait()

    def wait_ready(self) -> None:
        """Block a request while the model loads (bounded, and by its deadline), then 503 with the reason."""
        self._done.wait(max(0.0, min(self.scorer.core.ready_wait_s, serving_deadline(self.scorer.core).remaining())))
        if self.setup_error is not None:
            raise SetupFailed(self.setup_error)
        if not self._ready.is_set():
            raise NotReady("model is still loading; retry shortly")

    def score(self, items: Sequence[Any]) -> list[Result]:
        """Score one request's items: through the batcher to ``score``, or ``score_request``."""
        if not items:
            return []
        if self.scorer.batches_own_stages():
            results = list(self.scorer.score_request(items))
        else:
            assert self._batched_score is not None, "scored before setup"
            results = list(self._batched_score(items))
        metrics.ITEMS.labels(self.scorer.name).inc(len(results))
        return results


class RequestLimits:
    """What the requests of one worker share, whatever scorers it serves: the decoding slots and
    the bytes of request work in memory."""

    def __init__(self, core: CoreSettings) -> None:
        self.core = core
        # CPU-bound request work (decoding, preprocessing) beyond the cores only adds contention
        # and holds back the first items the model could already be working on; requests get
        # their turn in arrival order.
        self._decoding = OrderedSlots(core.decode_threads or usable_cpus())
        # Decoded images and model inputs of the requests in the worker, in bytes (``hold_work``).
        self.work = WorkBudget(core.max_work_bytes, env_name("", "max_work_bytes"))
        # The memory of a burst given back once the worker is idle.
        self.reclaimer = Reclaimer()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """The scope of one request's work: the bytes it holds (``hold_work``, which waits for
        room until the request's deadline) are given back at its end, and the memory once no
        request is left (``Reclaimer``)."""
        with self.reclaimer.request(), self.work.request(serving_deadline(self.core)):
            yield

    def prepare(self, to_items: Callable[[], list[Any] | Samples], stages: metrics.Stages) -> Samples:
        """``to_items()`` (a protocol's, e.g. the scorer's ``prepare_samples``), at most
        ``decode_threads`` requests at a time: the wait for a turn is the stage ``decode_wait``,
        the work ``decode``."""
        with contextlib.ExitStack() as turn:
            with stages("decode_wait"):
                turn.enter_context(self._decoding.hold(serving_deadline(self.core)))
            with stages("decode"):
                return Samples.of(to_items())
