"""Prometheus metrics. Under gunicorn every worker writes to ``PROMETHEUS_MULTIPROC_DIR``
(set by ``gunicorn.conf.py`` before any worker imports this), and ``/metrics`` merges them."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

REQUESTS = Counter("scorer_requests_total", "Scoring requests answered", ["service", "route", "status"])
ITEMS = Counter("scorer_items_total", "Samples scored", ["service"])
ERRORS = Counter("scorer_errors_total", "Requests answered with an error", ["service", "error"])
# A request's seconds, from a stage's half a millisecond to the longest deadline.
SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LATENCY = Histogram("scorer_request_seconds", "Scoring request latency", ["service", "route"], buckets=SECONDS)
BATCH_SIZE = Histogram(
    "scorer_batch_size",
    "Items per model call",
    ["service", "stage"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
BATCH_SECONDS = Histogram("scorer_batch_seconds", "Time of one model call", ["service", "stage"])
IMAGES_DECODED = Counter(
    "scorer_images_decoded_total", "Images and chosen video frames decoded, once per distinct image", ["service"]
)
# The samples a ``multi`` request dropped an optional reward's score of, by reward.
REWARD_DROPPED = Counter("scorer_reward_dropped_total", "Samples an optional reward failed for", ["service"])
# Samples answered with a service's infrastructure-failure score instead of one of their own
# (the code verifier's no-verdict: a deadline cut within a sample's plan, a sandbox failure), by why.
UNSCORED = Counter("scorer_unscored_total", "Samples left without a score of their own", ["service", "reason"])
# Where a scoring request's time goes (``Stages``): wall seconds per stage, and the CPU seconds its
# own thread spent there (the model's threads are in ``scorer_batch_seconds``).
STAGE_SECONDS = Histogram(
    "scorer_stage_seconds", "Wall time of a request in a stage", ["service", "stage"], buckets=SECONDS
)
STAGE_CPU = Counter(
    "scorer_stage_cpu_seconds_total", "CPU time of the request's thread in each stage", ["service", "stage"]
)
READY = Gauge("scorer_ready", "1 when the model is loaded and warm", ["service"], multiprocess_mode="livemax")


class Stages:
    """Times one request's stages into ``STAGE_SECONDS`` and ``STAGE_CPU``, so that a node's
    ``/metrics`` shows where its requests' time goes (the benches print it as a profile)."""

    def __init__(self, service: str) -> None:
        self.service = service

    def observe(self, stage: str, seconds: float, cpu_seconds: float = 0.0) -> None:
        STAGE_SECONDS.labels(self.service, stage).observe(seconds)
        STAGE_CPU.labels(self.service, stage).inc(cpu_seconds)

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        """The block's time, whether it ends in an answer or an error."""
        started, cpu = time.monotonic(), time.thread_time()
        try:
            yield
        finally:
            self.observe(stage, time.monotonic() - started, time.thread_time() - cpu)


def render() -> tuple[bytes, str]:
    """The exposition text of all workers (or of this process outside gunicorn)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
