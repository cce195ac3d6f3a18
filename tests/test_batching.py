"""The dynamic batcher, on its own: batches form, order holds, limits, deadlines and errors are clear."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from common.limits.deadlines import Deadline, check_deadline, request_deadline
from common.limits.errors import Overloaded, PayloadTooLarge
from common.limits.slots import OrderedSlots
from common.pipeline.batching import BatchedCall, DynamicBatcher
from testing.clock import ManualClock, wait_until

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


def test_a_lone_item_waits_for_max_wait_and_no_longer() -> None:
    clock = ManualClock()
    batcher, calls = make(max_wait_ms=62.5, clock=clock)  # binary fractions: no rounding in the sums
    future = batcher.submit([1], later())[0]
    clock.advance(0.03125)
    clock.read_again()
    assert not future.done() and calls == []  # the window is still open: more items may come
    clock.advance(0.03125)
    assert future.result(30) == 10  # the window has closed: the lone item goes
    assert calls == [[1]]


def test_a_full_queue_holds_requests_whole_until_there_is_room_in_deadline_order() -> None:
    """A full queue is no 503: the trainers' clients time out after 120 s and most do not survive
    a 503 (flow_grpo's reads the body as scores), so a request waits for room, whole, waiters
    getting in earliest deadline first; only one whose deadline passes first is refused."""
    scoring, gate = threading.Event(), threading.Event()
    batcher, calls = make(fn=lambda b: (scoring.set(), gate.wait(60), b)[2], max_batch=2, max_queue=4)
    first = batcher.submit([1, 2], later())
    assert scoring.wait(60)  # the first batch is being scored, blocked on the gate
    queued = batcher.submit([3, 4, 5, 6], later())  # the queue is full
    results: dict[int, list[int]] = {}

    def request(items: list[int], seconds: float) -> None:
        results[items[0]] = [future.result(30) for future in batcher.submit(items, Deadline(seconds))]

    waiters = [threading.Thread(target=request, args=args) for args in (([7], 50), ([8], 30), ([9, 10], 40))]
    for count, thread in enumerate(waiters, 1):
        thread.start()
        wait_until(lambda count=count: len(batcher._line) == count, f"{count} requests waiting for room")
    assert len(batcher._queue) == 4  # none of them half-queued
    with pytest.raises(Overloaded, match="deadline passed while it waited for room"):
        batcher.submit([11], Deadline(0.1))
    gate.set()
    for thread in waiters:
        thread.join(30)
    assert [f.result(5) for f in [*first, *queued]] == [1, 2, 3, 4, 5, 6]
    assert results == {7: [7], 8: [8], 9: [9, 10]}
    order = [item for call in calls for item in call]
    assert order.index(8) < order.index(9) < order.index(7) and 11 not in order


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


def test_cancelled_items_are_not_scored() -> None:
    scoring, gate = threading.Event(), threading.Event()
    batcher, calls = make(fn=lambda b: (scoring.set(), gate.wait(60), b)[2], max_batch=1)
    batcher.submit([1], later())
    assert scoring.wait(60)
    waiting = batcher.submit([2], later())[0]
    assert waiting.cancel()
    gate.set()
    assert batcher.submit([3], later())[0].result(5) == 3
    assert [2] not in calls


def test_a_withdrawn_requests_items_are_let_go_before_the_thread_reaches_them() -> None:
    """A request past its deadline withdraws its queued items: its inputs (a burst's prepared
    detector inputs are gigabytes) are not held until the busy thread would have got to them."""
    scoring, gate = threading.Event(), threading.Event()
    batcher, _ = make(fn=lambda b: (scoring.set(), gate.wait(60), [0] * len(b))[2], max_batch=1)
    batcher.submit([object()], later())
    assert scoring.wait(60)
    item = Item()
    held = weakref.ref(item)
    futures = batcher.submit([item], later())
    del item
    for future in futures:
        future.cancel()
    batcher.withdraw(futures)
    gc.collect()
    assert held() is None
    gate.set()


class Item:
    """An item a weak reference can follow."""


def test_items_are_served_earliest_deadline_first() -> None:
    scoring, gate = threading.Event(), threading.Event()
    batcher, calls = make(fn=lambda b: (scoring.set(), gate.wait(60), b)[2], max_batch=1)
    batcher.submit([0], later())
    assert scoring.wait(60)  # the first batch holds the model
    futures = [batcher.submit([n], Deadline(seconds))[0] for n, seconds in ((1, 30), (2, 10), (3, 20))]
    gate.set()
    assert [f.result(5) for f in futures] == [1, 2, 3]
    assert calls == [[0], [2], [3], [1]]


def test_a_request_larger_than_the_queue_is_413_not_a_retryable_503() -> None:
    batcher, _ = make(max_batch=2, max_queue=8)
    with pytest.raises(PayloadTooLarge, match="9 items in one request; the batch queue holds 8"):
        batcher.submit(list(range(9)), later())


def test_a_long_wait_is_held_to_the_deadline_never_refused_from_an_estimate() -> None:
    """Batches of 10 s and requests of 95 s: 30 requests queue behind a held model, none refused
    early (VeRL-Omni's client retries twice within 1.5 s and lost 87 of 128 requests to early
    503s that a busy node would have served); each is scored once the model is back, or gets
    its 503 when its deadline has passed."""
    clock = ManualClock()
    scoring, gate = threading.Event(), threading.Event()

    def run(batch: list[int]) -> list[int]:
        if batch == [-1]:
            scoring.set()
            gate.wait(60)
        clock.advance(10.0)
        return batch

    batcher, _ = make(fn=run, max_batch=1, max_wait_ms=0, clock=clock)
    for warm in (0, 0):
        batcher.submit([warm], later())[0].result(30)
    holding = batcher.submit([-1], later())[0]
    assert scoring.wait(60)
    accepted = [batcher.submit([n], Deadline(95.0))[0] for n in range(30)]
    with pytest.raises(Overloaded, match="deadline passed before"):
        batcher.submit([99], Deadline(0.0))
    gate.set()
    assert holding.result(30) == -1 and [future.result(30) for future in accepted] == list(range(30))


def test_one_deadline_across_all_stages_of_a_request() -> None:
    """A request's stages share its deadline: with the second stage's model held, the request
    gives up when its deadline passes, not a stage's own timeout (an hour) later."""
    gate = threading.Event()
    first = BatchedCall(DynamicBatcher(lambda b: b, 1, 1, 8, name="first"), timeout_s=3600.0)
    second = BatchedCall(DynamicBatcher(lambda b: (gate.wait(3600), b)[1], 1, 1, 8, name="second"), timeout_s=3600.0)
    deadline = Deadline(0.5)
    with request_deadline(deadline), pytest.raises(Overloaded, match="no result within the request's"):
        second(first([1]))
    assert deadline.remaining() <= 0
    gate.set()


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
    wait_until(lambda: admitted == [0], "the first holder is in")
    waiters = [threading.Thread(target=take, args=(n, seconds)) for n, seconds in ((1, 30), (2, 10), (3, 20))]
    for count, thread in enumerate(waiters, 1):
        thread.start()
        wait_until(lambda count=count: len(slots._line) == count, f"{count} waiters in line")
    with pytest.raises(Overloaded, match="deadline passed"), slots.hold(Deadline(0.1)):
        pass
    release.set()
    for thread in [holder, *waiters]:
        thread.join(5)
    assert admitted == [0, 2, 3, 1]


def test_the_deadline_is_checked_between_stages() -> None:
    check_deadline("nothing")  # outside a request
    with request_deadline(Deadline(-1.0)), pytest.raises(Overloaded, match="deadline passed before the reward rule"):
        check_deadline("the reward rule")
