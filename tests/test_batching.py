"""The dynamic batcher, on its own: batches form, order holds, limits, deadlines and errors are clear."""

from __future__ import annotations

import threading
import time

import pytest

from common.batching import BatchedCall, DynamicBatcher
from common.budget import WorkBudget, hold_work, tentative_work, trial_work
from common.deadlines import Deadline, check_deadline, request_deadline
from common.errors import Overloaded, PayloadTooLarge
from common.slots import OrderedSlots

pytestmark = pytest.mark.unit


def later(seconds: float = 60.0) -> Deadline:
    return Deadline(seconds)


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
        results[n] = [f.result(5) for f in batcher.submit([n, n + 100], later())]

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
    assert batcher.submit([1], later())[0].result(5) == 10
    assert time.monotonic() - started < 1.0
    assert calls == [[1]]
    batcher.stop()


def test_full_queue_refuses_whole_request() -> None:
    gate = threading.Event()
    batcher, _ = make(fn=lambda b: (gate.wait(5), [0] * len(b))[1], max_batch=2, max_queue=4, max_wait_ms=1)
    first = batcher.submit([1, 2], later())
    time.sleep(0.1)  # the first batch is now being "scored", blocked on the gate
    batcher.submit([3, 4, 5, 6], later())
    with pytest.raises(Overloaded, match="queue full"):
        batcher.submit([7], later())
    gate.set()
    assert [f.result(5) for f in first] == [0, 0]
    batcher.stop()


def test_model_error_fails_that_batch_only() -> None:
    def flaky(batch):
        if 13 in batch:
            raise RuntimeError("model fault")
        return batch

    batcher, _ = make(fn=flaky, max_batch=1, max_wait_ms=1)
    bad, good = batcher.submit([13], later())[0], batcher.submit([7], later())[0]
    with pytest.raises(RuntimeError, match="model fault"):
        bad.result(5)
    assert good.result(5) == 7
    batcher.stop()


def test_cancelled_items_are_not_scored() -> None:
    gate = threading.Event()
    batcher, calls = make(fn=lambda b: (gate.wait(5), b)[1], max_batch=1, max_wait_ms=1)
    batcher.submit([1], later())
    time.sleep(0.1)
    waiting = batcher.submit([2], later())[0]
    assert waiting.cancel()
    gate.set()
    assert batcher.submit([3], later())[0].result(5) == 3
    assert [2] not in calls
    batcher.stop()


def test_items_are_served_earliest_deadline_first() -> None:
    gate = threading.Event()
    batcher, calls = make(fn=lambda b: (gate.wait(5), b)[1], max_batch=1, max_wait_ms=1)
    batcher.submit([0], later())
    time.sleep(0.1)  # the first batch holds the model
    futures = [batcher.submit([n], Deadline(seconds))[0] for n, seconds in ((1, 30), (2, 10), (3, 20))]
    gate.set()
    assert [f.result(5) for f in futures] == [1, 2, 3]
    assert calls == [[0], [2], [3], [1]]
    batcher.stop()


def test_a_request_larger_than_the_queue_is_413_not_a_retryable_503() -> None:
    batcher, _ = make(max_batch=2, max_queue=8)
    with pytest.raises(PayloadTooLarge, match="9 items in one request; the batch queue holds 8"):
        batcher.submit(list(range(9)), later())
    batcher.stop()


def test_a_wait_past_the_deadline_is_refused_at_once() -> None:
    """Batches of 0.1 s, requests of 1 s: about ten fit, the rest are told at once."""
    batcher, _ = make(fn=lambda b: (time.sleep(0.1), b)[1], max_batch=1, max_wait_ms=1)
    for warm in (0, 0):  # the first batch is not a measure, the second is
        batcher.submit([warm], later())[0].result(5)
    accepted, refused = [], []
    for n in range(30):
        started = time.monotonic()
        try:
            accepted.append((n, batcher.submit([n], Deadline(1.0))[0]))
        except Overloaded as exc:
            assert "past the request's deadline" in exc.message
            assert time.monotonic() - started < 0.05
            refused.append(n)
    assert 5 <= len(accepted) <= 12 and len(refused) == 30 - len(accepted), (len(accepted), refused)
    assert [future.result(5) for _, future in accepted] == [n for n, _ in accepted]
    batcher.stop()


