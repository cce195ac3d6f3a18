"""The judge's engine calls taken fairly between clients and requests, capped, refused early
by the estimated wait; and the engine's health from calls and occasional probes (clocks moved
by hand)."""

from __future__ import annotations

import threading

import pytest

from common.limits.errors import Overloaded, PayloadTooLarge
from services.judge.calls import FairQueue
from services.judge.engine import EngineHealth
from testing.clock import ManualClock, wait_until

pytestmark = pytest.mark.unit


def bodies(name: str, count: int) -> list[dict[str, str]]:
    return [{"call": f"{name}{index}"} for index in range(count)]


def taken(queue: FairQueue, count: int) -> list[str]:
    names = []
    for _ in range(count):
        call = queue.take()
        assert call is not None
        names.append(call.body["call"])
    return names


def test_calls_are_taken_in_turn_between_clients_then_between_a_clients_requests() -> None:
    clock = ManualClock()
    queue = FairQueue(slots=2, max_queued=100, clock=clock)
    queue.add("flood", bodies("a", 5), clock() + 60)
    queue.add("flood", bodies("b", 5), clock() + 60)
    queue.add("other", bodies("x", 2), clock() + 60)
    # The flood's two requests share its turns; the other client has every other turn.
    assert taken(queue, 8) == ["a0", "x0", "b0", "x1", "a1", "b1", "a2", "b2"]


def test_a_request_is_refused_whole_when_the_queue_cannot_take_it() -> None:
    clock = ManualClock()
    queue = FairQueue(slots=2, max_queued=10, clock=clock)
    with pytest.raises(PayloadTooLarge, match="11 engine calls"):
        queue.add("c", bodies("a", 11), clock() + 60)
    queue.add("c", bodies("a", 8), clock() + 60)
    with pytest.raises(Overloaded, match="queue is full"):
        queue.add("d", bodies("b", 3), clock() + 60)
    assert taken(queue, 8) == [f"a{index}" for index in range(8)]  # nothing of the refused one queued


def test_the_wait_estimate_counts_turns_so_a_small_request_from_another_client_gets_in() -> None:
    clock = ManualClock()
    queue = FairQueue(slots=4, max_queued=10_000, clock=clock)
    assert queue.add("c", bodies("t", 1), clock() + 10) and queue.take() is not None
    queue.done(0.1)  # the median call: 0.1 s
    queue.add("flood", bodies("a", 300), clock() + 10)  # 300 calls / 4 slots * 0.1 s = 7.5 s
    with pytest.raises(Overloaded, match="runs past the request's deadline"):
        queue.add("flood", bodies("b", 300), clock() + 10)  # 600 calls of turns before its last: 15 s
    # Another client's 8 calls: 8 of the flood's turns interleaved with them, 0.4 s.
    assert queue.estimated_wait("other", 8) == pytest.approx(0.4)
    queue.add("other", bodies("x", 8), clock() + 10)
    assert sorted(name for name in taken(queue, 16) if name.startswith("x")) == [f"x{index}" for index in range(8)]


def test_withdrawn_calls_leave_the_queue_and_its_count() -> None:
    clock = ManualClock()
    queue = FairQueue(slots=1, max_queued=10, clock=clock)
    first = queue.add("c", bodies("a", 6), clock() + 60)
    queue.add("d", bodies("b", 2), clock() + 60)
    queue.withdraw(first)
    queue.add("c", bodies("e", 8), clock() + 60)  # room again
    assert taken(queue, 4) == ["b0", "e0", "b1", "e1"]


class Probe:
    """A probe that waits until ``go`` is set, then fails while ``down``."""

    def __init__(self) -> None:
        self.runs = 0
        self.down = False
        self.go = threading.Event()
        self.go.set()
        self.ended = threading.Event()

    def __call__(self) -> None:
        self.runs += 1
        self.go.wait(10)
        self.ended.set()
        if self.down:
            raise ConnectionRefusedError("refused")


def test_health_probes_only_when_calls_have_shown_nothing_and_one_at_a_time() -> None:
    clock = ManualClock()
    probe = Probe()
    health = EngineHealth(probe, probe_s=10.0, clock=clock)
    for _ in range(100):
        assert health.problem() is None
    assert probe.runs == 0  # fresh: no probe
    clock.advance(10)
    probe.down = True
    probe.go.clear()
    assert health.problem() is None  # the probe starts; /ready answers what is known at once
    wait_until(lambda: probe.runs == 1, "the probe started")
    for _ in range(100):
        health.problem()
    assert probe.runs == 1  # one at a time
    probe.go.set()
    wait_until(lambda: health.problem() is not None, "the probe's failure seen")
    assert "did not answer a probe" in (health.problem() or "")
    health.answered()  # a call got an answer
    assert health.problem() is None and probe.runs == 1
    health.unreachable("the judge's engine could not be reached")
    assert health.problem() == "the judge's engine could not be reached"
