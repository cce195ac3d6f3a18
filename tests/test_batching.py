"""The dynamic batcher, on its own: batches form, order holds, limits and errors are clear."""

from __future__ import annotations

import threading
import time

import pytest

from common.batching import DynamicBatcher
from common.errors import Overloaded


def make(fn=None, **kwargs):
    calls: list[list[int]] = []

    def run(batch):
        calls.append(list(batch))
        return fn(batch) if fn else [item * 10 for item in batch]

    batcher = DynamicBatcher(run, **{"max_batch": 8, "max_wait_ms": 50, "max_queue": 64, **kwargs})
    batcher.start()
    return batcher, calls


def test_concurrent_requests_share_batches_and_keep_order() -> None:
    batcher, calls = make()
    results: dict[int, list[int]] = {}

    def request(n: int) -> None:
        results[n] = [f.result(5) for f in batcher.submit([n, n + 100])]

    threads = [threading.Thread(target=request, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {n: [n * 10, (n + 100) * 10] for n in range(12)}
    assert max(len(c) for c in calls) == 8
    assert sum(len(c) for c in calls) == 24
    batcher.stop()


def test_a_lone_item_waits_at_most_max_wait() -> None:
    batcher, calls = make(max_wait_ms=30)
    started = time.monotonic()
    assert batcher.submit([1])[0].result(5) == 10
    assert time.monotonic() - started < 1.0
    assert calls == [[1]]
    batcher.stop()


def test_full_queue_refuses_whole_request() -> None:
    gate = threading.Event()
    batcher, _ = make(fn=lambda b: (gate.wait(5), [0] * len(b))[1], max_batch=2, max_queue=4, max_wait_ms=1)
    first = batcher.submit([1, 2])
    time.sleep(0.1)  # the first batch is now being "scored", blocked on the gate
    batcher.submit([3, 4, 5, 6])
    with pytest.raises(Overloaded, match="queue full"):
        batcher.submit([7])
    gate.set()
    assert [f.result(5) for f in first] == [0, 0]
    batcher.stop()


def test_model_error_fails_that_batch_only() -> None:
    def flaky(batch):
        if 13 in batch:
            raise RuntimeError("model fault")
        return batch

    batcher, _ = make(fn=flaky, max_batch=1, max_wait_ms=1)
    bad, good = batcher.submit([13])[0], batcher.submit([7])[0]
    with pytest.raises(RuntimeError, match="model fault"):
        bad.result(5)
    assert good.result(5) == 7
    batcher.stop()


def test_cancelled_items_are_not_scored() -> None:
    gate = threading.Event()
    batcher, calls = make(fn=lambda b: (gate.wait(5), b)[1], max_batch=1, max_wait_ms=1)
    batcher.submit([1])
    time.sleep(0.1)
    waiting = batcher.submit([2])[0]
    assert waiting.cancel()
    gate.set()
    assert batcher.submit([3])[0].result(5) == 3
    assert [2] not in calls
    batcher.stop()