def test_one_deadline_across_all_stages_of_a_request() -> None:
    """Two stages of 0.6 s each and a 1 s deadline: the second stage gets what the first left."""

    def stage(name: str) -> BatchedCall:
        return BatchedCall(DynamicBatcher(lambda b: (time.sleep(0.6), b)[1], 1, 1, 8, name=name), timeout_s=1.0)

    first, second = stage("first"), stage("second")
    started = time.monotonic()
    with request_deadline(Deadline(1.0)), pytest.raises(Overloaded):
        second(first([1]))
    assert time.monotonic() - started < 1.3
    first.batcher.stop()
    second.batcher.stop()


def test_ordered_slots_admit_in_deadline_order_and_give_up_at_the_deadline() -> None:
    slots = OrderedSlots(1)
    admitted: list[int] = []
    release = threading.Event()

    def take(n: int, seconds: float) -> None:
        with slots.hold(Deadline(seconds)):
            admitted.append(n)
            if n == 0:
                release.wait(5)

    holder = threading.Thread(target=take, args=(0, 60))
    holder.start()
    time.sleep(0.05)
    waiters = [threading.Thread(target=take, args=(n, seconds)) for n, seconds in ((1, 30), (2, 10), (3, 20))]
    for thread in waiters:
        thread.start()
        time.sleep(0.05)
    with pytest.raises(Overloaded, match="deadline passed"), slots.hold(Deadline(0.1)):
        pass
    release.set()
    for thread in [holder, *waiters]:
        thread.join(5)
    assert admitted == [0, 2, 3, 1]


def test_the_wait_estimate_takes_the_median_batch_not_the_fastest() -> None:
    """One fast batch among slow ones made the fastest-batch estimate admit requests that then
    waited past their deadline: a queue of slow batches is estimated at their median."""
    durations = iter([0.0, 0.0, 0.0, 0.2, 0.2, 0.2, 0.2])  # the first is the warm-up, then one fast batch

    def run(batch):
        time.sleep(next(durations, 0.2))
        return batch

    batcher, _ = make(fn=run, max_batch=1, max_wait_ms=1)
    for n in range(7):
        batcher.submit([n], later())[0].result(5)
    with batcher._cond:
        assert 0.15 < batcher.estimated_wait(time.monotonic() + 60, 1) < 0.3  # the fastest: ~0.0
    batcher.stop()


def test_work_bytes_are_held_until_the_request_ends_and_refused_past_the_budget() -> None:
    budget = WorkBudget(1000, "SCORER_MAX_WORK_BYTES")
    hold_work(10**9, "anything")  # outside a request: nothing held
    with budget.request():
        hold_work(600, "decoded images")
        with pytest.raises(PayloadTooLarge, match=r"\(SCORER_MAX_WORK_BYTES\)"):
            hold_work(401, "OCR inputs")  # the request alone: over the whole budget
        refused: list[Exception] = []

        def other() -> None:
            with budget.request():
                try:
                    hold_work(500, "decoded images")
                except Overloaded as exc:
                    refused.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert "(SCORER_MAX_WORK_BYTES); retry later" in refused[0].message
        assert budget.held == 600
    assert budget.held == 0
    with budget.request():
        hold_work(1000, "decoded images")  # given back: the whole budget again


def test_a_refused_check_holds_nothing_and_a_trial_holds_nothing_at_all() -> None:
    budget = WorkBudget(1000, "SCORER_MAX_WORK_BYTES")
    with budget.request():
        hold_work(300, "decoded images")
        with pytest.raises(PayloadTooLarge), tentative_work():
            hold_work(400, "OCR inputs")
            hold_work(400, "more OCR inputs")  # the check refuses after holding some
        assert budget.held == 300
        with tentative_work():
            hold_work(200, "kept")
        assert budget.held == 500
        for _ in range(10):
            with trial_work():
                hold_work(900, "one sample alone")  # each trial alone: under the budget
        with pytest.raises(PayloadTooLarge), trial_work():
            hold_work(900, "one sample")
            hold_work(101, "past the whole budget")
        assert budget.held == 500
    assert budget.held == 0


def test_the_deadline_is_checked_between_stages() -> None:
    check_deadline("nothing")  # outside a request
    with request_deadline(Deadline(-1.0)), pytest.raises(Overloaded, match="deadline passed before the reward rule"):
        check_deadline("the reward rule")
