"""Prometheus metrics. Under gunicorn every worker writes to ``PROMETHEUS_MULTIPROC_DIR``
(set by ``gunicorn.conf.py`` before any worker imports this), and ``/metrics`` merges them."""

from __future__ import annotations

import os

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
LATENCY = Histogram(
    "scorer_request_seconds",
    "Scoring request latency",
    ["service", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
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
READY = Gauge("scorer_ready", "1 when the model is loaded and warm", ["service"], multiprocess_mode="livemax")


def render() -> tuple[bytes, str]:
    """The exposition text of all workers (or of this process outside gunicorn)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
