"""Admission by the measured rate, in-process on a hand-moved clock: a burst of cheap samples is
taken whole, one client's backlog never gets another refused, every admitted sample keeps its
floor by its deadline, and a quiet node plans a sample at its full limits."""

from __future__ import annotations

import contextlib

import pytest

from common.limits.errors import Overloaded, PayloadTooLarge
from services.code.grading.grader import Grader
from services.code.sandbox.cgroups import Cgroups
from services.code.scheduling.admission import (
    FIRST_TEST_S,
    PLAN_FLOOR_S,
    PLAN_MARGIN,
    Admission,
    Cost,
    Rates,
    floor_shown,
)
from services.code.settings import CodeSettings
from testing.clock import ManualClock

pytestmark = pytest.mark.unit

SLOTS = 7
DEADLINE_S = 110.0


def cost(expected: float, worst: float) -> Cost:
    """A sample of 10 tests that cost ``expected`` in all at the measured rate, ``worst`` at its limits."""
    return Cost(Rates(first_test_s=expected / 10), "python", 10, worst)


# A correct A+B of 10 tests at 5 ms a test; at its limits, a 60 s sample.
CHEAP = cost(expected=0.05, worst=60.0)


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
    heavy = cost(expected=10.0, worst=60.0)  # floor: 30 s
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
        admission.admit("trainer", [cost(expected=20.0, worst=60.0)] * 64, admission.clock() + DEADLINE_S),
    ):
        pass


def test_one_clients_backlog_never_gets_another_client_refused() -> None:
    """Client A fills the node; A's next request is refused, B's is taken: B waits behind at
    most as much of A's work as B itself brings."""
    clock = ManualClock()
    admission = Admission(SLOTS, clock)
    heavy = cost(expected=10.0, worst=60.0)
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


def test_heavier_programs_raise_the_rate_within_a_few_samples_and_cheap_ones_lower_it_slowly() -> None:
    rates = Rates()
    for _ in range(50):
        rates.measured("python", 0.05, 10)
    cheap = rates.test_s("python")
    for _ in range(5):
        rates.measured("python", 5.0, 10)  # a correct program of 0.5 s a test
    assert rates.test_s("python") > 0.3
    rates.measured("python", 0.05, 10)
    assert rates.test_s("python") > 0.25 > 10 * cheap
    floor = Cost(rates, "python", 10, 60.0).floor
    assert floor > PLAN_MARGIN * 10 * cheap and floor > PLAN_FLOOR_S


def test_a_waiting_samples_floor_follows_what_the_node_measures_after_its_admission() -> None:
    """Admitted at the first runs' rate, a sample that starts after heavier runs were measured
    is planned at what they showed: the first wave of a burst sets the floors of the rest."""
    clock = ManualClock()
    rates = Rates()
    admission = Admission(SLOTS, clock)
    sample = Cost(rates, "python", 10, 60.0)
    with admission.admit("trainer", [sample] * 20, clock.now + DEADLINE_S) as request:
        before = sample.floor
        for _ in range(5):
            rates.measured("python", 5.0, 10)  # programs of 0.5 s a test, measured meanwhile
        assert sample.floor > 3 * before
        assert request.started(0) >= sample.floor


def test_spinners_are_not_measured_and_a_heavy_sample_cut_short_counts_its_ended_tests() -> None:
    """A sample whose tests all timed out (a spinner, cut at its plan) says nothing of what a test
    costs; one cut after 3 tests that ended on their own cost its slot time over 4."""
    grader = Grader(CodeSettings(infra_failure_score="nan"), FakeSandbox(), 60.0)
    grader._measure("python", 4.5, ["timeout"] * 10)
    assert grader.rates.stats()["test_s"] == {}
    grader._measure("python", 4.0, ["passed"] * 3 + ["timeout"] * 7)
    assert grader.rates.test_s("python") > FIRST_TEST_S  # it rose towards 1 s a test


class FakeSandbox:
    """What a ``Grader`` reads of its sandbox before it runs anything."""

    isolation = "none"
    cgroups = Cgroups(0, reason="a fake sandbox")


def test_a_request_alone_on_the_node_shares_all_of_it_between_its_samples() -> None:
    """A GRPO group of 8 that does not fit at its full limits (8 x 60 s on 7 slots by 110 s) has
    the node to itself: its samples are planned far past the floors a burst would get."""
    clock = ManualClock()
    admission = Admission(SLOTS, clock)
    with admission.admit("trainer", [CHEAP] * 8, clock.now + DEADLINE_S) as request:
        plans = [request.started(index) for index in range(SLOTS)]
    assert all(plan > 10 * CHEAP.floor for plan in plans), plans


def test_a_plan_cut_shows_the_floor_its_ended_tests_need_and_a_spinner_shows_none() -> None:
    """Cut at a 4.5 s plan after 9 of 10 tests ended on their own (a heavy program planned at a
    rate not yet measured): it needs its slot time over the 9 and the one cut, for 10, with the
    margin; a spinner (no test ended) shows nothing, and is never re-run for it."""
    assert floor_shown(4.5, 10, 9) == pytest.approx(PLAN_MARGIN * 4.5)
    assert floor_shown(4.5, 10, 0) == 0.0


def test_a_re_run_is_planned_at_least_what_its_first_run_showed_within_its_limits() -> None:
    clock = ManualClock()
    admission = Admission(SLOTS, clock)
    rates = Rates()
    # 20 samples that do not fit at their limits: each planned below them, at its floor and share
    with admission.admit("trainer", [Cost(rates, "python", 10, 60.0)] * 20, clock.now + DEADLINE_S) as request:
        assert request.started(2) < 20.0
        assert request.started(0, 20.0) == 20.0
        assert request.started(1, 90.0) == 60.0
