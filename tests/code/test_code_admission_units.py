"""Admission by the measured rate, in-process on a hand-moved clock: a burst of cheap samples is
taken whole, one client's backlog never gets another refused, every admitted sample keeps its
floor by its deadline, and a quiet node plans a sample at its full limits."""

from __future__ import annotations

import contextlib

import pytest

from common.errors import Overloaded, PayloadTooLarge
from services.code.admission import PLAN_FLOOR_S, PLAN_MARGIN, Admission, Cost, Rates
from testing.clock import ManualClock

pytestmark = pytest.mark.unit

SLOTS = 7
DEADLINE_S = 110.0
# A correct A+B of 10 tests at 5 ms a test; at its limits, a 60 s sample.
CHEAP = Cost(expected=0.05, worst=60.0)


def test_a_burst_of_256_cheap_one_sample_requests_is_taken_whole() -> None:
    """Planned at their worst case, 5 of them would fit; at the measured rate all 256 do."""
    clock = ManualClock()
    admission = Admission(SLOTS, clock)
    with contextlib.ExitStack() as held:
        for _ in range(256):
            held.enter_context(admission.admit("trainer", [CHEAP], clock.now + DEADLINE_S))
        assert admission.stats()["samples"] == 256


def test_work_past_the_deadline_is_refused_with_the_seconds_to_wait() -> None:
    clock = ManualClock()
    admission = Admission(SLOTS, clock)
    heavy = Cost(expected=10.0, worst=60.0)  # floor: 30 s
    with contextlib.ExitStack() as held:
        taken = 0
        with pytest.raises(Overloaded) as refused:
            while True:
                held.enter_context(admission.admit("trainer", [heavy], clock.now + DEADLINE_S))
                taken += 1
        assert taken * heavy.floor <= SLOTS * DEADLINE_S
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1
        assert admission.stats()["refused"] == 1


def test_a_request_that_could_not_be_graded_even_alone_is_413() -> None:
    admission = Admission(SLOTS, ManualClock())
    with (
        pytest.raises(PayloadTooLarge, match="split the request"),
        admission.admit("trainer", [Cost(expected=20.0, worst=60.0)] * 64, admission.clock() + DEADLINE_S),
    ):
        pass


def test_one_clients_backlog_never_gets_another_client_refused() -> None:
    """Client A fills the node; A's next request is refused, B's is taken: B waits behind at
    most as much of A's work as B itself brings."""
    clock = ManualClock()
    admission = Admission(SLOTS, clock)
    heavy = Cost(expected=10.0, worst=60.0)
    with contextlib.ExitStack() as held:
        with contextlib.suppress(Overloaded):
            while True:
                held.enter_context(admission.admit("a", [heavy], clock.now + DEADLINE_S))
        with pytest.raises(Overloaded):
            held.enter_context(admission.admit("a", [heavy], clock.now + DEADLINE_S))
        held.enter_context(admission.admit("b", [heavy], clock.now + DEADLINE_S))
        assert admission.stats()["clients"] == 2


def test_a_quiet_node_plans_a_sample_at_its_full_limits() -> None:
    clock = ManualClock()
    admission = Admission(SLOTS, clock)
    with admission.admit("trainer", [CHEAP], clock.now + DEADLINE_S) as request:
        assert request.started(0) == CHEAP.worst


def test_every_admitted_sample_keeps_its_floor_by_its_deadline() -> None:
    """A burst of spinners (each spends whatever it is planned): the first to start get more
    than their floor, but the plans of all, started in turn as slots free, end by the deadline."""
    clock = ManualClock()
    admission = Admission(SLOTS, clock)
    with contextlib.ExitStack() as held:
        requests = []
        with contextlib.suppress(Overloaded):
            while True:
                requests.append(held.enter_context(admission.admit("trainer", [CHEAP], clock.now + DEADLINE_S)))
        start, running, plans = clock.now, [], []  # running: (ends, request) per busy slot
        for request in requests:  # each takes the slot that frees first and spends its plan
            if len(running) == SLOTS:
                running.sort(key=lambda item: item[0])
                ends, finished = running.pop(0)
                clock.now = max(clock.now, ends)
                finished.done(0)
            plan = request.started(0)
            assert plan >= CHEAP.floor
            plans.append(plan)
            running.append((clock.now + plan, request))
        assert len(requests) >= 256
        assert max(ends for ends, _ in running) <= start + DEADLINE_S
        assert plans[0] > CHEAP.floor  # the first had the node to itself


def test_the_measured_rate_rises_with_what_runs_cost_and_tightens_admission() -> None:
    """Cheap programs lower the rate; a run of spinners after them raises it, and with it each
    sample's floor, so fewer are taken."""
    rates = Rates()
    for _ in range(50):
        rates.measured("python", 0.05, 10)
    cheap = rates.test_s("python")
    for _ in range(20):
        rates.measured("python", 4.0, 1)  # a spinner cut after one test, at its plan
    assert rates.test_s("python") > 20 * cheap
    floor = Cost(10 * rates.test_s("python"), 60.0).floor
    assert floor > PLAN_MARGIN * 10 * cheap and floor > PLAN_FLOOR_S
